"""Routing decisions outside the simulator: the registered routers, unchanged, on a caller's snapshot.

A router is typed against ``fleetwise.control.views.RouteView``. ``SnapshotRouteView`` implements that view from
a ``RouteRequest`` (the request's features and one ``ReplicaSnapshot`` per candidate replica); the answer is an
index into ``req.replicas``.

How the snapshot answers the view (replica ``i`` is ``req.replicas[i]``):

==============================  ===========================================================================
``candidates()``                 indices of the ready replicas (all of them when none is ready)
``model``                        a small integer per model name (round robin cycles per model)
``outstanding(i)``               ``outstanding_requests``
``outstanding_tokens(i)``        ``outstanding_tokens``
``kv_used_fraction(i)``          ``kv_used_fraction``
``waiting(i)``                   ``waiting``
``prefix_hit_tokens(i)``         ``prefix_hit_tokens`` (``has_prefix()`` is True: hits are the caller's report)
``rtt_s(i)``                     ``rtt_s`` (the caller's round trip from the request's origin)
``prefill_tps(i)``               ``tokens_per_s`` (unknown: the median of the known ones, else
                                 ``DEFAULT_TOKENS_PER_S``)
``ready_in_s(i)``                0
``rng``                          the policy's own seeded generator (random, power_of_two)
==============================  ===========================================================================
"""

from __future__ import annotations

from pathlib import Path

import threading
from typing import Any
from urllib.parse import parse_qsl

import numpy as np

from fleetwise.control.views import RouteScans
from fleetwise.errors import InputError
from fleetwise.serve.schemas import MAX_REPLICAS, ROUTE_EXAMPLE, ReplicaSnapshot, RouteRequest  # noqa: F401 (the wire)

DEFAULT_TOKENS_PER_S = 10_000.0  # prefill throughput assumed when no replica reports one


# --------------------------------------------------------------------------------------------- the view
class SnapshotRouteView(RouteScans):
    """``RouteView`` of one request from a caller's snapshot (time 0, request 0)."""

    __slots__ = ("snaps", "rng", "model", "prompt_tokens", "_ready", "_tps")
    time_s = 0.0
    request = 0

    def __init__(self, req: RouteRequest, model: int, rng: np.random.Generator):
        self.snaps = req.replicas
        self.rng = rng
        self.model = model
        self.prompt_tokens = req.prompt_tokens
        ready = [i for i, s in enumerate(self.snaps) if s.ready]
        self._ready = ready if ready else list(range(len(self.snaps)))
        self._tps: float | None = None

    def candidates(self) -> list[int]:
        return self._ready

    def outstanding(self, replica: int) -> int:
        return self.snaps[replica].outstanding_requests

    def outstanding_tokens(self, replica: int) -> int:
        return self.snaps[replica].outstanding_tokens

    def kv_used_fraction(self, replica: int) -> float:
        return self.snaps[replica].kv_used_fraction

    def waiting(self, replica: int) -> int:
        return self.snaps[replica].waiting

    def has_prefix(self) -> bool:
        return True

    def prefix_hit_tokens(self, replica: int) -> int:
        return self.snaps[replica].prefix_hit_tokens

    def prefill_tps(self, replica: int) -> float:
        tps = self.snaps[replica].tokens_per_s
        return tps if tps is not None else self._default_tps()

    def rtt_s(self, replica: int) -> float:
        return self.snaps[replica].rtt_s

    def ready_in_s(self, replica: int) -> float:
        return 0.0

    def _default_tps(self) -> float:
        if self._tps is None:
            known = sorted(s.tokens_per_s for s in self.snaps if s.tokens_per_s is not None)
            k = len(known)
            self._tps = (known[k // 2] + known[(k - 1) // 2]) / 2.0 if k else DEFAULT_TOKENS_PER_S
        return self._tps


def _coerce(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if v.isascii():  # (int() and float() read '١٢' and '１２' as 12; such a value stays text and is refused)
        for conv in (int, float):
            try:
                return conv(v)
            except ValueError:
                pass
    return v


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name?param=value&..."`` -> (name, params); values become int/float/bool/None where they parse."""
    name, _, query = spec.strip().partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise InputError(f"policy spec {spec!r}: expected name or name?param=value&param=value") from None
    return name.strip(), {k: _coerce(v) for k, v in pairs}


class RoutePolicy:
    """A registered router behind ``route(RouteRequest) -> index into req.replicas``.

    Safe to share between threads and coroutines: the router's own state (round robin's counters, the
    random generator) changes under a lock."""

    def __init__(self, router: Any, name: str, seed: int = 0, spec: str | None = None):
        self.router = router
        self.name = name
        self.spec = spec or name
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self._models: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def _model_index(self, model: str | None) -> int:
        m = self._models.get(model)
        if m is None:
            if len(self._models) >= 4096:  # bounded: names beyond the 4,096th share 0 and are not stored (each one
                return 0  # was kept: 200,000 names took 68 MB)
            m = self._models[model] = len(self._models)
        return m

    def view(self, req: RouteRequest) -> SnapshotRouteView:
        return SnapshotRouteView(req, self._model_index(req.model), self.rng)

    def route(self, req: RouteRequest) -> int:
        """Index into ``req.replicas`` of the replica that should serve the request."""
        with self._lock:
            i = self.router.route(self.view(req))
        i = int(i)
        if not 0 <= i < len(req.replicas):
            raise InputError(f"router {self.name!r} returned replica index {i}, not one of 0..{len(req.replicas) - 1}")
        return i

    def __repr__(self) -> str:
        return f"RoutePolicy({self.spec!r}, seed={self.seed})"


def route_policy_names() -> list[str]:
    from fleetwise.policies import names

    return names("router")


def load_route_policy(spec: str, seed: int = 0, *, files=None, force: bool = False) -> RoutePolicy:
    """A registered router by name (``fleetwise policies``), optionally ``"name?param=value&..."``, e.g.
    ``"prefix_aware?hit_weight=0.5"``. Unknown names or parameters raise ``InputError`` with one clear line.

    A learned router's ``checkpoint`` is resolved by ``files`` (``serve.adapters.CheckpointFiles``: inside
    ``--checkpoint-dir``; a client's reload by path is refused without one) and must have passed its deployment
    gate (its model card), unless ``force``."""
    from fleetwise.control.checkpoint import require_gate
    from fleetwise.policies import make

    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"route policy: expected a router name, got {spec!r}; "
                         f"one of: {', '.join(route_policy_names())}")
    name, params = parse_spec(spec)
    if files is not None and params.get("checkpoint") is not None:
        params = {**params, "checkpoint": str(files.resolve(str(params["checkpoint"])))}
    router = make("router", name, params, where="route policy: ")
    if getattr(router, "card", None) is not None or params.get("checkpoint") is not None:
        require_gate(getattr(router, "card", None),
                     f"router {name!r}: checkpoint {Path(str(getattr(router, 'checkpoint', ''))).name}", force)
    return RoutePolicy(router, name, seed=seed, spec=spec.strip())
