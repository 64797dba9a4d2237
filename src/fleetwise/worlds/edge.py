"""The edge world of DISPPO (docs/batching.md): several edge nodes with small GPUs, users attached to nodes, a
backhaul between them; request types with TTFT and end-to-end deadlines replayed from real traces.

``EdgeView`` holds the semi-Markov decision process's observation and action -> ``BatchPlan`` mapping, read from a
lane's ``LaneView``. The action adjusts the best rule, ``offload_greedy`` (:class:`OffloadGreedy`: Sarathi-style
chunked prefill, and offloading from the slowest node while a neighbour's backlog is shorter): a chunk budget and an
offload choice, index 0 of each being the rule's own, so the zero action is the rule, decision for decision.
``fleetwise.envs.edge.EdgeBatchingEnv`` is the Gymnasium environment over it and ``EdgePolicyBatcher`` runs a
trained policy as a batcher in the same simulator.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from fleetwise.control.protocols import DECODE, BatchPlan
from fleetwise.control.views import LaneView
from fleetwise.workload.request import Workload


@dataclass(frozen=True)
class RequestType:
    name: str
    trace: str  # trace alias or file: arrivals and lengths
    ttft_s: float  # deadline terms: end-to-end deadline = ttft_s + (output tokens - 1) * tpot_s
    tpot_s: float
    rate_share: float  # share of the total arrival rate


@dataclass(frozen=True)
class EdgeNode:
    name: str
    gpu: str
    user_share: float  # share of the users (and so of the requests) attached to this node


@dataclass(frozen=True)
class EdgeConfig:
    """The edge scenario. Defaults: three heterogeneous nodes serving Llama-3-8B with 4-bit weights."""

    nodes: tuple[EdgeNode, ...] = (
        EdgeNode("orin", "jetson-agx-orin-64gb", 0.4),
        EdgeNode("l4", "l4", 0.3),
        EdgeNode("t4", "t4", 0.3),
    )
    model: str = "llama-3-8b-int4"
    types: tuple[RequestType, ...] = (
        RequestType("chat", "azure-conv", ttft_s=2.0, tpot_s=0.10, rate_share=0.6),
        RequestType("code", "azure-code", ttft_s=1.5, tpot_s=0.08, rate_share=0.3),
        RequestType("summarize", "mooncake", ttft_s=15.0, tpot_s=0.15, rate_share=0.1),
    )
    rate_rps: float = 2.0  # total over all nodes
    segment_s: float = 300.0
    train_fraction: float = 0.7  # of each trace's time span; the rest is held out
    backhaul_rtt_s: float = 0.010
    backhaul_gbps: float = 1.0
    # the action: a prefill chunk budget (tokens per iteration, Sarathi-style; 0 = a decode step only when
    # anything decodes) x an offload choice (the rule's, never, the head of the queue now) x the order in which
    # new prompts are admitted (FCFS, or deadline: feasible first, earliest TTFT deadline first). Index 0 of each
    # is the rule's own (offload_greedy: 512-token chunks, offload from the slowest node, FCFS), so [0, 0, 0] is
    # the rule.
    chunk_sizes: tuple[int, ...] = (512, 0, 128, 256, 1024, 2048, 8192)
    offload_margin_s: float = 1.0  # the rule offloads when its backlog exceeds the neighbour's by this much
    max_running: int = 32
    miss_penalty: float = 0.5
    drop_penalty: float = 1.0
    gpu_memory_utilization: float = 0.9
    block_tokens: int = 16
    drain_s: float = 120.0  # after the segment's last arrival; unfinished requests then count as dropped

    validation_fraction: float = 0.1  # the end of the training part: validation windows (checkpoint choice)

    def __post_init__(self) -> None:
        """Values a segment cannot run with are refused here, naming the field (max_running=0 divided by zero,
        nodes=() failed in numpy's choice, rate_rps=0 gave an episode with no decision)."""
        def bad(field: str, what: str) -> ValueError:
            return ValueError(f"EdgeConfig.{field} = {getattr(self, field)!r}: expected {what}")

        finite = {k: getattr(self, k) for k in ("rate_rps", "segment_s", "backhaul_rtt_s", "backhaul_gbps",
                                                 "offload_margin_s", "miss_penalty", "drop_penalty", "drain_s")}
        for k, v in finite.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise bad(k, "a finite number")
        if (isinstance(self.nodes, (str, bytes)) or not self.nodes
                or not all(isinstance(n, EdgeNode) for n in self.nodes)):
            raise bad("nodes", "at least one edge node (a tuple of EdgeNode)")
        # the chunk choices: whole token budgets, the rule's first; 0 is the decode-only step (() was gymnasium's
        # error, 0 first or "512" failed at the first step)
        cs = self.chunk_sizes
        if (isinstance(cs, (str, bytes)) or not cs
                or not all(isinstance(c, numbers.Integral) and not isinstance(c, bool) and 0 <= c <= 10_000_000
                           for c in cs) or cs[0] < 1):
            raise bad("chunk_sizes", "a non-empty tuple of token budgets from 0 to 10,000,000, the first >= 1 "
                      "(the rule's)")
        for k in ("rate_rps", "segment_s", "backhaul_gbps"):
            if finite[k] <= 0:
                raise bad(k, "> 0")
        for k in ("backhaul_rtt_s", "offload_margin_s", "miss_penalty", "drop_penalty", "drain_s"):
            if finite[k] < 0:
                raise bad(k, ">= 0")
        # upper bounds too: max_running=10**12 tabulated a step time per batch size and hung the reset
        if not (isinstance(self.max_running, numbers.Integral) and 1 <= self.max_running <= 4096):
            raise bad("max_running", "an integer from 1 to 4,096")
        if not (isinstance(self.block_tokens, numbers.Integral) and 1 <= self.block_tokens <= 1024):
            raise bad("block_tokens", "an integer from 1 to 1,024")
        if self.rate_rps > 10_000 or self.segment_s > 86_400 * 366 or self.drain_s > 86_400:
            raise bad("rate_rps" if self.rate_rps > 10_000 else "segment_s" if self.segment_s > 86_400 * 366
                      else "drain_s", "rate_rps <= 10,000, segment_s <= a year, drain_s <= a day")
        # the mix: a request type with no share drew no request (rate_share 0: an episode with no decision)
        if not self.types:
            raise bad("types", "at least one request type")
        for t in self.types:
            if not (isinstance(t.rate_share, (int, float)) and math.isfinite(t.rate_share) and t.rate_share > 0):
                raise ValueError(f"EdgeConfig.types: {t.name!r} rate_share {t.rate_share!r}: expected a number > 0")
            if not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in (t.ttft_s, t.tpot_s)):
                raise ValueError(f"EdgeConfig.types: {t.name!r}: ttft_s and tpot_s must be numbers > 0")
        for nd in self.nodes:
            if not (isinstance(nd.user_share, (int, float)) and math.isfinite(nd.user_share) and nd.user_share >= 0):
                raise ValueError(f"EdgeConfig.nodes: {nd.name!r} user_share {nd.user_share!r}: expected a number >= 0")
        if sum(nd.user_share for nd in self.nodes) <= 0:
            raise bad("nodes", "some node with user_share > 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise bad("gpu_memory_utilization", "in (0, 1]")
        if not 0 <= self.validation_fraction < self.train_fraction <= 1:
            raise bad("train_fraction", f"in ({self.validation_fraction}, 1] (above validation_fraction)")

    @property
    def action_nvec(self) -> tuple[int, int, int]:
        return (len(self.chunk_sizes), len(OFFLOAD_CHOICES), len(QUEUE_ORDERS))


RULE = "offload_greedy"  # the rule of this world (OffloadGreedy below): the learned policy's zero action
OFFLOAD_CHOICES = ("rule", "never", "now")
QUEUE_ORDERS = ("fcfs", "deadline")


def n_features(nodes: int) -> int:
    """Length of the observation (``EdgeView.observe``) for ``nodes`` edge nodes."""
    return 16 + 3 * (nodes - 1)
SPLITS = ("train", "validation", "test")


def split_range(cfg: EdgeConfig, split: str | bool) -> tuple[float, float]:
    """The part of each trace's time span a split draws its windows from (fractions): train, then validation
    (the last ``validation_fraction`` of the training part), then test (held out). ``True``/``False``: test/train."""
    split = {True: "test", False: "train"}.get(split, split)  # type: ignore[arg-type]
    v = cfg.train_fraction - cfg.validation_fraction
    if split == "train":
        return 0.0, v
    if split == "validation":
        return v, cfg.train_fraction
    if split == "test":
        return cfg.train_fraction, 1.0
    raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")


@functools.lru_cache(maxsize=16)
def _trace(alias: str, max_total: int) -> Workload:
    from fleetwise.workload.spec import load_trace
    from fleetwise.workload.synthetic import clip_total_tokens

    w = load_trace(alias)
    w.prompt_tokens, w.output_tokens = clip_total_tokens(w.prompt_tokens, w.output_tokens, max_total)
    return w


def fit_edge_trace(cfg: EdgeConfig, trace: Workload, rng: np.random.Generator, load: float | None = None):
    """A user's trace as one segment of this scenario (fleetwise.workload.adapt, docs/workloads.md): prompts clipped
    to the model's context, ``segment_s`` simulated seconds of it (a window, or a block bootstrap when the trace is
    shorter, drawn by ``rng``), at ``load`` x the capacity of the edge (``None``: the trace's own rate). Users stay
    at their node unless a policy offloads, so the capacity is the rate at which the busiest node (its
    ``capacity_rps`` for the trace's mean request under the main request type's deadlines, over its user share)
    reaches load 1. Each request is a request type drawn by ``rate_share`` (its deadlines follow the type).
    Returns (workload, request type per request, AdaptReport)."""
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel
    from fleetwise.perf.capacity import capacity_rps
    from fleetwise.workload.adapt import TraceFit, adapt_trace

    model = get_model(cfg.model)
    main = max(cfg.types, key=lambda t: t.rate_share)
    users = np.array([n.user_share for n in cfg.nodes], float)
    users /= users.sum()

    def capacity(p: float, o: float) -> tuple[float, str]:
        caps, sat = [], []
        for n in cfg.nodes:
            kw = dict(max_num_seqs=cfg.max_running, gpu_memory_utilization=cfg.gpu_memory_utilization)
            pm = PerfModel(get_gpu(n.gpu), model)
            c = capacity_rps(pm, p, o, main.ttft_s, main.tpot_s, **kw)
            if c <= 0:  # no batch meets the deadlines for the mean request: its saturation rate
                c = capacity_rps(pm, p, o, **kw)
                sat.append(n.name)
            caps.append(c)
        k = int(np.argmin(np.asarray(caps) / users))
        note = (f"the busiest node {cfg.nodes[k].name} ({caps[k]:.3g} req/s for its {users[k]:.0%} of the users) "
                f"sets it")
        if sat:
            note += (f"; {', '.join(sat)}: no batch meets the {main.name} deadlines for the mean request, "
                     f"saturation rate used")
        return caps[k] / users[k], note

    fit = TraceFit(load=load, max_total_tokens=model.max_context, duration_s=cfg.segment_s)
    w, rep = adapt_trace(trace, rng, fit, capacity=capacity)
    shares = np.array([t.rate_share for t in cfg.types], float)
    ptype = rng.choice(len(cfg.types), size=len(w), p=shares / shares.sum())
    rep.classes = {t.name: float((ptype == i).mean()) for i, t in enumerate(cfg.types)}
    rep.class_rule = "each request a request type drawn by rate_share; deadlines from its type"
    return w, ptype, rep


def trace_part(alias: str, split: str, cfg: EdgeConfig) -> Workload:
    """The part of a trace (alias) that ``split`` may use (:func:`split_range` of its time span)."""
    from fleetwise.catalog import get_model

    w = _trace(alias, get_model(cfg.model).max_context)
    span = float(w.arrival_s[-1] - w.arrival_s[0]) or 1.0
    lo, hi = split_range(cfg, split)
    t = w.arrival_s - w.arrival_s[0]
    return w.take(np.nonzero((t >= lo * span) & (t < hi * span))[0])


@dataclass(frozen=True)
class TrainMix:
    """The distribution of training segments (robustness: several loads and trace shapes, docs/batching.md).

    With probability ``p_paper`` the paper's request mix at ``rate_rps`` drawn uniformly from ``rate_range``;
    otherwise one of ``traces`` (its training part only: windows the test never uses) fitted to the edge
    (``fleetwise.workload.adapt``: prompts clipped to the context) at a load drawn from ``load_range``, each request a
    request type by ``rate_share``."""

    p_paper: float = 0.5
    rate_range: tuple[float, float] = (1.0, 2.5)
    traces: tuple[str, ...] = ("azure-conv", "azure-code", "mooncake")
    load_range: tuple[float, float] = (0.4, 1.0)

    def draw(self, cfg: EdgeConfig, rng: np.random.Generator, split: bool | str = "train"):
        """One segment of the mix: (config, segment seed, trace part or None, load or None), the arguments of
        ``worlds.edge.segment`` (the environment's episodes and ``learn.batching_cem``'s training segments)."""
        seed = int(rng.integers(2**31))
        if rng.random() < self.p_paper:
            return replace(cfg, rate_rps=float(rng.uniform(*self.rate_range))), seed, None, None
        alias = self.traces[int(rng.integers(len(self.traces)))]
        part = trace_part(alias, {True: "test", False: "train"}.get(split, split), cfg)
        return cfg, seed, part, float(rng.uniform(*self.load_range))


def edge_workload(cfg: EdgeConfig, rng: np.random.Generator, held_out: bool | str, trace: Workload | None = None,
                  load: float | None = None, fit_cfg: EdgeConfig | None = None
                  ) -> tuple[Workload, np.ndarray, np.ndarray]:
    """One segment: each type's trace scaled to its share of ``rate_rps``, a window of ``segment_s`` from the
    part of its time span that the split uses (``held_out``: a split name, or True = test, False = train;
    :func:`split_range`); origins drawn by the nodes' user shares. A user's
    ``trace`` is fitted by :func:`fit_edge_trace` (at ``load`` of ``fit_cfg``'s capacity, default ``cfg``'s) instead.
    Returns (workload, TTFT deadline per request, end-to-end deadline per request), deadlines as absolute times."""
    from fleetwise.catalog import get_model

    max_total = get_model(cfg.model).max_context
    if trace is not None:
        fitted, ptype, _ = fit_edge_trace(fit_cfg or cfg, trace, rng, load)
        arr, order = fitted.arrival_s, np.arange(len(fitted))
        prompt, output = fitted.prompt_tokens, fitted.output_tokens
    else:
        parts = []
        for ti, t in enumerate(cfg.types):
            w = _trace(t.trace, max_total)
            span = float(w.arrival_s[-1] - w.arrival_s[0]) or 1.0
            speed = (cfg.rate_rps * t.rate_share) / (len(w) / span)  # time compression to reach the type's rate
            seg_trace = cfg.segment_s * speed  # trace seconds one segment covers
            lo, hi = (f * span for f in split_range(cfg, held_out))
            start = lo + rng.uniform(0.0, max(hi - lo - seg_trace, 0.0))
            idx = np.nonzero((w.arrival_s >= start) & (w.arrival_s < start + seg_trace))[0]
            parts.append((ti, (w.arrival_s[idx] - start) / speed, w.prompt_tokens[idx], w.output_tokens[idx]))
        arr = np.concatenate([p[1] for p in parts])
        order = np.argsort(arr, kind="stable")
        ptype = np.concatenate([np.full(len(p[1]), p[0]) for p in parts])[order]
        prompt = np.concatenate([p[2] for p in parts])[order]
        output = np.concatenate([p[3] for p in parts])[order]
    shares = np.array([n.user_share for n in cfg.nodes], dtype=float)
    origin = rng.choice(len(cfg.nodes), size=len(arr), p=shares / shares.sum())
    w = Workload(arrival_s=arr[order], prompt_tokens=prompt, output_tokens=output, origin=origin,
                 slo_class=ptype, origins=[n.name for n in cfg.nodes], slo_classes=[t.name for t in cfg.types],
                 name="edge" if trace is None else f"edge:{trace.name}")
    ttft = np.array([t.ttft_s for t in cfg.types])[ptype]
    tpot = np.array([t.tpot_s for t in cfg.types])[ptype]
    return w, w.arrival_s + ttft, w.arrival_s + ttft + np.maximum(output - 1, 0) * tpot


def build_edge_sim(cfg: EdgeConfig, workload: Workload, seed: int, learned: bool):
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel
    from fleetwise.sim.build import make_replica
    from fleetwise.sim.simulator import SimOptions, Simulator

    model = get_model(cfg.model)
    reps = []
    perfs = {}
    for i, node in enumerate(cfg.nodes):
        gpu = get_gpu(node.gpu)
        perf = perfs.setdefault(gpu.name, PerfModel(gpu, model))
        reps.append(make_replica(i, perf, region=i, name=node.name, block_tokens=cfg.block_tokens,
                                 gpu_memory_utilization=cfg.gpu_memory_utilization, prefix_caching=False))
    n = len(cfg.nodes)
    rtt = np.full((n, n), cfg.backhaul_rtt_s)
    np.fill_diagonal(rtt, 0.0)
    bw = np.full((n, n), cfg.backhaul_gbps)
    horizon = (float(workload.arrival_s[-1]) if len(workload) else 0.0) + cfg.drain_s
    sim = Simulator(reps, workload, rtt_s=rtt, bandwidth_gbps=bw, model_index=np.zeros(len(workload), np.int64),
                    max_context=[model.max_context], seed=seed,
                    options=SimOptions(prefix_caching=False, max_time_s=horizon))
    sim.batcher_stationary = not learned
    return sim


@dataclass
class EdgeView:
    """Per-simulation constants and the MDP's helpers, shared by the environment and the trained-policy batcher.
    Everything about the lane that decides comes from its ``LaneView``; the neighbours (offload targets) from
    the simulator's public API."""

    cfg: EdgeConfig
    sim: object
    ttft_deadline: np.ndarray
    e2e_deadline: np.ndarray
    prefill_tps: list = field(default_factory=list)
    step_s: list = field(default_factory=list)

    def __post_init__(self):
        sim = self.sim
        self._ttft_dl = self.ttft_deadline.tolist()
        self._e2e_dl = self.e2e_deadline.tolist()
        self._output = sim.workload.output_tokens.tolist()
        for r in sim.replicas:
            p = r.perf
            self.prefill_tps.append(1024.0 / p.iteration_time_s(1024, 1024.0 * 1024.0, 0, 0))
            self.step_s.append([p.decode_coeffs(b)[0] if b else 0.0 for b in range(self.cfg.max_running + 1)])
        self.n_features = n_features(len(sim.replicas))
        self.slowest = int(np.argmin(self.prefill_tps))  # where offload_greedy offloads from
        self._chunkers: dict = {}

    # ---------------------------------------------------------------- helpers
    def backlog_s(self, ri: int, now: float) -> float:
        return self.sim.replicas[ri].outstanding_tokens(now) / self.prefill_tps[ri]

    def offload_target(self, view: LaneView, rid: int) -> int:
        sim = self.sim
        best, best_t = -1, math.inf
        for r in sim.replicas:
            if r.index == view.replica or not sim.fits(rid, r.index):
                continue
            t = self.backlog_s(r.index, view.time_s)
            if t < best_t:
                best, best_t = r.index, t
        return best

    def rule_offload(self, view: LaneView) -> int:
        """The rule's offload decision for the head of the queue: its target replica, or -1. offload_greedy
        offloads from the slowest node (the smallest prefill speed) while the least-backlogged neighbour's
        estimated backlog is shorter than this node's by ``offload_margin_s``, once per request."""
        if view.replica != self.slowest or not view.waiting:
            return -1
        head = view.waiting[0]
        if view.offloaded(head):
            return -1
        to = self.offload_target(view, head)
        if to < 0 or self.backlog_s(view.replica, view.time_s) <= self.backlog_s(to, view.time_s) + \
                self.cfg.offload_margin_s:
            return -1
        return to

    def mask(self, view: LaneView) -> np.ndarray:
        """The choices (chunk choices, then offload choices, then queue orders) that differ from the rule's (index
        0 of each, always allowed): a chunk other than the rule's needs prompt tokens to prefill (a budget of 0 a
        decoding sequence too), "never" needs the rule to offload, "now" needs the rule not to and a neighbour
        that can hold the head of the queue, "deadline" order needs two waiting requests."""
        nc, no = len(self.cfg.chunk_sizes), len(OFFLOAD_CHOICES)
        m = np.zeros(nc + no + len(QUEUE_ORDERS), dtype=bool)
        m[0] = m[nc] = m[nc + no] = True
        m[nc + no + 1] = len(view.waiting) >= 2
        if view.waiting or view.prefilling:
            m[:nc] = True
            m[1] = bool(view.running)
        rule_to = self.rule_offload(view)
        m[nc + 1] = rule_to >= 0
        if rule_to < 0 and view.waiting and not view.offloaded(view.waiting[0]):
            m[nc + 2] = self.offload_target(view, view.waiting[0]) >= 0
        return m

    def plan(self, view: LaneView, action=(0, 0, 0)) -> BatchPlan:
        """The batch plan of ``action`` = (chunk index, offload index, queue order index); (0, 0, 0) is
        offload_greedy's own plan (a 2-element action means FCFS).

        Offload: index 0 the rule's decision (:meth:`rule_offload`), 1 never, 2 the head of the queue now (to
        the least-backlogged neighbour that can hold it; the rule's decision when none can). An offload is the
        whole plan (the node then decides again). Otherwise a Sarathi iteration with ``chunk_sizes[chunk]``
        prompt tokens (unfinished prefills first, then new requests in the queue order: 0 FCFS, 1 deadline:
        the requests that can still meet their TTFT deadline, estimated by their prefill time alone, earliest
        deadline first, then the rest, earliest first); a budget of 0 is a decode step when anything decodes
        (else the rule's chunk)."""
        cfg = self.cfg
        ci, oi = int(action[0]), int(action[1])
        qi = int(action[2]) if len(action) > 2 else 0
        if not (len(action) in (2, 3) and 0 <= ci < len(cfg.chunk_sizes) and 0 <= oi < len(OFFLOAD_CHOICES)
                and 0 <= qi < len(QUEUE_ORDERS)):
            raise ValueError(f"action {action!r}: expected (chunk in [0, {len(cfg.chunk_sizes)}), offload in "
                             f"[0, {len(OFFLOAD_CHOICES)}), queue order in [0, {len(QUEUE_ORDERS)}))")
        to = -1
        if oi == 2 and view.waiting and not view.offloaded(view.waiting[0]):
            to = self.offload_target(view, view.waiting[0])
        if oi == 0 or (oi == 2 and to < 0):
            to = self.rule_offload(view)
        if to >= 0:
            return BatchPlan(offload=((view.waiting[0], to),))
        chunk = cfg.chunk_sizes[ci]
        if chunk == 0:
            if view.running:
                return DECODE
            chunk = cfg.chunk_sizes[0]
        if qi == 1 and len(view.waiting) >= 2:
            return self._sarathi(chunk).plan_queue(view, self.deadline_order(view))
        return self._sarathi(chunk).plan(view)

    def deadline_order(self, view: LaneView) -> list[int]:
        """The waiting queue in deadline order: requests whose prompt can still be prefilled by their TTFT
        deadline at this node's prefill speed first, earliest deadline first; then the others, earliest first
        (stable: FCFS among equal deadlines)."""
        now, tps, dl = view.time_s, self.prefill_tps[view.replica], self._ttft_dl
        return sorted(view.waiting, key=lambda r: (dl[r] - now - view.context(r) / tps < 0, dl[r]))

    def _sarathi(self, chunk: int):
        s = self._chunkers.get(chunk)
        if s is None:
            from fleetwise.policies.batchers import Sarathi

            s = self._chunkers[chunk] = Sarathi(chunk_tokens=chunk, max_num_seqs=self.cfg.max_running)
        return s
    def observe(self, view: LaneView) -> np.ndarray:
        sim, cfg = self.sim, self.cfg
        now = view.time_s
        ri = view.replica
        o = np.zeros(self.n_features, dtype=np.float32)
        waiting = view.waiting
        tps = self.prefill_tps[ri]
        nrun = len(view.running)
        o[0] = min(len(waiting) / 32.0, 1.0)
        o[1] = min(nrun / cfg.max_running, 1.0)
        o[2] = 1.0 - view.free_blocks / view.cap_blocks if view.cap_blocks else 1.0
        step = self.step_s[ri][min(nrun, cfg.max_running)] if nrun else self.step_s[ri][1]

        def slack(x: float) -> float:  # seconds -> [0, 1], 0.5 = no slack left
            return min(max(0.5 + x / 40.0, 0.0), 1.0)

        if waiting:
            head = waiting[0]
            o[3] = min(view.context(head) / 8192.0, 1.0)
            o[4] = slack(self._ttft_dl[head] - now - view.context(head) / tps)
            tok = 0
            worst = math.inf
            for rid in waiting:
                c = view.context(rid)
                tok += c
                s = self._ttft_dl[rid] - now - c / tps
                if s < worst:
                    worst = s
            o[5] = slack(worst)
            o[8] = min(tok / 16384.0, 1.0)
            o[11] = 0.0 if view.offloaded(head) else 1.0
        else:
            o[4] = o[5] = 1.0
        if nrun:
            worst = math.inf
            risk = 0
            out = self._output
            for rid in view.running:
                s = self._e2e_dl[rid] - now - (out[rid] - view.generated(rid)) * step
                if s < worst:
                    worst = s
                if s < 0:
                    risk += 1
            o[6] = slack(worst)
            o[7] = risk / nrun
        else:
            o[6] = 1.0
        o[9] = min(tps / 10000.0, 1.0)
        o[10] = min(step / 0.2, 1.0)
        o[12] = min(sum(view.prefill_left(r) for r in view.prefilling) / 8192.0, 1.0)
        o[13] = 1.0 if self.rule_offload(view) >= 0 else 0.0
        own = self.backlog_s(ri, now)
        o[14] = min(own / 20.0, 1.0)
        if waiting and o[11]:  # the rule's offload test at this node, whichever node it is
            to = self.offload_target(view, waiting[0])
            if to >= 0 and own > self.backlog_s(to, now) + cfg.offload_margin_s:
                o[15] = 1.0
        k = 16
        for r in sim.replicas:
            if r.index == ri:
                continue
            o[k] = min(len(r.waiting) / 32.0, 1.0)
            o[k + 1] = min(len(r.lanes[0].running) / cfg.max_running, 1.0)
            o[k + 2] = min(self.backlog_s(r.index, now) / 20.0, 1.0)
            k += 3
        return o

    def ttft_ok(self, rid: int) -> bool:
        """Whether the request's first token came by its TTFT deadline (server side)."""
        t = self.sim.first_token_s[rid]
        return t == t and t <= self._ttft_dl[rid] + 1e-9

    def outcome(self, rid: int) -> int:
        """+1 on time, 0 late, -1 dropped."""
        t = self.sim.client_completion_s(rid)
        if t != t:  # NaN: not completed
            return -1
        return 1 if t <= self._e2e_dl[rid] + 1e-9 else 0


class OffloadGreedy:
    """The rule ``offload_greedy`` as a ``Batcher`` (docs/batching.md): greedy Sarathi-style chunked prefill
    (every iteration decodes the running sequences and fills a ``chunk_sizes[0]``-token budget with prompt chunks),
    and the slowest node offloads the head of its queue to the least-backlogged neighbour while that neighbour's
    backlog is shorter by ``offload_margin_s``. It reads the neighbours' state, so it decides every iteration (not
    stationary). The learned policy's zero action is this plan (``EdgeView.plan(view, (0, 0, 0))``)."""

    stationary = False

    def __init__(self, view: EdgeView):
        self.view = view

    def plan(self, lane: LaneView) -> BatchPlan:
        return self.view.plan(lane, (0, 0, 0))


class EdgePolicyBatcher:
    """A trained policy (anything with ``predict(obs, action_masks=..., deterministic=True)`` returning the (chunk,
    offload, queue order) action, e.g. MaskablePPO or ``fleetwise.learn.disppo.NumpyPolicy``) as a ``Batcher`` in the same simulator; it decides every iteration."""

    stationary = False

    def __init__(self, model, view: EdgeView):
        self.model = model
        self.view = view

    def plan(self, lane: LaneView) -> BatchPlan:
        a, _ = self.model.predict(self.view.observe(lane), action_masks=self.view.mask(lane), deterministic=True)
        return self.view.plan(lane, a)


def segment(cfg: EdgeConfig, seed: int, split: bool | str = True, trace: Workload | None = None,
             load: float | None = None, learned: bool = False, fit_cfg: EdgeConfig | None = None) -> EdgeView:
    """The segment that ``seed`` draws (workload, deadlines and simulator), as an ``EdgeView`` of a fresh
    simulator: ``evaluate`` and the environment's ``reset(options={"segment_seed": seed})`` run the same one."""
    rng = np.random.default_rng(seed)
    w, ttft_dl, e2e_dl = edge_workload(cfg, rng, split, trace, load, fit_cfg)
    sim = build_edge_sim(cfg, w, seed, learned=learned)  # run() sets stationarity from the batcher
    return EdgeView(cfg, sim, ttft_dl, e2e_dl)


def evaluate(cfg: EdgeConfig, make_batcher, seeds: Sequence[int], held_out: bool | str = True,
             trace: Workload | None = None, load: float | None = None,
             fit_cfg: EdgeConfig | None = None) -> list[dict]:
    """Run one policy on the segments drawn by ``seeds``; per seed the deadline metrics and the summary.

    ``make_batcher(view)`` returns a Batcher (a heuristic, or ``EdgePolicyBatcher``). ``fit_cfg``: the scenario
    whose capacity a ``trace``'s load is measured against (default ``cfg``; the batch-size sweep keeps the
    uncapped one, so that every batch limit replays the same requests, as it does without a trace)."""
    from fleetwise.control.controller import Controller
    from fleetwise.metrics.summary import summarize
    from fleetwise.policies import make
    from fleetwise.workload.slo import SLOClass

    out = []
    for seed in seeds:
        view = segment(cfg, seed, held_out, trace, load, fit_cfg=fit_cfg)
        sim, w = view.sim, view.sim.workload
        batcher = make_batcher(view)
        rec = sim.run(Controller(router=make("router", "nearest_region"), batcher=batcher))
        on_time = sum(1 for rid in range(len(w)) if view.outcome(rid) == 1)
        slo = [SLOClass(t.name, t.ttft_s, t.tpot_s) for t in cfg.types]
        s = summarize(rec, sim.replicas, slo_classes=slo, with_ideal=False)
        out.append({"seed": seed, "requests": len(w), "on_time": on_time,
                    "deadline_rps": on_time / cfg.segment_s, "goodput_rps": s["goodput_rps"],
                    "ttft_p99_s": s["ttft_p99_s"], "e2e_p99_s": s["e2e_p99_s"], "completed": s["completed"],
                    "dropped": len(w) - s["completed"],  # unfinished at the horizon, or rejected
                    "ttft_attainment": sum(view.ttft_ok(r) for r in range(len(w))) / max(len(w), 1),
                    "offloaded": int(np.frombuffer(sim.hops, dtype=np.int8).sum())})
    return out


def with_batch_limit(cfg: EdgeConfig, b: int) -> EdgeConfig:
    """The same scenario with batches capped at ``b``: at most ``b`` sequences decode at once (the action space
    is unchanged, so a trained policy still applies)."""
    return replace(cfg, max_running=b)
