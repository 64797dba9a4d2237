"""split_replicas in O(groups log groups) gives the targets of the quadratic original (kept below as the
reference) on random inputs: prices with ties, zones, spot and on-demand pools, caps, spot availability, units."""

from __future__ import annotations

import math

import numpy as np

from fleetwise.control.protocols import GroupState
from fleetwise.policies.scalers import _finite, current_replicas, group_cap, split_replicas


def reference_split_replicas(groups: list[GroupState], need_units: float, *, units: dict[str, float] | None = None,
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
    When the caps run out, every group ends at its cap.
    """
    unit = {g.key: 1.0 for g in groups}
    if units is not None:
        for k, u in units.items():
            if k in unit and _finite(u) and u > 0:
                unit[k] = float(u)
    cap = {g.key: group_cap(g) for g in groups}
    alloc = {g.key: min(max(0, int(g.min_replicas)), cap[g.key]) for g in groups}
    if need_units <= 0 and min_total <= 0:
        return alloc
    order = {g.key: i for i, g in enumerate(groups)}
    want_zones = min(max(0, int(min_zones)), len({g.zone for g in groups if cap[g.key] > 0}))

    def add(cands: list[GroupState], missing) -> None:
        """Add replicas to ``cands`` while ``missing(g)`` (replicas still needed if g gets them) is > 0."""
        while True:
            free = [g for g in cands if alloc[g.key] < cap[g.key]]
            if not free or missing(free[0]) <= 0:
                return
            zones = {g.zone for g in groups if alloc[g.key] > 0}
            spread = len(zones) < want_zones and any(g.zone not in zones for g in free)

            best = min(free, key=lambda g, z=zones, s=spread: (
                s and g.zone in z, max(0.0, g.price_usd_per_hour) / unit[g.key],
                alloc[g.key] >= current_replicas(g), order[g.key]))
            k = 1
            if not spread:  # several at once: up to the cap, what is missing, and the replicas it has now
                cur = current_replicas(best)
                k = min(cap[best.key] - alloc[best.key], missing(best),
                        cur - alloc[best.key] if alloc[best.key] < cur else cap[best.key])
            alloc[best.key] += max(1, k)

    od = [g for g in groups if g.pool != "spot"]
    add(od, lambda g: on_demand_floor - sum(alloc[h.key] for h in od))

    def short(g: GroupState) -> int:
        gap = need_units - sum(alloc[k] * unit[k] for k in alloc)
        by_units = math.ceil(gap / unit[g.key] - 1e-9) if gap > 1e-9 else 0
        return max(by_units, min_total - sum(alloc.values()))

    add(groups, short)
    return alloc


def random_groups(rng: np.random.Generator, n: int) -> tuple[list[GroupState], dict[str, float] | None]:
    zones = [f"z{k}" for k in range(int(rng.integers(1, 7)))]
    prices = rng.choice([0.0, 0.8, 1.2, 2.5, 3.7], size=n) if rng.random() < 0.5 else rng.uniform(0, 5, n)
    groups = []
    for i in range(n):
        lo = int(rng.integers(0, 3))
        hi = lo + int(rng.integers(0, 8))
        groups.append(GroupState(
            key=f"g{i}", model="m", gpu="A100", region="r", zone=str(rng.choice(zones)),
            pool="spot" if rng.random() < 0.4 else "on_demand", ready=int(rng.integers(0, 6)),
            starting=int(rng.integers(0, 3)), draining=0, min_replicas=lo, max_replicas=hi, waiting=0, running=0,
            kv_used=0.0, busy=0.0, arrivals_rps=0.0, price_usd_per_hour=float(prices[i]),
            available=None if rng.random() < 0.6 else int(rng.integers(0, 6))))
    r = rng.random()
    if r < 0.3:
        units = None
    elif r < 0.6:
        units = {g.key: float(rng.choice([1.0, 2.0, 3.5])) for g in groups}
    else:
        units = {g.key: float(rng.uniform(0.2, 9.0)) for g in groups}
        if rng.random() < 0.2:  # unusable units fall back to 1
            units[groups[0].key] = float("nan")
    return groups, units


def test_split_replicas_matches_the_quadratic_reference_on_random_inputs():
    rng = np.random.default_rng(20240614)
    cases = 0
    for _ in range(4000):
        groups, units = random_groups(rng, int(rng.integers(1, 25)))
        need = float(rng.choice([0.0, -1.0, rng.uniform(0, 60), float(rng.integers(0, 40))]))
        kw = {"units": units, "min_total": int(rng.integers(0, 6)), "on_demand_floor": int(rng.integers(0, 4)),
              "min_zones": int(rng.integers(0, 5))}
        want = reference_split_replicas(groups, need, **kw)
        got = split_replicas(groups, need, **kw)
        assert got == want, (need, kw, groups)
        assert list(got) == [g.key for g in groups]
        cases += 1
    assert cases == 4000


def test_split_replicas_on_many_groups_matches_and_respects_caps():
    rng = np.random.default_rng(7)
    groups, units = random_groups(rng, 600)
    for need in (0.5, 40.0, 400.0, 5000.0):
        got = split_replicas(groups, need, units=units, min_total=1)
        assert got == reference_split_replicas(groups, need, units=units, min_total=1)
        assert all(got[g.key] <= max(group_cap(g), 0) or got[g.key] == min(max(0, g.min_replicas), group_cap(g))
                   for g in groups)
