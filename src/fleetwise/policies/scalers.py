"""Heuristic autoscalers (issue 8): how many replicas each scaling group runs. docs/autoscaling.md.

A scaler has ``scale(obs: ScaleObs) -> {group key: target replicas}``, called at the start of every scaling
epoch. It reads the observation only (never the simulator) and is deterministic; it may keep state between
calls (stabilization windows, idle timers, correction factors). The platform clamps the targets to
[min_replicas, max_replicas] and to ``available``, starts replicas (cold start) and drains the ones removed.

Demand is per model, and several groups (zones, pools, regions) may serve one model: each scaler decides how
much a model needs, then ``split_replicas`` spreads that over the model's groups (cheapest capacity first, an
on-demand floor, zone spread).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetwise.control.registry import register_scaler
from fleetwise.perf.capacity import capacity_rps  # noqa: F401  (re-exported: scalers' capacity estimate)
from fleetwise.policies.scale_columns import NP_MIN_GROUPS, GroupCols, model_columns, pysum, split_cols

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.control.protocols import GroupState, ScaleObs

HPA_METRICS = ("busy", "kv", "queue")


# --------------------------------------------------------------------------------------------- helpers
def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)

# a replica's capacity below this (one request in 11 days) is read as unknown, as 0 is: 5e-324 requests/s made the
# replicas a model needs infinite (OverflowError in /v1/scale)
MIN_UNIT_RPS = 1e-6


def current_replicas(g: GroupState) -> int:
    """Replicas a group has now: ready + starting (draining ones are leaving)."""
    return max(0, int(g.ready)) + max(0, int(g.starting))


def group_cap(g: GroupState) -> int:
    """The most replicas a group can get: ``max_replicas``, and ``available`` (the pool's spot capacity,
    read as a cap on the group's target) when given."""
    cap = max(0, int(g.max_replicas))
    if g.available is not None:
        cap = min(cap, max(0, int(g.available)))
    return cap


def by_model(obs: ScaleObs) -> dict[str, list[GroupState]]:
    """The groups of each model, models in order of first appearance (deterministic)."""
    cols = getattr(obs, "columns", None)
    models = cols.get("model") if cols is not None else None
    if models is None:
        models = list(map(attrgetter("model"), obs.groups))
    if len(models) and len(set(models)) == 1:  # one model (as a rule in the service: no pass over the groups)
        groups = obs.groups
        return {models[0]: groups if isinstance(groups, list) or cols is not None else list(groups)}
    out: dict[str, list[GroupState]] = {}
    for g in obs.groups:
        out.setdefault(g.model, []).append(g)
    return out


def model_demand(groups: list[GroupState]) -> tuple[float, int, int]:
    """(model arrivals/s over the last epoch, waiting requests, running requests) of one model: the largest
    finite ``arrivals_rps`` of its groups (0 when none), and the sums of their non-negative counts. (One pass:
    scalers call this per model at every epoch, over up to 10,000 groups in the service.)"""
    rps, waiting, running, inf = 0.0, 0, 0, math.inf
    for g in groups:
        a = g.arrivals_rps
        if a is not None and rps < a < inf:
            rps = a
        w, r = int(g.waiting), int(g.running)
        if w > 0:
            waiting += w
        if r > 0:
            running += r
    return float(rps), waiting, running


def _history(groups: list[GroupState]) -> list[float]:
    """The model's demand series, oldest first: the longest ``history_rps`` of its groups + this epoch."""
    hist = max((g.history_rps for g in groups), key=len, default=())
    series = [max(0.0, float(x)) if _finite(x) else 0.0 for x in hist]
    series.append(model_demand(groups)[0])
    return series


def split_replicas(groups: list[GroupState], need_units: float, *, units: dict[str, float] | None = None,
                   min_total: int = 0, on_demand_floor: int = 1, min_zones: int = 2) -> dict[str, int]:
    """Targets for the groups of one model that together provide ``need_units`` of capacity.

    ``units[key]`` is what one replica of a group provides (requests/s; 1 for every group when None, i.e.
    ``need_units`` counts replicas). Deterministic greedy, replica by replica:

    1. every group starts at its ``min_replicas`` (capped by ``group_cap``): the platform keeps those anyway;
    2. nothing more when ``need_units <= 0`` and ``min_total <= 0`` (the model is scaled to zero);
    3. on-demand floor: add replicas to non-spot groups until they hold ``on_demand_floor`` (spot capacity
       can vanish at once; ignored when the model has no non-spot group);
    4. demand: add replicas until the capacity reaches ``need_units`` and the count ``min_total``.

    Each step picks, among groups below their cap: first a group in a zone that has no replica yet, while
    fewer than ``min(min_zones, zones the model can use)`` zones have one (so a zone outage cannot take all
    capacity); then the lowest price per unit of capacity (spot before on-demand); then a group that had
    more replicas than allocated so far (no needless moves, no cold starts); then the order of ``groups``.
    When the caps run out, every group ends at its cap. Group keys are unique.

    O(groups log groups): the candidates sit in a heap by that key, and the counts the steps test (zones with a
    replica, capacity and replicas so far) are kept as running totals. (The capacity total is a running sum, so
    where a sum lands within float rounding of the 1e-9 tolerance the result may differ from re-summing.)
    """
    if len(groups) >= NP_MIN_GROUPS:  # many groups: the same greedy over numpy columns (policies/scale_columns.py)
        cols = GroupCols(groups)
        res = _split_cols(cols, None, need_units, _unit_array(cols, units), min_total, on_demand_floor, min_zones)
        if res is not None:
            return res
    keys, cap, unit, n, zone, cur, ppu, is_od = [], [], [], [], [], [], [], []
    for g in groups:  # one pass (this runs per zone, per model, per epoch: 10,000 groups in the service)
        k = g.key
        c = int(g.max_replicas)
        c = c if c > 0 else 0
        if g.available is not None:  # group_cap, inline
            a = int(g.available)
            c = min(c, a if a > 0 else 0)
        u = units.get(k) if units is not None else None
        u = float(u) if u is not None and 0 < u < math.inf else 1.0
        m, r, st, p = int(g.min_replicas), int(g.ready), int(g.starting), g.price_usd_per_hour
        keys.append(k)
        cap.append(c)
        unit.append(u)
        n.append(min(m if m > 0 else 0, c))
        zone.append(g.zone)
        cur.append((r if r > 0 else 0) + (st if st > 0 else 0))  # current_replicas, inline
        ppu.append((p if p > 0.0 else 0.0) / u)
        is_od.append(g.pool != "spot")
    alloc = dict(zip(keys, n))
    if need_units <= 0 and min_total <= 0:
        return alloc
    usable = {z for z, c in zip(zone, cap) if c > 0}
    split = _Split(alloc, keys, cap, unit, n, zone, cur, ppu, is_od, min(max(0, int(min_zones)), len(usable)))
    split.add([i for i, od in enumerate(is_od) if od], floor=on_demand_floor)
    split.add(list(range(len(groups))), need_units=need_units, min_total=min_total)
    return alloc


def _unit_array(cols: GroupCols, units: dict[str, float] | None) -> np.ndarray | None:
    """``units`` as ``split_replicas`` reads them (1 where missing, not finite or <= 0), aligned with the columns."""
    if units is None:
        return None
    u = np.array([units.get(k, math.nan) for k in cols.keys], dtype=np.float64)
    return np.where((u > 0.0) & (u < math.inf), u, 1.0)


def _split_cols(cols: GroupCols, idx: np.ndarray | None, need_units: float, unit: np.ndarray | None, min_total: int,
                on_demand_floor: int, min_zones: int) -> dict[str, int] | None:
    """``split_replicas`` of ``cols`` (``idx``: of those groups, in that order; ``unit`` aligned with them) as a
    dict, or None: an input left to the per-group code."""
    sel = np.arange(cols.n) if idx is None else idx
    res = split_cols(cols, sel, need_units, unit, min_total=min_total, on_demand_floor=on_demand_floor,
                     min_zones=min_zones)
    if res is None:
        return None
    keys = cols.keys if idx is None else [cols.keys[i] for i in idx.tolist()]
    return dict(zip(keys, res.tolist()))


class _Split:
    """The state of one ``split_replicas`` call, by group index, with the running totals its steps test."""

    def __init__(self, alloc: dict[str, int], keys: list[str], cap: list[int], unit: list[float], n: list[int],
                 zone: list[str], cur: list[int], ppu: list[float], is_od: list[bool], want_zones: int):
        self.alloc, self.keys, self.cap, self.unit, self.n, self.zone = alloc, keys, cap, unit, n, zone
        self.cur, self.ppu, self.is_od = cur, ppu, is_od
        self.total_units = sum(k * u for k, u in zip(n, unit))
        self.total_count = sum(n)
        self.od_total = sum(k for k, od in zip(n, is_od) if od)
        self.covered = {z for z, k in zip(zone, n) if k > 0}
        self.want_zones = want_zones

    def key(self, i: int) -> tuple[float, bool, int]:
        return self.ppu[i], self.n[i] >= self.cur[i], i

    def add(self, cands: list[int], floor: int | None = None, need_units: float = 0.0, min_total: int = 0) -> None:
        """Add replicas to ``cands`` (indices, in order) while ``missing(first free candidate) > 0``: replicas
        still missing to the on-demand ``floor`` (when given), else to ``need_units`` of capacity (counted in the
        candidate's replicas) and ``min_total`` replicas. (The hot loop of /v1/scale at 10,000 groups: the totals
        live in locals while it runs.)"""
        n, cap, zone, unit, alloc, keys = self.n, self.cap, self.zone, self.unit, self.alloc, self.keys
        is_od, covered, ceil = self.is_od, self.covered, math.ceil
        total_units, total_count, od_total = self.total_units, self.total_count, self.od_total

        def missing(i: int) -> int:
            if floor is not None:
                return floor - od_total
            gap = need_units - total_units
            q = gap / unit[i] - 1e-9 if gap > 1e-9 else 0.0
            m = ceil(q) if q < 1e15 else 10**15  # (an infinite need, e.g. no capacity_rps: ceil(inf) raised)
            return m if m >= min_total - total_count else min_total - total_count

        def grow(i: int, k: int) -> None:
            nonlocal total_units, total_count, od_total
            n[i] += k
            alloc[keys[i]] = n[i]
            total_units += k * unit[i]
            total_count += k
            if is_od[i]:
                od_total += k
            covered.add(zone[i])

        try:
            self._add(cands, missing, grow)
        finally:
            self.total_units, self.total_count, self.od_total = total_units, total_count, od_total

    def _add(self, cands: list[int], missing, grow) -> None:
        n, cap, zone, cur = self.n, self.cap, self.zone, self.cur
        free = [i for i in cands if n[i] < cap[i]]
        nf = len(free)
        first = 0  # free[first]: the first candidate below its cap (caps are only ever reached)
        # phase 1, while fewer than want_zones zones have a replica and a free candidate lies in another zone:
        # one replica at a time to the best candidate of an uncovered zone (all at 0 replicas: the key is static)
        heap = None
        uncovered = 0
        while True:
            while first < nf and n[free[first]] >= cap[free[first]]:
                first += 1
            if first == nf or missing(free[first]) <= 0:
                return
            if len(self.covered) >= self.want_zones:
                break
            if heap is None:
                # zones with a free candidate and no replica (a replica only ever goes to a zone it covers)
                uncovered = len({zone[i] for i in free} - self.covered)
                heap = [self.key(i) for i in free]
                heapq.heapify(heap)
            if uncovered <= 0:
                break
            while zone[heap[0][2]] in self.covered:  # a candidate in an uncovered zone exists: the loop ends
                heapq.heappop(heap)
            grow(heapq.heappop(heap)[2], 1)  # its zone is covered now
            uncovered -= 1
        # phase 2: the spread is done for good; the best free candidate, several replicas at once
        ppu = self.ppu
        heap = [(ppu[i], n[i] >= cur[i], i) for i in free[first:] if n[i] < cap[i]]
        heapq.heapify(heap)
        while True:
            i = heap[0][2]
            ni, ci = n[i], cap[i]
            k = min(ci - ni, missing(i), cur[i] - ni if ni < cur[i] else ci)
            grow(i, k if k > 1 else 1)
            if n[i] < ci:
                heapq.heapreplace(heap, (ppu[i], n[i] >= cur[i], i))
            else:
                heapq.heappop(heap)
            while first < nf and n[free[first]] >= cap[free[first]]:
                first += 1
            if first == nf or missing(free[first]) <= 0:
                return


@dataclass
class _Window:
    """Kubernetes HPA stabilization: recommendations of the last ``window_s`` seconds (scale-down) and, with
    ``up_window_s`` (0, HPA's default: none), of the last ``up_window_s`` (scale-up)."""

    window_s: float
    up_window_s: float = 0.0
    recs: list[tuple[float, float]] = field(default_factory=list)
    raw: list[tuple[float, float]] = field(default_factory=list)  # the recommendations of the scale-up window

    def stabilize(self, now: float, rec: float, current: float) -> float:
        """Up at once (to ``rec``); down only to the highest recommendation of the window. With a scale-up window,
        a recommendation counts for the lowest of the last ``up_window_s`` (as HPA's ``behavior.scaleUp
        .stabilizationWindowSeconds``): a rise that one epoch alone sees is not acted on. It is the lowest
        *recommendation*, not HPA's comparison with the current replicas: a zone-redundant scaler's current
        capacity counts the spare zone, which would let a one-epoch rise through (docs/autoscaling.md).

        A kept recommendation that the new one dominates (no later in time, and no lower for the scale-down
        window or no higher for the scale-up one) is dropped: whenever it would still be inside a window, so is
        the new one, so no answer changes; and the lists stay short when a client's clock does not advance."""
        if self.up_window_s > 0.0:
            self.raw = [(t, r) for t, r in self.raw if t > now - self.up_window_s and (t > now or r < rec)]
            self.raw.append((now, rec))
            rec = min(r for _, r in self.raw)
        self.recs = [(t, r) for t, r in self.recs if t > now - self.window_s and (t > now or r > rec)]
        self.recs.append((now, rec))
        if rec > current:
            return rec
        down = max(r for _, r in self.recs)
        return min(current, down)

    def reset(self) -> None:
        self.recs.clear()
        self.raw.clear()


MAX_KEYS_KEPT = 20_000  # models (groups for `static`) a scaler keeps state for: twice a /v1/scale call's groups


class _Recent:
    """The call that last saw each model (or group) a scaler keeps state for. Beyond ``MAX_KEYS_KEPT``, the least
    recently seen (never those of the current call) are forgotten from every dict given, down to 90% of it: a
    model that comes back after that is new to the scaler. A fleet's own models are seen every epoch and never
    forgotten; what this bounds is a decision-service client sending ever new names (docs/security.md)."""

    __slots__ = ("calls", "last", "cap")

    def __init__(self) -> None:
        self.calls = 0
        self.last: dict[str, int] = {}
        self.cap = MAX_KEYS_KEPT

    def saw(self, keys: Any, *state: dict) -> None:
        self.calls += 1
        c, last = self.calls, self.last
        for k in keys:
            last[k] = c
        if len(last) > self.cap:
            old = heapq.nsmallest(len(last) - self.cap * 9 // 10, ((v, k) for k, v in last.items() if v != c))
            for _, k in old:
                del last[k]
                for d in state:
                    d.pop(k, None)


class _Idle:
    """When each model last had demand (arrivals, waiting or running requests)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def idle_for(self, model: str, now: float, active: bool, current: int) -> float:
        """Seconds since the model's last demand; a model first seen with no demand and no replica counts as
        idle for ever (it stays at zero), one first seen with replicas as active now."""
        if active:
            self.last[model] = now
        elif model not in self.last:
            self.last[model] = -math.inf if current == 0 else now
        return now - self.last[model]


def _check(name: str, value: float, lo: float = 0.0, strict: bool = False) -> None:
    if not _finite(value) or value < lo or (strict and value <= lo):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {lo}, got {value}")


# --------------------------------------------------------------------------------------------- static
@register_scaler("static")
class Static:
    """No autoscaling (the baseline): every group keeps the target it had when first seen, i.e. its replicas
    then (ready + starting, at least ``min_replicas``), or ``replicas`` for every group when given. Lost
    replicas (spot reclaims) are replaced, as a Kubernetes Deployment does."""

    def __init__(self, replicas: int | None = None):
        from fleetwise.limits import MAX_REPLICAS

        if replicas is not None and not 0 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be 0 to {MAX_REPLICAS:,} (docs/limits.md), got {replicas}")
        self.replicas = replicas
        self.target: dict[str, int] = {}
        self._recent = _Recent()

    def scale(self, obs: ScaleObs) -> dict[str, int]:
        fields = ("key", "ready", "starting", "min_replicas")
        cols = getattr(obs, "columns", None)
        if cols is not None and all(cols.get(f) is not None for f in fields):  # the groups as columns: read those
            rows = zip(*(cols[f] for f in fields))
        else:
            rows = map(attrgetter(*fields), obs.groups)
        keys, targets = [], []
        for k, r, st, m in rows:
            if k not in self.target:
                n = self.replicas if self.replicas is not None else max(0, int(r)) + max(0, int(st))
                self.target[k] = max(int(n), max(0, int(m)))
            keys.append(k)
            targets.append(self.target[k])
        # within [min_replicas, group_cap] as every other scaler answers (the platform clamps them too, but the
        # decision service answers what the scaler says: replicas=10 gave 10 to a group of max_replicas 3)
        g = GroupCols(obs.groups, cols)
        cap = g.cap()
        t = np.minimum(np.maximum(np.array(targets, np.int64), np.minimum(g.ints("min_replicas"), cap)), cap)
        self._recent.saw(keys, self.target)
        return dict(zip(keys, t.tolist()))


# --------------------------------------------------------------------------------------------- HPA
@register_scaler("hpa")
class HPA:
    """Kubernetes Horizontal Pod Autoscaler (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale:
    the algorithm, the replica calculator and the default ``behavior``), per model over its groups:
    ``desired = ceil(current * metric / target)`` where ``metric`` is the mean over ready replicas of ``busy``
    (GPU-busy fraction), ``kv`` (KV-cache fraction in use) or ``queue`` (waiting requests per ready replica),
    i.e. ``ceil(sum of the metric / target)``; no change while ``|metric / target - 1| <= tolerance``. As in
    Kubernetes, when scaling up, replicas still starting count as using 0 (and ready ones without a metric:
    0 up, the target down); if that brings the ratio within the tolerance or reverses it, no change; no
    metric at all: no change. Scale-down is stabilized (the highest recommendation of the last
    ``downscale_window_s``); scale-up is limited per epoch to ``max(current * scale_up_factor, current +
    scale_up_pods)`` (HPA's default policies: 100% or 4 pods, the larger). At least one replica per model,
    unless ``scale_to_zero`` (as KEDA): zero after ``idle_s`` without arrivals, waiting or running requests;
    from zero as soon as requests arrive or wait (one replica; ``ceil(waiting / target)`` for the queue
    metric). The model's replicas are then split over its groups by ``split_replicas``."""

    def __init__(self, metric: str = "busy", target: float | None = None, tolerance: float = 0.1,
                 downscale_window_s: float = 300.0, scale_up_factor: float = 2.0, scale_up_pods: int = 4,
                 scale_to_zero: bool = False, idle_s: float = 300.0, on_demand_floor: int = 1, min_zones: int = 2,
                 upscale_window_s: float = 0.0):
        if metric not in HPA_METRICS:
            raise ValueError(f"metric must be one of {', '.join(HPA_METRICS)}, got {metric!r}")
        if target is None:
            target = 2.0 if metric == "queue" else 0.7
        _check("target", target, strict=True)
        _check("tolerance", tolerance)
        _check("downscale_window_s", downscale_window_s)
        _check("upscale_window_s", upscale_window_s)
        _check("scale_up_factor", scale_up_factor, 1.0)
        _check("scale_up_pods", scale_up_pods)
        _check("idle_s", idle_s)
        _check("on_demand_floor", on_demand_floor)
        _check("min_zones", min_zones)
        self.metric, self.target, self.tolerance = metric, float(target), float(tolerance)
        self.downscale_window_s, self.upscale_window_s = float(downscale_window_s), float(upscale_window_s)
        self.scale_up_factor, self.scale_up_pods = float(scale_up_factor), int(scale_up_pods)
        self.scale_to_zero, self.idle_s = bool(scale_to_zero), float(idle_s)
        self.on_demand_floor, self.min_zones = int(on_demand_floor), int(min_zones)
        self._win: dict[str, _Window] = {}
        self._idle = _Idle()
        self._recent = _Recent()

    def recommend(self, groups: list[GroupState], cols: GroupCols | None = None) -> int:
        """HPA's raw recommendation for one model (before stabilization, rate limit and the model minimum),
        as the Kubernetes replica calculator computes it. (``cols``: the same groups as columns.)"""
        if cols is not None:
            current, starting = int(cols.current().sum()), int(cols.ints("starting").sum())
            rps, waiting, _ = cols.demand()
        else:
            current = sum(current_replicas(g) for g in groups)
            starting = sum(max(0, int(g.starting)) for g in groups)
            rps, waiting, _ = model_demand(groups)
        t, tol = self.target, self.tolerance
        if current == 0:  # scale from zero (KEDA-style activation)
            if waiting > 0 or rps > 0:
                return max(1, math.ceil(waiting / t - 1e-9)) if self.metric == "queue" else 1
            return 0
        total, n, missing = 0.0, 0, 0  # metric summed over ready replicas that report it; those that do not
        if self.metric == "queue":  # all waiting requests (also those held for a replica) over ready replicas
            total = float(waiting)
            n = int(cols.ints("ready").sum()) if cols is not None else sum(max(0, int(g.ready)) for g in groups)
        elif cols is not None:
            r = cols.ints("ready")
            v = cols.col("busy" if self.metric == "busy" else "kv_used")
            has = (r > 0) & np.isfinite(v)
            vh = v[has]
            total = float(pysum(r[has] * np.where(vh > 0.0, vh, 0.0)))
            n, missing = int(r[has].sum()), int(r[~has].sum())
        else:
            for g in groups:
                r = max(0, int(g.ready))
                v = g.busy if self.metric == "busy" else g.kv_used
                if r and _finite(v):
                    total, n = total + r * max(0.0, float(v)), n + r
                else:
                    missing += r
        if n == 0 and (self.metric != "queue" or total == 0):
            return current  # no metrics: no change
        ratio = total / (n * t) if n else math.inf
        up = ratio > 1.0
        if (up and starting > 0) or missing > 0:
            # not-yet-ready replicas count as 0 when scaling up; missing metrics as 0 (up) or the target (down)
            total2, n2 = (total, n + missing + starting) if up else (total + missing * t, n + missing)
            ratio2 = total2 / (n2 * t)
            if abs(ratio2 - 1.0) <= tol or (up and ratio2 < 1.0) or (not up and ratio2 > 1.0):
                return current
            return math.ceil(total2 / t - 1e-9)
        if abs(ratio - 1.0) <= tol:
            return current
        return math.ceil(total / t - 1e-9)

    def scale(self, obs: ScaleObs) -> dict[str, int]:
        out: dict[str, int] = {}
        now = obs.time_s
        models = by_model(obs)
        many = model_columns(obs, models, NP_MIN_GROUPS)  # models with many groups: over numpy columns
        for model, groups in models.items():
            cols = many.get(model)
            if cols is not None:
                current, model_max = int(cols.current().sum()), int(cols.cap().sum())
                rps, waiting, running = cols.demand()
            else:
                current = sum(current_replicas(g) for g in groups)
                model_max = sum(group_cap(g) for g in groups)
                rps, waiting, running = model_demand(groups)
            idle = self._idle.idle_for(model, now, rps > 0 or waiting > 0 or running > 0, current)
            win = self._win.setdefault(model, _Window(self.downscale_window_s, self.upscale_window_s))
            if self.scale_to_zero and idle >= self.idle_s:
                desired = 0
                win.reset()
            else:
                rec = min(max(self.recommend(groups, cols), 1), model_max)  # zero only when idle
                desired = int(win.stabilize(now, rec, current))
                limit = max(math.floor(current * self.scale_up_factor), current + self.scale_up_pods)
                desired = min(desired, limit) if desired > current else desired
            res = None if cols is None else _split_cols(cols, None, desired, None, desired, self.on_demand_floor,
                                                        self.min_zones)
            out.update(res if res is not None else split_replicas(
                groups, desired, min_total=desired, on_demand_floor=self.on_demand_floor, min_zones=self.min_zones))
        self._recent.saw(models, self._win, self._idle.last)
        return out


# --------------------------------------------------------------------------------------------- capacity-based
class _CapacityScaler:
    """Shared by ``slo_aware`` and ``predictive``: demand in requests/s -> capacity -> replicas per group."""

    def __init__(self, headroom: float, drain_s: float, downscale_window_s: float, idle_s: float,
                 scale_to_zero: bool, on_demand_floor: int, min_zones: int, zone_redundant: bool = False,
                 upscale_window_s: float = 0.0):
        _check("headroom", headroom)
        _check("drain_s", drain_s, strict=True)
        _check("downscale_window_s", downscale_window_s)
        _check("upscale_window_s", upscale_window_s)
        _check("idle_s", idle_s)
        _check("on_demand_floor", on_demand_floor)
        _check("min_zones", min_zones)
        self.headroom, self.drain_s = float(headroom), float(drain_s)
        self.downscale_window_s, self.idle_s = float(downscale_window_s), float(idle_s)
        self.upscale_window_s = float(upscale_window_s)
        self.scale_to_zero = bool(scale_to_zero)
        self.on_demand_floor, self.min_zones = int(on_demand_floor), int(min_zones)
        # zone_redundant: a model with demand keeps a replica in each of min_zones zones, and capacity such
        # that losing its largest zone still leaves the need (N+1 across zones, as for multi-AZ services)
        self.zone_redundant = bool(zone_redundant)
        self._win: dict[str, _Window] = {}
        self._idle = _Idle()
        self._recent = _Recent()
        self._cap_est: dict[str, float] = {}  # last observed capacity per replica of a model (fallback)

    def _state(self) -> tuple[dict, ...]:
        """The dicts of per-model state (``_Recent`` forgets a model from each)."""
        return self._win, self._idle.last, self._cap_est

    def units(self, model: str, groups: list[GroupState]) -> dict[str, float] | None:
        """Requests/s one replica of each group sustains: ``capacity_rps``; for a group without one (0 or
        NaN) the mean of its model's other groups, else the observed rate per fully busy ready replica
        (arrivals / sum of ready * busy, remembered per model). None when nothing is known."""
        caps = [c if c is not None and MIN_UNIT_RPS <= c < math.inf else None
                for c in (g.capacity_rps for g in groups)]
        known = [c for c in caps if c is not None]
        if len(known) == len(groups):
            return {g.key: float(c) for g, c in zip(groups, known)}
        if known:
            ref = sum(known) / len(known)
        else:
            rps = model_demand(groups)[0]
            busy = sum(max(0, int(g.ready)) * g.busy for g in groups if _finite(g.busy) and g.busy > 0)
            if rps > 0 and busy > 0:
                self._cap_est[model] = rps / busy
            ref = self._cap_est.get(model)
            if ref is None:
                return None
        return {g.key: float(c) if c is not None else ref for g, c in zip(groups, caps)}

    def units_cols(self, model: str, cols: GroupCols) -> np.ndarray | None:
        """``units`` over columns: aligned with the groups."""
        c = cols.col("capacity_rps")
        known = (c >= MIN_UNIT_RPS) & (c < math.inf)
        if known.all():
            return c
        if known.any():
            ref = pysum(c[known]) / int(np.count_nonzero(known))
        else:
            rps = cols.demand()[0]
            b = cols.col("busy")
            has = np.isfinite(b) & (b > 0.0)
            busy = pysum(cols.ints("ready")[has] * b[has])
            if rps > 0 and busy > 0:
                self._cap_est[model] = rps / busy
            ref = self._cap_est.get(model)
            if ref is None:
                return None
        return np.where(known, c, ref)

    def demand_rps(self, model: str, groups: list[GroupState], obs: ScaleObs) -> float:  # pragma: no cover
        raise NotImplementedError

    def need_rps(self, model: str, groups: list[GroupState], obs: ScaleObs, units: dict[str, float]) -> float:
        """Capacity the model needs: demand * (1 + headroom) + backlog / drain_s."""
        waiting = model_demand(groups)[1]
        return self.demand_rps(model, groups, obs) * (1.0 + self.headroom) + waiting / self.drain_s

    def need_cols(self, model: str, groups: list[GroupState], obs: ScaleObs, cols: GroupCols, unit: np.ndarray,
                  demand: tuple[float, int, int]) -> float:
        """``need_rps`` with the model's groups as columns, and its ``model_demand`` known."""
        return self.demand_rps(model, groups, obs) * (1.0 + self.headroom) + demand[1] / self.drain_s

    def redundant(self, model: str, now: float) -> bool:
        """Whether ``model``'s capacity is spread N+1 across zones this epoch (``zone_redundant`` with
        ``min_zones >= 2``; the learned correction of ``scalers_rl`` may lift it per model and epoch)."""
        return self.zone_redundant and self.min_zones >= 2

    def keep_zero(self, model: str, groups: list[GroupState], obs: ScaleObs) -> bool:
        """Whether an idle model may go to zero now (the predictive scaler checks its forecast)."""
        return True

    def scale(self, obs: ScaleObs) -> dict[str, int]:
        out: dict[str, int] = {}
        now = obs.time_s
        models = by_model(obs)
        many = model_columns(obs, models, NP_MIN_GROUPS)
        for model, groups in models.items():
            if model in many:  # many groups: the same decision over numpy columns
                out.update(self._scale_cols(model, groups, obs, many[model]))
                continue
            rps, waiting, running = model_demand(groups)
            active = rps > 0 or waiting > 0 or running > 0
            cr = [current_replicas(g) for g in groups]
            idle = self._idle.idle_for(model, now, active, sum(cr))
            win = self._win.setdefault(model, _Window(self.downscale_window_s, self.upscale_window_s))
            split = {"on_demand_floor": self.on_demand_floor, "min_zones": self.min_zones}
            if self.scale_to_zero and idle >= self.idle_s and self.keep_zero(model, groups, obs):
                win.reset()
                out.update(split_replicas(groups, 0.0, **split))
                continue
            units = self.units(model, groups)
            if units is None:  # no capacity known or observed: hold, one more while requests wait
                units = {g.key: 1.0 for g in groups}
                current = float(sum(cr))
                need = current + (1.0 if waiting > 0 else 0.0)
            else:
                current = float(sum(c * units[g.key] for c, g in zip(cr, groups)))
                need = self.need_rps(model, groups, obs, units)
            need = win.stabilize(now, need, current)
            if not self.redundant(model, now):
                out.update(split_replicas(groups, need, units=units, min_total=1, **split))
                continue
            out.update(self._zone_redundant(groups, need, units, split))
        self._recent.saw(models, *self._state())
        return out

    def _scale_cols(self, model: str, groups: list[GroupState], obs: ScaleObs, cols: GroupCols) -> dict[str, int]:
        """``scale`` for one model with many groups, over numpy columns: the same targets."""
        now = obs.time_s
        demand = cols.demand()
        rps, waiting, running = demand
        cur = cols.current()
        idle = self._idle.idle_for(model, now, rps > 0 or waiting > 0 or running > 0, int(cur.sum()))
        win = self._win.setdefault(model, _Window(self.downscale_window_s, self.upscale_window_s))
        if self.scale_to_zero and idle >= self.idle_s and self.keep_zero(model, groups, obs):
            win.reset()
            return _split_cols(cols, None, 0.0, None, 0, self.on_demand_floor, self.min_zones)  # type: ignore[return-value]
        unit = self.units_cols(model, cols)
        if unit is None:  # no capacity known or observed: hold, one more while requests wait
            current = float(int(cur.sum()))
            need = current + (1.0 if waiting > 0 else 0.0)
        else:
            current = float(pysum(cur * unit))
            need = self.need_cols(model, groups, obs, cols, unit, demand)
        need = win.stabilize(now, need, current)
        if not self.redundant(model, now):
            su = None if unit is None else np.where((unit > 0.0) & (unit < math.inf), unit, 1.0)
            res = _split_cols(cols, None, need, su, 1, self.on_demand_floor, self.min_zones)
            if res is not None:
                return res
            return split_replicas(groups, need, units=self._unit_dict(cols, unit), min_total=1,
                                  on_demand_floor=self.on_demand_floor, min_zones=self.min_zones)
        return self._zone_redundant_cols(groups, cols, need, unit)

    @staticmethod
    def _unit_dict(cols: GroupCols, unit: np.ndarray | None, idx: np.ndarray | None = None) -> dict[str, float]:
        sel = range(cols.n) if idx is None else idx.tolist()
        if unit is None:
            return {cols.keys[i]: 1.0 for i in sel}
        return {cols.keys[i]: float(unit[i]) for i in sel}

    def _zone_redundant_cols(self, groups: list[GroupState], cols: GroupCols, need: float, unit: np.ndarray | None
                             ) -> dict[str, int]:
        """``_zone_redundant`` over columns (zones with ``NP_MIN_GROUPS`` groups or more split by numpy too)."""
        cap = cols.cap()
        alloc = np.minimum(cols.ints("min_replicas"), cap)
        zid, _ = cols.zones()
        usable = np.flatnonzero(cap > 0)
        if not len(usable):
            return dict(zip(cols.keys, alloc.tolist()))
        by_zone = usable[np.argsort(zid[usable], kind="stable")]  # each zone's groups in the groups' order
        zs = zid[by_zone]
        cuts = np.flatnonzero(np.diff(zs)) + 1
        parts = np.split(by_zone, cuts)
        nz = len(parts)
        share = need / (nz - 1) if nz >= 2 else need
        u = np.ones(cols.n) if unit is None else unit
        su = np.where((u > 0.0) & (u < math.inf), u, 1.0)
        glist = None  # the groups as a list, made once if a zone goes to the per-group code
        for idx in parts:
            res = None
            if len(idx) >= NP_MIN_GROUPS:
                res = split_cols(cols, idx, share, su[idx], min_total=1, on_demand_floor=0, min_zones=1)
            if res is None:
                if glist is None:
                    glist = groups if isinstance(groups, list) else list(groups)
                d = split_replicas([glist[i] for i in idx.tolist()], share, units=self._unit_dict(cols, u, idx),
                                   min_total=1, on_demand_floor=0, min_zones=1)
                res = np.array(list(d.values()), dtype=np.int64)
            alloc[idx] = res
        od = cols.is_od() & (cap > 0)
        floor = self.on_demand_floor
        if od.any() and int(alloc[od].sum()) < floor:
            price = cols.col("price_usd_per_hour")
            ppu = np.where(price > 0.0, price, 0.0) / u
            cand = np.flatnonzero(od)
            if np.isnan(ppu[cand]).any():  # (NaN keys: Python's min decides, as the per-group code)
                best = min(cand.tolist(), key=lambda i: (float(ppu[i]), cols.keys[i]))
            else:
                lo = ppu[cand].min()
                best = min((i for i in cand[ppu[cand] == lo].tolist()), key=lambda i: cols.keys[i])
            alloc[best] = min(int(cap[best]), int(alloc[best]) + floor - int(alloc[od].sum()))
        return dict(zip(cols.keys, alloc.tolist()))

    def _zone_redundant(self, groups: list[GroupState], need: float, units: dict[str, float], split: dict
                        ) -> dict[str, int]:
        """N+1 across zones: with Z usable zones (cap > 0) each zone gets capacity for ``need / (Z - 1)``, so that
        losing any one zone leaves the need (Z = 1: the need, in that zone). Within a zone, ``split_replicas``
        (cheapest per unit first); at least one replica per zone; the on-demand floor over the whole model."""
        zones: dict[str, list[GroupState]] = {}
        alloc: dict[str, int] = {}
        caps: dict[str, int] = {}
        for g in groups:
            c = caps[g.key] = group_cap(g)
            alloc[g.key] = min(max(0, int(g.min_replicas)), c)
            if c > 0:
                zones.setdefault(g.zone, []).append(g)
        if not zones:
            return alloc
        nz = len(zones)
        share = need / (nz - 1) if nz >= 2 else need
        for zg in zones.values():
            alloc.update(split_replicas(zg, share, units=units, min_total=1, on_demand_floor=0, min_zones=1))
        od = [g for g in groups if g.pool != "spot" and caps[g.key] > 0]
        floor = split.get("on_demand_floor", 1)
        if od and sum(alloc[g.key] for g in od) < floor:
            g = min(od, key=lambda g: (max(0.0, g.price_usd_per_hour) / units[g.key], g.key))
            alloc[g.key] = min(group_cap(g), alloc[g.key] + floor - sum(alloc[h.key] for h in od))
        return alloc


@register_scaler("slo_aware")
class SLOAware(_CapacityScaler):
    """SLO-aware scaling, after NVIDIA Dynamo's SLA planner (and AIBrix): per model, the capacity needed is
    ``predicted arrivals/s * (1 + headroom) * correction + waiting / drain_s`` (serve the predicted load with
    headroom, and drain the backlog within ``drain_s``), where the prediction is last epoch's rate (Dynamo's
    constant predictor) and a replica of a group provides its ``capacity_rps`` (the performance model's
    requests/s within the SLO: ``capacity_rps()``); the groups then get replicas by ``split_replicas``.
    ``correction`` adapts per model to the observed SLO, like Dynamo's correction factor (observed /
    expected latency): each epoch ``q = max(ttft_p90 / slo_ttft, tpot_p90 / slo_tpot)`` over the model's
    groups (NaN ignored); when q > 1 and the ready replicas had the capacity for last epoch's arrivals (so the
    capacity estimate, not a shortage, is wrong), the target is ``correction * q``; when q <= 1 it is
    ``max(1, correction * q)``; ``correction`` moves ``correction_gain`` of the way there, within
    [1, max_correction]. Scale-down waits until the need stays lower for ``downscale_window_s`` (the highest
    need of the window is used). A model with no arrivals, waiting or running requests for ``idle_s`` goes to
    zero (``scale_to_zero``); otherwise it keeps at least one replica."""

    def __init__(self, headroom: float = 0.2, drain_s: float = 60.0, downscale_window_s: float = 300.0,
                 idle_s: float = 600.0, scale_to_zero: bool = True, correction_gain: float = 0.5,
                 max_correction: float = 4.0, on_demand_floor: int = 1, min_zones: int = 2,
                 zone_redundant: bool = True, upscale_window_s: float = 0.0):
        super().__init__(headroom, drain_s, downscale_window_s, idle_s, scale_to_zero, on_demand_floor, min_zones,
                         zone_redundant, upscale_window_s)
        _check("correction_gain", correction_gain)
        if correction_gain > 1:
            raise ValueError(f"correction_gain must be <= 1, got {correction_gain}")
        _check("max_correction", max_correction, 1.0)
        self.correction_gain, self.max_correction = float(correction_gain), float(max_correction)
        self.correction: dict[str, float] = {}

    def _state(self) -> tuple[dict, ...]:
        return (*super()._state(), self.correction)

    def _update_correction(self, model: str, groups: list[GroupState], units: dict[str, float]) -> float:
        q = math.nan
        inf = math.inf
        for g in groups:  # (flat: this runs over every group of the model each epoch)
            for obs_s, slo_s in ((g.ttft_p90_s, g.slo_ttft_s), (g.tpot_p90_s, g.slo_tpot_s)):
                # both finite (NaN fails every comparison), the SLO > 0
                if obs_s is not None and slo_s is not None and -inf < obs_s < inf and 0 < slo_s < inf:
                    r = obs_s / slo_s
                    q = r if q != q or r > q else q
        return self._correct(model, q, lambda: sum(max(0, int(g.ready)) * units[g.key] for g in groups),
                             lambda: model_demand(groups)[0])

    def _correct(self, model: str, q: float, ready_cap: Any, rps: Any) -> float:
        """The correction after an epoch whose worst p90 / SLO ratio was ``q`` (NaN: none known);
        ``ready_cap()``: the ready replicas' capacity, ``rps()``: the model's arrivals/s."""
        c = self.correction.get(model, 1.0)
        if math.isnan(q):
            return c
        if q > 1.0:
            if rps() > ready_cap():  # a shortage explains the violation: keep the estimate
                return c
            goal = c * q
        else:
            goal = max(1.0, c * q)
        c = c + self.correction_gain * (goal - c)
        c = min(self.max_correction, max(1.0, c))
        self.correction[model] = c
        return c

    def demand_rps(self, model, groups, obs):
        return model_demand(groups)[0]

    def need_rps(self, model, groups, obs, units):
        c = self._update_correction(model, groups, units)
        waiting = model_demand(groups)[1]
        return self.demand_rps(model, groups, obs) * (1.0 + self.headroom) * c + waiting / self.drain_s

    def need_cols(self, model, groups, obs, cols, unit, demand):
        rps, waiting, _ = demand
        q = math.nan
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            for o, slo in (("ttft_p90_s", "slo_ttft_s"), ("tpot_p90_s", "slo_tpot_s")):
                ov, sv = cols.col(o), cols.col(slo)
                ok = np.isfinite(ov) & (sv > 0.0) & (sv < math.inf)
                if ok.any():
                    r = float((ov[ok] / sv[ok]).max())
                    q = r if q != q or r > q else q
        c = self._correct(model, q, lambda: pysum(cols.ints("ready") * unit), lambda: rps)
        return rps * (1.0 + self.headroom) * c + waiting / self.drain_s


def holt_forecast(series: list[float], steps: float, alpha: float = 0.5, beta: float = 0.2) -> float:
    """Holt's linear trend (double exponential smoothing; Holt 1957): level l and trend b over ``series``
    (oldest first, one value per epoch), ``l_t = a y_t + (1 - a)(l_{t-1} + b_{t-1})``,
    ``b_t = beta (l_t - l_{t-1}) + (1 - beta) b_{t-1}``, started at l = y_0, b = y_1 - y_0; the forecast
    ``steps`` epochs ahead is ``l + steps * b``."""
    if not series:
        return 0.0
    level, trend = series[0], (series[1] - series[0] if len(series) > 1 else 0.0)
    for y in series[1:]:
        prev = level
        level = alpha * y + (1.0 - alpha) * (level + trend)
        trend = beta * (level - prev) + (1.0 - beta) * trend
    return level + steps * trend


def _at(series: list[float], i: float) -> float:
    """series at fractional index i (linear interpolation, clamped to the ends)."""
    i = min(max(i, 0.0), len(series) - 1.0)
    lo = math.floor(i)
    hi = min(lo + 1, len(series) - 1)
    return series[lo] + (i - lo) * (series[hi] - series[lo])


@register_scaler("predictive")
class Predictive(_CapacityScaler):
    """Predictive scaling: provision now for the demand ``lead_s`` ahead, so replicas finish their cold start
    when the load arrives. Per model, the series ``history_rps + [arrivals_rps]`` (one value per epoch) is
    forecast ``h = lead_s / epoch_s`` epochs ahead with Holt's linear trend (Holt 1957; smoothing ``alpha``,
    ``beta``); with ``season_s`` and at least one season of history (m = season_s / epoch_s epochs), the
    forecast is ``season_weight * (y_T + y_{T+h-m} - y_{T-m}) + (1 - season_weight) * holt`` (a
    seasonal-naive term: the change seen one season ago over the same horizon). ``lead_s`` defaults to the
    largest ``cold_start_s`` of the model's groups + one epoch. The capacity needed is
    ``max(forecast, arrivals_rps) * (1 + headroom) + waiting / drain_s``; replicas as ``slo_aware``
    (``capacity_rps`` per replica, ``split_replicas``, scale-down after ``downscale_window_s``). A model with no
    demand for ``idle_s`` goes to zero unless one season ago there was demand at the forecast time."""

    def __init__(self, lead_s: float | None = None, alpha: float = 0.5, beta: float = 0.2,
                 season_s: float | None = None, season_weight: float = 0.5, headroom: float = 0.2,
                 drain_s: float = 60.0, downscale_window_s: float = 300.0, idle_s: float = 600.0,
                 scale_to_zero: bool = True, on_demand_floor: int = 1, min_zones: int = 2,
                 zone_redundant: bool = True, upscale_window_s: float = 0.0):
        super().__init__(headroom, drain_s, downscale_window_s, idle_s, scale_to_zero, on_demand_floor, min_zones,
                         zone_redundant, upscale_window_s)
        if lead_s is not None:
            _check("lead_s", lead_s)
        if season_s is not None:
            _check("season_s", season_s, strict=True)
        for name, v in (("alpha", alpha), ("beta", beta), ("season_weight", season_weight)):
            if not (_finite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if alpha == 0:
            raise ValueError("alpha must be > 0")
        self.lead_s = None if lead_s is None else float(lead_s)
        self.alpha, self.beta = float(alpha), float(beta)
        self.season_s = None if season_s is None else float(season_s)
        self.season_weight = float(season_weight)

    def _steps(self, groups: list[GroupState], obs: ScaleObs) -> tuple[float, float]:
        epoch = obs.epoch_s if _finite(obs.epoch_s) and obs.epoch_s > 0 else 1.0
        lead = self.lead_s
        if lead is None:
            lead = max((g.cold_start_s for g in groups if _finite(g.cold_start_s)), default=0.0) + epoch
        return max(0.0, lead) / epoch, epoch

    def _season(self, series: list[float], h: float, epoch: float) -> tuple[float, float] | None:
        """(y_{T+h-m}, y_{T-m}) when the history covers one season, else None."""
        if self.season_s is None:
            return None
        m = self.season_s / epoch
        T = len(series) - 1
        if T - m < 0 or h > m:
            return None
        return _at(series, T + h - m), _at(series, T - m)

    def forecast(self, groups: list[GroupState], obs: ScaleObs) -> float:
        """The model's arrivals/s ``lead_s`` ahead (>= 0)."""
        series = _history(groups)
        h, epoch = self._steps(groups, obs)
        f = holt_forecast(series, h, self.alpha, self.beta)
        s = self._season(series, h, epoch)
        if s is not None:
            f = self.season_weight * (series[-1] + s[0] - s[1]) + (1.0 - self.season_weight) * f
        return max(0.0, f) if _finite(f) else 0.0

    def demand_rps(self, model, groups, obs):
        return max(self.forecast(groups, obs), model_demand(groups)[0])

    def keep_zero(self, model, groups, obs):
        series = _history(groups)
        h, epoch = self._steps(groups, obs)
        s = self._season(series, h, epoch)
        return s is None or s[0] <= 0.0
