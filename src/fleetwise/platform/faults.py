"""Faults of the platform layer (docs/platform.md): a schedule of GPU, node, zone, region and link faults, checked
against the fleet before anything runs, injected at their times with health-checked failover, and the time
until each is recovered from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fleetwise.errors import InputError
from fleetwise.sim.simulator import event

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.platform.runner import Platform


@dataclass
class FaultRecord:
    time_s: float
    kind: str
    target: str
    replicas: int  # replicas it killed
    requests: int  # requests they held (retried elsewhere)
    models: tuple[int, ...] = ()
    ready_before: int = 0
    recovered_s: float | None = None  # time until the affected models had as many ready replicas again


def _index(s: str) -> int | None:
    """The index in a target's ``g<N>`` / ``r<N>`` (ASCII digits only: ``str.isdigit`` also takes '²'; at most 9 of
    them: 5,000 digits failed Python's integer-string limit), or None."""
    return int(s) if s.isascii() and s.isdigit() and len(s) <= 9 else None


def check_fault_targets(faults, zones: list[str], n_groups: int, regions: list[str]) -> None:
    """Every fault must hit something that exists (a target naming nothing used to be ignored silently):
    ``zones`` of the deployments (groups), their number, the fleet's ``regions``."""
    zones = sorted(set(zones))
    for k, f in enumerate(faults):
        t, where = f.target.strip(), f"platform.faults[{k}]: {f.kind} target {f.target!r}"
        if f.kind in ("gpu", "node"):
            forms = "empty (random), g<deployment index>" + (" or r<replica index>" if f.kind == "gpu" else "")
            g = _index(t[1:])
            ok = t == "" or (t[:1] == "g" and g is not None and g < n_groups) or \
                (f.kind == "gpu" and t[:1] == "r" and g is not None)
            if not ok:
                raise InputError(f"{where}: expected {forms} (deployments: {n_groups})")
        elif f.kind == "zone" and t not in zones:
            raise InputError(f"{where}: not a zone of the deployments ({', '.join(zones)})")
        elif f.kind == "region" and t not in regions:
            raise InputError(f"{where}: not a region of the fleet ({', '.join(regions)})")
        elif f.kind == "link":
            parts = [x.strip() for x in t.split(",")] if t else []
            if len(parts) != 2 or any(x not in regions for x in parts) or parts[0] == parts[1]:
                raise InputError(f"{where}: expected 'regionA,regionB', two regions of the fleet "
                                 f"({', '.join(regions)})")


def check_scenario_faults(scenario) -> None:
    """A scenario's fault targets, checked from its fleet and deployments alone (before anything is built, e.g.
    when a sweep is expanded)."""
    if scenario.platform is None or not scenario.platform.faults:
        return
    from fleetwise.fleet.spec import build_fleet

    fleet = build_fleet(scenario.fleet_spec, np.random.default_rng(0))
    names = [r.name for r in fleet.regions]
    zones = []
    for di, d in enumerate(scenario.deployments):
        try:
            region = names[fleet.index(d.region)] if d.region is not None else names[0]
        except InputError as e:
            raise InputError(f"deployments[{di}]: {e}") from None
        zones.append(d.zone or f"{region}-a")
    check_fault_targets(scenario.platform.faults, zones, len(scenario.deployments), names)


class FaultInjector:
    """Applies a platform's fault schedule to its simulator and records each fault (``platform.faults``)."""

    def __init__(self, platform: "Platform"):
        self.p = platform

    def check_recovery(self) -> None:
        """A fault is recovered from when its models have as many ready replicas as before it, or as many as
        the scaler wants now (whichever is fewer)."""
        p = self.p
        for f in p.faults:
            if f.recovered_s is None and f.replicas and \
                    p.ready_of(f.models) >= min(f.ready_before, max(1, p.wanted(f.models))):
                f.recovered_s = p.sim.now - f.time_s

    def inject(self, f, k: int) -> None:
        """Apply fault ``f`` (``platform.faults[k]``) now."""
        p = self.p
        sim = p.sim
        if p.done():
            return
        reps = sim.replicas
        now = sim.now
        alive = [i for i in range(len(reps)) if p.alive(i)]
        victims: list[int] = []
        target = f.target.strip()  # (as check_fault_targets read it)
        if f.kind == "link":
            names = [r.name for r in p.built.fleet.regions]
            parts = [x.strip() for x in target.split(",")] if target else []
            if len(parts) != 2 or any(x not in names for x in parts):
                raise InputError(f"platform.faults[{k}]: link target {target!r}: expected 'regionA,regionB' with "
                                 f"regions from: {', '.join(names)}")
            a, b = names.index(parts[0]), names.index(parts[1])
            self.degrade(a, b, f.factor)
            p.events.append((now, f"link {target} x{f.factor:g}"))
            if f.duration_s:
                sim.at(now + f.duration_s, event(self.degrade, a, b, 1.0 / f.factor))
            p.faults.append(FaultRecord(now, f.kind, target, 0, 0, recovered_s=f.duration_s or 0.0))
            return
        if f.kind == "gpu":
            i = _index(target[1:])
            if target.startswith("r") and i is not None:  # a replica not (or no longer, or never) there: nothing
                victims = [i] if i < len(reps) and p.alive(i) else []
            else:
                pool = [j for j in alive if not target or (target.startswith("g") and reps[j].group == i)]
                victims = [pool[int(p.rng.integers(len(pool)))]] if pool else []
        elif f.kind == "node":
            gi = _index(target[1:]) if target.startswith("g") else None
            nodes = [nid for nid, m in p.nodes.items() if any(p.alive(j) for j in m)
                     and (gi is None or p.nodes_group[nid] == gi)]
            if nodes:
                nid = nodes[int(p.rng.integers(len(nodes)))]
                victims = [j for j in p.nodes[nid] if p.alive(j)]
        elif f.kind == "zone":
            p.down_zones.add(target)
            victims = [i for i in alive if reps[i].zone == target]
        elif f.kind == "region":
            p.down_regions.add(target)
            victims = [i for i in alive if p.built.fleet.regions[reps[i].region].name == target]
        models = tuple(sorted({reps[i].model_index for i in victims}))
        before = p.ready_of(models)
        held = 0
        for i in victims:
            held += sim.fail(i, detect_s=p.spec.health_check_s)
        p.faults.append(FaultRecord(now, f.kind, target or "random", len(victims), held, models, before))
        p.events.append((now, f"{f.kind} fault {target}".strip()))
        if f.kind in ("zone", "region") and f.duration_s:
            sim.at(now + f.duration_s, event(self.recover, f))
        p.reconcile()  # replace what died where zones are up (like a ReplicaSet controller)

    def recover(self, f) -> None:
        p = self.p
        (p.down_zones if f.kind == "zone" else p.down_regions).discard(f.target)
        p.events.append((p.sim.now, f"{f.kind} {f.target} back"))
        p.reconcile()

    def degrade(self, a: int, b: int, factor: float) -> None:
        """Links a-b and b-a: round trip x ``factor``, bandwidth / ``factor``."""
        sim = self.p.sim
        for x, y in ((a, b), (b, a)):
            rtt, bw = sim.link(x, y)
            sim.set_link(x, y, rtt * factor, None if bw is None else bw / factor)
