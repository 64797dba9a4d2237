"""The decision service: the project's policies behind HTTP (FastAPI + uvicorn). docs/serve.md.

Endpoints: ``POST /v1/route`` (which replica serves a request), ``POST /v1/scale`` (target replicas per scaling
group), ``POST /v1/plan`` (an origins x regions transport plan of demand), ``POST /v1/admin/reload`` (swap
policies while serving), ``GET /healthz``, ``GET /readyz``, ``GET /metrics`` (Prometheus), ``GET /openapi.json``.

Every path but ``/healthz`` and ``/readyz`` needs ``Authorization: Bearer <token>`` when the service has a token.
Bad bodies get 422 with a one-line ``detail`` naming the field; a policy that cannot decide gets 4xx with its
message, never 5xx. A reload builds the new policies first and swaps them in one assignment under a lock: calls
in flight finish on the policies they started with; a failed load answers 400 and changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hmac
import ipaddress
import json
import logging
import math
import os
import threading
import time
import typing
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleetwise.control.protocols import GroupState, ScaleObs
from fleetwise.errors import InputError
from fleetwise.serve.policy import RoutePolicy, RouteRequest, load_route_policy, parse_spec

log = logging.getLogger("fleetwise.serve")

TOKEN_ENV = "FLEETWISE_SERVE_TOKEN"
DEFAULT_ROUTER = "least_outstanding_tokens"
DEFAULT_PLANNER = "ot_capacity"
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 2.0)
_BIG = 1e15
MAX_GROUPS = 10_000
MAX_REGIONS = 256
MAX_BODY_BYTES = 8 << 20


# --------------------------------------------------------------------------------------------- bodies
class RouteResponse(BaseModel):
    replica_index: int = Field(description="index into the request's replicas")
    replica_id: str
    policy: str


class ErrorBody(BaseModel):
    detail: str = Field(description="one line: what is wrong and where")


class ValidationErrorBody(ErrorBody):
    errors: list[dict[str, Any]] = Field(default_factory=list, description="every error: loc, msg, type")


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
            fields[f.name] = (float | None, Field(None, ge=0.0, le=_BIG, description="null: unknown"))
        elif t is float:
            fields[f.name] = (float, Field(default, ge=0.0, le=_BIG))
        elif t is int:
            fields[f.name] = (int, Field(default, ge=0, le=int(_BIG)))
        elif t == (int | None):
            fields[f.name] = (int | None, Field(default, ge=0, le=int(_BIG)))
        elif t is str:
            fields[f.name] = (str, Field(default, min_length=1, max_length=256))
        elif t == tuple[float, ...]:
            fields[f.name] = (list[Annotated[float, Field(ge=0.0, le=_BIG)]],
                              Field(list(default) if default is not ... else ..., max_length=10_000))
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


class _ScaleBase(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [SCALE_EXAMPLE]})

    @model_validator(mode="after")
    def _unique_keys(self):
        seen: set[str] = set()
        for g in self.groups:
            if g.key in seen:
                raise ValueError(f"group keys must be unique; {g.key!r} appears more than once")
            seen.add(g.key)
            if g.min_replicas > g.max_replicas:
                raise ValueError(f"group {g.key!r}: min_replicas {g.min_replicas} > max_replicas {g.max_replicas}")
        return self


ScaleRequest = create_model(
    "ScaleRequest", __base__=_ScaleBase, __doc__="A scaling epoch's observation (control.protocols.ScaleObs).",
    time_s=(float, Field(ge=0.0, le=_BIG)), epoch_s=(float, Field(gt=0.0, le=_BIG)),
    groups=(list[GroupStateModel], Field(min_length=1, max_length=MAX_GROUPS)))
_NAN_FIELDS = frozenset(f.name for f in dataclasses.fields(GroupState)
                        if isinstance(f.default, float) and math.isnan(f.default))


class ScaleResponse(BaseModel):
    targets: dict[str, int] = Field(description="target replicas per group key; groups left out keep theirs")
    policy: str


class RegionState(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=256)
    capacity_rps: float = Field(gt=0.0, le=_BIG, description="requests/s the region's servers sustain")
    util: float = Field(0.0, ge=0.0, le=1.0, description="GPU-busy fraction over the last slot")
    backlog_s: float = Field(0.0, ge=0.0, le=_BIG, description="outstanding work, seconds of service")
    free_frac: float | None = Field(None, ge=0.0, le=1.0,
                                    description="fraction of servers with nothing outstanding (null: 1 - util)")


Matrix = list[list[Annotated[float, Field(ge=0.0, le=_BIG)]]]


class PlanRequest(BaseModel):
    """One planning slot: demand per origin, state per region, origin-to-region network."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [PLAN_EXAMPLE]})

    origins: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(min_length=1, max_length=MAX_REGIONS)
    demand_rps: list[Annotated[float, Field(ge=0.0, le=_BIG)]] = Field(
        description="requests/s that originated at each origin over the last slot")
    demand_history: list[list[Annotated[float, Field(ge=0.0, le=_BIG)]]] = Field(
        default_factory=list, max_length=64, description="earlier slots' demand_rps, newest first")
    regions: list[RegionState] = Field(min_length=1, max_length=MAX_REGIONS)
    rtt_s: Matrix = Field(description="origins x regions network round trip, seconds")
    egress_usd_per_gb: Matrix | None = Field(None, description="origins x regions; null: all 0")
    slot_s: float = Field(6.0, gt=0.0, le=1e6, description="planning slot length, seconds")
    hour_utc: float = Field(0.0, ge=0.0, lt=24.0, description="UTC hour of the coming slot")

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
    target: list[float] = Field(description="the supply weights the plan transports demand to (sum 1)")
    policy: str


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid",
                              json_schema_extra={"examples": [{"router": "prefix_aware?hit_weight=0.5"}]})

    router: str | None = Field(None, max_length=1000, description="router spec, e.g. prefix_aware?hit_weight=0.5")
    scaler: str | None = Field(None, max_length=1000, description="scaler spec (registry level 'scaler')")
    planner: str | None = Field(None, max_length=1000, description="planner spec (ot, ot_capacity)")
    checkpoint: str | None = Field(None, max_length=4096,
                                   description="TORTA planner checkpoint (Stable-Baselines3 .zip) on the server")
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


# --------------------------------------------------------------------------------------------- policies
class PolicyFailed(Exception):
    """A policy could not decide on a valid request (answered 422 with the message)."""


class ScalePolicy:
    def __init__(self, scaler: Any, name: str):
        self.scaler, self.name = scaler, name
        self._lock = threading.Lock()

    def scale(self, body: BaseModel) -> dict[str, int]:
        groups = []
        for g in body.groups:
            d = g.model_dump()
            for k in _NAN_FIELDS:
                if d.get(k) is None:  # null: unknown (NaN)
                    d[k] = float("nan")
            d["history_rps"] = tuple(d.get("history_rps", ()))
            groups.append(GroupState(**d))
        obs = ScaleObs(time_s=body.time_s, epoch_s=body.epoch_s, groups=groups)
        with self._lock:
            out = self.scaler.scale(obs)
        if not isinstance(out, dict):
            raise PolicyFailed(f"scaler {self.name!r} returned {type(out).__name__}, expected {{group key: replicas}}")
        try:
            return {str(k): int(v) for k, v in out.items()}
        except (TypeError, ValueError, OverflowError) as e:
            raise PolicyFailed(f"scaler {self.name!r} returned a non-integer target: {e}") from None


def load_scale_policy(spec: str) -> ScalePolicy:
    from fleetwise.policies import make

    name, params = parse_spec(spec)
    return ScalePolicy(make("scaler", name, params, where="scaler: "), spec.strip())


def _missing_extra(e: ModuleNotFoundError, extra: str = "rl") -> InputError:
    return InputError(f"this needs the {extra} extra (missing module {e.name!r}): "
                      f"pip install -c constraints.txt 'fleetwise[{extra}]'")


class PlanPolicy:
    """An OT planner of policies/planners.py on one slot: per-origin demand to per-region target weights."""

    def __init__(self, planner: Any, name: str, regions: int | None = None, history: int = 1):
        self.planner, self.name = planner, name
        self.regions = regions  # a checkpoint plans for exactly this many regions (= origins)
        self.history = max(int(history), 1)
        self._lock = threading.Lock()

    def obs(self, req: PlanRequest):
        import numpy as np

        from fleetwise.control.views import SlotObs

        m, n = len(req.origins), len(req.regions)
        if self.regions is not None and not (m == n == self.regions):
            raise PolicyFailed(f"planner {self.name!r} was trained on {self.regions} regions (each also an origin, "
                               f"in the same order); got {m} origins and {n} regions")
        rows = [req.demand_rps, *req.demand_history][: self.history]
        rows += [rows[-1]] * (self.history - len(rows))  # short history: repeat the oldest slot given
        util = np.array([r.util for r in req.regions], float)
        free = np.array([1.0 - r.util if r.free_frac is None else r.free_frac for r in req.regions], float)
        eg = np.zeros((m, n)) if req.egress_usd_per_gb is None else np.asarray(req.egress_usd_per_gb, float)
        return SlotObs(slot=0, hour_utc=req.hour_utc, backlog_s=np.array([r.backlog_s for r in req.regions], float),
                       util=util, free_frac=free, demand=np.asarray(rows, float) * req.slot_s,
                       capacity_rps=np.array([r.capacity_rps for r in req.regions], float),
                       rtt_s=np.asarray(req.rtt_s, float), egress_usd_per_gb=eg, slot_s=req.slot_s)

    def plan(self, req: PlanRequest) -> dict[str, Any]:
        import numpy as np

        obs = self.obs(req)
        with self._lock:
            self.planner.plan(obs)
            mat = None if self.planner.matrix is None else np.array(self.planner.matrix, float)
            target = np.asarray(self.planner.target(obs), float) if hasattr(self.planner, "target") else None
        if mat is None or mat.shape != (len(req.origins), len(req.regions)) or not np.isfinite(mat).all():
            raise PolicyFailed(f"planner {self.name!r} gave no valid transport plan for this slot")
        rs = mat.sum(1, keepdims=True)
        shares = np.divide(mat, rs, out=np.full_like(mat, 1.0 / mat.shape[1]), where=rs > 0)
        shares /= shares.sum(1, keepdims=True)
        plan = np.asarray(req.demand_rps, float)[:, None] * shares
        if target is None:
            target = mat.sum(0) / max(mat.sum(), 1e-300)
        return {"origins": list(req.origins), "regions": [r.name for r in req.regions], "plan_rps": plan.tolist(),
                "shares": shares.tolist(), "target": target.tolist(), "policy": self.name}


def _probe_plan(p: PlanPolicy) -> PlanPolicy:
    """Check at load time that the planner produces a transport plan (a 2-region slot)."""
    n = p.regions or 2
    req = PlanRequest(origins=[f"o{i}" for i in range(n)], demand_rps=[1.0] * n,
                      regions=[RegionState(name=f"r{i}", capacity_rps=1.0) for i in range(n)],
                      rtt_s=[[0.0 if i == j else 0.05 for j in range(n)] for i in range(n)])
    try:
        p.plan(req)
    except PolicyFailed:
        raise InputError(f"planner {p.name!r} does not produce a transport plan; use ot, ot_capacity or "
                         f"--checkpoint") from None
    return p


def load_plan_policy(spec: str | None = None, checkpoint: str | None = None) -> PlanPolicy:
    """A registered planner (``ot``, ``ot_capacity``, ...) or a TORTA PPO checkpoint (Stable-Baselines3 .zip,
    as trained by learn/torta.py): its action sets the OT target weights; otherwise free-capacity weights."""
    from fleetwise.policies import make

    try:
        if checkpoint is not None:
            return _probe_plan(_load_checkpoint(checkpoint))
        name, params = parse_spec(spec or DEFAULT_PLANNER)
        planner = make("planner", name, params, where="planner: ")
        return _probe_plan(PlanPolicy(planner, (spec or DEFAULT_PLANNER).strip()))
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("fleetwise"):
            raise
        raise _missing_extra(e) from None


def _load_checkpoint(path: str) -> PlanPolicy:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"checkpoint {path!r}: no such file")
    from stable_baselines3 import PPO

    from fleetwise.policies.planners import PolicyPlanner
    from fleetwise.worlds.torta import TortaConfig

    try:
        model = PPO.load(str(p), device="cpu")
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line
        raise InputError(f"checkpoint {path!r}: not a Stable-Baselines3 PPO zip ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    n = int(model.action_space.shape[0])
    d = int(model.observation_space.shape[0])
    if d == 3 * n:
        temporal, history = False, 1
    elif (d - 2) % n == 0 and (d - 2) // n - 3 >= 1:
        temporal, history = True, (d - 2) // n - 3
    else:
        raise InputError(f"checkpoint {path!r}: observation size {d} does not fit a TORTA planner of {n} regions")
    cfg = TortaConfig(temporal=temporal, history=history)
    return PlanPolicy(PolicyPlanner(cfg, model, temporal), f"checkpoint:{p.name}", regions=n, history=history)


# --------------------------------------------------------------------------------------------- the service
class Policies:
    """The policies in use. Calls take one reference at their start; a reload replaces the whole object."""

    __slots__ = ("route", "scale", "plan", "plan_error")

    def __init__(self, route: RoutePolicy, scale: ScalePolicy | None, plan: PlanPolicy | None,
                 plan_error: str | None = None):
        self.route, self.scale, self.plan, self.plan_error = route, scale, plan, plan_error


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter("fleetwise_decisions", "Decisions made, by endpoint and policy",
                                 ["endpoint", "policy"], registry=self.registry)
        self.latency = Histogram("fleetwise_decision_latency_seconds",
                                 "Server-side time of a decision call (body parsing to response), by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter("fleetwise_errors", "Responses with status >= 400, by endpoint and status",
                              ["endpoint", "status"], registry=self.registry)
        self.reloads = Counter("fleetwise_reloads", "Policy reloads, by result", ["result"], registry=self.registry)
        self._dec: dict[tuple[str, str], Any] = {}
        self.latency_by_endpoint = {ep: self.latency.labels(ep) for ep in ("route", "scale", "plan")}

    def decided(self, endpoint: str, policy: str) -> None:
        c = self._dec.get((endpoint, policy))
        if c is None:
            c = self._dec[(endpoint, policy)] = self.decisions.labels(endpoint, policy)
        c.inc()


ENDPOINTS = {"/v1/route": "route", "/v1/scale": "scale", "/v1/plan": "plan", "/v1/admin/reload": "reload",
             "/metrics": "metrics", "/healthz": "healthz", "/readyz": "readyz", "/openapi.json": "openapi"}


class _Edge:
    """Pure ASGI middleware: bearer auth, latency and error metrics (cheaper than BaseHTTPMiddleware)."""

    def __init__(self, app: Any, token: str | None, metrics: Metrics, fast: dict | None = None):
        self.app = app
        self.token = token.encode() if token else None
        self.metrics = metrics
        self.fast = fast or {}  # (method, path) -> ASGI handler that skips FastAPI's routing and body parsing

    def _authorized(self, scope: dict) -> tuple[bool, bool]:
        """(authorized, a credential was given)."""
        for k, v in scope["headers"]:
            if k == b"authorization":
                scheme, _, cred = v.partition(b" ")
                return (scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), self.token)), True
        return False, False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope["path"]
        ep = ENDPOINTS.get(path, "other")
        m = self.metrics
        if self.token is not None and path not in OPEN_PATHS:
            ok, given = self._authorized(scope)
            if not ok:
                m.errors.labels(ep, "401").inc()
                detail = "invalid bearer token" if given else "missing bearer token (Authorization: Bearer <token>)"
                challenge = 'Bearer realm="fleetwise"' + (', error="invalid_token"' if given else "")
                body = json.dumps({"detail": detail}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"www-authenticate", challenge.encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        t0 = time.perf_counter()
        status = 500

        async def send_status(msg: dict) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            handler = self.fast.get((scope["method"], path)) if self.fast else None
            await (handler or self.app)(scope, receive, send_status)
        finally:
            lat = m.latency_by_endpoint.get(ep)
            if lat is not None:
                lat.observe(time.perf_counter() - t0)
            if status >= 400:
                m.errors.labels(ep, str(status)).inc()


class ServiceApp(FastAPI):
    """FastAPI with ``_Edge`` in front of everything (auth, metrics, fast paths): no Starlette middleware stack
    on the hot path."""

    edge: _Edge | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        edge = self.edge
        if edge is not None and scope["type"] == "http":
            await edge(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def _loc(loc: Any) -> str:
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "body"


def validation_detail(errors: list[dict]) -> str:
    """One line naming each bad field (at most three): ``body.replicas[0].id: String should have ...``."""
    parts = []
    for e in errors[:3]:
        msg = str(e.get("msg", "invalid"))
        ctx = e.get("ctx") or {}
        if e.get("type") == "json_invalid" and ctx.get("error") and str(ctx["error"]) not in msg:
            msg = f"{msg}: {ctx['error']}"
        parts.append(f"{_loc(e.get('loc', ()))}: {msg}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return ("; ".join(parts) + more).replace("\n", " ")


def _error_bytes(detail: str) -> bytes:
    return json.dumps({"detail": detail.replace("\n", " ")}).encode()


def _validation_bytes(errors: list[dict]) -> bytes:
    """The 422 body: ``detail`` (one line) and ``errors`` (loc, msg, type of each; not the input)."""
    errs = [{"loc": [p if isinstance(p, (int, str)) else str(p) for p in e.get("loc", ())],
             "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in errors]
    return json.dumps({"detail": validation_detail(errors), "errors": errs}).encode()


def _json_content(scope: dict) -> bool:
    for k, v in scope["headers"]:
        if k == b"content-type":
            return b"json" in v.lower()
    return True  # none given: try JSON


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The whole request body, or None when it is larger than ``limit`` bytes."""
    chunks = []
    n = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        b = msg.get("body", b"")
        if b:
            n += len(b)
            if n > limit:
                return None
            chunks.append(b)
        if not msg.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _err(status: int, detail: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail.replace("\n", " ")}, status_code=status, headers=headers)


_E4 = {401: {"model": ErrorBody, "description": "missing or invalid bearer token"},
       422: {"model": ValidationErrorBody, "description": "invalid body, or the policy cannot decide on it"}}


def create_app(route_policy: str | RoutePolicy = DEFAULT_ROUTER, scaler: str | ScalePolicy | None = None,
               planner: str | PlanPolicy | None = None, checkpoint: str | None = None, token: str | None = None,
               seed: int = 0, fast_route: bool = True) -> FastAPI:
    """The decision service as an ASGI app. ``token`` None: no authentication (the CLI allows that on loopback
    only). ``planner`` None and no ``checkpoint``: ``ot_capacity`` if the rl extra is installed, else /v1/plan
    answers 409. Bad policy names raise ``InputError``."""
    route = route_policy if isinstance(route_policy, RoutePolicy) else load_route_policy(route_policy, seed)
    scale = scaler if isinstance(scaler, ScalePolicy) or scaler is None else load_scale_policy(scaler)
    plan_error = None
    if isinstance(planner, PlanPolicy):
        plan = planner
    elif planner is None and checkpoint is None:
        try:
            plan = load_plan_policy(DEFAULT_PLANNER)
        except InputError as e:  # the default planner needs the rl extra (POT); the rest of the service does not
            plan, plan_error = None, str(e)
    else:
        plan = load_plan_policy(planner, checkpoint)

    metrics = Metrics()
    state = {"policies": Policies(route, scale, plan, plan_error), "ready": True, "reloads": 0, "seed": seed}
    reload_lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        state["ready"] = False

    app = ServiceApp(title="fleetwise decision service", version=_version(), docs_url=None, redoc_url=None,
                     lifespan=lifespan,
                     description="Routing, scaling and regional planning decisions from fleetwise policies. "
                                 "All paths but /healthz and /readyz need `Authorization: Bearer <token>`.")
    app.state.fleetwise = state
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return Response(_validation_bytes(list(exc.errors())), status_code=422, media_type="application/json")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # e.g. not UTF-8
            return Response(_validation_bytes([{"loc": ("body",), "msg": "not valid JSON (expected a UTF-8 JSON "
                                                "object)", "type": "json_invalid"}]),
                            status_code=422, media_type="application/json")
        return await http_exception_handler(request, exc)

    def decide_route(req: RouteRequest) -> tuple[int, bytes]:
        pol = state["policies"].route  # one reference for the whole call: a reload does not affect it
        try:
            i = pol.route(req)
        except InputError as e:
            return 422, _error_bytes(str(e))
        except Exception as e:  # noqa: BLE001 - a policy failing on valid input is the caller's 4xx, with why
            log.exception("router %s failed", pol.name)
            return 422, _error_bytes(f"router {pol.name!r} failed on this request: {type(e).__name__}: {e}")
        metrics.decided("route", pol.name)
        return 200, (b'{"replica_index":%d,"replica_id":%s,"policy":%s}'
                     % (i, json.dumps(req.replicas[i].id).encode(), json.dumps(pol.name).encode()))

    @app.post("/v1/route", response_model=RouteResponse, responses=_E4, tags=["decisions"])
    async def route_request(req: RouteRequest) -> Response:
        """Which replica serves this request: index into ``replicas`` and its id."""
        status, body = decide_route(req)
        return Response(body, status_code=status, media_type="application/json")

    async def route_fast(scope: dict, receive: Any, send: Any) -> None:
        """POST /v1/route without FastAPI's routing, dependency solving and double JSON pass (a few times cheaper):
        the body goes straight to pydantic-core's JSON validator; answers as the endpoint above."""
        body = await _read_body(receive, MAX_BODY_BYTES)
        if body is None:
            status, out = 413, _error_bytes(f"body: larger than {MAX_BODY_BYTES} bytes")
        elif not _json_content(scope):
            status, out = 422, _error_bytes("body: expected Content-Type: application/json")
        else:
            try:
                req = RouteRequest.model_validate_json(body)
            except ValidationError as e:
                errs = [{**err, "loc": ("body", *err.get("loc", ()))} for err in e.errors(include_url=False)]
                status, out = 422, _validation_bytes(errs)
            else:
                status, out = decide_route(req)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})

    def decide(kind: str, role: str, pol: Any, on: str, call: Any) -> Any:
        """One /v1/scale or /v1/plan decision: a policy failing on valid input is a 422 that names it and why."""
        try:
            res = call()
        except (InputError, PolicyFailed) as e:
            return _err(422, str(e))
        except Exception as e:  # noqa: BLE001
            log.exception("%s %s failed", role, pol.name)
            return _err(422, f"{role} {pol.name!r} failed on this {on}: {type(e).__name__}: {e}")
        metrics.decided(kind, pol.name)
        return res

    @app.post("/v1/scale", response_model=ScaleResponse,
              responses={**_E4, 409: {"model": ErrorBody, "description": "no scaler loaded"}}, tags=["decisions"])
    def scale_request(req: ScaleRequest) -> Any:  # type: ignore[valid-type]
        """Target replicas per scaling group for the coming epoch (the loaded scaler, registry level 'scaler')."""
        pol = state["policies"].scale
        if pol is None:
            return _err(409, "no scaler loaded: start with --scaler NAME or POST /v1/admin/reload {\"scaler\": NAME}")
        return decide("scale", "scaler", pol, "observation",
                      lambda: {"targets": pol.scale(req), "policy": pol.name})

    @app.post("/v1/plan", response_model=PlanResponse,
              responses={**_E4, 409: {"model": ErrorBody, "description": "no planner loaded"}}, tags=["decisions"])
    def plan_request(req: PlanRequest) -> Any:
        """Regional distribution for the coming slot: an origins x regions transport plan of the demand."""
        pols = state["policies"]
        pol = pols.plan
        if pol is None:
            return _err(409, f"no planner loaded: {pols.plan_error or 'start with --planner or --checkpoint'}")
        return decide("plan", "planner", pol, "slot", lambda: pol.plan(req))

    @app.post("/v1/admin/reload", response_model=ReloadResponse,
              responses={**_E4, 400: {"model": ErrorBody, "description": "the new policy did not load; "
                                                                          "the old one stays"}}, tags=["admin"])
    def reload(req: ReloadRequest) -> Any:
        """Load new policies (all given ones, or none) and swap them in; calls in flight finish on the old ones."""
        with reload_lock:  # one reload at a time; decisions never wait for it
            old = state["policies"]
            try:
                seed_ = state["seed"] if req.seed is None else req.seed
                route_ = load_route_policy(req.router, seed_) if req.router is not None else old.route
                scale_ = load_scale_policy(req.scaler) if req.scaler is not None else old.scale
                plan_, plan_err = old.plan, old.plan_error
                if req.planner is not None or req.checkpoint is not None:
                    plan_, plan_err = load_plan_policy(req.planner, req.checkpoint), None
            except Exception as e:  # noqa: BLE001 - every failed load is the caller's 400, old policies kept
                metrics.reloads.labels("failed").inc()
                msg = str(e) if isinstance(e, InputError) else f"{type(e).__name__}: {e}"
                return _err(400, f"reload failed, policies unchanged: {msg}")
            state["policies"] = Policies(route_, scale_, plan_, plan_err)  # one assignment: the atomic swap
            state["reloads"] += 1
            metrics.reloads.labels("ok").inc()
            return {"router": route_.spec, "scaler": scale_.name if scale_ else None,
                    "planner": plan_.name if plan_ else None, "reloads": state["reloads"]}

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"model": ErrorBody, "description": "not ready"}})
    async def readyz() -> Any:
        """Readiness: policies loaded and not shutting down."""
        pols = state["policies"]
        if not state["ready"]:
            return _err(503, "shutting down")
        return {"status": "ready", "router": pols.route.spec, "scaler": pols.scale.name if pols.scale else None,
                "planner": pols.plan.name if pols.plan else None}

    @app.get("/metrics", tags=["ops"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
                        401: _E4[401]})
    async def metrics_text() -> Response:
        """Prometheus metrics: decisions, decision latency, errors, reloads."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearerAuth"] = {
                "type": "http", "scheme": "bearer"}
            for path, ops in schema.get("paths", {}).items():
                if path in OPEN_PATHS:
                    continue
                for op in ops.values():
                    op["security"] = [{"bearerAuth": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.edge = _Edge(functools.partial(FastAPI.__call__, app), token=token, metrics=metrics,
                     fast={("POST", "/v1/route"): route_fast} if fast_route else None)
    return app


def _version() -> str:
    from fleetwise import __version__

    return __version__


# --------------------------------------------------------------------------------------------- the command
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(token_file: str | None = None) -> str | None:
    """The bearer token: the file's first line (``--token-file``), else ``$FLEETWISE_SERVE_TOKEN``, else None."""
    if token_file is not None:
        p = Path(token_file)
        try:
            tok = p.read_text().strip()
        except OSError as e:
            raise InputError(f"--token-file {token_file}: cannot read ({e.strerror})") from None
        if not tok or any(c.isspace() for c in tok):
            raise InputError(f"--token-file {token_file}: expected one token (no spaces) on one line")
        return tok
    tok = os.environ.get(TOKEN_ENV, "").strip()
    return tok or None


def check_token(host: str, token: str | None) -> None:
    """No token: refuse a non-loopback address (InputError, exit 2); on loopback, warn."""
    if token is None:
        if not is_loopback(host):
            raise InputError(f"refusing to serve on {host} without a token: set {TOKEN_ENV} or --token-file "
                             "(or bind 127.0.0.1)")
        log.warning("no token: serving %s without authentication (loopback only)", host)


class _CoalescingTransport:
    """A transport whose writes within one event-loop iteration go out as one ``send``: uvicorn writes a
    response's status line + headers and its body separately, which on loopback is two segments, two wake-ups of
    the client and (measured) most of a route call's time in the service. Everything else is the real transport."""

    __slots__ = ("_t", "_buf", "_loop")

    def __init__(self, transport: Any, loop: Any):
        self._t = transport
        self._buf: list[bytes] = []
        self._loop = loop

    def write(self, data: bytes) -> None:
        if not self._buf:
            self._loop.call_soon(self._flush)
        self._buf.append(data)

    def _flush(self) -> None:
        if self._buf:
            data = b"".join(self._buf) if len(self._buf) > 1 else self._buf[0]
            self._buf.clear()
            if not self._t.is_closing():
                self._t.write(data)

    def writelines(self, chunks: Any) -> None:
        for c in chunks:
            self.write(c)

    def close(self) -> None:
        self._flush()
        self._t.close()

    def write_eof(self) -> None:
        self._flush()
        self._t.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


def http_protocol() -> Any:
    """uvicorn's httptools protocol with coalesced writes, or "auto" where httptools is not installed."""
    try:
        import asyncio

        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class CoalescingHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(_CoalescingTransport(transport, asyncio.get_running_loop()))

    return CoalescingHttpToolsProtocol


def main(host: str = "127.0.0.1", port: int = 8000, router: str = DEFAULT_ROUTER, scaler: str | None = None,
         planner: str | None = None, checkpoint: str | None = None, token_file: str | None = None, seed: int = 0,
         log_level: str = "warning", access_log: bool = False) -> None:
    """``fleetwise serve``: check the token rule, build the app (bad policies: InputError), run uvicorn."""
    import uvicorn

    token = resolve_token(token_file)
    check_token(host, token)
    for backend in ("PYTORCH", "JAX", "CUPY", "TENSORFLOW"):  # POT (the planner's Sinkhorn) works on numpy here:
        os.environ.setdefault(f"POT_BACKEND_DISABLE_{backend}", "1")  # skip importing torch & co (seconds, 100s MB)
    if token is None:
        print(f"warning: no token ({TOKEN_ENV} or --token-file): serving {host}:{port} without authentication",
              flush=True)
    app = create_app(router, scaler=scaler, planner=planner, checkpoint=checkpoint, token=token, seed=seed)
    gc.collect()
    gc.freeze()  # the ~250k objects of the imports never move again: full collections stop scanning them (ms)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log, http=http_protocol(),
                proxy_headers=False, server_header=False)  # no proxy-header middleware: client addresses unused
