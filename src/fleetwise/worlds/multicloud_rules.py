"""Hand-written rules of the multi-cloud world (Graph-MARL's baselines, docs/graph-marl.md): one epoch's joint
decision (cloud and model variant per class, replicas per pool, routing rule per class) from the world's state."""

from __future__ import annotations

import numpy as np

from fleetwise.errors import InputError
from fleetwise.worlds.multicloud import MultiCloud

HEURISTICS = ("static", "cheapest", "latency_greedy", "least_loaded")


BACKLOG_S = 5.0  # a pool whose on replicas are backlogged by more than this is overloaded (every threshold rule)


def backlogged(mc: MultiCloud, pi: int) -> bool:
    """Whether pool ``pi``'s on replicas hold more than ``BACKLOG_S`` seconds of work on average."""
    on = [i for i in mc.pools[pi].replicas if mc.inst[i].on]
    return bool(on) and float(np.mean([mc.backlog_s(i, mc.sim.now) for i in on])) > BACKLOG_S


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
        if on and (util > hi or backlog > BACKLOG_S) and n < m:
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


# ------------------------------------------------------------------ the rule inside the learned action
RULE = "least_loaded"  # the rule the learned agents correct (docs/graph-marl.md: "the rule inside the action")
_DELTA = np.array([0, -1, 1, 1])  # world GPU code (0 hold, 1 down, 2 add on-demand, 3 add spot) -> replica change


def _can_add(mc: MultiCloud, pi: int, spot: bool) -> bool:
    p = mc.pools[pi]
    if all(mc.inst[i].on for i in p.replicas):
        return False
    return not (spot and mc.spot_frac(p.region, mc.sim.now) * p.spec.max_replicas < 1 + sum(
        mc.inst[i].on and mc.inst[i].spot for i in p.replicas))


def _down_victim(mc: MultiCloud, pi: int) -> int | None:
    """The replica a scale-down of pool ``pi`` switches off (``MultiCloud.act``: the newest on one)."""
    ons = [i for i in mc.pools[pi].replicas if mc.inst[i].on]
    return ons[-1] if ons else None


def _gpu_code(rule_code: int, corr: int) -> int:
    """World GPU code of a correction: 0 the rule's, 1 one replica fewer than the rule, 2 one more (on-demand),
    3 one more (spot); the change is clipped to one replica either way."""
    if corr == 0:
        return int(rule_code)
    d = int(_DELTA[rule_code]) + (-1 if corr == 1 else 1)
    d = max(-1, min(1, d))
    if d < 0:
        return 1
    if d == 0:
        return 0
    return 3 if corr == 3 or rule_code == 3 else 2


def _guarded(mc: MultiCloud, pi: int, rule_code: int, new: int) -> bool:
    """The tail guard: a correction that removes capacity against the rule's decision (one fewer than the rule)
    is not allowed on a pool backlogged by more than ``BACKLOG_S`` (it would cancel or reverse the rule's reaction
    to an overloaded pool), nor, with ``cfg.guard_scale_ups``, wherever the rule scales up."""
    if _DELTA[new] >= _DELTA[rule_code]:
        return False
    return (mc.cfg.guard_scale_ups and _DELTA[rule_code] > 0) or backlogged(mc, pi)


def rule_decision(mc: MultiCloud, rule: str = RULE) -> dict:
    return heuristic(rule, mc)


def compose(mc: MultiCloud, corr: dict, rule: str = RULE, base: dict | None = None) -> dict:
    """World decision = the rule's decision corrected by ``corr`` (every agent's action; all zeros: exactly the
    rule). Cloud, model and router: a cyclic shift of the rule's choice (``(rule + a) mod choices``); GPU: per pool
    :func:`_gpu_code`. A correction that would leave a request class without a ready replica of its variant in
    its cloud is not applied (the masks of :func:`action_masks` exclude it; this is the check in sequence)."""
    base = base or rule_decision(mc, rule)
    nclouds, nvar = len(mc.clouds) + 1, len(mc.cfg.variants)
    out = {k: np.asarray(v, np.int64).copy() for k, v in base.items()}
    c = {a: np.asarray(corr.get(a, np.zeros_like(out[a])), np.int64) for a in out}
    cloud = (out["cloud"] + c["cloud"]) % nclouds
    model = (out["model"] + c["model"]) % nvar
    ok = mc.covered(cloud, model)
    # a class whose corrected (cloud, variant) has no ready replica keeps the rule's choice
    out["cloud"] = np.where(ok, cloud, out["cloud"])
    out["model"] = np.where(ok, model, out["model"])
    out["router"] = (out["router"] + c["router"]) % 3
    removed: set = set()
    for pi in range(len(mc.pools)):
        code = int(out["gpu"][pi])
        if code == 1:
            v = _down_victim(mc, pi)
            if v is not None:
                removed.add(v)
        if c["gpu"][pi] == 0:
            continue
        new = _gpu_code(code, int(c["gpu"][pi]))
        if _guarded(mc, pi, code, new):
            continue  # would cancel the rule's scale-up or shrink an overloaded pool: not applied
        if new == 1 and code != 1:
            v = _down_victim(mc, pi)
            if v is None or not mc.covered(out["cloud"], out["model"], removed | {v}).all():
                continue  # would leave a class without a ready replica: not applied
            removed.add(v)
        elif code == 1 and new != 1:
            removed.discard(_down_victim(mc, pi))
        out["gpu"][pi] = new
    return out


def action_masks(mc: MultiCloud, rule: str = RULE, base: dict | None = None) -> dict:
    """Per agent a boolean array (factors, choices): the corrections allowed now. Choice 0 (the rule) is always
    allowed. Cloud / model: no shift to a (cloud, variant) without a ready replica for the class. GPU: no
    "one fewer" that switches off the last ready replica a class is served by, none on a pool with nothing on,
    none on a pool backlogged by more than ``BACKLOG_S`` (the tail guard, :func:`_guarded`; with
    ``cfg.guard_scale_ups`` also none where the rule scales up), none before ``cfg.scale_down_after_s`` of the
    segment; no "one more" on a full pool; no spot without spot capacity."""
    base = base or rule_decision(mc, rule)
    nclouds, nvar, nc = len(mc.clouds) + 1, len(mc.cfg.variants), len(mc.cfg.classes)
    m = {"cloud": np.ones((nc, nclouds), bool), "model": np.ones((nc, nvar), bool),
         "router": np.ones((nc, 3), bool), "gpu": np.ones((len(mc.pools), 4), bool)}
    for a in range(1, nclouds):
        cl = (base["cloud"] + a) % nclouds
        m["cloud"][:, a] = mc.covered(cl, base["model"])
    for a in range(1, nvar):
        m["model"][:, a] = mc.covered(base["cloud"], (base["model"] + a) % nvar)
    for pi in range(len(mc.pools)):
        code = int(base["gpu"][pi])
        for corr in (1, 2, 3):
            new = _gpu_code(code, corr)
            if new == code:
                continue
            if _guarded(mc, pi, code, new):
                m["gpu"][pi, corr] = False
            elif new == 1:
                if mc.sim.now < mc.cfg.scale_down_after_s:  # (the scale-down window: no cut yet)
                    m["gpu"][pi, corr] = False
                    continue
                v = _down_victim(mc, pi)
                m["gpu"][pi, corr] = v is not None and bool(mc.covered(base["cloud"], base["model"], {v}).all())
            elif new in (2, 3):
                m["gpu"][pi, corr] = _can_add(mc, pi, new == 3)
    return m
