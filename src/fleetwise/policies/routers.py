"""Heuristic routers: which replica serves one request.

Every router is typed against ``RouteView`` (``fleetwise.control.views``): it picks one of
``view.candidates()`` (the replicas serving the request's model) from what the view reports of them
(outstanding requests and tokens, KV use, prefix-cache hits, network round trip, prefill throughput). The
simulator and the decision service both implement the view, so a router runs unchanged in either.

Routers that take the least-loaded candidate ask the view for it (``least_outstanding``,
``least_outstanding_tokens``, ``prefix_candidates``) instead of scanning ``candidates()``: the simulator answers
from indexes kept as its state changes, so routing costs the same at 4 replicas and at 10,000; the answer is the
scan's, ties to the lowest index (``docs/simulator.md``, "Routing at fleet scale").
"""

from __future__ import annotations

from fleetwise.control.registry import register_router
from fleetwise.control.views import RouteView


@register_router("random")
class Random:
    """Uniformly random replica (the run's seeded generator)."""

    def route(self, view: RouteView) -> int:
        c = view.candidates()
        return c[int(view.rng.integers(len(c)))]


@register_router("round_robin")
class RoundRobin:
    """Cycle through the replicas of the request's model."""

    def __init__(self):
        self.turn: dict[int, int] = {}

    def route(self, view: RouteView) -> int:
        c = view.candidates()
        m = view.model
        i = self.turn.get(m, 0)
        self.turn[m] = i + 1
        return c[i % len(c)]


@register_router("least_outstanding_requests")
class LeastOutstandingRequests:
    """Fewest requests routed and not finished (running + waiting); ties to the lowest index."""

    def route(self, view: RouteView) -> int:
        return view.least_outstanding()


@register_router("least_outstanding_tokens")
class LeastOutstandingTokens:
    """Fewest prefill + decode tokens still to compute (an estimate of the work queued at the replica)."""

    def route(self, view: RouteView) -> int:
        return view.least_outstanding_tokens()


@register_router("least_kv_load")
class LeastKVLoad:
    """Lowest fraction of KV cache in use, then fewest waiting requests."""

    def route(self, view: RouteView) -> int:
        return view.least_kv_load()  # min over candidates of (kv_used_fraction, waiting), from an index


@register_router("power_of_two")
class PowerOfTwo:
    """Power of two choices (Mitzenmacher): sample two replicas, take the one with fewer outstanding requests."""

    def route(self, view: RouteView) -> int:
        c = view.candidates()
        if len(c) == 1:
            return c[0]
        i, j = view.rng.choice(len(c), size=2, replace=False)
        a, b = c[int(i)], c[int(j)]
        return a if view.outstanding(a) <= view.outstanding(b) else b


@register_router("prefix_aware")
class PrefixAware:
    """Prefix-cache aware: minimise (outstanding tokens - prompt tokens found in the replica's prefix cache),
    i.e. the work ahead of the request minus the prefill it would save. Falls back to least outstanding
    tokens when the request's prefix hits are unknown.

    Only replicas holding the request's first prefix block can have a hit (``view.prefix_candidates()``); every
    other candidate's key is its outstanding tokens, so the least-loaded candidate stands for all of them (with a
    positive ``hit_weight`` no replica without a hit can beat a replica with one and the same load)."""

    MAX_HIT_WEIGHT = 1e6  # a prompt token found weighs at most this many outstanding tokens (1e308 overflowed keys)

    def __init__(self, hit_weight: float = 1.0):
        if not -self.MAX_HIT_WEIGHT <= hit_weight <= self.MAX_HIT_WEIGHT:
            raise ValueError(f"hit_weight {hit_weight!r}: expected a number between -{self.MAX_HIT_WEIGHT:,.0f} and "
                             f"{self.MAX_HIT_WEIGHT:,.0f}")
        self.hit_weight = float(hit_weight)

    def route(self, view: RouteView) -> int:
        if not view.has_prefix():
            return view.least_outstanding_tokens()
        w = self.hit_weight
        if w <= 0:
            return min(view.candidates(), key=lambda i: view.outstanding_tokens(i) - w * view.prefix_hit_tokens(i))
        best = view.least_outstanding_tokens()
        key, best = view.outstanding_tokens(best), best
        for i in view.prefix_candidates():
            k = view.outstanding_tokens(i) - w * view.prefix_hit_tokens(i)
            if k < key or (k == key and i < best):
                key, best = k, i
        return best


@register_router("nearest_region")
class NearestRegion:
    """Lowest network round trip from the request's origin region; among equals, fewest outstanding requests."""

    def route(self, view: RouteView) -> int:
        return view.nearest_least_outstanding()  # min over candidates of (rtt_s, outstanding), from an index


@register_router("latency_aware")
class LatencyAware:
    """Lowest estimated time to first token: network round trip + outstanding tokens / the replica's
    prefill throughput (from its performance model, a 512-token chunk) + time until it serves."""

    def route(self, view: RouteView) -> int:
        return view.least_latency()  # min over candidates of rtt + tokens / throughput + wait, from an index
