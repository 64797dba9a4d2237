"""Graph-MARL-CloudLLM's world (docs/graph-marl.md): multi-cloud LLM serving on the fleet simulator.

Three clouds x two regions, each region with three GPU pools (a pool = GPU type x model variant; all replicas
a pool may ever run are built up front and switched on/off by the GPU-allocation decision, so the simulator's
replica set stays fixed). Request classes (chat, code, batch) arrive from real traces at the regions; every
control epoch (``epoch_s`` simulated seconds) four decisions are taken together — the cloud and the model
variant of each request class, the replicas of each pool, the routing rule of each class — and the fleet
simulator runs the epoch (``MultiCloud.act`` + ``MultiCloud.run_epoch``). The PettingZoo environment is
``fleetwise.envs.graph_marl``; the hand-written rules are ``fleetwise.worlds.multicloud_rules``.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleetwise.errors import InputError
from fleetwise.workload.request import Workload

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
    validation_fraction: float = 0.1  # the last part of the training range: validation segments (checkpoint choice)
    # robustness (the shared recipe): each training segment scales each class's rate by its own factor drawn
    # log-uniformly from this range (light load to one class's surge; the classes' rates are about 0.2 of the
    # starting fleet's capacity for their lengths); test segments run at the classes' rates, and validation
    # segments too unless validation_varies (then drawn like training segments). Measured in docs/graph-marl.md:
    # (0.6, 3.5) with validation_varies (up to about 0.7 of the capacity) made every learned variant keep close
    # to its rule, and lose most of its savings on the test segments.
    train_rate_range: tuple[float, float] = (0.6, 1.5)
    validation_varies: bool = False
    # workload shapes (the shared recipe's "several traces' shapes"): each training segment (and validation segment
    # when validation_varies) multiplies every prompt length by one factor drawn log-uniformly from this range,
    # clipped to the context; (1, 1): the traces' own lengths. Measured in docs/graph-marl.md; not the default.
    train_prompt_range: tuple[float, float] = (1.0, 1.0)
    # the tail guard (multicloud_rules): no correction shrinks a pool backlogged > 5 s; with guard_scale_ups also
    # none cancels the rule's scale-up of a busy pool (measured in docs/graph-marl.md: not kept as the default)
    guard_scale_ups: bool = False
    # no correction removes capacity before this many seconds of a segment (as Kubernetes' HPA waits a scale-down
    # stabilisation window): the first decisions, taken before any traffic is seen, may add but not cut
    scale_down_after_s: float = 0.0
    slo_target: float = 0.94  # SLO attainment a policy must reach to "meet the SLO" (the best rule is chosen among those)
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
        lo, hi = self.train_rate_range
        if not (0 < lo <= hi <= 10):
            raise InputError(f"{where}: train_rate_range needs 0 < low <= high <= 10, got {self.train_rate_range}")
        lo, hi = self.train_prompt_range
        if not (0 < lo <= hi <= 20):
            raise InputError(f"{where}: train_prompt_range needs 0 < low <= high <= 20, got {self.train_prompt_range}")
        # finite and bounded (found by fuzzing, 2026-12-06: load_gb_per_s=0 divided by zero, initial_replicas=-1
        # ran with rewards of -3e9, epoch_s=NaN failed in numpy, segment_s=1e12 was a MemoryError)
        nums = {"epoch_s": (1.0, 3600.0), "segment_s": (1.0, 7 * 86_400.0), "drain_s": (0.0, 86_400.0),
                "provision_s": (0.0, 86_400.0), "load_gb_per_s": (1e-3, 1e4), "slo_target": (0.0, 1.0),
                "cost_weight": (0.0, 1e6), "late_penalty": (0.0, 1e6), "drop_penalty": (0.0, 1e6),
                "train_fraction": (0.0, 1.0), "validation_fraction": (0.0, 1.0),
                "scale_down_after_s": (0.0, 7 * 86_400.0)}
        for k, (lo_, hi_) in nums.items():
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo_ <= v <= hi_:
                raise InputError(f"{where}: {k} {v!r}: expected a number from {lo_:g} to {hi_:g}")
        for k, lo_, hi_ in (("initial_replicas", 0, 1000), ("max_context", 16, 1 << 20)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or not lo_ <= v <= hi_:
                raise InputError(f"{where}: {k} {v!r}: expected an integer from {lo_} to {hi_}")
        if not self.variants:
            raise InputError(f"{where}: variants: expected at least one model variant")
        if not all(isinstance(w, (int, float)) and math.isfinite(w) for w in self.origin_weights):
            raise InputError(f"{where}: origin_weights must be finite numbers, got {self.origin_weights}")
        if self.epoch_s <= 0 or self.segment_s < self.epoch_s:
            raise InputError(f"{where}: need 0 < epoch_s <= segment_s, got epoch_s={self.epoch_s}, "
                             f"segment_s={self.segment_s}")
        for r in self.regions:
            if region_of(r).cloud not in self.pools:
                raise InputError(f"{where}: region {r} is in cloud {region_of(r).cloud}, which has no pools")

    @property
    def clouds(self) -> tuple[str, ...]:
        out = []
        for r in self.regions:
            c = region_of(r).cloud
            if c not in out:
                out.append(c)
        return tuple(out)


def region_of(name: str):
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

    if len(trace) < 2:  # a rate and a segment need two arrivals at least
        raise InputError(f"trace {trace.name!r}: needs at least 2 requests")
    main = max(cfg.classes, key=lambda c: c.rate_rps)

    def capacity(p: float, o: float) -> tuple[float, str]:
        pms = [(min(cfg.initial_replicas, spec.max_replicas),
                PerfModel(get_gpu(spec.gpu), get_model(cfg.variants[spec.variant].model), tp=spec.tp))
               for r in cfg.regions for spec in cfg.pools[region_of(r).cloud]]
        note = f"the {cfg.initial_replicas} instance(s) per pool a segment starts with, at the {main.name} SLO"
        cap = sum(k * capacity_rps(pm, p, o, main.ttft_s, main.tpot_s) for k, pm in pms)
        if cap <= 0:  # no instance meets the SLO for the mean request: the saturation rate
            cap = sum(k * capacity_rps(pm, p, o) for k, pm in pms)
            note += " (none meets it for the mean request: saturation rate used)"
        return cap, note

    dur = cfg.segment_s if duration_s is None else duration_s
    w, rep = adapt_trace(trace, rng, TraceFit(load=load, max_total_tokens=cfg.max_context, duration_s=dur),
                         capacity=capacity)
    total = sum(c.rate_rps for c in cfg.classes)
    cls = rng.choice(len(cfg.classes), size=len(w), p=[c.rate_rps / total for c in cfg.classes])
    rep.classes = {c.name: float((cls == i).mean()) for i, c in enumerate(cfg.classes)}
    rep.class_rule = "each request a class drawn by the classes' rate shares; SLO and quality weight from it"
    return w, cls, rep


def split_range(cfg: GraphMARLConfig, split: str, span: float) -> tuple[float, float]:
    """The part of a trace of length ``span`` a split draws from: ``train`` the first ``train_fraction -
    validation_fraction``, ``validation`` the rest of the first ``train_fraction``, ``test`` (held out) the last
    ``1 - train_fraction``."""
    tv = cfg.train_fraction * span
    va = max(cfg.train_fraction - cfg.validation_fraction, 0.0) * span
    if split == "train":
        return 0.0, va
    if split == "validation":
        return va, tv
    if split == "test":
        return tv, span
    raise InputError(f"graph-marl split {split!r}: expected train, validation or test")


def _window(t: np.ndarray, lo: float, hi: float, start: float, seg: float) -> tuple[np.ndarray, np.ndarray]:
    """The requests of trace times ``t`` in ``[start, start + seg)``, never outside the split ``[lo, hi)``: a
    window longer than the split wraps around to ``lo`` (the split's requests repeat, at later times). Returns
    (indices into ``t``, times from the window's start)."""
    idx, rel, done, at = [], [], 0.0, start
    while done < seg and hi > lo:
        take = min(seg - done, hi - at)
        i = np.nonzero((t >= at) & (t < at + take))[0]
        idx.append(i)
        rel.append(t[i] - at + done)
        done, at = done + take, lo
    if not idx:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(idx), np.concatenate(rel)


# the fewest arrivals in an epoch from which its share of long requests counts (MultiCloud.long_share; fewer: unknown)
LONG_SHARE_MIN_ARRIVALS = 20


def epoch_long_share(w: Workload, epoch_s: float) -> np.ndarray:
    """Per control epoch of ``w`` (``[k epoch_s, (k+1) epoch_s)``, to its last arrival): the share of the requests
    arriving in it that are long (more than ``LONG_TOKENS`` prompt + output tokens), NaN where fewer than
    ``LONG_SHARE_MIN_ARRIVALS`` arrived -- what ``MultiCloud.long_share`` reports after each epoch."""
    from fleetwise.control.views import LONG_TOKENS

    if not len(w):
        return np.zeros(0)
    ep = (np.asarray(w.arrival_s) // epoch_s).astype(np.int64)
    n = np.bincount(ep)
    k = np.bincount(ep, weights=(np.asarray(w.prompt_tokens) + np.asarray(w.output_tokens)) > LONG_TOKENS)
    return np.where(n >= LONG_SHARE_MIN_ARRIVALS, k / np.maximum(n, 1), np.nan)


def multicloud_workload(cfg: GraphMARLConfig, rng: np.random.Generator, held_out: bool,
                        duration_s: float | None = None, trace: Workload | None = None,
                        load: float | None = None, split: str | None = None) -> Workload:
    """One segment of ``duration_s``: each class's arrivals from its trace, time-scaled to its rate, from the
    training, validation or held-out (test) part of the trace (:func:`split_range`; ``split`` None: test when
    ``held_out``, else train); origins drawn by ``origin_weights``. A training segment scales each class's rate by
    a factor drawn log-uniformly from ``cfg.train_rate_range`` (one per class), and so does a validation segment
    when ``cfg.validation_varies``.
    A window reads only its split of a trace, wrapping around where the split is shorter (:func:`_window`).
    A user's ``trace`` is fitted by :func:`fit_multicloud_trace` (at ``load``) instead."""
    dur = cfg.segment_s if duration_s is None else duration_s
    split = split or ("test" if held_out else "train")
    parts = []
    lo_f, hi_f = cfg.train_rate_range
    vary = trace is None and (split == "train" or (split == "validation" and cfg.validation_varies))
    factor = np.exp(rng.uniform(np.log(lo_f), np.log(hi_f), len(cfg.classes))) if vary and hi_f > lo_f \
        else np.full(len(cfg.classes), lo_f if vary else 1.0)
    if trace is not None:
        fw, cls, _ = fit_multicloud_trace(cfg, trace, rng, dur, load)
        parts = [(cls, fw.arrival_s, fw.prompt_tokens, fw.output_tokens)]
    for ci, c in enumerate(cfg.classes if trace is None else ()):
        if not c.source.startswith("servegen:"):
            w = _trace(c.source, cfg.max_context)
            if len(w) < 2:
                raise InputError(f"trace {w.name!r}: needs at least 2 requests")
            span = float(w.arrival_s[-1] - w.arrival_s[0]) or 1.0
            speed = c.rate_rps * factor[ci] / (len(w) / span)
            seg = dur * speed
            lo, hi = split_range(cfg, split, span)
            start = lo + rng.uniform(0.0, max(hi - lo - seg, 0.0))
            idx, arr = _window(w.arrival_s, lo, hi, start, seg)
            arr = arr / speed
            pr, out = w.prompt_tokens[idx], w.output_tokens[idx]
        else:
            from fleetwise.workload.readers import servegen_arrivals
            from fleetwise.workload.synthetic import LognormalLengths

            rates = _servegen(c.source.split(":", 1)[1])
            day = float(rates.window_start_s[-1] + rates.window_s)
            mean_rate = float(np.nansum(rates.rate) * rates.window_s / day)  # requests/s over the trace
            scale = c.rate_rps * factor[ci] / max(mean_rate, 1e-9)
            lo, hi = split_range(cfg, split, day)
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
    plo, phi = cfg.train_prompt_range
    if vary and (plo, phi) != (1.0, 1.0):  # one prompt-length factor for the segment (drawn when not a point)
        f = np.exp(rng.uniform(np.log(plo), np.log(phi))) if phi > plo else plo
        prompt = np.round(prompt * f).astype(np.int64)
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
        from fleetwise.control.controller import Controller
        from fleetwise.fleet.topology import continental_backbone
        from fleetwise.perf import PerfModel
        from fleetwise.policies import make
        from fleetwise.sim.build import make_replica
        from fleetwise.sim.simulator import SimOptions, Simulator

        self.cfg = cfg
        self.clouds = cfg.clouds
        fleet = continental_backbone(list(cfg.regions))
        idx = [fleet.index(region_of(r).name) if region_of(r).name in fleet.names else fleet.index(r)
               for r in cfg.regions]
        self.rtt = np.asarray(fleet.rtt_s)[np.ix_(idx, idx)]
        self.egress = np.asarray(fleet.egress_usd_per_gb)[np.ix_(idx, idx)]
        self.pools: list[Pool] = []
        reps = []
        perfs = {}
        for ri, rname in enumerate(cfg.regions):
            cloud = region_of(rname).cloud
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
        self._ctl = Controller(router=self, batcher=self.batcher)
        self._arrivals = np.zeros(len(cfg.classes))
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
        from fleetwise.control.views import LONG_TOKENS

        self._is_long = ((np.asarray(workload.prompt_tokens) + np.asarray(workload.output_tokens))
                         > LONG_TOKENS).tolist()
        self._long = 0  # long requests (over LONG_TOKENS prompt + output tokens) that arrived this epoch
        # after each epoch: the share of long requests among those that arrived in it (None: fewer than
        # LONG_SHARE_MIN_ARRIVALS arrived; read by a trained policy's input guard, recipe.InputGuard)
        self.long_share: float | None = None
        self.ttft_slo = np.array([c.ttft_s for c in cfg.classes])[self.cls]
        self.tpot_slo = np.array([c.tpot_s for c in cfg.classes])[self.cls]
        self.quality = np.array([v.quality for v in cfg.variants])
        self.qw = np.array([c.quality_weight for c in cfg.classes])
        self.epoch = 0
        self.t_epoch = 0.0
        self.done = False
        self._busy_prev = np.zeros(len(reps))
        self.busy_frac = np.zeros(len(reps))
        self.cls_arrivals = np.zeros(ncls)
        self.pool_routed = np.zeros(len(self.pools), np.int64)  # requests routed to each pool last epoch
        self._routed = np.zeros(len(self.pools), np.int64)
        self.cls_slo = np.ones(ncls)
        self.cls_ok = np.zeros(ncls, np.int64)  # requests of each class that ended last epoch: within SLO
        self.cls_ended = np.zeros(ncls, np.int64)  # ... and all that ended (completed or dropped)
        # ... and their TTFTs (s, network included; a dropped request's is inf), per class: a tail constraint's input
        self.cls_ttft: list = [np.zeros(0)] * ncls
        self.decisions: list[dict] = []  # the world-level decisions of every epoch (act's input, for tests)
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

    def provisioning_left_s(self, i: int, now: float) -> float:
        """Seconds until replica ``i`` (switched on) is ready; 0 when ready or off."""
        st = self.inst[i]
        return max(st.ready_s - now, 0.0) if st.on else 0.0

    def covered(self, cloud: np.ndarray, variant: np.ndarray, without: set | None = None) -> np.ndarray:
        """Per class: whether a ready replica of its variant in its cloud (``cloud`` = len(clouds): any) exists,
        not counting the replicas in ``without``."""
        now, nclouds = self.sim.now, len(self.clouds)
        out = np.zeros(len(variant), bool)
        for k in range(len(variant)):
            for p in self.pools:
                if p.spec.variant != variant[k] or (cloud[k] < nclouds and p.cloud != cloud[k]):
                    continue
                if any(self.routable(i, now) and (without is None or i not in without) for i in p.replicas):
                    out[k] = True
                    break
        return out

    def backlog_s(self, i: int, now: float) -> float:
        rep = self.sim.replicas[i]
        return rep.pending_tokens / self.pools[self.pool_of[i]].tps

    # ------------------------------------------------------------------ actions
    def act(self, actions: dict) -> None:
        """Apply one epoch's decisions (missing agents keep their previous decisions / hold)."""
        cfg, now = self.cfg, self.sim.now
        nc = len(cfg.classes)
        self.decisions.append({k: np.asarray(v).copy() for k, v in actions.items()})
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

    def route(self, view) -> int:
        """The world's router (the simulator asks it through ``run_until``): the class's rule picks the replica."""
        rid = view.request
        self._arrivals[self.cls[rid]] += 1
        self._long += self._is_long[rid]
        ri = self.pick(rid)
        self._routed[self.pool_of[ri]] += 1
        return ri

    def pick(self, rid: int) -> int:
        """The replica for request ``rid`` under its class's cloud, variant and routing rule."""
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
        self._arrivals = arrivals = np.zeros(len(cfg.classes))
        self._long = 0
        if sim.run_until(t_end, self._ctl) is None:
            self.done = True
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
        ncls = len(cfg.classes)
        c_ok, c_end = np.zeros(ncls, np.int64), np.zeros(ncls, np.int64)
        c_ttft: list = [[] for _ in range(ncls)]
        qsum = 0.0
        egress = 0.0
        fts, cmp_, arr, out = sim.first_token_s, sim.completion_s, sim.arrival, sim.output
        for rid in sim.completions:
            c_end[self.cls[rid]] += 1
            if sim.status[rid] != 1:
                dropped += 1
                c_ttft[self.cls[rid]].append(math.inf)
                continue
            half = sim.net_s[rid] / 2.0
            ttft = fts[rid] + half - arr[rid]
            c_ttft[self.cls[rid]].append(ttft)
            tpot = (cmp_[rid] - fts[rid]) / max(out[rid] - 1, 1)
            good = ttft <= self.ttft_slo[rid] and tpot <= self.tpot_slo[rid]
            self.slo_ok[rid] = good
            ri = sim.replica_of[rid]
            c = self.cls[rid]
            qsum += self.qw[c] * self.quality[self.pools[self.pool_of[ri]].spec.variant]
            if good:
                ok += 1
                c_ok[c] += 1
            else:
                late += 1
            reg = sim.replicas[ri].region
            if reg != sim.origin[rid]:  # prompt in, text out, ~4 bytes per token
                egress += (sim.prompt[rid] + out[rid]) * 4e-9 * self.egress[sim.origin[rid]][reg]
        n_end = ok + late
        self.cls_ok, self.cls_ended = c_ok, c_end
        self.cls_ttft = [np.asarray(t, dtype=np.float64) for t in c_ttft]
        self.cls_slo = np.where(c_end > 0, c_ok / np.maximum(c_end, 1), self.cls_slo)
        sim.completions.clear()
        self.gpu_usd += usd
        self.egress_usd += egress
        self.cls_arrivals = arrivals / max(dt, 1e-9)
        n_arr = int(arrivals.sum())
        self.long_share = self._long / n_arr if n_arr >= LONG_SHARE_MIN_ARRIVALS else None
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
        cls_c = np.asarray(self.cls)[:n][comp]
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
            **{f"slo_attainment_{c.name}": float(self.slo_ok[self.cls == k].sum() / max((self.cls == k).sum(), 1))
               for k, c in enumerate(self.cfg.classes)},
            **{f"latency_p99_s_{c.name}": float(np.percentile(ttft[cls_c == k], 99)) if (cls_c == k).any() else math.nan
               for k, c in enumerate(self.cfg.classes)},
            "dropped": int((st != 1).sum()),
            "quality": float(np.mean(qual)),
        }
