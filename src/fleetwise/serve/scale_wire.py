"""``POST /v1/scale`` at 10,000 groups: the body decoded by msgspec, then made the scalers' ``GroupState``s.

pydantic (``schemas.ScaleRequest``) stays the schema of record: it is what OpenAPI shows and what every error
message comes from. For speed, the service first decodes the body with a msgspec ``Struct`` mirrored from the same
dataclass with the same bounds (numbers finite, >= 0, <= 1e15; strings of 1-256 characters; unknown fields
refused; at most ``MAX_GROUPS`` groups and 10,000 history values), which is several times faster on a body of
megabytes. msgspec is stricter than pydantic's lax JSON mode (e.g. it refuses ``"3"`` for an integer), so when it
refuses a body, or the body breaks a cross-field rule, the body is validated again by pydantic, which then gives
the answer: either the same request (lax input) or its one-line 422. So the fast path never accepts what the
schema refuses, and never refuses what it accepts.

The struct mirrors ``GroupState``'s fields in order (null read as NaN, ``history_rps`` a tuple), so each group
becomes a ``GroupState`` from the struct's values in one call: scalers get the protocol's own type.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Sequence
from itertools import starmap
from typing import Annotated, Any

from fleetwise.control.protocols import GroupState, ScaleObs
from fleetwise.serve.schemas import FRACTION_FIELDS, MAX_FLOAT, MAX_GROUPS, NAN_FIELDS

assert NAN_FIELDS == {"ttft_p90_s", "tpot_p90_s", "slo_ttft_s", "slo_tpot_s"}, "decode_scale: mirror NAN_FIELDS"


def _struct_types() -> tuple[Any, Any]:
    import msgspec

    F = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_FLOAT)]
    Int = Annotated[int, msgspec.Meta(ge=0, le=int(MAX_FLOAT))]
    Str = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    hints = typing.get_type_hints(GroupState)
    fields: list[tuple] = []
    for f in dataclasses.fields(GroupState):
        t = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else msgspec.NODEFAULT)  # type: ignore[misc]
        if f.name in NAN_FIELDS:
            fields.append((f.name, F | None, None))
        elif f.name in FRACTION_FIELDS:
            fields.append((f.name, Annotated[float, msgspec.Meta(ge=0.0, le=1.0)], default))
        elif t is float:
            fields.append((f.name, F, default))
        elif t is int:
            fields.append((f.name, Int, default))
        elif t == (int | None):
            fields.append((f.name, Int | None, default))
        elif t is str:
            fields.append((f.name, Str, default))
        elif t == tuple[float, ...]:
            fields.append((f.name, Annotated[tuple[F, ...], msgspec.Meta(max_length=10_000)], default))
        else:  # pragma: no cover - a new GroupState field type must be mirrored here and in schemas._mirror
            raise TypeError(f"GroupState.{f.name}: no msgspec mirror for {t}")
    fields = [(n, t) if d is msgspec.NODEFAULT else (n, t, d) for n, t, d in fields]
    # gc=False: the structs hold only numbers, strings and tuples of floats (no cycles possible), so the cyclic
    # collector need not track 10,000 of them (msgspec's documented option for such structs)
    Group = msgspec.defstruct("GroupStateWire", fields, forbid_unknown_fields=True, array_like=False, gc=False)
    # the columnar body: each field a list of the same values (a field with a default may be left out)
    col_fields = []
    for f in fields:
        lst = Annotated[list[f[1]], msgspec.Meta(min_length=1, max_length=MAX_GROUPS)]  # type: ignore[valid-type]
        col_fields.append((f[0], lst) if len(f) == 2 else (f[0], lst | None, None))
    Columns = msgspec.defstruct("ScaleColumnsWire", col_fields, forbid_unknown_fields=True, gc=False)
    Req = msgspec.defstruct("ScaleRequestWire", [
        ("time_s", F), ("epoch_s", Annotated[float, msgspec.Meta(gt=0.0, le=MAX_FLOAT)]),
        ("groups", Annotated[list[Group], msgspec.Meta(min_length=1, max_length=MAX_GROUPS)] | None, None),
        ("columns", Columns | None, None)],
        forbid_unknown_fields=True, gc=False)
    return msgspec.json.Decoder(Req), msgspec


_DECODER: Any = None


def decode_scale(body: bytes) -> ScaleObs | None:
    """The ``ScaleObs`` of a ``/v1/scale`` body, or None: let pydantic validate it (and answer)."""
    global _DECODER
    if _DECODER is None:
        try:
            _DECODER = _struct_types()
        except ImportError:  # msgspec is in the serve extra; without it pydantic validates every body
            _DECODER = False
    if not _DECODER:
        return None
    decoder, msgspec = _DECODER
    try:
        req = decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if (req.groups is None) == (req.columns is None):
        return None
    if req.columns is not None:
        return _from_columns(req, msgspec)
    nan = math.nan
    groups = req.groups
    keys: set[str] = set()
    for g in groups:  # null -> NaN (unknown), as GroupState has it; the cross-field rules of ScaleRequest
        if g.ttft_p90_s is None:
            g.ttft_p90_s = nan
        if g.tpot_p90_s is None:
            g.tpot_p90_s = nan
        if g.slo_ttft_s is None:
            g.slo_ttft_s = nan
        if g.slo_tpot_s is None:
            g.slo_tpot_s = nan
        if g.min_replicas > g.max_replicas:
            return None
        keys.add(g.key)
    if len(keys) != len(groups):
        return None
    # the struct's fields are GroupState's, in its order
    return ScaleObs(time_s=req.time_s, epoch_s=req.epoch_s,
                    groups=list(starmap(GroupState, map(msgspec.structs.astuple, groups))))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GroupState) if f.default is not dataclasses.MISSING}
_DEFAULTS_ORDER = [f.name for f in dataclasses.fields(GroupState)]  # GroupState's fields, in its order


def _from_columns(req: Any, msgspec: Any) -> ScaleObs | None:
    """The ``ScaleObs`` of a columnar body (``GroupState``s made from the columns, which it also carries), or None
    when a cross-field rule fails (pydantic answers)."""
    c = req.columns
    cols = {name: getattr(c, name) for name in _DEFAULTS_ORDER}
    n = len(cols["key"])
    if any(v is not None and len(v) != n for v in cols.values()):
        return None
    if len(set(cols["key"])) != n:
        return None
    if any(lo > hi for lo, hi in zip(cols["min_replicas"], cols["max_replicas"])):
        return None
    nan = math.nan
    for name in NAN_FIELDS:  # null -> NaN (unknown), as GroupState has it
        v = cols[name]
        if v is not None and None in v:
            cols[name] = [nan if x is None else x for x in v]
    full = {name: v if v is not None else [_DEFAULTS[name]] * n for name, v in cols.items()}  # left out: defaults
    return ScaleObs(time_s=req.time_s, epoch_s=req.epoch_s, groups=ColumnGroups(full, n),  # type: ignore[arg-type]
                    columns=full)


class ColumnGroups(Sequence):
    """The ``GroupState``s of a columnar body, each made when first asked for: a scaler that decides a model of
    many groups from ``ScaleObs.columns`` never makes the 10,000 objects (about a third of such a call)."""

    __slots__ = ("_cols", "_n", "_made")

    def __init__(self, cols: dict[str, list], n: int):
        self._cols = list(cols.values())  # every GroupState field, in its order
        self._n = n
        self._made: list[GroupState] | None = None

    def _all(self) -> list[GroupState]:
        if self._made is None:
            self._made = list(starmap(GroupState, zip(*self._cols)))
        return self._made

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if self._made is not None or isinstance(i, slice):
            return self._all()[i]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return GroupState(*(c[i] for c in self._cols))

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


def encode_targets(targets: dict[str, int], policy: str) -> bytes:
    """The ``/v1/scale`` answer, ``{"targets": {...}, "policy": ...}`` (msgspec's encoder when it is installed: a
    tenth of the standard library's time for 10,000 targets)."""
    if _DECODER:
        return _DECODER[1].json.encode({"targets": targets, "policy": policy})
    return json.dumps({"targets": targets, "policy": policy}, separators=(",", ":")).encode()
