"""The platform layer on top of the simulator: scaling groups, cold starts with a node-local model cache,
spot capacity from real traces with preemption notices, a fault schedule with health-checked failover, tenants'
rate limits and quotas, overload admission control, cost accounting and monitoring. docs/platform.md.

It only uses the simulator's public run-time API (``at``, ``add_replica``, ``drain``, ``preemption_notice``,
``fail``) and answers nothing itself: every ``epoch_s`` it returns a "scale" decision point whose payload is a
:class:`~fleetwise.control.protocols.ScaleObs`; a heuristic scaler (through the Controller) or the RL
environment ``fleetwise/Autoscaling-v0`` answers it with target replicas per group.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetwise.control.protocols import DecisionPoint, GroupState, ScaleObs
from fleetwise.errors import InputError
from fleetwise.limits import MAX_PERIODIC_EVENTS
from fleetwise.platform.admission import Admission
from fleetwise.platform.faults import FaultInjector, FaultRecord, check_fault_targets
from fleetwise.scenario import STORAGE_GBPS, Built, PlatformSpec
from fleetwise.sim.records import COMPLETED
from fleetwise.sim.simulator import event


@dataclass
class Group:
    """One scaling group: a deployment (model x GPU x region/zone x pool) whose replica count the scaler sets."""

    index: int
    key: str
    model: str
    model_index: int
    gpu: str
    region: int
    region_name: str
    zone: str
    pool: str
    cloud: str
    template: dict
    min_replicas: int
    max_replicas: int
    target: int
    new_node_s: float  # node provisioning + weight load from the storage tier
    cached_s: float  # weight load from the node's host-memory copy (node-local model cache)
    slots_per_node: int
    price_usd_per_hour: float  # per replica
    capacity_rps: float = 0.0
    slo_ttft_s: float = math.nan
    slo_tpot_s: float = math.nan
    spot: Any = None  # SpotTrace
    spot_capacity: int = 0
    spot_offset_s: float = 0.0
    available: int | None = None
    notice_s: float = 0.0
    replicas: list[int] = field(default_factory=list)
    scale_events: int = 0
    cold_starts: int = 0
    cache_starts: int = 0
    preemptions: int = 0


class Platform:
    """Attach the platform layer to a built scenario (``fleetwise.scenario.build``) and run it.

    ``scaler``: a Scaler (``scale(ScaleObs) -> {group key: replicas}``), or None when someone else answers the
    "scale" decision points (the RL environment)."""

    def __init__(self, built: Built, scaler=None, *, spec: PlatformSpec | None = None, seed: int = 0,
                 monitor: bool = True):
        from fleetwise.catalog import get_gpu
        from fleetwise.perf.capacity import capacity_rps
        from fleetwise.platform import spot as spotmod
        from fleetwise.workload.slo import get_slo

        sc = built.scenario
        self.built = built
        self.spec = spec = spec or sc.platform or PlatformSpec()
        self.scaler = scaler
        self.sim = sim = built.sim
        o = sim.options
        o.hold_unroutable = True
        o.retry_backoff_s = spec.retry_backoff_s
        o.retry_backoff_max_s = spec.retry_backoff_max_s
        if sim.completions is None:
            sim.completions = []
        self.rng = np.random.default_rng(np.random.SeedSequence([int(seed), 8]))
        w = sim.workload
        n = sim.n
        last = float(w.arrival_s[-1]) if n else 0.0
        self.end_s = float(spec.duration_s) if spec.duration_s is not None else last
        self.horizon_s = self.end_s + spec.drain_s
        for name in ("epoch_s", "monitor_s"):  # periodic events over the horizon: bounded up front
            if self.horizon_s / getattr(spec, name) > MAX_PERIODIC_EVENTS:
                raise InputError(f"platform.{name}: {getattr(spec, name):g} s over a {self.horizon_s:.0f} s horizon is "
                                 f"{self.horizon_s / getattr(spec, name):.3g} events, above the limit of "
                                 f"{MAX_PERIODIC_EVENTS:,} (docs/limits.md)")
        o.max_time_s = self.horizon_s
        fleet = built.fleet
        models = built.models or []
        # per model: typical request (means) and its dominant SLO class, for capacity estimates
        model_of = np.frombuffer(sim.model_of, dtype=np.int64)
        self.groups: list[Group] = []
        for di, d in enumerate(sc.deployments):
            tm = built.templates[di]
            perf = tm["perf"]
            mi = tm["model_index"]
            reg = fleet.regions[tm["region"]]
            cloud = d.cloud or reg.cloud
            gpu = get_gpu(d.gpu)
            zone = d.zone or f"{reg.name}-a"
            key = f"{models[mi]}/{gpu.name}/{zone}/{d.pool}"
            if any(g.key == key for g in self.groups):
                key = f"{key}#{di}"
            mask = model_of == mi
            ptok = float(w.prompt_tokens[mask].mean()) if mask.any() else 512.0
            otok = float(w.output_tokens[mask].mean()) if mask.any() else 128.0
            if mask.any():
                cls = np.bincount(w.slo_class[mask], minlength=len(w.slo_classes))
                slo = get_slo(w.slo_classes[int(np.argmax(cls))])
            else:
                slo = get_slo("standard")
            maxr = d.max_replicas if d.max_replicas is not None else max(d.replicas, 1) * 4
            g = Group(
                index=di, key=key, model=models[mi], model_index=mi, gpu=gpu.name, region=tm["region"],
                region_name=reg.name, zone=zone, pool=d.pool, cloud=cloud, template=tm,
                min_replicas=d.min_replicas, max_replicas=maxr, target=d.replicas,
                new_node_s=d.provision_s + perf.load_time_s(STORAGE_GBPS[d.storage]),
                cached_s=perf.load_time_s(spec.host_load_gbps),
                slots_per_node=max(1, gpu.gpus_per_node // perf.num_gpus),
                price_usd_per_hour=tm["price_usd_per_gpu_hour"] * perf.num_gpus,
                slo_ttft_s=slo.ttft_s, slo_tpot_s=slo.tpot_s,
            )
            g.capacity_rps = capacity_rps(perf, ptok, otok, slo.ttft_s, slo.tpot_s,
                                          gpu_memory_utilization=tm["gpu_memory_utilization"])
            if d.pool == "spot":
                name = d.spot_trace
                if name == "auto":
                    name = spotmod.spot_trace_for_zone(zone)
                    if name is None:
                        raise InputError(f"deployments[{di}]: no spot trace for zone {zone!r}; name one in spot_trace")
                if name is not None:
                    g.spot = spotmod.load_spot_trace(name)
                    g.spot_capacity = maxr
                    g.spot_offset_s = d.spot_offset_s
                    g.available = g.spot.available(0.0, maxr, d.spot_offset_s)
                notice = spec.notice_s
                g.notice_s = float(notice) if notice is not None else spotmod.PREEMPTION_NOTICE_S.get(cloud, 30.0)
            self.groups.append(g)
        self.by_key = {g.key: g for g in self.groups}
        check_fault_targets(spec.faults, [g.zone for g in self.groups], len(self.groups),
                            [r.name for r in fleet.regions])
        self.model_groups: dict[int, list[Group]] = {}
        for g in self.groups:
            self.model_groups.setdefault(g.model_index, []).append(g)
        # nodes: replicas of a group packed gpus_per_node / gpus-per-replica to a node; the node keeps one host
        # copy of the weights while any replica lives on it
        self.nodes: dict[int, list[int]] = {}
        self.node_of: dict[int, int] = {}
        self._next_node = 0
        for rep in sim.replicas:
            g = self.groups[rep.group]
            g.replicas.append(rep.index)
            self._place(g, rep.index)
        self.down_zones: set[str] = set()
        self.down_regions: set[str] = set()
        self.faults: list[FaultRecord] = []
        self.fault_injector = FaultInjector(self)
        self.events: list[tuple[float, str]] = []
        self.flaps = 0  # scaling oscillations (direction reversals of a model's total target)
        self.flaps_by_model: dict[str, int] = {g.model: 0 for g in self.groups}  # ... per model (name)
        self.flap_log: list[tuple[float, str]] = []  # ... each one: (time, model name)
        self._last_dir: dict[int, int] = {}
        self.spot_preemptions = 0
        self.peak_host_copies = 0
        # epoch bookkeeping
        self._busy_prev: dict[int, float] = {}
        self._arr_prev = list(sim.arrived)
        self._hist: dict[int, deque] = {m: deque(maxlen=240) for m in self.model_groups}
        self._seen = 0
        self._mon_seen = 0
        self._mon_arr = list(sim.arrived)
        self._mon_t = 0.0
        self.admission = Admission(self, spec)
        if self.admission.active:
            sim.admission = self.admission
        self.monitor = None
        if monitor:
            from fleetwise.platform.monitor import Monitor

            self.monitor = Monitor(interval_s=spec.monitor_s)
            for g in self.groups:
                self.monitor.register(g.key, model=g.model, region=g.region_name, zone=g.zone, pool=g.pool)
        # timers: scaling epochs, monitoring, faults, spot capacity changes
        sim.at(spec.epoch_s, self._epoch)
        sim.at(0.0, self._sample)
        for k, f in enumerate(spec.faults):
            if f.at_s < self.horizon_s:
                sim.at(f.at_s, event(self.fault_injector.inject, f, k))
        for g in self.groups:
            if g.spot is not None:
                for t, avail in g.spot.changes(0.0, self.horizon_s, g.spot_capacity, g.spot_offset_s):
                    sim.at(t, event(self._spot_change, g, avail))
        if any(g.available is not None and g.available < len(g.replicas) for g in self.groups):
            sim.at(0.0, event(self.reconcile))

    # ------------------------------------------------------------------ replica lifecycle
    def alive(self, i: int) -> bool:
        r = self.sim.replicas[i]
        return r.stop_s is None and not r.failed

    def _place(self, g: Group, i: int) -> bool:
        """Put replica ``i`` on a node of its group with a free slot (True: that node holds the weights)."""
        for nid, members in self.nodes.items():
            if self.nodes_group[nid] == g.index:
                live = [j for j in members if self.alive(j)]
                self.nodes[nid] = live
                if len(live) < g.slots_per_node and live:
                    live.append(i)
                    self.node_of[i] = nid
                    return True
        nid = self._next_node
        self._next_node += 1
        self.nodes[nid] = [i]
        self.nodes_group[nid] = g.index
        self.node_of[i] = nid
        return False

    @property
    def nodes_group(self) -> dict[int, int]:
        if not hasattr(self, "_nodes_group"):
            self._nodes_group: dict[int, int] = {}
        return self._nodes_group

    def _start_replica(self, g: Group) -> int:
        from fleetwise.sim.build import make_replica

        sim = self.sim
        now = sim.now
        idx = len(sim.replicas)
        # a node of the group with a free slot and the weights in host memory: load from there (no provisioning)
        cached = self._place(g, idx) and self.spec.node_cache
        load = g.cached_s if cached else g.new_node_s
        if cached:
            g.cache_starts += 1
        else:
            g.cold_starts += 1
        rep = make_replica(idx, name=f"{g.key}#{idx}", start_s=now, ready_s=now + load, **g.template)
        rep.group, rep.zone, rep.pool = g.index, g.zone, g.pool
        sim.add_replica(rep)
        g.replicas.append(idx)
        return idx

    def _live(self, g: Group) -> list[int]:
        reps = self.sim.replicas
        return [i for i in g.replicas if reps[i].stop_s is None and not reps[i].failed and not reps[i].draining]

    def _usable(self, g: Group) -> bool:
        return g.zone not in self.down_zones and g.region_name not in self.down_regions

    def reconcile(self) -> None:
        """Bring every group to its target: start replicas (where the zone is up and spot capacity allows) or
        drain the surplus (starting ones first, then the ready ones with the fewest requests: consolidation)."""
        sim = self.sim
        reps = sim.replicas
        now = sim.now
        for g in self.groups:
            want = min(max(g.target, g.min_replicas), g.max_replicas)
            if g.available is not None:
                want = min(want, g.available)
            live = self._live(g)
            if len(live) < want and self._usable(g):
                for _ in range(want - len(live)):
                    self._start_replica(g)
            elif len(live) > want:
                order = sorted(live, key=lambda i: (now >= reps[i].ready_s, reps[i].outstanding, -i))
                for i in order[: len(live) - want]:
                    sim.drain(i)
        copies = sum(1 for m in self.nodes.values() if any(self.alive(j) for j in m))
        self.peak_host_copies = max(self.peak_host_copies, copies)

    def check_targets(self, targets: dict[str, int] | None) -> list[tuple[Any, int]]:
        """A scaler's answer as [(group, replicas)], or one InputError line naming what is wrong (an unknown group,
        a number of replicas that is not a whole number >= 0). Changes nothing."""
        if targets is not None and not hasattr(targets, "items"):
            raise InputError(f"scaler answered {targets!r:.60}; expected a mapping of group keys to replicas")
        # every answer checked before any is applied: a refused one changes nothing, and the decision stays pending
        # (Simulator.apply), so an environment's episode goes on (it was stuck: "no decision pending")
        checked = []
        for key, v in (targets or {}).items():
            g = self.by_key.get(key)
            if g is None:
                raise InputError(f"scaler answered for unknown group {key!r}; groups: {', '.join(self.by_key)}")
            if isinstance(v, bool) or not isinstance(v, (int, np.integer, float, np.floating)) or v != v \
                    or v in (math.inf, -math.inf) or int(v) != v:
                raise InputError(f"scaler answered {v!r} replicas for group {key!r}; expected a whole number >= 0")
            if v < 0:
                raise InputError(f"scaler answered {int(v)} replicas for group {key!r}; expected >= 0")
            checked.append((g, int(v)))
        return checked

    def set_targets(self, targets: dict[str, int] | None) -> None:
        """Apply a scaler's answer: new targets (clamped to the group's limits), then reconcile."""
        before = {m: sum(g.target for g in gs) for m, gs in self.model_groups.items()}
        for g, v in self.check_targets(targets):
            v = min(max(v, g.min_replicas), g.max_replicas)
            if v != g.target:
                g.scale_events += 1
                g.target = v
        # oscillations: a model's total target reversing direction (capacity moved between pools is not one)
        for m, gs in self.model_groups.items():
            after = sum(g.target for g in gs)
            if after != before[m]:
                d = 1 if after > before[m] else -1
                last = self._last_dir.get(m, 0)
                if last and d != last:
                    self.flaps += 1
                    self.flaps_by_model[gs[0].model] += 1
                    self.flap_log.append((self.sim.now, gs[0].model))
                self._last_dir[m] = d
        self.reconcile()

    # ------------------------------------------------------------------ observation
    def model_queue(self, m: int) -> tuple[int, int]:
        """(ready replicas, waiting + held requests) of model ``m``."""
        reps = self.sim.replicas
        ready = waiting = 0
        for i in self.sim.candidates[m] if m < len(self.sim.candidates) else ():
            ready += 1
            waiting += len(reps[i].waiting)
        if m < len(self.sim.held):
            waiting += len(self.sim.held[m])
        return ready, waiting

    def observe(self) -> ScaleObs:
        sim = self.sim
        reps = sim.replicas
        now = sim.now
        ep = self.spec.epoch_s
        # percentiles of the last epoch's completions, per group
        new = sim.completions[self._seen:]
        self._seen = len(sim.completions)
        ttft: dict[int, list[float]] = {}
        tpot: dict[int, list[float]] = {}
        for rid in new:
            if sim.status[rid] != COMPLETED:
                continue
            gi = reps[sim.replica_of[rid]].group
            ttft.setdefault(gi, []).append(sim.first_token_s[rid] - sim.arrival[rid])
            o = sim.output[rid]
            if o > 1:
                tpot.setdefault(gi, []).append((sim.completion_s[rid] - sim.first_token_s[rid]) / (o - 1))
        arr = {}
        for m, hist in self._hist.items():
            a = (sim.arrived[m] - self._arr_prev[m]) / ep if m < len(sim.arrived) else 0.0
            arr[m] = (a, tuple(hist))
            hist.append(a)
        self._arr_prev = list(sim.arrived)
        out = []
        for g in self.groups:
            ready, starting, draining, waiting, running, kv, busy = self._group_now(g, ep, "e")
            a, hist = arr.get(g.model_index, (0.0, ()))
            tt, tp = ttft.get(g.index), tpot.get(g.index)
            out.append(GroupState(
                key=g.key, model=g.model, gpu=g.gpu, region=g.region_name, zone=g.zone, pool=g.pool, ready=ready,
                starting=starting, draining=draining, min_replicas=g.min_replicas, max_replicas=g.max_replicas,
                waiting=waiting, running=running, kv_used=kv, busy=busy, arrivals_rps=a, history_rps=hist,
                ttft_p90_s=float(np.percentile(tt, 90)) if tt else math.nan,
                tpot_p90_s=float(np.percentile(tp, 90)) if tp else math.nan,
                slo_ttft_s=g.slo_ttft_s, slo_tpot_s=g.slo_tpot_s, capacity_rps=g.capacity_rps,
                price_usd_per_hour=g.price_usd_per_hour, cold_start_s=g.new_node_s,
                available=None if g.available is None else (g.available if self._usable(g) else 0),
            ))
        return ScaleObs(time_s=now, epoch_s=ep, groups=out)

    def _group_now(self, g: Group, dt: float, tag: str) -> tuple[int, int, int, int, int, float, float]:
        """(ready, starting, draining, waiting, running, mean KV use, mean GPU busy over the last ``dt`` seconds)
        of a group's live replicas; waiting includes, on the model's first group, requests held for a replica.
        ``tag`` keeps one busy-time baseline per caller (scaling epochs, monitoring)."""
        sim = self.sim
        reps = sim.replicas
        now = sim.now
        prev = self._busy_prev
        ready = starting = draining = waiting = running = 0
        kv = busy = 0.0
        for i in g.replicas:
            r = reps[i]
            if r.stop_s is not None or r.failed:
                continue
            b = r.busy_s - prev.get((tag, i), 0.0)
            prev[(tag, i)] = r.busy_s
            if r.draining:
                draining += 1
            elif now < r.ready_s:
                starting += 1
            else:
                ready += 1
                kv += r.kv_used_fraction(now)
                busy += min(1.0, b / dt)
            waiting += len(r.waiting)
            running += r.num_running()
        if self.model_groups[g.model_index][0] is g:
            waiting += len(sim.held[g.model_index])
        return ready, starting, draining, waiting, running, kv / ready if ready else 0.0, \
            busy / ready if ready else 0.0

    def done(self) -> bool:
        sim = self.sim
        return sim.ended >= sim.n and sim.now >= self.end_s

    # ------------------------------------------------------------------ timers
    def _epoch(self, sim) -> DecisionPoint | None:
        self.check_recovery()
        if self.done():
            return None
        sim.at(sim.now + self.spec.epoch_s, self._epoch)
        obs = self.observe()
        return DecisionPoint("scale", sim.now, sim, payload=obs, handler=self.set_targets)

    def _sample(self, sim) -> None:
        self.check_recovery()
        if self.monitor is not None:
            self._record()
        if not self.done():
            sim.at(sim.now + self.spec.monitor_s, self._sample)

    def _record(self, at: float | None = None) -> None:
        """One monitoring sample of every group, at ``at`` (default: now; the last one: the billing window's end)."""
        sim = self.sim
        reps = sim.replicas
        now = sim.now if at is None else at
        dt = max(now - self._mon_t, 1e-9)
        new = sim.completions[self._mon_seen:]
        self._mon_seen = len(sim.completions)
        done = [0] * len(self.groups)
        rej = [0] * len(self.groups)
        tt: dict[int, list[float]] = {}
        for rid in new:
            ri = sim.replica_of[rid]
            gi = reps[ri].group if ri >= 0 else self.model_groups.get(sim.model_of[rid], self.groups[:1])[0].index
            if sim.status[rid] == COMPLETED:
                done[gi] += 1
                tt.setdefault(gi, []).append(sim.first_token_s[rid] - sim.arrival[rid])
            else:
                rej[gi] += 1
        cols: dict[str, list] = {k: [] for k in ("replicas_ready", "replicas_starting", "replicas_draining", "waiting",
                                                 "running", "kv_used", "busy", "arrivals_rps", "completed",
                                                 "rejected", "ttft_p90_s", "cost_usd", "spot_available")}
        bill_t = now  # the billing window closes at end_s, or at the last request's end if later (finish): a sample
        # past it, once every request has ended, bills no further (it showed an hour more than the summary)
        if now > self.end_s and len(sim.completions) >= sim.n:
            ends = np.frombuffer(sim.completion_s, dtype=np.float64)
            bill_t = min(now, max(self.end_s, float(np.nanmax(ends)) if not np.isnan(ends).all() else 0.0))
        for g in self.groups:
            ready, starting, draining, waiting, running, kv, busy = self._group_now(g, dt, "m")
            m = g.model_index
            cost = sum(reps[i].gpu_cost_usd(reps[i].active_s(bill_t)) for i in g.replicas)
            t = tt.get(g.index)
            cols["replicas_ready"].append(ready)
            cols["replicas_starting"].append(starting)
            cols["replicas_draining"].append(draining)
            cols["waiting"].append(waiting)
            cols["running"].append(running)
            cols["kv_used"].append(kv)
            cols["busy"].append(busy)
            cols["arrivals_rps"].append((sim.arrived[m] - self._mon_arr[m]) / dt if m < len(sim.arrived) else 0.0)
            cols["completed"].append(done[g.index])
            cols["rejected"].append(rej[g.index])
            cols["ttft_p90_s"].append(float(np.percentile(t, 90)) if t else math.nan)
            cols["cost_usd"].append(cost)
            cols["spot_available"].append(-1 if g.available is None else g.available)
        self._mon_arr = list(sim.arrived)
        self._mon_t = now
        self.monitor.add_many(now, [g.key for g in self.groups], **cols)

    def _spot_change(self, g: Group, avail: int) -> None:
        sim = self.sim
        if self.done():  # after the window: nothing runs any more, nothing to preempt or start
            return
        g.available = avail
        live = [i for i in self._live(g)]
        extra = len(live) - avail
        if extra > 0:  # the cloud takes capacity back: the newest replicas get the interruption notice
            self.events.append((sim.now, f"spot -{extra} {g.zone}"))
            for i in sorted(live, reverse=True)[:extra]:
                sim.preemption_notice(i, g.notice_s, migrate=self.spec.migrate)
                g.preemptions += 1
                self.spot_preemptions += 1
        self.reconcile()

    def ready_of(self, models: tuple[int, ...]) -> int:
        reps = self.sim.replicas
        now = self.sim.now
        return sum(1 for m in models for g in self.model_groups[m] for i in g.replicas
                   if reps[i].stop_s is None and not reps[i].failed and not reps[i].draining and now >= reps[i].ready_s)

    def wanted(self, models: tuple[int, ...]) -> int:
        """Replicas the scaler wants now for ``models`` where they can run (zone up, spot available)."""
        n = 0
        for m in models:
            for g in self.model_groups[m]:
                if self._usable(g):
                    w = min(max(g.target, g.min_replicas), g.max_replicas)
                    n += w if g.available is None else min(w, g.available)
        return n

    # ------------------------------------------------------------------ running and results
    def run(self, controller=None, progress=None):
        """Run to the end (every request completed or explicitly rejected); return the simulator's records."""
        from fleetwise.control.controller import Controller

        if controller is None:
            controller = self.built.controller()
        if controller.scaler is None:
            controller = Controller(router=controller.router, batcher=controller.batcher, scaler=self.scaler)
        if controller.scaler is None:
            raise InputError("platform: no scaler (give one, or answer the 'scale' decision points yourself)")
        records = self.sim.run(controller, progress=progress)
        self.finish()
        return records

    def finish(self) -> None:
        """Close the billing window: replicas still running stop at the end of the window (or now, if later)."""
        sim = self.sim
        # the window ends at end_s, or when the last request ended if later (not at a timer that fired after)
        done = np.frombuffer(sim.completion_s, dtype=np.float64)
        last = float(np.nanmax(done)) if sim.n and not np.isnan(done).all() else 0.0
        end = max(self.end_s, min(last, sim.now))
        # a last monitoring sample at the end: a sample due after the horizon never fires, so the export's counts
        # stopped at the last one (109 of 199 completed with monitor_s 30; none at all with monitor_s 1000). Taken
        # at the billing window's end, before the window is closed below: the cumulative cost column never
        # decreases, and its last value is the summary's cost_gpu_usd (taken at a timer's time after the end, an
        # hour past a platform day, it billed that hour too: $862 in the plot against $827 in the summary)
        at = max(min(sim.now, end), self._mon_t)
        if self.monitor is not None and (at > self._mon_t or self._mon_seen < len(sim.completions)):
            self._record(at)
        for r in sim.replicas:
            if r.stop_s is None:
                r.stop_s = max(end, r.start_s)
            elif r.stop_s > end and r.start_s <= end:
                r.stop_s = end
        self.check_recovery()

    def check_recovery(self) -> None:
        self.fault_injector.check_recovery()

    def results(self, records) -> dict[str, Any]:
        """The summary (fleetwise.metrics.summarize) plus the platform's own figures (``platform.results``)."""
        from fleetwise.platform.results import platform_results

        return platform_results(self, records)

    def cost_breakdown(self) -> dict[str, dict[str, float]]:
        """GPU + energy cost (USD) by model, region, pool and tenant (``platform.results``)."""
        from fleetwise.platform.results import cost_breakdown

        return cost_breakdown(self)
