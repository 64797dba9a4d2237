"""Heuristic routers: which replica serves one request.

Every router picks among ``sim.candidates[model]`` (the replicas serving the request's model) and reads the
replicas' public state only (outstanding requests and tokens, KV use, prefix cache, region).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetwise.control.registry import register_router

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.control.protocols import DecisionPoint


def _cands(dp: "DecisionPoint") -> list[int]:
    sim = dp.sim
    return sim.candidates[sim.model_of[dp.request]]


@register_router("random")
class Random:
    """Uniformly random replica (the simulator's seeded generator)."""

    def route(self, dp):
        c = _cands(dp)
        return c[int(dp.sim.rng.integers(len(c)))]


@register_router("round_robin")
class RoundRobin:
    """Cycle through the replicas of the request's model."""

    def __init__(self):
        self._next: dict[int, int] = {}

    def route(self, dp):
        c = _cands(dp)
        m = dp.sim.model_of[dp.request]
        i = self._next.get(m, 0)
        self._next[m] = i + 1
        return c[i % len(c)]


@register_router("least_outstanding_requests")
class LeastOutstandingRequests:
    """Fewest requests routed and not finished (running + waiting); ties to the lowest index."""

    def route(self, dp):
        reps = dp.sim.replicas
        return min(_cands(dp), key=lambda i: reps[i].outstanding)


@register_router("least_outstanding_tokens")
class LeastOutstandingTokens:
    """Fewest prefill + decode tokens still to compute (an estimate of the work queued at the replica)."""

    def route(self, dp):
        reps, now = dp.sim.replicas, dp.time_s
        return min(_cands(dp), key=lambda i: reps[i].outstanding_tokens(now))


@register_router("least_kv_load")
class LeastKVLoad:
    """Lowest fraction of KV cache in use, then fewest waiting requests."""

    def route(self, dp):
        reps, now = dp.sim.replicas, dp.time_s
        return min(_cands(dp), key=lambda i: (reps[i].kv_used_fraction(now), len(reps[i].waiting)))


@register_router("power_of_two")
class PowerOfTwo:
    """Power of two choices (Mitzenmacher): sample two replicas, take the one with fewer outstanding requests."""

    def route(self, dp):
        c = _cands(dp)
        if len(c) == 1:
            return c[0]
        i, j = dp.sim.rng.choice(len(c), size=2, replace=False)
        a, b = c[int(i)], c[int(j)]
        reps = dp.sim.replicas
        return a if reps[a].outstanding <= reps[b].outstanding else b


@register_router("prefix_aware")
class PrefixAware:
    """Prefix-cache aware: minimise (outstanding tokens - prompt tokens found in the replica's prefix cache),
    i.e. the work ahead of the request minus the prefill it would save. Falls back to least outstanding
    tokens when the workload has no prefix block ids."""

    def __init__(self, hit_weight: float = 1.0):
        self.hit_weight = hit_weight

    def route(self, dp):
        sim, now = dp.sim, dp.time_s
        reps = sim.replicas
        rid = dp.request
        if not sim._has_prefix:
            return min(_cands(dp), key=lambda i: reps[i].outstanding_tokens(now))
        blocks = sim._pblk[sim._pofs[rid]:sim._pofs[rid + 1]].tolist()
        bt = sim.prefix_block_tokens
        w = self.hit_weight
        return min(_cands(dp), key=lambda i: reps[i].outstanding_tokens(now) - w * bt * reps[i].prefix_hit_blocks(blocks))


@register_router("nearest_region")
class NearestRegion:
    """Lowest network round trip from the request's origin region; among equals, fewest outstanding requests."""

    def route(self, dp):
        sim = dp.sim
        reps = sim.replicas
        row = sim._rtt[sim.origin[dp.request]]
        return min(_cands(dp), key=lambda i: (row[reps[i].region], reps[i].outstanding))


@register_router("latency_aware")
class LatencyAware:
    """Lowest estimated time to first token: network round trip + outstanding tokens / the replica's
    prefill throughput (from its performance model, a 512-token chunk)."""

    def __init__(self):
        self._tps: dict[int, float] = {}

    def route(self, dp):
        sim, now = dp.sim, dp.time_s
        reps = sim.replicas
        row = sim._rtt[sim.origin[dp.request]]
        tps = self._tps

        def est(i: int) -> float:
            r = reps[i]
            if i not in tps:
                tps[i] = 512.0 * len(r.lanes) / r.perf.iteration_time_s(512, 512.0 * 512, 0, 0)
            return row[r.region] + r.outstanding_tokens(now) / tps[i] + max(0.0, r.ready_s - now)

        return min(_cands(dp), key=est)

