"""The wire schemas of the decision service and the gateway (pydantic only): what a request may hold and what a
response holds, with the bounds that keep every number finite and every list short. docs/serve.md, docs/gateway.md.

Service: ``RouteRequest`` (a request and its candidate ``ReplicaSnapshot``s), ``ScaleRequest`` (mirrors
``control.protocols.ScaleObs``), ``PlanRequest``, ``ReloadRequest`` and their responses. Gateway: the fields of an
OpenAI completion / chat completion request the gateway reads (``CompletionRequest``, ``ChatRequest``), checked
before anything is forwarded; the other fields pass through unchanged. ``validation_detail`` turns pydantic's
errors into the one-line ``detail``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from fleetwise.control.protocols import GroupState

MAX_REPLICAS = 10_000
MAX_GROUPS = 10_000
MAX_REGIONS = 256
_BIG = 10**15  # bound on counts: keeps every estimate a finite float
MAX_COUNT = _BIG  # (the same, for the gateway, which clips a backend's gauges into it)
MAX_FLOAT = 1e15  # bound on every float of the wire schemas (and serve/scale_wire.py)


class _FewKeys(BaseModel):
    """A request object with more keys than its fields (+ 16) is refused in one error naming the count and the
    first unknown ones: each unknown key was an error of its own (250,000 of them took 1.2 s to list)."""

    @model_validator(mode="before")
    @classmethod
    def _not_too_many_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > len(cls.model_fields) + 16:
            unknown = [str(k)[:40] for k in list(data)[:64] if k not in cls.model_fields][:3]
            raise ValueError(f"{len(data)} fields, more than the {len(cls.model_fields)} this object has (unknown: "
                             f"{', '.join(unknown)}, ...)")
        return data


# --------------------------------------------------------------------------------------------- /v1/route
class ReplicaSnapshot(BaseModel):
    """One candidate replica as the caller sees it now."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: str = Field(min_length=1, max_length=256)
    region: str | None = Field(None, max_length=256)
    outstanding_requests: int = Field(0, ge=0, le=_BIG, description="routed, not finished")
    outstanding_tokens: int = Field(0, ge=0, le=_BIG,
                                    description="prefill + decode tokens still to compute (estimate)")
    kv_used_fraction: float = Field(0.0, ge=0.0, le=1.0)
    waiting: int = Field(0, ge=0, le=_BIG, description="queued, not admitted")
    ready: bool = Field(True, description="False: not serving; never picked unless no replica is ready")
    rtt_s: float = Field(0.0, ge=0.0, le=3600.0, description="network round trip from the request's origin")
    prefix_hit_tokens: int = Field(0, ge=0, le=_BIG, description="prompt tokens cached here for this request")
    tokens_per_s: float | None = Field(None, ge=1e-6, le=1e12, description="prefill throughput, if known")


ROUTE_EXAMPLE = {
    "prompt_tokens": 812, "output_tokens": 256, "model": "llama-3-8b", "origin": "us-east-1",
    "replicas": [
        {"id": "r0", "region": "us-east-1", "outstanding_requests": 4, "outstanding_tokens": 5200,
         "kv_used_fraction": 0.41, "waiting": 1, "rtt_s": 0.002, "tokens_per_s": 12000.0},
        {"id": "r1", "region": "eu-central-1", "outstanding_requests": 1, "outstanding_tokens": 900,
         "kv_used_fraction": 0.12, "rtt_s": 0.09, "prefix_hit_tokens": 512, "tokens_per_s": 12000.0},
    ],
}


class RouteRequest(_FewKeys):
    """One request to route: its features and a snapshot of the candidate replicas."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [ROUTE_EXAMPLE]})

    prompt_tokens: int = Field(ge=1, le=_BIG)
    output_tokens: int = Field(128, ge=1, le=_BIG, description="expected / max output tokens")
    model: str | None = Field(None, max_length=256)
    origin: str | None = Field(None, max_length=256)
    slo_class: str = Field("standard", max_length=256)
    tenant: str = Field("default", max_length=256)
    # fail_fast (here and on every list of a request): validation stops at the first bad item, so a body of 10,000
    # bad replicas is one item's errors, not 300,000 (whose 422 took 6 s to build and was 35 MB)
    replicas: list[ReplicaSnapshot] = Field(min_length=1, max_length=MAX_REPLICAS, fail_fast=True)

    @model_validator(mode="after")
    def _unique_ids(self) -> "RouteRequest":
        reps = self.replicas
        if len({r.id for r in reps}) != len(reps):
            seen: set[str] = set()
            for r in reps:
                if r.id in seen:
                    raise ValueError(f"replica ids must be unique; {r.id!r} appears more than once")
                seen.add(r.id)
        return self


# --------------------------------------------------------------------------------------------- bodies
class RouteResponse(BaseModel):
    replica_index: int = Field(description="index into the request's replicas")
    replica_id: str
    policy: str


class ErrorBody(BaseModel):
    detail: str = Field(description="one line: what is wrong and where")


class ValidationErrorBody(ErrorBody):
    errors: list[dict[str, Any]] = Field(default_factory=list, description="the first 20 errors: loc, msg, type")


# fractions of a whole, at most 1 (a busy of 1.5 or 1e15 was taken and moved the target: 7 replicas for 4)
FRACTION_FIELDS = frozenset({"kv_used", "busy"})


def _mirror(dc: type, name: str, doc: str, overrides: dict[str, Any] | None = None) -> type[BaseModel]:
    """A pydantic model with the fields of dataclass ``dc`` (so the API follows the protocol): numbers are
    finite and >= 0; a float whose default is NaN ("unknown") becomes ``float | None`` (null: unknown)."""
    hints = typing.get_type_hints(dc)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(dc):
        t = hints[f.name]
        default: Any = ...
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        if overrides and f.name in overrides:
            fields[f.name] = overrides[f.name]
        elif t is float and isinstance(default, float) and math.isnan(default):
            fields[f.name] = (float | None, Field(None, ge=0.0, le=MAX_FLOAT, description="null: unknown"))
        elif t is float:
            fields[f.name] = (float, Field(default, ge=0.0, le=1.0 if f.name in FRACTION_FIELDS else MAX_FLOAT))
        elif t is int:
            fields[f.name] = (int, Field(default, ge=0, le=int(MAX_FLOAT)))
        elif t == (int | None):
            fields[f.name] = (int | None, Field(default, ge=0, le=int(MAX_FLOAT)))
        elif t is str:
            fields[f.name] = (str, Field(default, min_length=1, max_length=256))
        elif t == tuple[float, ...]:
            fields[f.name] = (list[Annotated[float, Field(ge=0.0, le=MAX_FLOAT)]],
                              Field(list(default) if default is not ... else ..., max_length=10_000, fail_fast=True))
        else:
            fields[f.name] = (t, default)
    return create_model(name, __config__=ConfigDict(extra="forbid", allow_inf_nan=False), __doc__=doc, **fields)


GroupStateModel = _mirror(GroupState, "GroupStateModel", GroupState.__doc__ or "")


SCALE_EXAMPLE = {
    "time_s": 3600.0, "epoch_s": 60.0,
    "groups": [{"key": "llama-8b/A100-80GB/us-east-1a/on_demand", "model": "llama-8b", "gpu": "A100-80GB",
                "region": "us-east-1", "zone": "us-east-1a", "pool": "on_demand", "ready": 3, "starting": 0,
                "draining": 0, "min_replicas": 1, "max_replicas": 10, "waiting": 12, "running": 40, "kv_used": 0.7,
                "busy": 0.85, "arrivals_rps": 9.5, "history_rps": [7.0, 8.2], "ttft_p90_s": 0.8, "tpot_p90_s": 0.04,
                "slo_ttft_s": 1.0, "slo_tpot_s": 0.05, "capacity_rps": 3.0, "price_usd_per_hour": 3.7,
                "cold_start_s": 90.0}],
}
PLAN_EXAMPLE = {
    "origins": ["us-east-1", "eu-central-1"], "demand_rps": [40.0, 25.0], "demand_history": [[35.0, 30.0]],
    "regions": [{"name": "us-east-1", "capacity_rps": 50.0, "util": 0.8, "backlog_s": 2.0},
                {"name": "eu-central-1", "capacity_rps": 30.0, "util": 0.4},
                {"name": "ap-south-1", "capacity_rps": 20.0, "util": 0.1}],
    "rtt_s": [[0.001, 0.09, 0.19], [0.09, 0.001, 0.12]], "slot_s": 60.0, "hour_utc": 14.0,
}


NAN_FIELDS = frozenset(f.name for f in dataclasses.fields(GroupState)
                        if isinstance(f.default, float) and math.isnan(f.default))


def _columns_model() -> type[BaseModel]:
    """The groups as columns: each field of ``GroupStateModel`` a list with one value per group (the same bounds
    per value); a field with a default may be left out (the default for every group)."""
    fields: dict[str, Any] = {}
    for name, f in GroupStateModel.model_fields.items():
        item = Annotated[f.annotation, *f.metadata]  # type: ignore[valid-type]
        if f.is_required():
            fields[name] = (list[item], Field(..., min_length=1, max_length=MAX_GROUPS, fail_fast=True))
        else:  # (an Annotated with fail_fast cannot go into a union: its metadata is not hashable)
            fields[name] = (list[item] | None, Field(None, min_length=1, max_length=MAX_GROUPS, fail_fast=True))
    return create_model("ScaleColumns", __config__=ConfigDict(extra="forbid", allow_inf_nan=False),
                        __doc__="The scaling groups as columns: field -> one value per group, in one order (no field "
                                "name repeated per group: a smaller body for large fleets).", **fields)


ScaleColumns = _columns_model()
COLUMN_DEFAULTS = {name: f.get_default(call_default_factory=True)
                   for name, f in GroupStateModel.model_fields.items() if not f.is_required()}


def column_groups(cols: Any) -> list[dict[str, Any]]:
    """The groups of a ``ScaleColumns`` as dicts (left-out columns: the defaults); raises ValueError when the
    columns' lengths differ."""
    d = {name: getattr(cols, name) for name in GroupStateModel.model_fields}
    n = len(d["key"])
    for name, v in d.items():
        if v is not None and len(v) != n:
            raise ValueError(f"columns.{name} has {len(v)} values for {n} groups (columns.key)")
    names = list(d)
    vals = [v if v is not None else [COLUMN_DEFAULTS[k]] * n for k, v in d.items()]
    return [dict(zip(names, row)) for row in zip(*vals)]


def check_groups(groups: Any, key: Any = lambda g: g.key, lo: Any = lambda g: g.min_replicas,
                 hi: Any = lambda g: g.max_replicas) -> None:
    """The cross-field rules of a scaling body: unique group keys, ``min_replicas <= max_replicas``."""
    seen: set[str] = set()
    for g in groups:
        k = key(g)
        if k in seen:
            raise ValueError(f"group keys must be unique; {k!r} appears more than once")
        seen.add(k)
        if lo(g) > hi(g):
            raise ValueError(f"group {k!r}: min_replicas {lo(g)} > max_replicas {hi(g)}")


class _ScaleBase(_FewKeys):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [SCALE_EXAMPLE]})

    @model_validator(mode="after")
    def _groups_or_columns(self):
        if (self.groups is None) == (self.columns is None):
            raise ValueError("give the scaling groups either as groups (a list of objects) or as columns "
                             "(field -> list of values), not both" if self.groups is not None else
                             "give the scaling groups as groups (a list of objects) or as columns "
                             "(field -> list of values)")
        if self.groups is not None:
            check_groups(self.groups)
        else:
            rows = column_groups(self.columns)
            check_groups(rows, key=lambda g: g["key"], lo=lambda g: g["min_replicas"], hi=lambda g: g["max_replicas"])
        return self


ScaleRequest = create_model(
    "ScaleRequest", __base__=_ScaleBase, __doc__="A scaling epoch's observation (control.protocols.ScaleObs): the "
    "groups as a list of objects (``groups``) or as columns (``columns``), one of the two.",
    time_s=(float, Field(ge=0.0, le=MAX_FLOAT)), epoch_s=(float, Field(gt=0.0, le=MAX_FLOAT)),
    groups=(list[GroupStateModel] | None, Field(None, min_length=1, max_length=MAX_GROUPS, fail_fast=True)),
    columns=(ScaleColumns | None, None))


class ScaleResponse(BaseModel):
    targets: dict[str, int] = Field(description="target replicas per group key; groups left out keep theirs")
    policy: str


class RegionState(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=256)
    capacity_rps: float = Field(gt=0.0, le=MAX_FLOAT, description="requests/s the region's servers sustain")
    util: float = Field(0.0, ge=0.0, le=1.0, description="GPU-busy fraction over the last slot")
    backlog_s: float = Field(0.0, ge=0.0, le=MAX_FLOAT, description="outstanding work, seconds of service")
    free_frac: float | None = Field(None, ge=0.0, le=1.0,
                                    description="fraction of servers with nothing outstanding (null: 1 - util)")


Matrix = Annotated[list[Annotated[list[Annotated[float, Field(ge=0.0, le=MAX_FLOAT)]], Field(fail_fast=True)]],
                   Field(fail_fast=True)]


class PlanRequest(_FewKeys):
    """One planning slot: demand per origin, state per region, origin-to-region network."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [PLAN_EXAMPLE]})

    origins: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(min_length=1, max_length=MAX_REGIONS,
                                                                               fail_fast=True)
    demand_rps: list[Annotated[float, Field(ge=0.0, le=MAX_FLOAT)]] = Field(fail_fast=True,
        description="requests/s that originated at each origin over the last slot")
    demand_history: list[list[Annotated[float, Field(ge=0.0, le=MAX_FLOAT)]]] = Field(
        default_factory=list, max_length=64, fail_fast=True, description="earlier slots' demand_rps, newest first")
    regions: list[RegionState] = Field(min_length=1, max_length=MAX_REGIONS, fail_fast=True)
    rtt_s: Matrix = Field(description="origins x regions network round trip, seconds")
    egress_usd_per_gb: Matrix | None = Field(None, description="origins x regions; null: all 0")
    slot_s: float = Field(6.0, ge=1e-3, le=1e6, description="planning slot length, seconds (at least 1 ms)")
    hour_utc: float = Field(0.0, ge=0.0, lt=24.0, description="UTC hour of the coming slot")
    long_share: float | None = Field(None, ge=0.0, le=1.0,
                                     description="the share of recent requests (TORTA's world: the last two slots') "
                                                 "of more than 1,500 prompt + output tokens; a trained TORTA "
                                                 "checkpoint plans by its rule when it is above any share of its "
                                                 "training days (null: unknown, no guard)")

    @model_validator(mode="after")
    def _shapes(self):
        m, n = len(self.origins), len(self.regions)
        if len(self.demand_rps) != m:
            raise ValueError(f"demand_rps has {len(self.demand_rps)} values for {m} origins")
        for k, row in enumerate(self.demand_history):
            if len(row) != m:
                raise ValueError(f"demand_history[{k}] has {len(row)} values for {m} origins")
        for fname in ("rtt_s", "egress_usd_per_gb"):
            mat = getattr(self, fname)
            if mat is None:
                continue
            if len(mat) != m or any(len(r) != n for r in mat):
                raise ValueError(f"{fname} must be {m} origins x {n} regions")
        for fname, names in (("origins", self.origins), ("regions", [r.name for r in self.regions])):
            if len(set(names)) != len(names):
                raise ValueError(f"{fname}: names must be unique")
        return self


class PlanResponse(BaseModel):
    origins: list[str]
    regions: list[str]
    plan_rps: list[list[float]] = Field(description="origins x regions: requests/s from each origin to each region; "
                                                    "row i sums to demand_rps[i]")
    shares: list[list[float]] = Field(description="origins x regions: the share of each origin's requests per region")
    shares_long: list[list[float]] | None = Field(None, description="a size-aware TORTA checkpoint: the same for "
                                                  "requests of more than 1,500 prompt + output tokens (null: as "
                                                  "shares)")
    target: list[float] = Field(description="the supply weights the plan transports demand to (sum 1)")
    guarded: bool = Field(False, description="a trained TORTA checkpoint's guard planned this slot by its rule "
                                             "(long_share above its training days'), not by the learned policy")
    policy: str


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid",
                              json_schema_extra={"examples": [{"router": "prefix_aware?hit_weight=0.5"}]})

    router: str | None = Field(None, max_length=1000, description="router spec, e.g. prefix_aware?hit_weight=0.5")
    scaler: str | None = Field(None, max_length=1000, description="scaler spec (registry level 'scaler')")
    planner: str | None = Field(None, max_length=1000, description="planner spec (ot, ot_capacity)")
    checkpoint: str | None = Field(None, max_length=4096,
                                   description="TORTA planner checkpoint (fleetwise NAME.npz + NAME.card.json) inside "
                                               "the service's --checkpoint-dir: a name relative to it, or a path in it")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)

    @model_validator(mode="after")
    def _something(self):
        if self.router is None and self.scaler is None and self.planner is None and self.checkpoint is None:
            raise ValueError("give at least one of router, scaler, planner, checkpoint")
        if self.planner is not None and self.checkpoint is not None:
            raise ValueError("give planner or checkpoint, not both")
        return self


class ReloadResponse(BaseModel):
    router: str
    scaler: str | None
    planner: str | None
    reloads: int


# --------------------------------------------------------------------------------------------- errors
def _loc(loc: Any) -> str:
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "body"


def validation_detail(errors: list[dict], total: int | None = None) -> str:
    """One line naming each bad field (at most three): ``body.replicas[0].id: String should have ...``; ``total``:
    how many errors there were (default: ``len(errors)``)."""
    total = len(errors) if total is None else total
    parts = []
    for e in errors[:3]:
        msg = str(e.get("msg", "invalid"))
        ctx = e.get("ctx") or {}
        if e.get("type") == "json_invalid" and ctx.get("error") and str(ctx["error"]) not in msg:
            msg = f"{msg}: {ctx['error']}"
        parts.append(f"{_loc(e.get('loc', ()))}: {msg}")
    more = f" (and {total - 3} more)" if total > 3 else ""
    return ("; ".join(parts) + more).replace("\n", " ")


def error_bytes(detail: str) -> bytes:
    return json.dumps({"detail": detail.replace("\n", " ")}).encode()


def validation_bytes(errors: list[dict], total: int | None = None) -> bytes:
    """The 422 body: ``detail`` (one line) and ``errors`` (loc, msg, type of the first ``MAX_ERRORS_SHOWN``; not
    the input); ``total``: how many there were (default: ``len(errors)``), said in ``detail``."""
    total = len(errors) if total is None else total
    errs = [{"loc": [p if isinstance(p, (int, str)) else str(p) for p in e.get("loc", ())],
             "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in errors[:MAX_ERRORS_SHOWN]]
    return json.dumps({"detail": validation_detail(errors, total), "errors": errs}).encode()


MAX_ERRORS_SHOWN = 20  # errors listed in a 422 (the detail says how many there were)


# --------------------------------------------------------------------------------------------- gateway
MAX_OUTPUT_TOKENS = 1 << 24
MAX_CHOICES = 128
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class _FastList:
    """``_Fast[list[X]]``: a list whose validation stops at its first bad item (``fail_fast``)."""

    def __class_getitem__(cls, t):
        return Annotated[t, Field(fail_fast=True)]


_Fast = _FastList


class _OpenAIRequest(BaseModel):
    """The fields of an OpenAI request the gateway reads to route it (strict JSON types); any other field passes
    through to the backend unchanged."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = Field(None, max_length=256)
    stream: bool | None = None
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    max_tokens: int | None = Field(None, ge=0, le=MAX_OUTPUT_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_OUTPUT_TOKENS)


class CompletionRequest(_OpenAIRequest):
    prompt: str | _Fast[list[str]] | _Fast[list[TokenId]] | _Fast[list[_Fast[list[TokenId]]]] = ""


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: str = Field(max_length=64)
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: str = Field(min_length=1, max_length=64)
    content: str | _Fast[list[ContentPart]] | None = None


class ChatRequest(_OpenAIRequest):
    messages: _Fast[list[ChatMessage]]
