"""Hand-written rules of the multi-cloud world (Graph-MARL's baselines, docs/graph-marl.md): one epoch's joint
decision (cloud and model variant per class, replicas per pool, routing rule per class) from the world's state."""

from __future__ import annotations

import numpy as np

from fleetwise.errors import InputError
from fleetwise.worlds.multicloud import MultiCloud

HEURISTICS = ("static", "cheapest", "latency_greedy", "least_loaded")


def _threshold_scaling(mc: MultiCloud, hi: float, lo: float, spot: bool) -> np.ndarray:
    """Per pool: one more replica when the pool's on replicas are busier than ``hi`` (or backlogged by
    more than 5 s), one fewer below ``lo`` (at least one: an HPA with ``minReplicas: 1``); new replicas spot when ``spot`` and the region has capacity."""
    a = np.zeros(len(mc.pools), np.int64)
    now = mc.sim.now
    for pi, p in enumerate(mc.pools):
        m = p.spec.max_replicas
        on = [i for i in p.replicas if mc.inst[i].on]
        n = len(on)
        util = float(np.mean(mc.busy_frac[on])) if on else 0.0
        backlog = float(np.mean([mc.backlog_s(i, now) for i in on])) if on else 0.0
        if on and (util > hi or backlog > 5.0) and n < m:
            a[pi] = 3 if spot and mc.spot_frac(p.region, now) > 0.5 else 2
        elif util < lo and n > 1:
            a[pi] = 1
    return a


def _hold(mc: MultiCloud) -> np.ndarray:
    return np.zeros(len(mc.pools), np.int64)


def heuristic(name: str, mc: MultiCloud) -> dict:
    """One epoch's joint action of a heuristic: ``static``, ``cheapest``, ``latency_greedy``, ``least_loaded``."""
    if name not in HEURISTICS:
        raise InputError(f"unknown graph-marl heuristic {name!r}; expected one of {', '.join(HEURISTICS)}")
    cfg = mc.cfg
    nc = len(cfg.classes)
    anyc = len(mc.clouds)
    model = np.array([1 if c.quality_weight >= 1.0 else 0 for c in cfg.classes])  # 70B where quality is valued
    if name == "static":
        return {"cloud": np.full(nc, anyc), "model": model, "gpu": _hold(mc),
                "router": np.zeros(nc, np.int64)}
    if name == "cheapest":  # the cheapest cloud per variant, cost-first routing, spot when available
        clouds = []
        for k in range(nc):
            best = min((p.od_usd_per_gpu_h * p.spec.tp / p.tps, p.cloud) for p in mc.pools if p.spec.variant == model[k])
            clouds.append(best[1])
        return {"cloud": np.array(clouds), "model": model, "gpu": _threshold_scaling(mc, 0.85, 0.3, True),
                "router": np.full(nc, 2)}
    if name == "latency_greedy":
        return {"cloud": np.full(nc, anyc), "model": model, "gpu": _threshold_scaling(mc, 0.5, 0.1, False),
                "router": np.zeros(nc, np.int64)}
    if name == "least_loaded":
        return {"cloud": np.full(nc, anyc), "model": model, "gpu": _threshold_scaling(mc, 0.7, 0.25, False),
                "router": np.ones(nc, np.int64)}
    raise InputError(f"unknown graph-marl heuristic {name!r}; expected static, cheapest, latency_greedy, least_loaded")
