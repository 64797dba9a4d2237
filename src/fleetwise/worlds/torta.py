"""TORTA's world: compressed days of multi-region demand on heterogeneous GPU servers (docs/torta.md).

A *compressed day*: 24 planning slots of ``slot_s`` simulated seconds, one per hour of the day. Each region's
demand follows its own local time of day (ServeGen's hourly rate profile of three Alibaba Model Studio models,
shifted by the region's UTC offset) with request lengths replayed from the Azure conversation / code traces,
plus random bursts. Each region has a few heterogeneous GPU servers; each server holds one of three models and
pays ``reload_s`` (weights / NVMe bandwidth) to switch (``Simulator.stall``).

``Day`` runs one day on the simulator with a region planner and a micro allocator (``fleetwise.policies
.planners``), which see it as a ``PlanView``. ``fleetwise.envs.torta.TortaEnv`` is the macro layer as a
Gymnasium environment over the same ``Day``.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from fleetwise.control.views import HOURS_PER_DAY, LONG_TOKENS, SlotObs
from fleetwise.errors import InputError
from fleetwise.workload.request import Workload

HOURS = HOURS_PER_DAY
# SlotObs.long_share: the share of long requests among those routed in the last this many slots (two: one slot's
# share swings at the quiet hours; over one slot the guard also split Mooncake days between the rule and the
# policy, docs/torta.md "A guard on the share of long requests")
LONG_SHARE_SLOTS = 2
TOPOLOGIES = ("backbone", "grid", "random_geometric", "ring")
# real cloud regions for the continental backbone (each with its real price, carbon, UTC offset, RTTs)
BACKBONE = ("us-east-1", "us-west-2", "sa-east-1", "eu-central-1", "ap-south-1", "ap-northeast-1",
            "ap-southeast-1", "australiaeast")
# heterogeneous servers: region k gets SERVER_MIX[k % len]; one GPU each, Llama-3-8B-class models
SERVER_MIX = (("H100-80GB", "L4", "L4"), ("A100-80GB", "L40S"), ("L40S", "L4", "L4"), ("A100-80GB", "L4"),
              ("H100-80GB", "L40S", "L4"))


@dataclass(frozen=True)
class ModelType:
    name: str
    lengths: str  # trace alias for (prompt, output) pairs
    profile: str  # ServeGen model whose hourly rate profile shapes this type's demand
    share: float  # share of the total demand


@dataclass(frozen=True)
class TortaConfig:
    topology: str = "backbone"  # one of TOPOLOGIES, or a fleet YAML/JSON file (docs/fleet.md)
    model: str = "Llama-3-8B"  # performance model of every type (all three are 8B-class models)
    types: tuple[ModelType, ...] = (
        ModelType("chat", "azure-conv", "m-large", 0.5),
        ModelType("code", "azure-code", "m-mid", 0.3),
        ModelType("assist", "azure-conv", "m-small", 0.2),
    )
    slot_s: float = 6.0  # simulated seconds per planning slot (= one hour of the day)
    load: float = 0.55  # mean demand / fleet service capacity
    burst_prob: float = 0.08  # per region and slot: a burst of burst_factor x the rate
    burst_factor: float = 3.0
    reload_s: float = 3.2  # switch: 16 GB of weights at 5 GB/s (local NVMe, as the simulator's cold start)
    max_total_tokens: int = 4096
    train_fraction: float = 0.7  # of each length trace's rows and of the ServeGen days; the rest is held out
    drain_s: float = 60.0
    reg: float = 0.05  # entropic regularisation of Sinkhorn (costs are normalised to [0, 1])
    exact_ot: bool = False  # ot.emd instead of ot.sinkhorn
    w_latency: float = 1.0  # OT cost terms (normalised)
    w_migration: float = 0.5
    w_congestion: float = 1.0
    temporal: bool = True  # observation with demand history and time of day (False: reactive)
    history: int = 3
    seed_topology: int = 7

    def __post_init__(self) -> None:
        """Values a day cannot run with, refused naming the field (slot_s=0 divided by zero, load=-1 failed in
        numpy's Poisson draw, history=0 changed the observation's length after reset)."""
        def bad(field: str, what: str) -> ValueError:
            return ValueError(f"TortaConfig.{field} = {getattr(self, field)!r}: expected {what}")

        for k in ("slot_s", "load", "burst_factor", "reg"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise bad(k, "a finite number > 0")
        for k in ("burst_prob", "reload_s", "drain_s", "w_latency", "w_migration", "w_congestion"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise bad(k, "a finite number >= 0")
        if self.burst_prob > 1:
            raise bad("burst_prob", "a probability in [0, 1]")
        if not 0 < self.train_fraction < 1:
            raise bad("train_fraction", "in (0, 1)")
        if not (isinstance(self.history, numbers.Integral) and self.history >= 1):
            raise bad("history", "an integer >= 1")
        if not (isinstance(self.max_total_tokens, numbers.Integral) and self.max_total_tokens >= 2):
            raise bad("max_total_tokens", "an integer >= 2")
        # upper bounds: load=1e6 drew billions of requests (9 GB before it was stopped), slot_s=1e7 a MemoryError
        for k, hi in (("load", 10.0), ("burst_factor", 100.0), ("slot_s", 3600.0), ("drain_s", 86_400.0),
                      ("reload_s", 3600.0)):
            if getattr(self, k) > hi:
                raise bad(k, f"at most {hi:g}")
        if not (isinstance(self.history, numbers.Integral) and self.history <= 24):
            raise bad("history", "at most 24 slots")
        if not self.types:
            raise bad("types", "at least one model type")
        for t in self.types:  # (a share of 0 divided by zero, -1 failed in numpy's Poisson draw)
            if not (isinstance(t.share, (int, float)) and math.isfinite(t.share) and t.share > 0):
                raise ValueError(f"TortaConfig.types: {t.name!r} share {t.share!r}: expected a number > 0")


# ------------------------------------------------------------------------------------------- topologies
def make_fleet(cfg: TortaConfig):
    from fleetwise.fleet import continental_backbone, grid, random_geometric, ring

    t = cfg.topology
    if t == "backbone":
        return continental_backbone(BACKBONE)
    if t == "grid":
        return grid(3, 3, spacing_km=1200)
    if t == "random_geometric":
        return random_geometric(8, radius=0.45, rng=np.random.default_rng(cfg.seed_topology), side_km=6000)
    if t == "ring":
        return ring(6, spacing_km=2000)
    return load_topology_file(t)


def load_topology_file(path: str):
    """A fleet from a YAML/JSON file (``fleet:`` mapping or the mapping itself); errors name the file."""
    from fleetwise.fleet import build_fleet
    from fleetwise.yamlio import load_file

    p = Path(path)
    if not p.is_file():
        raise InputError(f"topology {path!r}: not one of {', '.join(TOPOLOGIES)} and no such file")
    data = load_file(p, "topology")  # one-line errors: not UTF-8, invalid YAML/JSON, a key given twice
    if isinstance(data, dict) and "fleet" in data:
        data = data["fleet"]
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping with a fleet topology, got {type(data).__name__}")
    try:
        fleet = build_fleet(data, rng=np.random.default_rng(0))
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    if len(fleet.names) < 2:
        raise InputError(f"{path}: a TORTA topology needs at least 2 regions, got {len(fleet.names)}")
    if not fleet.is_connected:
        raise InputError(f"{path}: the regions are not all connected")
    return fleet


# ------------------------------------------------------------------------------------------- workload
@functools.lru_cache(maxsize=8)
def _lengths(alias: str, max_total: int) -> tuple[np.ndarray, np.ndarray]:
    from fleetwise.workload.spec import load_trace
    from fleetwise.workload.synthetic import clip_total_tokens

    w = load_trace(alias)
    p, o = clip_total_tokens(w.prompt_tokens, w.output_tokens, max_total)
    return np.asarray(p), np.asarray(o)


@functools.lru_cache(maxsize=8)
def hourly_profiles(model: str) -> np.ndarray:
    """(days, 24) hourly rate of a ServeGen model (sum over clients of its 10-minute windows), each day / its mean."""
    from fleetwise.data import data_path
    from fleetwise.workload.readers import read_servegen

    r = read_servegen(data_path("servegen-alibaba-modelstudio"), model=model)
    tot = np.asarray(r.rate, float).sum(0)
    days = len(tot) // 144
    prof = tot[: days * 144].reshape(days, 24, 6).mean(2)
    ok = prof.min(1) > 0  # days with a gap in the data are left out
    prof = prof[ok] if ok.any() else prof + 1e-3
    return prof / prof.mean(1, keepdims=True)


def torta_workload(cfg: TortaConfig, fleet, capacity_rps: float, rng: np.random.Generator, held_out: bool,
                   trace: Workload | None = None, load: float | None = None, report: list | None = None) -> Workload:
    """One compressed day. Rate of type m at region r in local hour h: ``load x capacity x share_m x
    weight_r x profile_m(h)``; 10-minute resolution (profile interpolated), plus bursts; Poisson within windows.

    A user's ``trace`` (fleetwise.workload.adapt) fills the day instead: clipped to ``max_total_tokens``, a window
    (or block bootstrap) of it drawn per seed, its rate ``load`` x the fleet's capacity for the trace's mean
    request (the capacity the synthetic days use, ``capacity_rps``, scaled by ``MEAN_TOKENS`` / the trace's mean
    prompt + output tokens; ``load=None``: the trace's own rate); each request goes to a region drawn by the
    day's regional weights and keeps its time as that region's local time; model types by share. The fit's
    AdaptReport is appended to ``report``."""
    n = len(fleet.names)
    offs = np.asarray(fleet.utc_offset_h, float)
    weight = 0.5 + rng.random(n)  # regional demand weights (population), drawn per day
    weight /= weight.sum()
    win = 6 * HOURS  # 10-minute windows
    dt = cfg.slot_s / 6.0
    burst = np.where(rng.random((n, HOURS)) < cfg.burst_prob, cfg.burst_factor, 1.0)
    arr, org, mod, pr, out = [], [], [], [], []
    if trace is not None:  # user trace, fitted to the fleet: its arrivals over the day, each region at local time
        from fleetwise.workload.adapt import TraceFit, adapt_trace

        def capacity(p: float, o: float) -> tuple[float, str]:
            return capacity_rps * MEAN_TOKENS / (p + o), "the capacity of the synthetic days, for this mean request"

        fit = TraceFit(load=load, max_total_tokens=cfg.max_total_tokens, duration_s=HOURS * cfg.slot_s)
        tw, rep = adapt_trace(trace, rng, fit, capacity=capacity)
        r_of = rng.choice(n, size=len(tw), p=weight)
        hloc = tw.arrival_s / cfg.slot_s  # hours of the day on the trace's (fitted) clock, local at its region
        arr.append(((hloc - offs[r_of]) % HOURS) * cfg.slot_s)
        org.append(r_of)
        m_of = rng.choice(len(cfg.types), len(tw), p=_shares(cfg))
        mod.append(m_of)
        pr.append(tw.prompt_tokens)
        out.append(tw.output_tokens)
        rep.classes = {mt.name: float((m_of == i).mean()) for i, mt in enumerate(cfg.types)}
        rep.class_rule = "model type drawn by share; region by the day's regional weights"
        if report is not None:
            report.append(rep)
    else:
        for m, mt in enumerate(cfg.types):
            prof = hourly_profiles(mt.profile)
            ntrain = max(1, int(round(cfg.train_fraction * len(prof))))
            days = np.arange(ntrain, len(prof)) if held_out and ntrain < len(prof) else np.arange(ntrain)
            day = prof[rng.choice(days)]
            p_all, o_all = _lengths(mt.lengths, cfg.max_total_tokens)
            cut = int(cfg.train_fraction * len(p_all))
            lo, hi = (cut, len(p_all)) if held_out else (0, cut)
            for r in range(n):
                hours_utc = (np.arange(win) + 0.5) / 6.0
                hloc = (hours_utc + offs[r]) % HOURS
                rate = np.interp(hloc, np.arange(HOURS) + 0.5, day, period=HOURS)
                rate = rate * burst[r, (np.arange(win) // 6)]
                lam = cfg.load * capacity_rps * mt.share / _shares(cfg).sum() * weight[r] * rate
                cnt = rng.poisson(lam * dt)
                t = (np.repeat(np.arange(win), cnt) + rng.random(cnt.sum())) * dt
                idx = rng.integers(lo, hi, len(t))
                arr.append(t)
                org.append(np.full(len(t), r))
                mod.append(np.full(len(t), m))
                pr.append(p_all[idx])
                out.append(o_all[idx])
    a = np.concatenate(arr)
    order = np.argsort(a, kind="stable")
    return Workload(arrival_s=a[order], prompt_tokens=np.concatenate(pr)[order],
                    output_tokens=np.concatenate(out)[order], origin=np.concatenate(org)[order],
                    model=np.concatenate(mod)[order], origins=list(fleet.names),
                    models=[t.name for t in cfg.types], name=f"torta-{cfg.topology}")


def _shares(cfg: TortaConfig) -> np.ndarray:
    s = np.array([t.share for t in cfg.types], float)
    return s / s.sum()


def clip_pairs(p, o, max_total):
    from fleetwise.workload.synthetic import clip_total_tokens

    p, o = clip_total_tokens(np.asarray(p), np.asarray(o), max_total)
    return np.maximum(np.asarray(p), 1), np.maximum(np.asarray(o), 1)


# ------------------------------------------------------------------------------------------- servers
@dataclass
class Servers:
    """Per-replica constants: region, speed (tokens/s of a mixed iteration), prices."""

    region: np.ndarray
    speed_tps: np.ndarray
    gpu_usd_per_s: np.ndarray
    power_idle_w: np.ndarray
    elec_usd_per_j: np.ndarray
    by_region: list = field(default_factory=list)
    region_speed: np.ndarray = None


def build_replicas(cfg: TortaConfig, fleet):
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel
    from fleetwise.sim.build import make_replica

    model = get_model(cfg.model)
    reps, perfs = [], {}
    for r, name in enumerate(fleet.names):
        reg = fleet.region(name)
        for g in SERVER_MIX[r % len(SERVER_MIX)]:
            gpu = get_gpu(g)
            perf = perfs.setdefault(gpu.name, PerfModel(gpu, model))
            price = gpu.prices.get(reg.cloud) or gpu.prices.get("aws") or next(iter(gpu.prices.values()))
            reps.append(make_replica(len(reps), perf, region=r, name=f"{name}/{g}-{len(reps)}",
                                     price_usd_per_gpu_hour=price.on_demand_usd_per_hour,
                                     electricity_usd_per_kwh=float(reg.electricity_usd_per_kwh),
                                     prefix_caching=False))
    speed = np.array([2048.0 / rp.perf.iteration_time_s(1024, 1024 * 1024, 64, 64 * 1200) for rp in reps])
    region = np.array([rp.region for rp in reps])
    srv = Servers(region=region, speed_tps=speed,
                  gpu_usd_per_s=np.array([rp.gpu_usd_per_s for rp in reps]),
                  power_idle_w=np.array([rp.perf.idle_power_w() for rp in reps]),
                  elec_usd_per_j=np.array([rp.electricity_usd_per_kwh / 3.6e6 for rp in reps]))
    srv.by_region = [np.flatnonzero(region == r) for r in range(len(fleet.names))]
    srv.region_speed = np.array([speed[ix].sum() for ix in srv.by_region])
    return reps, srv


MEAN_TOKENS = 1400.0  # prompt + output tokens of a mean request (Azure conv/code mix), for capacities
SERVICE_EFFICIENCY = 0.12  # requests/s actually served per (speed / MEAN_TOKENS): decode-bound; measured, docs/torta.md


# ------------------------------------------------------------------------------------------- one day
class Day:
    """One compressed day on the simulator: a planner picks a region per request, a micro allocator a server;
    switches stall the server (``Simulator.stall``). ``run_slot()`` advances to the next planning slot.

    The day is the planners' ``PlanView`` (``fleetwise.control.views``): what they read of it is that view."""

    def __init__(self, cfg: TortaConfig, fleet, workload: Workload, seed: int, planner, micro,
                 servers=None):
        from fleetwise.control.controller import Controller
        from fleetwise.policies import make
        from fleetwise.sim.simulator import SimOptions, Simulator

        self.cfg, self.fleet, self.w = cfg, fleet, workload
        reps, self.srv = build_replicas(cfg, fleet) if servers is None else servers()
        self.n = len(fleet.names)
        horizon = HOURS * cfg.slot_s + cfg.drain_s
        self.sim = Simulator(reps, workload, rtt_s=np.asarray(fleet.rtt_s), bandwidth_gbps=np.asarray(fleet.bandwidth_gbps),
                             model_index=np.zeros(len(workload), np.int64),
                             seed=seed, options=SimOptions(prefix_caching=False, max_time_s=horizon,
                                                           timeline_bucket_s=cfg.slot_s))
        self.sim.completions = []
        self.batcher = make("batcher", "sarathi", {"chunk_tokens": 512, "max_num_seqs": 64})
        self._ctl = Controller(router=self, batcher=self.batcher)
        self.planner, self.micro = planner, micro
        nm = len(cfg.types)
        # initial model placement: each region's servers hold the types in turn (fastest server: the largest type)
        self.held = np.zeros(len(reps), np.int64)
        for ix in self.srv.by_region:
            order = ix[np.argsort(-self.srv.speed_tps[ix])]
            for k, ri in enumerate(order):
                self.held[ri] = k % nm
        self.switches = 0
        self.migrations = 0
        self.slot = 0
        self.demand_hist = np.zeros((cfg.history, self.n))
        self._slot_demand = np.zeros(self.n)
        self._slot_long = 0  # routed requests over LONG_TOKENS tokens in this slot
        self._long_hist: list[tuple[int, float]] = []  # (long, routed) of the last LONG_SHARE_SLOTS slots
        self._long_prev = None  # the share of long ones among them (SlotObs.long_share)
        self.long_share_max = 0.0  # the highest such share of the day so far
        self.slots_planned = 0
        self.guarded_slots = 0  # slots whose plan the planner's guard handed to its rule
        self._done = False
        self._busy_prev = np.zeros(len(reps))
        self._util_prev = np.zeros(len(reps))  # GPU-busy fraction of each server over the last closed slot
        self._energy_prev = np.zeros(len(reps))
        self.slot_rows: list[dict] = []
        self.plans: list[np.ndarray] = []
        self.capacity_rps = self.srv.region_speed / MEAN_TOKENS * SERVICE_EFFICIENCY
        self.model_of = workload.model.astype(np.int64)
        self.origin = workload.origin.astype(np.int64)
        self.tokens = (workload.prompt_tokens + workload.output_tokens).astype(np.float64)
        # the PlanView
        self.server_region = self.srv.region
        self.server_speed_tps = self.srv.speed_tps
        self.region_speed_tps = self.srv.region_speed
        self.servers_by_region = self.srv.by_region
        self.server_model = self.held
        self.model_shares = np.array([t.share for t in cfg.types], float)
        self.reload_s = cfg.reload_s
        self.request = -1  # the request being routed now

    # -- the PlanView: state a policy may read
    def backlog_s(self) -> np.ndarray:
        """Outstanding service seconds per server: pending tokens / speed (+ the rest of a reload)."""
        sim = self.sim
        pend = np.array([r.pending_tokens for r in sim.replicas], float)
        ready = np.array([max(r.ready_s - sim.now, 0.0) for r in sim.replicas])
        return pend / self.srv.speed_tps + ready

    def server_outstanding(self) -> np.ndarray:
        return np.array([r.outstanding for r in self.sim.replicas], float)

    def request_model(self, rid: int) -> int:
        return int(self.model_of[rid])

    def request_tokens(self, rid: int) -> float:
        return float(self.tokens[rid])

    def recent_arrivals(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        hi = self.sim.arrivals_processed
        lo = max(hi - k, 0)
        return self.origin[lo:hi], self.model_of[lo:hi]

    def observe(self) -> SlotObs:
        b = self.backlog_s()
        out = self.server_outstanding()
        util = self._util_prev
        reg = self.srv.region
        return SlotObs(slot=self.slot, hour_utc=(self.slot + 0.5) % HOURS,
                       backlog_s=np.bincount(reg, b, self.n) / np.maximum(np.bincount(reg, None, self.n), 1),
                       util=np.bincount(reg, util, self.n) / np.maximum(np.bincount(reg, None, self.n), 1),
                       free_frac=np.bincount(reg, (out == 0).astype(float), self.n) / np.bincount(reg, None, self.n),
                       demand=self.demand_hist.copy(), capacity_rps=self.capacity_rps,
                       rtt_s=np.asarray(self.fleet.rtt_s), egress_usd_per_gb=np.asarray(self.fleet.egress_usd_per_gb),
                       slot_s=self.cfg.slot_s, long_share=self._long_prev)

    # -- the loop
    def run_slot(self) -> dict:
        """Plan for the coming slot, then simulate it; returns the slot's row (latency, cost, balance). Requests
        that arrive from the slot's end on are routed under the next slot's plan."""
        sim, cfg = self.sim, self.cfg
        obs = self.observe()
        self.planner.plan(obs)
        self.micro.plan(self, obs)
        if getattr(self.planner, "matrix", None) is not None:
            self.plans.append(np.asarray(self.planner.matrix, float))
        last = self.slot == HOURS - 1
        end = math.inf if last else (self.slot + 1) * cfg.slot_s
        sim.completions = []
        if sim.run_until(end, self._ctl) is None:
            self._done = True
        return self._close_slot()

    def route(self, view) -> int:
        """The day's router (the simulator asks it through ``run_until``): the planner picks the region, the micro
        allocator the server; a server that holds another model switches (a stall of ``reload_s``)."""
        sim = self.sim
        rid = view.request
        self.request = int(rid)
        o = self.origin[rid]
        self._slot_demand[o] += 1
        if self.tokens[rid] > LONG_TOKENS:
            self._slot_long += 1
        region = int(self.planner.region(o, self))
        ri = int(self.micro.pick(region, rid, self))
        m = self.model_of[rid]
        if self.held[ri] != m:
            # a reload in progress is abandoned for the new model: it serves again reload_s from now
            extra = sim.now + self.cfg.reload_s - max(sim.replicas[ri].ready_s, sim.now)
            if extra > 0:
                sim.stall(ri, extra)
            self.held[ri] = m
            self.switches += 1
        if self.srv.region[ri] != o:
            self.migrations += 1
        return ri

    def _close_slot(self) -> dict:
        sim, cfg = self.sim, self.cfg
        busy = np.array([r.busy_s for r in sim.replicas])
        energy = np.array([r.energy_busy_j for r in sim.replicas])
        db = np.maximum(busy - self._busy_prev, 0.0)
        active = (db > 0).astype(float)  # billed: servers that worked in the slot (scale to zero per slot)
        gpu = float((active * self.srv.gpu_usd_per_s).sum() * cfg.slot_s)
        idle_j = active * np.maximum(cfg.slot_s - db, 0.0) * self.srv.power_idle_w
        elec = float(((energy - self._energy_prev + idle_j) * self.srv.elec_usd_per_j).sum())
        util = np.clip(db / cfg.slot_s, 0, 1)
        rec = sim.request_outcomes(sim.completions)
        done = rec.completed
        lat = float((rec.completion_s[done] - rec.arrival_s[done]).mean()) if done.any() else 0.0
        # ``rejected``: requests the slot lost (the simulator logs a rejection as the request's end)
        row = {"slot": self.slot, "latency_mean_s": lat, "completed": int(done.sum()),
               "rejected": int((rec.status == 2).sum()), "gpu_usd": gpu,
               "energy_usd": elec, "util_cv": float(util.std() / util.mean()) if util.mean() > 0 else 0.0}
        self.slot_rows.append(row)
        self._busy_prev, self._energy_prev, self._util_prev = busy, energy, util
        self.demand_hist = np.vstack([self._slot_demand[None, :], self.demand_hist[:-1]])
        self._long_hist = [*self._long_hist, (self._slot_long, float(self._slot_demand.sum()))][-LONG_SHARE_SLOTS:]
        routed = sum(r for _, r in self._long_hist)
        self._long_prev = sum(k for k, _ in self._long_hist) / routed if routed > 0 else None
        if self._long_prev is not None and self._long_prev > self.long_share_max:
            self.long_share_max = self._long_prev
        self._slot_demand = np.zeros(self.n)
        self._slot_long = 0
        self.slots_planned += 1
        self.guarded_slots += bool(getattr(self.planner, "guarded", False))
        self.slot += 1
        return row

    @property
    def done(self) -> bool:
        return self._done or self.slot >= HOURS

    def finish(self) -> dict:
        """Run to the end (remaining slots with the current planner) and return the day's metrics."""
        while not self.done:
            self.run_slot()
        return self.metrics()

    def metrics(self) -> dict:
        sim = self.sim
        rec = sim.records()
        done = rec.completed
        e2e = rec.e2e_s[done]
        reg = self.srv.region
        routed = rec.replica >= 0
        gb = self.tokens[routed] * 4 / 1e9
        egress = float((gb * np.asarray(self.fleet.egress_usd_per_gb)[self.origin[routed], rec.region[routed]]).sum())
        util = np.array([r.busy_s for r in sim.replicas]) / (HOURS * self.cfg.slot_s)
        gpu = sum(r["gpu_usd"] for r in self.slot_rows)
        elec = sum(r["energy_usd"] for r in self.slot_rows)
        return {"requests": len(rec), "completed": int(done.sum()), "rejected": int((rec.status == 2).sum()),
                "response_time_mean_s": float(e2e.mean()) if len(e2e) else math.nan,
                "response_time_p95_s": float(np.percentile(e2e, 95)) if len(e2e) else math.nan,
                "response_time_p99_s": float(np.percentile(e2e, 99)) if len(e2e) else math.nan,
                "network_s_mean": float(rec.network_s[done].mean()) if done.any() else 0.0,
                "load_cv": float(util.std() / util.mean()) if util.mean() > 0 else 0.0,
                "load_std": float(util.std()),
                "region_load_cv": float(_cv(np.bincount(reg, util, self.n) / np.bincount(reg, None, self.n))),
                "cost_gpu_usd": gpu, "cost_energy_usd": elec, "cost_egress_usd": egress,
                "cost_usd": gpu + elec + egress, "switches": self.switches, "migrations": self.migrations,
                # the highest share of long requests a slot saw (what a trained planner's guard is set from), and
                # the slots whose plan a planner's guard handed to its rule (ResidualPlanner.long_share_max)
                "long_share_max": self.long_share_max, "guarded_slots": self.guarded_slots,
                "slots_planned": self.slots_planned}


def _cv(x):
    x = np.asarray(x, float)
    return x.std() / x.mean() if x.mean() > 0 else 0.0


def evaluate(cfg: TortaConfig, make_planner: Callable, micro: str, seeds: Sequence[int], held_out: bool = True,
             trace: Workload | None = None, keep_day: bool = False, load: float | None = None) -> list[dict]:
    """Run one (planner, micro allocator) on the days drawn by ``seeds``; one metrics row per seed."""
    from fleetwise.policies.planners import make_micro

    fleet = make_fleet(cfg)
    _, srv = build_replicas(cfg, fleet)
    cap = float(srv.region_speed.sum() / MEAN_TOKENS * SERVICE_EFFICIENCY)
    rows = []
    for seed in seeds:
        w = torta_workload(cfg, fleet, cap, np.random.default_rng(seed), held_out, trace, load)
        day = Day(cfg, fleet, w, seed, make_planner(cfg), make_micro(micro, cfg))
        m = day.finish()
        m["seed"] = seed
        if keep_day:
            m["slots"] = day.slot_rows
            m["plans"] = [p.tolist() for p in day.plans]
        rows.append(m)
    return rows
