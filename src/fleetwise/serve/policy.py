"""Routing decisions outside the simulator: the registered routers, unchanged, on a caller's snapshot.

A router reads a read-only view of the simulator (``sim.candidates``, ``sim.replicas[i].outstanding``, ...,
see policies/routers.py). ``RoutePolicy.route`` builds a small stand-in of that view from a ``RouteRequest``
(the request's features and one ``ReplicaSnapshot`` per candidate replica) and asks the router; the answer is
an index into ``req.replicas``. The stand-in costs a few microseconds per replica.

How the snapshot maps onto what the routers read (request index 0, time 0):

==============================  ===========================================================================
``sim.candidates[m]``            indices of the ready replicas (all of them when none is ready); ``m`` is a
                                 small integer per model name (round robin cycles per model)
``replicas[i].outstanding``      ``outstanding_requests``
``outstanding_tokens(now)``      ``outstanding_tokens``
``kv_used_fraction(now)``        ``kv_used_fraction``
``len(replicas[i].waiting)``     ``waiting``
``prefix_hit_blocks(blocks)``    ``prefix_hit_tokens`` (with ``sim.prefix_block_tokens`` = 1)
``sim._rtt[origin][region]``     ``rtt_s`` (the caller's round trip from the request's origin)
``perf`` / ``lanes``             a prefill throughput of ``tokens_per_s`` (unknown: the median of the known
                                 ones, else ``DEFAULT_TOKENS_PER_S``)
``sim.rng``                      the policy's own seeded generator (random, power_of_two)
==============================  ===========================================================================
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import parse_qsl

import numpy as np

from fleetwise.control.protocols import DecisionPoint
from fleetwise.errors import InputError
from fleetwise.serve.schemas import ROUTE_EXAMPLE, MAX_REPLICAS, ReplicaSnapshot, RouteRequest  # noqa: F401 (the wire)

DEFAULT_TOKENS_PER_S = 10_000.0  # prefill throughput assumed when no replica reports one


# --------------------------------------------------------------------------------------------- the stand-in
class _Rep:
    """What a router reads of one replica (``Replica``'s public surface), read from a snapshot on demand."""

    __slots__ = ("index", "s", "view")
    lanes = (None,)  # one lane: latency_aware's throughput is 512 x lanes / iteration time
    ready_s = 0.0

    def __init__(self, i: int, s: ReplicaSnapshot, view: "_View"):
        self.index = i
        self.s = s
        self.view = view

    @property
    def outstanding(self) -> int:
        return self.s.outstanding_requests

    def outstanding_tokens(self, now: float) -> int:
        return self.s.outstanding_tokens

    def kv_used_fraction(self, now: float) -> float:
        return self.s.kv_used_fraction

    @property
    def waiting(self) -> range:  # only its len() is read
        return range(self.s.waiting)

    def prefix_hit_blocks(self, blocks) -> int:
        return self.s.prefix_hit_tokens

    @property
    def region(self) -> int:  # column of this replica in the request's RTT row
        return self.index

    @property
    def perf(self) -> "_Rep":
        return self

    def iteration_time_s(self, *args: Any) -> float:
        """Time of a 512-token prefill chunk at ``tokens_per_s`` (unknown: the median of the known ones)."""
        tps = self.s.tokens_per_s
        return 512.0 / (tps if tps is not None else self.view.default_tps())


class _View:
    """The slice of ``Simulator`` the routers read, for one request (index 0) at time 0."""

    __slots__ = ("candidates", "model_of", "replicas", "_rtt", "origin", "rng", "snaps", "_tps")
    _has_prefix = True
    prefix_block_tokens = 1  # prefix hits are reported in tokens: one "block" per token
    _pblk = np.zeros(0, np.int64)  # the request's block ids (unused: hits come from the snapshot)
    _pofs = (0, 0)

    def default_tps(self) -> float:
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

    # per-replica-index caches some routers keep across calls; indices mean other replicas in every call
    _PER_CALL_CACHES = ("_tps",)

    def __init__(self, router: Any, name: str, seed: int = 0, spec: str | None = None):
        self.router = router
        self.name = name
        self.spec = spec or name
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self._models: dict[str | None, int] = {}
        self._lock = threading.Lock()
        self._caches = [getattr(router, a) for a in self._PER_CALL_CACHES
                        if isinstance(getattr(router, a, None), dict)]

    def _model_index(self, model: str | None) -> int:
        m = self._models.get(model)
        if m is None:
            m = len(self._models) if len(self._models) < 4096 else 0  # bounded: unknown names beyond share 0
            self._models[model] = m
        return m

    def view(self, req: RouteRequest) -> _View:
        snaps = req.replicas
        v = _View()
        v.snaps = snaps
        v._tps = None
        v.replicas = [_Rep(i, s, v) for i, s in enumerate(snaps)]
        v._rtt = ([s.rtt_s for s in snaps],)
        v.origin = (0,)
        v.rng = self.rng
        m = self._model_index(req.model)
        v.model_of = (m,)
        ready = [i for i, s in enumerate(snaps) if s.ready]
        v.candidates = {m: ready if ready else list(range(len(snaps)))}
        return v

    def route(self, req: RouteRequest) -> int:
        """Index into ``req.replicas`` of the replica that should serve the request."""
        with self._lock:
            v = self.view(req)
            for c in self._caches:
                c.clear()
            i = self.router.route(DecisionPoint("route", 0.0, v, 0))
        i = int(i)
        if not 0 <= i < len(req.replicas):
            raise InputError(f"router {self.name!r} returned replica index {i}, not one of 0..{len(req.replicas) - 1}")
        return i

    def __repr__(self) -> str:
        return f"RoutePolicy({self.spec!r}, seed={self.seed})"


def route_policy_names() -> list[str]:
    from fleetwise.control.registry import names

    return names("router")


def load_route_policy(spec: str, seed: int = 0) -> RoutePolicy:
    """A registered router by name (``fleetwise policies``), optionally ``"name?param=value&..."``, e.g.
    ``"prefix_aware?hit_weight=0.5"``. Unknown names or parameters raise ``InputError`` with one clear line."""
    from fleetwise.control.registry import make

    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"route policy: expected a router name, got {spec!r}; "
                         f"one of: {', '.join(route_policy_names())}")
    name, params = parse_spec(spec)
    router = make("router", name, params, where="route policy: ")
    return RoutePolicy(router, name, seed=seed, spec=spec.strip())
