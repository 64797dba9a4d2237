"""The RL scaler's observation vector and action mapping, from a ``ScaleObs`` and the rule's targets (numpy).

The RL scaler contains its rule (docs/learning.md): each epoch the rule (``slo_aware``) answers first, and the
policy's action is a bounded correction of the rule's target per group (``residual_targets``); the centre action
(a change of 0 in every group) returns the rule's targets unchanged. Shared by the Gymnasium environment
``fleetwise/Autoscaling-v0`` (``fleetwise.envs.autoscaling``, whose docstring tables every feature) and the deployed
scaler ``rl`` (``fleetwise.policies.scalers_rl``), so both see the same thing.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fleetwise.errors import InputError

N_GROUP_FEATURES = 19
RULE = "slo_aware"  # the rule the RL scaler corrects (policies/scalers.py)
ACTION_KIND = "residual"  # the model card's training["action"]: corrections of the rule's targets
N_GLOBAL_FEATURES = 2
OBS_CLIP = 5.0
DAY_S = 86400.0


# --------------------------------------------------------------------------------------------- observation
def _fin(x, default: float = 0.0) -> float:
    return float(x) if x is not None and math.isfinite(x) else default


def features(obs, max_groups: int, rule_targets: dict[str, int] | None = None) -> np.ndarray:
    """The observation vector of a ScaleObs and the rule's targets for it (see the env's docstring):
    ``max_groups * 19 + 2`` float32 values in [-5, 5]. Uses these only, so the env and the deployed scaler see the
    same thing. ``rule_targets`` None: the rule's target is taken as the current replicas."""
    groups = list(obs.groups)
    if len(groups) > max_groups:
        raise InputError(f"rl scaler: the scenario has {len(groups)} scaling groups; the policy handles at most "
                         f"{max_groups}")
    out = np.zeros(max_groups * N_GROUP_FEATURES + N_GLOBAL_FEATURES, dtype=np.float64)
    top_price = max((_fin(g.price_usd_per_hour) for g in groups), default=0.0)
    epoch = obs.epoch_s if obs.epoch_s and obs.epoch_s > 0 else 30.0
    supply: dict[str, float] = {}
    for g in groups:
        u = _fin(g.capacity_rps) if _fin(g.capacity_rps) > 0 else 1.0
        supply[g.model] = supply.get(g.model, 0.0) + (max(0, g.ready) + max(0, g.starting)) * u
    for i, g in enumerate(groups):
        cap = max(1, int(g.max_replicas))
        u = _fin(g.capacity_rps) if _fin(g.capacity_rps) > 0 else 1.0
        arr = max(0.0, _fin(g.arrivals_rps))
        hist = [max(0.0, _fin(x)) for x in g.history_rps[-4:]]
        ready = max(0, int(g.ready))
        f = out[i * N_GROUP_FEATURES:(i + 1) * N_GROUP_FEATURES]
        f[0] = 1.0
        f[1] = 1.0 if g.pool == "spot" else 0.0
        f[2] = ready / cap
        f[3] = max(0, int(g.starting)) / cap
        f[4] = max(0, int(g.draining)) / cap
        f[5] = math.log1p(max(0, int(g.waiting)) / max(ready, 1)) / math.log1p(100.0)
        f[6] = _fin(g.busy)
        f[7] = _fin(g.kv_used)
        f[8] = arr / (u * cap)
        f[9] = (arr - sum(hist) / len(hist)) / (u * cap) if hist else 0.0
        f[10] = _fin(g.ttft_p90_s) / g.slo_ttft_s if _fin(g.slo_ttft_s) > 0 else 0.0
        f[11] = _fin(g.tpot_p90_s) / g.slo_tpot_s if _fin(g.slo_tpot_s) > 0 else 0.0
        f[12] = _fin(g.price_usd_per_hour) / top_price if top_price > 0 else 0.0
        f[13] = 1.0 if g.available is None else max(0, int(g.available)) / cap
        f[14] = (ready + max(0, int(g.starting))) / cap
        f[15] = min(OBS_CLIP, supply[g.model] / arr) if arr > 1e-9 else OBS_CLIP
        f[16] = _fin(g.cold_start_s) / (10.0 * epoch)
        cur = ready + max(0, int(g.starting))
        rt = cur if rule_targets is None else max(0, int(rule_targets.get(g.key, cur)))
        f[17] = rt / cap  # what the rule wants (the action corrects it)
        f[18] = (rt - cur) / cap  # the change the rule asks for
    ang = 2.0 * math.pi * (_fin(obs.time_s) % DAY_S) / DAY_S
    out[-2] = math.sin(ang)
    out[-1] = math.cos(ang)
    np.nan_to_num(out, copy=False, nan=0.0, posinf=OBS_CLIP, neginf=-OBS_CLIP)
    return np.clip(out, -OBS_CLIP, OBS_CLIP).astype(np.float32)


# --------------------------------------------------------------------------------------------- action
def symmetric_deltas(n: int) -> tuple[int, ...]:
    """``n`` (odd) replica changes centred on 0: 5 -> (-2, -1, 0, 1, 2)."""
    if n < 1 or n % 2 == 0:
        raise InputError(f"action choices per group: expected an odd number, got {n}")
    return tuple(range(-(n // 2), n // 2 + 1))


def check_deltas(deltas, where: str = "deltas") -> tuple[int, ...]:
    """Replica changes an action chooses among: distinct whole numbers, one of them 0 (the change that keeps the
    rule's target: a learned scaler contains its rule). ``(-1, 0, 1, 2)`` is fine; ``(1, 2)`` has no 0."""
    if (isinstance(deltas, (str, bytes)) or not hasattr(deltas, "__len__") or not len(deltas)
            or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in deltas)):
        raise InputError(f"{where} = {deltas!r}: expected a non-empty tuple of whole replica changes")
    d = tuple(int(x) for x in deltas)
    if len(set(d)) != len(d):
        raise InputError(f"{where} = {deltas!r}: a replica change appears twice")
    if 0 not in d:
        raise InputError(f"{where} = {deltas!r}: expected a change of 0 among them (the action that keeps the "
                         "rule's target)")
    return d


def _no_change(deltas: Sequence[int]) -> int:
    """The index of the change 0 (what a group missing from a short action gets); the middle one without a 0."""
    return list(deltas).index(0) if 0 in deltas else len(deltas) // 2


def centre_action(max_groups: int, deltas: Sequence[int]) -> np.ndarray:
    """The action that reproduces the rule: the index of the change 0 in every group."""
    return np.full(max_groups, _no_change(deltas), dtype=np.int64)


def residual_targets(obs, action: Sequence[int], deltas: Sequence[int], rule_targets: dict[str, int],
                     on_demand_floor: int = 1) -> dict[str, int]:
    """The RL scaler's answer: per group the rule's target plus ``deltas[action[i]]`` replicas. A group whose change
    is 0 keeps the rule's target exactly; a changed one is clamped to ``[min_replicas, min(max_replicas,
    available)]``, and then the safety rules of :func:`targets_from_action` restore what a change broke (on-demand
    floor, never zero replicas for a model with demand). All changes 0: the rule's targets, unchanged."""
    a = np.asarray(action, dtype=np.int64).reshape(-1)
    mid = _no_change(deltas)
    d = [deltas[min(max(int(a[i]) if i < len(a) else mid, 0), len(deltas) - 1)] for i in range(len(obs.groups))]
    if not any(d):
        return dict(rule_targets)
    base = {g.key: int(rule_targets.get(g.key, max(0, int(g.ready)) + max(0, int(g.starting)))) for g in obs.groups}
    return _targets(obs, base, d, on_demand_floor, keep_unchanged=True)


def targets_from_action(obs, action: Sequence[int], deltas: Sequence[int], on_demand_floor: int = 1
                        ) -> dict[str, int]:
    """Targets {group key: replicas}: per group ``ready + starting + deltas[action[i]]`` clamped to
    ``[min_replicas, min(max_replicas, available)]``. Then two safety rules per model with demand (arrivals
    or waiting requests), as the heuristics' ``on_demand_floor``: its non-spot groups keep at least
    ``on_demand_floor`` replicas together (spot capacity can vanish at once; the cheapest non-spot group gets
    the missing ones), and its targets never add up to zero (one replica in its cheapest group that can have
    one), so requests are never held until the horizon."""
    a = np.asarray(action, dtype=np.int64).reshape(-1)
    mid = _no_change(deltas)
    d = [deltas[min(max(int(a[i]) if i < len(a) else mid, 0), len(deltas) - 1)] for i in range(len(obs.groups))]
    base = {g.key: max(0, int(g.ready)) + max(0, int(g.starting)) for g in obs.groups}
    return _targets(obs, base, d, on_demand_floor)


def _targets(obs, base: dict[str, int], d: Sequence[int], on_demand_floor: int, keep_unchanged: bool = False
             ) -> dict[str, int]:
    """``base[key] + d[i]`` per group, clamped to its limits (with ``keep_unchanged``, groups with ``d[i] == 0``
    keep ``base`` as it is), then the safety rules per model with demand."""
    out: dict[str, int] = {}
    caps: dict[str, int] = {}
    for i, g in enumerate(obs.groups):
        cap = max(0, int(g.max_replicas))
        if g.available is not None:
            cap = min(cap, max(0, int(g.available)))
        lo = min(max(0, int(g.min_replicas)), max(0, int(g.max_replicas)))
        if keep_unchanged and d[i] == 0:
            out[g.key] = base[g.key]
        else:
            out[g.key] = max(lo, min(cap, base[g.key] + d[i])) if cap >= lo else lo
        caps[g.key] = cap
    models: dict[str, list] = {}
    for g in obs.groups:
        models.setdefault(g.model, []).append(g)

    def price(g):
        return (_fin(g.price_usd_per_hour, math.inf), g.pool == "spot")

    for gs in models.values():
        if not any(_fin(g.arrivals_rps) > 0 or g.waiting > 0 for g in gs):
            continue
        od = [g for g in gs if g.pool != "spot" and caps[g.key] > 0]
        missing = on_demand_floor - sum(out[g.key] for g in od)
        for g in sorted(od, key=price):
            if missing <= 0:
                break
            add = min(missing, caps[g.key] - out[g.key])
            if add > 0:
                out[g.key] += add
                missing -= add
        if sum(out[g.key] for g in gs) == 0:
            ok = [g for g in gs if caps[g.key] > 0] or gs
            out[min(ok, key=price).key] = 1
    return out
