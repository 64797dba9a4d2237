"""Multi-cloud LLM serving as a cooperative multi-agent environment (Graph-MARL-CloudLLM, docs/graph-marl.md).

Three clouds x two regions, each region with three GPU pools (a pool = GPU type x model variant; all replicas
a pool may ever run are built up front and switched on/off by the GPU-allocation agent, so the simulator's
replica set stays fixed). Request classes (chat, code, batch) arrive from real traces at the regions; every
control epoch (``epoch_s`` simulated seconds) four agents act together and the fleet simulator runs the epoch.

Agents (PettingZoo ``ParallelEnv``, all cooperative, one shared team reward)

    ========  ===========================================  =================================================
    agent     action (``MultiDiscrete``)                    meaning
    ========  ===========================================  =================================================
    cloud     per class: ``clouds + 1``                     serve the class in that cloud; last = any cloud
    model     per class: ``variants``                       model variant (8B / 70B) the class is served by
    gpu       per pool: 4                                   0 hold, 1 scale down (drain), 2 add on-demand,
                                                            3 add spot (when the region has spot capacity)
    router    per class: 3                                  request routing rule: 0 latency-first (RTT + queue),
                                                            1 least-loaded, 2 cost-first (price/token + queue)
    ========  ===========================================  =================================================

Observation (every agent; ``Dict``): the heterogeneous resource graph as fixed-size arrays

    ===========  =====================  ======================================================================
    key          shape                  content
    ===========  =====================  ======================================================================
    x            (nodes, 12) float32    node features (below), zero padded per type
    node_type    (nodes,) int64         0 cloud, 1 region, 2 pool, 3 instance, 4 request class
    edge_index   (2, edges) int64       src, dst node ids (fixed topology)
    edge_type    (edges,) int64         0 region-in-cloud, 1 pool-in-region, 2 instance-in-pool (hosting),
                                        3 class-demand-at-region, 4 class-to-pool (serving candidate),
                                        5 region-region link
    edge_attr    (edges, 4) float32     latency (RTT s / 0.2), cost (USD/GPU-h / 50, or egress USD/GB / 0.2),
                                        load, share of the class's demand (type 3)
    ===========  =====================  ======================================================================

Node features: cloud: one-hot (3), active GPUs / 64; region: rtt-weighted demand, spot availability, active
GPUs / 32, GPU busy fraction last epoch; pool: on-demand price, spot price (/50 per GPU-hour), model variant
one-hot, GPU count, active / provisioning / spot replicas / max, busy fraction last epoch, backlog (s / 30);
instance: on, ready, spot, outstanding requests / 64, backlog s / 30, busy fraction; class: one-hot, arrival
rate last epoch / 50, SLO attainment last epoch, TTFT/TPOT SLO, chosen variant, quality weight.

``state()``: a flat ``float32`` vector for a centralized critic: all node features plus global aggregates.

Reward (team, per epoch; the paper's "QoS-aware" reward, weights ours)
    ``(sum over requests that ended: slo_ok + quality_weight * quality - 0.5 late - drop) / expected requests per epoch
    - cost_weight * cost of the epoch / cost of the initial allocation for one epoch``.

Episode end
    All agents truncate after ``segment_s / epoch_s`` epochs; the last step also drains the remaining requests
    (up to ``drain_s``; requests not finished then count as dropped).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from fleetwise.errors import InputError
from fleetwise.workload.request import Workload

NODE_TYPES = ("cloud", "region", "pool", "instance", "class")
EDGE_TYPES = (("region", "in", "cloud"), ("pool", "in", "region"), ("instance", "in", "pool"),
              ("class", "demand", "region"), ("class", "serve", "pool"), ("region", "link", "region"))
F_NODE = 12
F_EDGE = 4
AGENTS = ("cloud", "model", "gpu", "router")
ROUTE_RULES = ("latency_first", "least_loaded", "cost_first")


@dataclass(frozen=True)
class Variant:
    name: str  # the family member's label
    model: str  # catalog model
    quality: float  # MMLU 5-shot (Meta's Llama 3 model card): 8B 66.6, 70B 79.5 -> 0.666 / 0.795


@dataclass(frozen=True)
class PoolSpec:
    gpu: str
    variant: int  # index into variants
    tp: int
    max_replicas: int = 4


@dataclass(frozen=True)
class RequestClass:
    name: str
    source: str  # "azure-conv", "azure-code" (timestamps + lengths) or "servegen:<model>" (ServeGen rates)
    rate_rps: float
    ttft_s: float
    tpot_s: float
    quality_weight: float  # how much the class values the better model


# spot availability per region: a file under spot-availability-multiregion (see docs/graph-marl.md)
SPOT_TRACES = {
    "us-east-1": "skypilot-spot-traces/availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json",
    "us-west-2": "skypilot-spot-traces/availability/16-node/aws-08-27-2023/us-west-2a_v100_1.json",
    "us-central1": "spothedge-gcp1/us-central1-a_a100_40gb_8.json",
    "europe-west4": "spothedge-gcp1/europe-west4-a_a100_40gb_8.json",
    # Azure publishes no spot traces here: its regions borrow GCP zones of the same metro class
    "eastus": "spothedge-gcp1/us-central1-b_a100_40gb_8.json",
    "westeurope": "spothedge-gcp1/asia-northeast1-a_a100_40gb_8.json",
}


@dataclass(frozen=True)
class GraphMARLConfig:
    regions: tuple[str, ...] = ("us-east-1", "us-west-2", "us-central1", "europe-west4", "eastus", "westeurope")
    origin_weights: tuple[float, ...] = (0.25, 0.15, 0.15, 0.2, 0.1, 0.15)  # users near each region
    variants: tuple[Variant, ...] = (Variant("8B", "Llama-3-8B", 0.666), Variant("70B", "Llama-3-70B", 0.795))
    # per cloud: the pools every region of that cloud has
    pools: dict = field(default_factory=lambda: {
        "aws": (PoolSpec("L4", 0, 1), PoolSpec("A100-80GB", 0, 1), PoolSpec("H100-80GB", 1, 4)),
        "gcp": (PoolSpec("L4", 0, 1), PoolSpec("A100-80GB", 0, 1), PoolSpec("H100-80GB", 1, 4)),
        "azure": (PoolSpec("A100-80GB", 0, 1), PoolSpec("A100-80GB", 1, 4), PoolSpec("H100-80GB", 1, 4)),
    })
    initial_replicas: int = 1  # per pool at the start
    classes: tuple[RequestClass, ...] = (
        RequestClass("chat", "azure-conv", 10.0, ttft_s=0.5, tpot_s=0.05, quality_weight=0.5),
        RequestClass("code", "azure-code", 5.0, ttft_s=2.0, tpot_s=0.10, quality_weight=2.0),
        RequestClass("batch", "servegen:m-large", 4.0, ttft_s=60.0, tpot_s=0.5, quality_weight=0.5),
    )
    epoch_s: float = 30.0
    segment_s: float = 600.0
    drain_s: float = 120.0
    train_fraction: float = 0.7
    provision_s: float = 40.0  # VM start; plus weights / load_gbps
    load_gb_per_s: float = 2.0
    max_context: int = 8192
    cost_weight: float = 0.5
    late_penalty: float = 0.5  # a request that completed outside its SLO
    drop_penalty: float = 1.0
    spot: bool = True

    def __post_init__(self) -> None:
        where = "graph-marl config"
        if len(self.origin_weights) != len(self.regions) or min(self.origin_weights, default=0) < 0 \
                or sum(self.origin_weights) <= 0:
            raise InputError(f"{where}: origin_weights needs {len(self.regions)} non-negative weights (one per "
                             f"region), got {self.origin_weights}")
        if not self.classes or any(c.rate_rps <= 0 for c in self.classes):
            raise InputError(f"{where}: classes need rate_rps > 0")
        if self.epoch_s <= 0 or self.segment_s < self.epoch_s:
            raise InputError(f"{where}: need 0 < epoch_s <= segment_s, got epoch_s={self.epoch_s}, "
                             f"segment_s={self.segment_s}")
        for r in self.regions:
            if _region(r).cloud not in self.pools:
                raise InputError(f"{where}: region {r} is in cloud {_region(r).cloud}, which has no pools")

    @property
    def clouds(self) -> tuple[str, ...]:
        out = []
        for r in self.regions:
            c = _region(r).cloud
            if c not in out:
                out.append(c)
        return tuple(out)


def _region(name: str):
    from fleetwise.fleet.regions import get_region

    return get_region(name)


@functools.lru_cache(maxsize=8)
def _trace(alias: str, max_total: int) -> Workload:
    from fleetwise.workload.spec import load_trace
    from fleetwise.workload.synthetic import clip_total_tokens

    w = load_trace(alias)
    w.prompt_tokens, w.output_tokens = clip_total_tokens(w.prompt_tokens, w.output_tokens, max_total)
    return w


@functools.lru_cache(maxsize=4)
def _servegen(model: str):
    from fleetwise.data import data_path
    from fleetwise.workload.readers import read_servegen

    return read_servegen(data_path("servegen-alibaba-modelstudio") / "language" / model)


@functools.lru_cache(maxsize=16)
def spot_series(region: str) -> np.ndarray:
    """Spot availability of ``region`` as a fraction of its trace's maximum, one value per minute."""
    from fleetwise.data import data_path

    rel = SPOT_TRACES.get(region)
    if rel is None:
        return np.ones(1)
    path = data_path("spot-availability-multiregion") / rel
    try:
        d = json.loads(Path(path).read_text())
        gap, data = float(d["metadata"]["gap_seconds"]), np.asarray(d["data"], float)
    except (OSError, KeyError, ValueError) as e:
        raise InputError(f"{path}: cannot read spot availability ({e})") from None
    mx = data.max() if len(data) and data.max() > 0 else 1.0
    t = np.arange(0.0, gap * len(data), 60.0)  # resampled to one value per minute
    return data[np.minimum((t // gap).astype(int), len(data) - 1)] / mx


def fit_multicloud_trace(cfg: GraphMARLConfig, trace: Workload, rng: np.random.Generator,
                         duration_s: float | None = None, load: float | None = None):
    """A user's trace as one segment (fleetwise.workload.adapt, docs/workloads.md): prompts clipped to
    ``max_context``, ``duration_s`` of it (a window, or a block bootstrap when the trace is shorter, drawn by
    ``rng``), at ``load`` x the capacity of the instances the segment starts with (``capacity_rps`` of each,
    for the trace's mean request under the largest class's SLO; ``None``: the trace's own rate); each request a
    class drawn by the classes' rate shares. Returns (workload, class per request, AdaptReport)."""
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel
    from fleetwise.perf.capacity import capacity_rps
    from fleetwise.workload.adapt import TraceFit, adapt_trace

    main = max(cfg.classes, key=lambda c: c.rate_rps)

    def capacity(p: float, o: float) -> tuple[float, str]:
        cap = 0.0
        for r in cfg.regions:
            for spec in cfg.pools[_region(r).cloud]:
                pm = PerfModel(get_gpu(spec.gpu), get_model(cfg.variants[spec.variant].model), tp=spec.tp)
                cap += min(cfg.initial_replicas, spec.max_replicas) * capacity_rps(pm, p, o, main.ttft_s, main.tpot_s)
        return cap, f"the {cfg.initial_replicas} instance(s) per pool a segment starts with, at the {main.name} SLO"

    dur = cfg.segment_s if duration_s is None else duration_s
    w, rep = adapt_trace(trace, rng, TraceFit(load=load, max_total_tokens=cfg.max_context, duration_s=dur),
                         capacity=capacity)
    total = sum(c.rate_rps for c in cfg.classes)
    cls = rng.choice(len(cfg.classes), size=len(w), p=[c.rate_rps / total for c in cfg.classes])
    rep.classes = {c.name: float((cls == i).mean()) for i, c in enumerate(cfg.classes)}
    rep.class_rule = "each request a class drawn by the classes' rate shares; SLO and quality weight from it"
    return w, cls, rep


def multicloud_workload(cfg: GraphMARLConfig, rng: np.random.Generator, held_out: bool,
                        duration_s: float | None = None, trace: Workload | None = None,
                        load: float | None = None) -> Workload:
    """One segment of ``duration_s``: each class's arrivals from its trace, time-scaled to its rate, from the
    training (first ``train_fraction``) or held-out part of the trace; origins drawn by ``origin_weights``.
    A user's ``trace`` is fitted by :func:`fit_multicloud_trace` (at ``load``) instead."""
    dur = cfg.segment_s if duration_s is None else duration_s
    parts = []
    if trace is not None:
        fw, cls, _ = fit_multicloud_trace(cfg, trace, rng, dur, load)
        parts = [(cls, fw.arrival_s, fw.prompt_tokens, fw.output_tokens)]
    for ci, c in enumerate(cfg.classes if trace is None else ()):
        if not c.source.startswith("servegen:"):
            w = _trace(c.source, cfg.max_context)
            if len(w) < 2:
                raise InputError(f"trace {w.name!r}: needs at least 2 requests")
            span = float(w.arrival_s[-1] - w.arrival_s[0]) or 1.0
            speed = c.rate_rps / (len(w) / span)
            seg = dur * speed
            lo, hi = (0.0, cfg.train_fraction * span) if not held_out else (cfg.train_fraction * span, span)
            start = lo + rng.uniform(0.0, max(hi - lo - seg, 0.0))
            idx = np.nonzero((w.arrival_s >= start) & (w.arrival_s < start + seg))[0]
            arr = (w.arrival_s[idx] - start) / speed
            pr, out = w.prompt_tokens[idx], w.output_tokens[idx]
        else:
            from fleetwise.workload.readers import servegen_arrivals
            from fleetwise.workload.synthetic import LognormalLengths

            rates = _servegen(c.source.split(":", 1)[1])
            day = float(rates.window_start_s[-1] + rates.window_s)
            mean_rate = float(np.nansum(rates.rate) * rates.window_s / day)  # requests/s over the trace
            scale = c.rate_rps / max(mean_rate, 1e-9)
            lo, hi = (0.0, cfg.train_fraction * day) if not held_out else (cfg.train_fraction * day, day)
            start = lo + rng.uniform(0.0, max(hi - lo - dur, 0.0))
            arr, _ = servegen_arrivals(rates, rng, start, start + dur, rate_scale=scale)
            # lengths: the default lognormal (fitted to the Azure conversation trace, docs/workloads.md)
            ln = LognormalLengths(6.633313, 0.985154, 5.018997, 0.859009, rho=0.087489, prompt_max=6000,
                                  output_max=1000)
            pr, out = ln.sample(rng, len(arr))
        parts.append((np.full(len(arr), ci), arr, np.asarray(pr), np.asarray(out)))
    arr = np.concatenate([p[1] for p in parts])
    order = np.argsort(arr, kind="stable")
    cls = np.concatenate([p[0] for p in parts])[order].astype(np.int16)
    prompt = np.concatenate([p[2] for p in parts])[order].astype(np.int64)
    output = np.maximum(np.concatenate([p[3] for p in parts])[order].astype(np.int64), 1)
    prompt = np.clip(prompt, 1, cfg.max_context - output)
    ow = np.asarray(cfg.origin_weights, float)
    origin = rng.choice(len(cfg.regions), size=len(arr), p=ow / ow.sum()).astype(np.int16)
    return Workload(arrival_s=arr[order].astype(np.float64), prompt_tokens=prompt, output_tokens=output,
                    origin=origin, slo_class=cls, origins=list(cfg.regions),
                    slo_classes=[c.name for c in cfg.classes], name="multicloud")


@dataclass(slots=True)
class Pool:
    region: int
    cloud: int
    spec: PoolSpec
    replicas: list  # replica indices in the simulator
    od_usd_per_gpu_h: float
    spot_usd_per_gpu_h: float
    provision_s: float
    tps: float  # tokens/s one replica sustains (decode at batch 32, for load estimates)


@dataclass(slots=True)
class InstState:
    on: bool = False
    spot: bool = False
    ready_s: float = 0.0
    off_s: float = -1.0  # when it was switched off (drains); -1 never
    billed_s: float = 0.0  # GPU-seconds billed so far / num_gpus
    usd: float = 0.0


class MultiCloud:
    """The fleet, its simulator, the instance states, the routing rule and the per-epoch bookkeeping.
    Heuristic and learned policies both act through ``act(actions)`` + ``run_epoch()``."""

    def __init__(self, cfg: GraphMARLConfig, workload: Workload, seed: int):
        from fleetwise.catalog import get_gpu, get_model
        from fleetwise.control.registry import make
        from fleetwise.fleet.topology import continental_backbone
        from fleetwise.perf import PerfModel
        from fleetwise.sim.build import make_replica
        from fleetwise.sim.simulator import SimOptions, Simulator

        self.cfg = cfg
        self.clouds = cfg.clouds
        fleet = continental_backbone(list(cfg.regions))
        idx = [fleet.index(_region(r).name) if _region(r).name in fleet.names else fleet.index(r)
               for r in cfg.regions]
        self.rtt = np.asarray(fleet.rtt_s)[np.ix_(idx, idx)]
        self.egress = np.asarray(fleet.egress_usd_per_gb)[np.ix_(idx, idx)]
        self.pools: list[Pool] = []
        reps = []
        perfs = {}
        for ri, rname in enumerate(cfg.regions):
            cloud = _region(rname).cloud
            for spec in cfg.pools[cloud]:
                gpu = get_gpu(spec.gpu)
                price = gpu.prices.get(cloud)
                if price is None:
                    raise InputError(f"graph-marl pools: {cloud} does not sell {spec.gpu}")
                model = get_model(cfg.variants[spec.variant].model)
                key = (gpu.name, model.name, spec.tp)
                if key not in perfs:
                    perfs[key] = PerfModel(gpu, model, tp=spec.tp)
                perf = perfs[key]
                tps = 32.0 / perf.decode_coeffs(32)[0]  # decode tokens/s at batch 32
                prov = cfg.provision_s + model.weight_bytes / 1e9 / cfg.load_gb_per_s
                pool = Pool(ri, self.clouds.index(cloud), spec, [], price.on_demand_usd_per_hour,
                            price.spot_usd_per_hour or price.on_demand_usd_per_hour, prov, tps)
                for k in range(spec.max_replicas):
                    i = len(reps)
                    reps.append(make_replica(i, perf, region=ri, name=f"{rname}/{spec.gpu}/{model.name}/{k}",
                                             prefix_caching=False, price_usd_per_gpu_hour=0.0))
                    pool.replicas.append(i)
                self.pools.append(pool)
        self.pool_of = np.zeros(len(reps), np.int64)
        for pi, p in enumerate(self.pools):
            self.pool_of[p.replicas] = pi
        self.workload = workload
        horizon = (float(workload.arrival_s[-1]) if len(workload) else 0.0) + cfg.drain_s
        self.end_s = cfg.segment_s
        self.sim = Simulator(reps, workload, rtt_s=self.rtt, model_index=np.zeros(len(workload), np.int64),
                             max_context=[cfg.max_context], seed=seed,
                             options=SimOptions(prefix_caching=False, max_time_s=max(horizon, cfg.segment_s)))
        self.sim.completions = []
        self.batcher = make("batcher", "sarathi", {"chunk_tokens": 512, "max_num_seqs": 64})
        self.inst = [InstState() for _ in reps]
        self.spot_avail = [spot_series(r) for r in cfg.regions]
        self.spot_offset = int(np.random.default_rng(seed).integers(0, 10_000))
        for p in self.pools:
            for k in p.replicas[: cfg.initial_replicas]:
                self.inst[k].on = True
        ncls = len(cfg.classes)
        self.cloud_choice = np.full(ncls, len(self.clouds), np.int64)
        self.variant = np.array([0] * ncls, np.int64)
        self.rule = np.zeros(ncls, np.int64)
        self.cls = workload.slo_class.astype(np.int64)
        self.ttft_slo = np.array([c.ttft_s for c in cfg.classes])[self.cls]
        self.tpot_slo = np.array([c.tpot_s for c in cfg.classes])[self.cls]
        self.quality = np.array([v.quality for v in cfg.variants])
        self.qw = np.array([c.quality_weight for c in cfg.classes])
        self.epoch = 0
        self.t_epoch = 0.0
        self._dp = None
        self.done = False
        self._busy_prev = np.zeros(len(reps))
        self.busy_frac = np.zeros(len(reps))
        self.cls_arrivals = np.zeros(ncls)
        self.pool_routed = np.zeros(len(self.pools), np.int64)  # requests routed to each pool last epoch
        self._routed = np.zeros(len(self.pools), np.int64)
        self.cls_slo = np.ones(ncls)
        self.base_cost = sum(
            p.od_usd_per_gpu_h * p.spec.tp * min(cfg.initial_replicas, p.spec.max_replicas) for p in self.pools
        ) * cfg.epoch_s / 3600.0
        rate = sum(c.rate_rps for c in cfg.classes)
        self.expected_per_epoch = max(rate * cfg.epoch_s, 1.0)
        self.slo_ok = np.zeros(len(workload), bool)
        self.egress_usd = 0.0
        self.gpu_usd = 0.0
        self.gpu_s_billed = 0.0
        self.history: list[dict] = []
        self._ppt = np.array([self.pools[self.pool_of[i]].od_usd_per_gpu_h * self.pools[self.pool_of[i]].spec.tp
                              / 3600.0 / self.pools[self.pool_of[i]].tps for i in range(len(reps))])

    # ------------------------------------------------------------------ helpers
    def spot_frac(self, region: int, t: float) -> float:
        s = self.spot_avail[region]
        return float(s[(self.spot_offset + int(t // 60.0)) % len(s)]) if self.cfg.spot else 0.0

    def routable(self, i: int, now: float) -> bool:
        st = self.inst[i]
        return st.on and now >= st.ready_s

    def backlog_s(self, i: int, now: float) -> float:
        rep = self.sim.replicas[i]
        return rep.pending_tokens / self.pools[self.pool_of[i]].tps

    # ------------------------------------------------------------------ actions
    def act(self, actions: dict) -> None:
        """Apply one epoch's decisions (missing agents keep their previous decisions / hold)."""
        cfg, now = self.cfg, self.sim.now
        nc = len(cfg.classes)
        if "cloud" in actions:
            self.cloud_choice = np.clip(np.asarray(actions["cloud"], np.int64)[:nc], 0, len(self.clouds))
        if "model" in actions:
            self.variant = np.clip(np.asarray(actions["model"], np.int64)[:nc], 0, len(cfg.variants) - 1)
        if "router" in actions:
            self.rule = np.clip(np.asarray(actions["router"], np.int64)[:nc], 0, len(ROUTE_RULES) - 1)
        if "gpu" in actions:
            a = np.asarray(actions["gpu"], np.int64)
            for pi, p in enumerate(self.pools):
                x = int(a[pi]) if pi < len(a) else 0
                if x == 1:  # scale down: the newest on replica stops taking requests and drains (billed until empty)
                    ons = [i for i in p.replicas if self.inst[i].on]
                    if ons and sum(st.on for st in self.inst) > 1:
                        st = self.inst[ons[-1]]
                        st.on, st.off_s = False, now
                elif x in (2, 3):
                    spot = x == 3
                    if spot and self.spot_frac(p.region, now) * p.spec.max_replicas < 1 + sum(
                            self.inst[i].on and self.inst[i].spot for i in p.replicas):
                        continue  # no spot capacity in this region now
                    offs = [i for i in p.replicas if not self.inst[i].on]
                    if offs:
                        st = self.inst[offs[0]]
                        draining = self.sim.replicas[offs[0]].outstanding > 0  # still loaded: serves at once
                        st.on, st.spot, st.off_s = True, spot, -1.0
                        st.ready_s = now if draining else now + p.provision_s

    def route(self, rid: int) -> int:
        sim, now = self.sim, self.sim.now
        c = int(self.cls[rid])
        org = sim.origin[rid]
        want_v, want_c, rule = int(self.variant[c]), int(self.cloud_choice[c]), int(self.rule[c])
        best, best_s = -1, math.inf
        for tier in range(3):  # 0: variant and cloud as chosen; 1: the variant anywhere; 2: anything ready
            for pi, p in enumerate(self.pools):
                if tier < 2 and p.spec.variant != want_v:
                    continue
                if tier == 0 and want_c < len(self.clouds) and p.cloud != want_c:
                    continue
                rtt = self.rtt[org][p.region]
                for i in p.replicas:
                    if not self.routable(i, now):
                        continue
                    load = self.backlog_s(i, now)
                    if rule == 0:
                        s = rtt + load
                    elif rule == 1:
                        s = load + 1e-3 * rtt
                    else:
                        s = self._ppt[i] * 1e4 + load
                    if s < best_s:
                        best, best_s = i, s
            if best >= 0:
                return best
        # nothing ready: the on replica that becomes ready first
        cand = [i for i, st in enumerate(self.inst) if st.on] or [0]
        return min(cand, key=lambda i: self.inst[i].ready_s)

    # ------------------------------------------------------------------ running an epoch
    def run_epoch(self, final: bool = False) -> float:
        """Run the simulator to the end of the current epoch (to the end when ``final``); return the reward."""
        cfg, sim = self.cfg, self.sim
        t_end = math.inf if final else self.t_epoch + cfg.epoch_s
        arrivals = np.zeros(len(cfg.classes))
        while True:
            dp = self._dp if self._dp is not None else sim.advance()
            self._dp = None
            if dp is None:
                self.done = True
                break
            if dp.time_s >= t_end:
                self._dp = dp
                break
            if dp.kind == "route":
                arrivals[self.cls[dp.request]] += 1
                ri = self.route(dp.request)
                self._routed[self.pool_of[ri]] += 1
                sim.apply(ri)
            else:
                sim.apply(self.batcher.plan(dp.lane, sim))
        t1 = sim.now if final or self.done else t_end
        t1 = max(t1, self.t_epoch)
        # billing: on or provisioning replicas, and switched-off ones still draining
        usd = 0.0
        busy = np.array([r.busy_s for r in sim.replicas])
        dt = t1 - self.t_epoch
        for i, st in enumerate(self.inst):
            rep = sim.replicas[i]
            if st.on or rep.outstanding > 0 or busy[i] > self._busy_prev[i]:
                p = self.pools[self.pool_of[i]]
                price = p.spot_usd_per_gpu_h if st.spot else p.od_usd_per_gpu_h
                u = price * p.spec.tp * dt / 3600.0
                st.usd += u
                usd += u
                self.gpu_s_billed += p.spec.tp * dt
                st.billed_s += dt
        if dt > 0:
            self.busy_frac = np.clip((busy - self._busy_prev) / dt, 0.0, 1.0)
        self._busy_prev = busy
        # spot preemption: beyond what the region's availability allows, spot replicas are reclaimed (drain)
        for p in self.pools:
            cap = int(self.spot_frac(p.region, t1) * p.spec.max_replicas)
            spots = [i for i in p.replicas if self.inst[i].on and self.inst[i].spot]
            for i in spots[cap:]:
                self.inst[i].on, self.inst[i].off_s = False, t1
        # outcomes of the requests that ended
        ok = late = dropped = 0
        qsum = 0.0
        egress = 0.0
        fts, cmp_, arr, out = sim.first_token_s, sim.completion_s, sim.arrival, sim.output
        for rid in sim.completions:
            if sim.status[rid] != 1:
                dropped += 1
                continue
            half = sim.net_s[rid] / 2.0
            ttft = fts[rid] + half - arr[rid]
            tpot = (cmp_[rid] - fts[rid]) / max(out[rid] - 1, 1)
            good = ttft <= self.ttft_slo[rid] and tpot <= self.tpot_slo[rid]
            self.slo_ok[rid] = good
            ri = sim.replica_of[rid]
            c = self.cls[rid]
            qsum += self.qw[c] * self.quality[self.pools[self.pool_of[ri]].spec.variant]
            if good:
                ok += 1
            else:
                late += 1
            reg = sim.replicas[ri].region
            if reg != sim.origin[rid]:  # prompt in, text out, ~4 bytes per token
                egress += (sim.prompt[rid] + out[rid]) * 4e-9 * self.egress[sim.origin[rid]][reg]
        n_end = ok + late
        sim.completions.clear()
        self.gpu_usd += usd
        self.egress_usd += egress
        self.cls_arrivals = arrivals / max(dt, 1e-9)
        self.pool_routed, self._routed = self._routed, np.zeros(len(self.pools), np.int64)
        reward = (ok + qsum - cfg.late_penalty * late - cfg.drop_penalty * dropped) / self.expected_per_epoch \
            - cfg.cost_weight * (usd + egress) / max(self.base_cost * dt / cfg.epoch_s, 1e-9) * (dt / cfg.epoch_s)
        self.history.append({"t_s": t1, "ok": ok, "late": late, "dropped": dropped, "usd": usd,
                             "ended": n_end})
        self.t_epoch = t1
        self.epoch += 1
        return float(reward)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict:
        sim = self.sim
        rec = sim.records()
        st = np.asarray(rec.status)
        comp = st == 1
        half = np.frombuffer(sim.net_s, dtype=np.float64) / 2.0
        ttft = (rec.first_token_s + half - rec.arrival_s)[comp]
        e2e = (rec.completion_s + half - rec.arrival_s)[comp]
        n = len(rec)
        busy_gpu_s = sum(r.busy_s * r.num_gpus for r in sim.replicas)
        tokens = float(rec.output_tokens[comp].sum() + rec.prompt_tokens[comp].sum())
        cost = self.gpu_usd + self.egress_usd
        dur = max(self.t_epoch, 1e-9)
        ri = np.asarray(rec.replica)[comp]
        qual = self.quality[[self.pools[self.pool_of[i]].spec.variant for i in ri]] if len(ri) else np.array([np.nan])
        return {
            "requests": n,
            "latency_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else math.nan,
            "latency_p99_s": float(np.percentile(ttft, 99)) if len(ttft) else math.nan,
            "e2e_p99_s": float(np.percentile(e2e, 99)) if len(e2e) else math.nan,
            "throughput_rps": float(comp.sum() / dur),
            "tokens_per_s": tokens / dur,
            "gpu_util": float(busy_gpu_s / max(self.gpu_s_billed, 1e-9)),
            "cost_usd": float(cost),
            "egress_usd": float(self.egress_usd),
            "cost_per_mtok_usd": float(cost / max(tokens, 1.0) * 1e6),
            "slo_attainment": float(self.slo_ok.sum() / max(n, 1)),
            "dropped": int((st != 1).sum()),
            "quality": float(np.mean(qual)),
        }


# ---------------------------------------------------------------------- the resource graph
@dataclass(frozen=True)
class GraphLayout:
    """Node ranges per type and the fixed edges of one configuration's graph."""

    offsets: dict  # type -> (start, count)
    edge_index: np.ndarray  # (2, E)
    edge_type: np.ndarray  # (E,)
    node_type: np.ndarray  # (N,)

    @property
    def num_nodes(self) -> int:
        return len(self.node_type)


def graph_layout(n_clouds: int, n_regions: int, region_cloud: Sequence[int], pool_region: Sequence[int],
                 inst_pool: Sequence[int], n_classes: int, region_degree: int | None = None) -> GraphLayout:
    """Fixed nodes and edges; region-region links form a full mesh, or with ``region_degree`` each region links
    to that many ring neighbours (for large synthetic fleets)."""
    counts = {"cloud": n_clouds, "region": n_regions, "pool": len(pool_region), "instance": len(inst_pool),
              "class": n_classes}
    offsets, o = {}, 0
    for t in NODE_TYPES:
        offsets[t] = (o, counts[t])
        o += counts[t]
    node_type = np.concatenate([np.full(counts[t], k) for k, t in enumerate(NODE_TYPES)]).astype(np.int64)
    src, dst, et = [], [], []

    def add(s, d, k):
        src.append(s)
        dst.append(d)
        et.append(k)

    R, C, P, I, K = (offsets[t][0] for t in ("region", "cloud", "pool", "instance", "class"))
    for r, c in enumerate(region_cloud):
        add(R + r, C + c, 0)
    for p, r in enumerate(pool_region):
        add(P + p, R + r, 1)
    for i, p in enumerate(inst_pool):
        add(I + i, P + p, 2)
    for k in range(n_classes):
        for r in range(n_regions):
            add(K + k, R + r, 3)
        for p in range(len(pool_region)):
            add(K + k, P + p, 4)
    for a in range(n_regions):
        if region_degree is None:
            nb = [b for b in range(n_regions) if b != a]
        else:
            nb = sorted({(a + d) % n_regions for d in range(-(region_degree // 2), region_degree // 2 + 1)} - {a})
        for b in nb:
            add(R + a, R + b, 5)
    return GraphLayout(offsets, np.array([src, dst], np.int64), np.array(et, np.int64), node_type)


def graph_features(mc: MultiCloud, lay: GraphLayout) -> tuple[np.ndarray, np.ndarray]:
    """Node features (N, F_NODE) and edge attributes (E, F_EDGE) of the current state."""
    cfg, sim, now = mc.cfg, mc.sim, mc.sim.now
    x = np.zeros((lay.num_nodes, F_NODE), np.float32)
    ea = np.zeros((lay.edge_index.shape[1], F_EDGE), np.float32)
    C, R, P, I, K = (lay.offsets[t][0] for t in NODE_TYPES)
    nreg = len(cfg.regions)
    gpus_on_region = np.zeros(nreg)
    busy_region = np.zeros(nreg)
    pool_backlog = np.zeros(len(mc.pools))
    for pi, p in enumerate(mc.pools):
        on = [i for i in p.replicas if mc.inst[i].on]
        ready = [i for i in on if now >= mc.inst[i].ready_s]
        spot = [i for i in on if mc.inst[i].spot]
        bl = np.mean([mc.backlog_s(i, now) for i in ready]) if ready else 0.0
        bf = float(np.mean(mc.busy_frac[p.replicas])) * p.spec.max_replicas / max(len(on), 1)
        pool_backlog[pi] = bl
        v = np.zeros(2)
        v[min(p.spec.variant, 1)] = 1
        x[P + pi] = [p.od_usd_per_gpu_h / 50, p.spot_usd_per_gpu_h / 50, v[0], v[1], p.spec.tp / 8,
                     len(ready) / p.spec.max_replicas, (len(on) - len(ready)) / p.spec.max_replicas,
                     len(spot) / p.spec.max_replicas, min(bf, 1.0), min(bl / 30, 2.0), len(on) / p.spec.max_replicas,
                     mc.spot_frac(p.region, now)]
        gpus_on_region[p.region] += len(on) * p.spec.tp
        busy_region[p.region] += float(np.sum(mc.busy_frac[p.replicas])) * p.spec.tp
    for c in range(len(mc.clouds)):
        x[C + c, c] = 1.0
        x[C + c, 3] = sum(gpus_on_region[r] for r in range(nreg) if _region(cfg.regions[r]).cloud == mc.clouds[c]) / 64
    ow = np.asarray(cfg.origin_weights, float)
    ow = ow / ow.sum()
    for r in range(nreg):
        x[R + r, :5] = [ow[r], mc.spot_frac(r, now), gpus_on_region[r] / 32,
                        busy_region[r] / max(gpus_on_region[r], 1), float(np.mean(mc.rtt[r]) / 0.2)]
    for i, st in enumerate(mc.inst):
        rep = sim.replicas[i]
        x[I + i, :6] = [st.on, st.on and now >= st.ready_s, st.spot, min(rep.outstanding / 64, 2.0),
                        min(mc.backlog_s(i, now) / 30, 2.0), mc.busy_frac[i]]
    for k, c in enumerate(cfg.classes):
        x[K + k, min(k, 3)] = 1.0
        x[K + k, 4:10] = [mc.cls_arrivals[k] / 50, mc.cls_slo[k], min(c.ttft_s / 10, 6.0), c.tpot_s,
                          mc.variant[k] / max(len(cfg.variants) - 1, 1), c.quality_weight / 2]
    # edge attributes
    src, dst = lay.edge_index
    for e in range(len(src)):
        t = lay.edge_type[e]
        s, d = src[e], dst[e]
        if t == 1:
            p = mc.pools[s - P]
            ea[e] = [0, p.od_usd_per_gpu_h * p.spec.tp / 50, x[s, 8], 0]
        elif t == 2:
            ea[e] = [0, 0, x[s, 5], 0]
        elif t == 3:
            ea[e] = [0, 0, 0, ow[d - R]]
        elif t == 4:
            p = mc.pools[d - P]
            ea[e] = [float(ow @ mc.rtt[:, p.region]) / 0.2, p.od_usd_per_gpu_h * p.spec.tp / 50,
                     min(pool_backlog[d - P] / 30, 2.0), float(p.spec.variant == mc.variant[s - K])]
        elif t == 5:
            a, b = s - R, d - R
            ea[e] = [mc.rtt[a, b] / 0.2, mc.egress[a, b] / 0.2, 0, 0]
    return x, ea


# ---------------------------------------------------------------------- PettingZoo environment
def _pz():
    from gymnasium import spaces
    from pettingzoo import ParallelEnv

    return spaces, ParallelEnv


def make_env(config: GraphMARLConfig | None = None, held_out: bool = False, trace: Workload | None = None,
             duration_s: float | None = None, load: float | None = None):
    """The PettingZoo parallel environment (class built lazily so the module imports without pettingzoo).
    ``trace`` replaces the classes' arrivals, fitted at ``load`` (:func:`fit_multicloud_trace`)."""
    return _env_class()(config, held_out, trace, duration_s, load)


@functools.lru_cache(maxsize=1)
def _env_class():
    spaces, ParallelEnv = _pz()

    class MultiCloudMARLEnv(ParallelEnv):
        __doc__ = __doc__
        metadata = {"name": "fleetwise_multicloud_v0", "render_modes": []}

        def __init__(self, config=None, held_out=False, trace=None, duration_s=None, load=None):
            self.cfg = config or GraphMARLConfig()
            self.held_out, self.trace, self.duration_s, self.load = held_out, trace, duration_s, load
            cfg = self.cfg
            clouds = cfg.clouds
            region_cloud = [clouds.index(_region(r).cloud) for r in cfg.regions]
            pool_region, inst_pool = [], []
            for ri, r in enumerate(cfg.regions):
                for spec in cfg.pools[_region(r).cloud]:
                    inst_pool += [len(pool_region)] * spec.max_replicas
                    pool_region.append(ri)
            self.layout = graph_layout(len(clouds), len(cfg.regions), region_cloud, pool_region, inst_pool,
                                       len(cfg.classes))
            self.n_pools = len(pool_region)
            nc = len(cfg.classes)
            self.possible_agents = list(AGENTS)
            self.agents = []
            self._act = {
                "cloud": spaces.MultiDiscrete([len(clouds) + 1] * nc),
                "model": spaces.MultiDiscrete([len(cfg.variants)] * nc),
                "gpu": spaces.MultiDiscrete([4] * self.n_pools),
                "router": spaces.MultiDiscrete([len(ROUTE_RULES)] * nc),
            }
            N, E = self.layout.num_nodes, self.layout.edge_index.shape[1]
            self._obs = spaces.Dict({
                "x": spaces.Box(-10.0, 10.0, (N, F_NODE), np.float32),
                "node_type": spaces.Box(0, len(NODE_TYPES) - 1, (N,), np.int64),
                "edge_index": spaces.Box(0, N - 1, (2, E), np.int64),
                "edge_type": spaces.Box(0, len(EDGE_TYPES) - 1, (E,), np.int64),
                "edge_attr": spaces.Box(-10.0, 10.0, (E, F_EDGE), np.float32),
            })
            self.state_dim = N * F_NODE + 8
            self._state_space = spaces.Box(-10.0, 10.0, (self.state_dim,), np.float32)
            self.mc: MultiCloud | None = None
            self.n_epochs = int(round((duration_s or cfg.segment_s) / cfg.epoch_s))
            self._rng = np.random.default_rng()

        def observation_space(self, agent):
            return self._obs

        def action_space(self, agent):
            return self._act[agent]

        @property
        def state_space(self):
            return self._state_space

        def _observe(self):
            x, ea = graph_features(self.mc, self.layout)
            self._x = x
            o = {"x": np.clip(x, -10, 10), "node_type": self.layout.node_type, "edge_index": self.layout.edge_index,
                 "edge_type": self.layout.edge_type, "edge_attr": np.clip(ea, -10, 10)}
            return {a: o for a in self.agents}

        def state(self):
            mc = self.mc
            g = np.zeros(8, np.float32)
            if mc is not None:
                g[:4] = [mc.epoch / max(self.n_epochs, 1), mc.gpu_usd / max(mc.base_cost * self.n_epochs, 1e-9),
                         sum(s.on for s in mc.inst) / len(mc.inst), float(np.mean(mc.busy_frac))]
                x = self._x
            else:
                x = np.zeros((self.layout.num_nodes, F_NODE), np.float32)
            return np.clip(np.concatenate([x.ravel(), g]), -10, 10).astype(np.float32)

        def reset(self, seed=None, options=None):
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            rng = self._rng
            w = multicloud_workload(self.cfg, rng, self.held_out, self.duration_s, self.trace, self.load)
            self.mc = MultiCloud(self.cfg, w, int(rng.integers(2**31)))
            self.agents = list(self.possible_agents)
            obs = self._observe()
            return obs, {a: {} for a in self.agents}

        def step(self, actions):
            mc = self.mc
            if not self.agents:
                raise RuntimeError("episode is over; call reset()")
            mc.act(actions)
            last = mc.epoch + 1 >= self.n_epochs
            r = mc.run_epoch(final=last)
            ended = last or mc.done
            obs = self._observe()
            rew = {a: r for a in self.agents}
            info = {a: {"time_s": mc.sim.now, "epoch": mc.epoch} for a in self.agents}
            if ended:
                m = mc.metrics()
                for a in self.agents:
                    info[a]["metrics"] = m
            term = {a: False for a in self.agents}
            trunc = {a: ended for a in self.agents}
            if ended:
                self.agents = []
            return obs, rew, term, trunc, info

    return MultiCloudMARLEnv


# ---------------------------------------------------------------------- heuristic policies
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




def evaluate(cfg: GraphMARLConfig, policy, seeds: Sequence[int], held_out: bool = True,
             trace: Workload | None = None, duration_s: float | None = None, load: float | None = None) -> list[dict]:
    """Run ``policy`` on the held-out segments drawn by ``seeds``; per seed the metrics.

    ``policy``: a heuristic name, or a callable ``(env, obs, state) -> actions`` (a trained policy)."""
    out = []
    for seed in seeds:
        env = make_env(cfg, held_out=held_out, trace=trace, duration_s=duration_s, load=load)
        obs, _ = env.reset(seed=seed)
        if hasattr(policy, "reset"):
            policy.reset(seed)
        m = None
        while env.agents:
            if isinstance(policy, str):
                act = heuristic(policy, env.mc)
            else:
                act = policy(env, obs, env.state())
            obs, _, _, _, info = env.step(act)
            m = next(iter(info.values())).get("metrics", m)
        out.append({"seed": seed, **m})
    return out
