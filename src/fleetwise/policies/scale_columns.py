"""The scalers' per-group work over numpy columns, for models with many groups (``/v1/scale`` takes 10,000).

``policies/scalers.py`` states the algorithms group by group, in Python; that is what every simulation runs (a
few groups per model) and the reference. A model with ``NP_MIN_GROUPS`` groups or more (a zone with that many, for
the zone-redundant split) is decided here instead, from its groups' fields read once into numpy arrays
(``GroupCols``), with the *same* answers, bit for bit (``tests/test_scale_columns.py`` checks both against each
other on random fleets, and ``split_replicas`` against the quadratic original):

* sums are Python's own, in the same order (``sum(array.tolist())``: numpy's pairwise sum rounds otherwise);
  maxima and comparisons are exact in any order;
* ``split_cols`` is ``split_replicas``' greedy. Its phase 2 takes replicas from a heap of candidates keyed by
  ``(price per unit, at or above current replicas, index)``; each candidate's key changes once at most (when it
  reaches its current replicas), so the heap's successive tops are a fixed sequence of *segments*: per
  candidate, up to its current replicas, then up to its cap, sorted by key. The running totals along that
  sequence are cumulative sums (``np.cumsum`` adds in sequence, as the loop does), so the segments that the loop
  would take whole without stopping are applied at once, and the loop itself runs from the first one that it
  might split or stop in (one or two steps, as a rule).

A call with a non-finite price per unit of capacity goes back to the Python path, which gives the answer; a need
that overflows raises the per-group code's ``OverflowError`` here too (the first check of what is missing is the
same ``math.ceil``).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

NP_MIN_GROUPS = 128  # from this many groups in one call, the columns are cheaper than the per-group Python loop


class GroupCols:
    """One model's groups as columns, read once: from the groups (``GroupState``s or anything with its fields),
    or from ``columns`` (``ScaleObs.columns``: field -> one value per group of the observation) at ``idx`` (the
    model's groups among them; None: all)."""

    __slots__ = ("groups", "keys", "n", "_c", "zone_ids", "nzones", "src", "idx")

    def __init__(self, groups: list[Any], columns: dict[str, Any] | None = None, idx: np.ndarray | None = None):
        self.groups = groups
        self.src, self.idx = columns, idx
        self.n = len(groups)
        self._c: dict[str, np.ndarray] = {}
        self.zone_ids: np.ndarray | None = None
        self.nzones = 0
        self.keys: list[str] = self.values("key")

    def values(self, name: str) -> list:
        """The field's values as a list, in the groups' order."""
        v = None if self.src is None else self.src.get(name)
        if v is None:
            return list(map(operator.attrgetter(name), self.groups))
        if self.idx is None:
            return v if isinstance(v, list) else list(v)
        return [v[i] for i in self.idx.tolist()]

    def col(self, name: str, dtype: Any = np.float64) -> np.ndarray:
        a = self._c.get(name)
        if a is None:
            v = None if self.src is None else self.src.get(name)
            if v is None:
                a = np.fromiter(map(operator.attrgetter(name), self.groups), dtype, self.n)
            else:  # (None in a float column: NaN, unknown, as the groups have it)
                a = np.array(v, dtype=dtype)
                if self.idx is not None:
                    a = a[self.idx]
            self._c[name] = a
        return a

    def ints(self, name: str) -> np.ndarray:
        """``max(0, int(field))`` per group."""
        a = self._c.get("+" + name)
        if a is None:
            a = self._c["+" + name] = np.maximum(self.col(name, np.int64), 0)
        return a

    def zones(self) -> tuple[np.ndarray, int]:
        """Zone ids (0, 1, ... in order of first appearance) and how many zones."""
        if self.zone_ids is None:
            zones = self.values("zone")
            ids = {z: i for i, z in enumerate(dict.fromkeys(zones))}
            self.zone_ids = np.fromiter(map(ids.__getitem__, zones), np.int64, self.n)
            self.nzones = len(ids)
        return self.zone_ids, self.nzones

    def cap(self) -> np.ndarray:
        """``group_cap`` per group: ``max_replicas``, and ``available`` when given."""
        a = self._c.get("=cap")
        if a is None:
            a = self.ints("max_replicas")
            av = self.values("available")
            if av.count(None) != len(av):
                given = np.array([x is not None for x in av])
                vals = np.maximum(np.array([0 if x is None else x for x in av], dtype=np.int64), 0)
                a = np.where(given, np.minimum(a, vals), a)
            self._c["=cap"] = a
        return a

    def current(self) -> np.ndarray:
        """``current_replicas`` per group: ready + starting (each at least 0)."""
        a = self._c.get("=cur")
        if a is None:
            a = self._c["=cur"] = self.ints("ready") + self.ints("starting")
        return a

    def demand(self) -> tuple[float, int, int]:
        """``scalers.model_demand``: the largest finite positive ``arrivals_rps`` (0 with none), the sums of the
        non-negative waiting and running counts."""
        a = self.col("arrivals_rps")
        ok = a[np.isfinite(a) & (a > 0.0)]
        rps = float(ok.max()) if len(ok) else 0.0
        return rps, int(self.ints("waiting").sum()), int(self.ints("running").sum())

    def is_od(self) -> np.ndarray:
        a = self._c.get("=od")
        if a is None:
            a = self._c["=od"] = np.array([p != "spot" for p in self.values("pool")], dtype=bool)
        return a


def pysum(a: np.ndarray) -> float:
    """Python's ``sum`` of the values, in order (the rounding of the per-group code)."""
    return sum(a.tolist())


def split_cols(cols: GroupCols, idx: np.ndarray, need_units: float, unit: np.ndarray | None, *, min_total: int = 0,
               on_demand_floor: int = 1, min_zones: int = 2) -> np.ndarray | None:
    """``split_replicas`` of the groups ``cols[idx]`` (in that order) with ``unit`` per group (aligned with ``idx``;
    None: 1 each, already sanitized: finite and > 0): their targets, aligned with ``idx``. None: an input this
    path leaves to the per-group code (non-finite prices per unit)."""
    cap = cols.cap()[idx]
    n = np.minimum(cols.ints("min_replicas")[idx], cap)
    if need_units <= 0 and min_total <= 0:
        return n
    m = len(idx)
    u = np.ones(m) if unit is None else unit
    price = cols.col("price_usd_per_hour")[idx]
    ppu = np.where(price > 0.0, price, 0.0) / u
    if not np.all(np.isfinite(ppu)):
        return None
    zid_all, _ = cols.zones()
    zid = zid_all[idx]
    # zones renumbered within the call
    uz, zid = np.unique(zid, return_inverse=True)
    nz = len(uz)
    usable = int(np.count_nonzero(np.bincount(zid[cap > 0], minlength=nz)))
    s = _Split(n, cap, u, cols.current()[idx], ppu, cols.is_od()[idx], zid, nz,
               min(max(0, int(min_zones)), usable))
    s.add(np.flatnonzero(s.is_od), floor=on_demand_floor)
    s.add(np.arange(m), need_units=need_units, min_total=min_total)
    return n


class _Split:
    """``scalers._Split`` over arrays (same phases, same order of float additions)."""

    def __init__(self, n, cap, unit, cur, ppu, is_od, zid, nz, want_zones):
        self.n, self.cap, self.unit, self.cur, self.ppu, self.is_od, self.zid = n, cap, unit, cur, ppu, is_od, zid
        self.total_units = pysum(n * unit)
        self.total_count = int(n.sum())
        self.od_total = int(n[is_od].sum())
        self.covered = np.bincount(zid[n > 0], minlength=nz) > 0
        self.ncovered = int(np.count_nonzero(self.covered))
        self.want_zones = want_zones

    def _missing(self, i: int, floor, need_units: float, min_total: int) -> int:
        if floor is not None:
            return floor - self.od_total
        gap = need_units - self.total_units
        m = math.ceil(gap / float(self.unit[i]) - 1e-9) if gap > 1e-9 else 0
        return m if m >= min_total - self.total_count else min_total - self.total_count

    def _grow(self, i: int, k: int) -> None:
        self.n[i] += k
        self.total_units += k * float(self.unit[i])
        self.total_count += k
        if self.is_od[i]:
            self.od_total += k
        z = self.zid[i]
        if not self.covered[z]:
            self.covered[z] = True
            self.ncovered += 1

    def add(self, cands: np.ndarray, floor: int | None = None, need_units: float = 0.0, min_total: int = 0) -> None:
        if floor is not None and floor - self.od_total <= 0:  # (what the first stop() below would say)
            return
        n, cap, zid, cur, ppu = self.n, self.cap, self.zid, self.cur, self.ppu
        free = cands[n[cands] < cap[cands]]
        nf = len(free)
        first = 0

        def stop() -> bool:  # advances ``first`` past capped candidates; True: nothing more to add
            nonlocal first
            while first < nf and n[free[first]] >= cap[free[first]]:
                first += 1
            return first == nf or self._missing(int(free[first]), floor, need_units, min_total) <= 0

        # phase 1: one replica at a time to the best free candidate of a zone without one, while fewer than
        # want_zones zones have one (keys as of the first pass: they are static for candidates at 0 replicas)
        ranked = None
        uncovered = 0
        while True:
            if stop():
                return
            if self.ncovered >= self.want_zones:
                break
            if ranked is None:
                ranked = free[np.lexsort((free, n[free] >= cur[free], ppu[free]))]
                zs = np.zeros(len(self.covered), dtype=bool)
                zs[zid[free]] = True
                uncovered = int(np.count_nonzero(zs & ~self.covered))
            if uncovered <= 0:
                break
            i = int(ranked[np.argmax(~self.covered[zid[ranked]])])
            self._grow(i, 1)
            uncovered -= 1
        # phase 2: the heap's successive tops as segments (module docstring); those taken whole at once
        rem = free[first:]
        rem = rem[n[rem] < cap[rem]]
        nr, cr, kr = n[rem], cur[rem], cap[rem]
        below = nr < cr
        a_g = rem[below]
        a_size = np.minimum(kr[below], cr[below]) - nr[below]
        b_has = np.where(below, cr < kr, True)
        b_g = rem[b_has]
        b_size = kr[b_has] - np.maximum(nr[b_has], cr[b_has])
        g = np.concatenate((a_g, b_g))
        flag = np.concatenate((np.zeros(len(a_g), dtype=bool), np.ones(len(b_g), dtype=bool)))
        size = np.concatenate((a_size, b_size))
        order = np.lexsort((g, flag, ppu[g]))
        g, flag, size = g[order], flag[order], size[order]
        ns = len(g)
        u = self.unit[g]
        tu = np.cumsum(np.concatenate(([self.total_units], size * u)))  # totals before segment j, after: j + 1
        cnt = self.total_count + np.concatenate(([0], np.cumsum(size)))
        if floor is not None:  # every candidate is on demand here
            od = self.od_total + np.concatenate(([0], np.cumsum(size)))
            whole = floor - od[:-1] >= size
            safe = od[1:] < floor
        else:
            gap = need_units - tu[:-1]
            with np.errstate(over="ignore", invalid="ignore"):
                m = np.where(gap > 1e-9, np.ceil(gap / u - 1e-9), 0.0)
            miss = np.maximum(m, min_total - cnt[:-1])
            whole = miss >= size
            # no stop after segment j: the gap stays far above the 1e-9 tolerance for any candidate's unit, or
            # the count is still short
            umax = float(self.unit[free].max()) if nf else 1.0
            safe = (need_units - tu[1:] >= max(2e-9, 1e-8 * umax)) | (cnt[1:] < min_total)
        ok = whole & safe
        j = int(np.argmin(ok)) if ns and not ok.all() else ns
        if j:
            gj = g[:j]
            np.add.at(n, gj, size[:j])
            self.total_units = float(tu[j])
            self.total_count = int(cnt[j])
            self.od_total += int(size[:j][self.is_od[gj]].sum())
            newz = np.unique(zid[gj])
            self.ncovered += int(np.count_nonzero(~self.covered[newz]))
            self.covered[newz] = True
        # the loop, from segment j on
        p = j
        while True:
            if stop() or p >= ns:
                return
            i = int(g[p])
            ni, ci, cu = int(n[i]), int(cap[i]), int(cur[i])
            k = min(ci - ni, self._missing(i, floor, need_units, min_total), cu - ni if ni < cu else ci)
            self._grow(i, k if k > 1 else 1)
            ni = int(n[i])
            if ni >= ci or (not flag[p] and ni >= cu):  # the segment is done: the next top is the next segment
                p += 1


def model_columns(obs: Any, models: dict[str, list[Any]], min_groups: int) -> dict[str, GroupCols]:
    """``GroupCols`` of the models of ``obs`` (``models``: their groups, ``by_model``) with at least ``min_groups``
    groups, read from ``obs.columns`` when the observation has them."""
    big = {m: g for m, g in models.items() if len(g) >= min_groups}
    if not big:
        return {}
    columns = getattr(obs, "columns", None)
    if columns is None or columns.get("model") is None:
        return {m: GroupCols(g) for m, g in big.items()}
    if len(models) == 1:
        return {m: GroupCols(g, columns) for m, g in big.items()}
    names = columns["model"]
    ids = {m: k for k, m in enumerate(models)}
    mid = np.fromiter(map(ids.__getitem__, names), np.int64, len(names))
    return {m: GroupCols(g, columns, np.flatnonzero(mid == ids[m])) for m, g in big.items()}
