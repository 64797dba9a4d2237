"""The edge world of DISPPO (docs/batching.md): several edge nodes with small GPUs, users attached to nodes, a
backhaul between them; request types with TTFT and end-to-end deadlines replayed from real traces.

``EdgeView`` holds the semi-Markov decision process's observation, action mask and action -> ``BatchPlan``
mapping, read from a lane's ``LaneView``; ``fleetwise.envs.edge.EdgeBatchingEnv`` is the Gymnasium environment
over it and ``EdgePolicyBatcher`` runs a trained policy as a batcher in the same simulator.
"""

from __future__ import annotations

import functools
import math
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
    prefill_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_running: int = 32
    wait_s: float = 0.05
    miss_penalty: float = 0.5
    drop_penalty: float = 1.0
    gpu_memory_utilization: float = 0.9
    block_tokens: int = 16
    drain_s: float = 120.0  # after the segment's last arrival; unfinished requests then count as dropped

    @property
    def num_actions(self) -> int:
        return len(self.prefill_sizes) + 3


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


def edge_workload(cfg: EdgeConfig, rng: np.random.Generator, held_out: bool, trace: Workload | None = None,
                  load: float | None = None) -> tuple[Workload, np.ndarray, np.ndarray]:
    """One segment: each type's trace scaled to its share of ``rate_rps``, a window of ``segment_s`` from the
    training part (or the held-out part) of its time span; origins drawn by the nodes' user shares. A user's
    ``trace`` is fitted by :func:`fit_edge_trace` (at ``load``) instead.
    Returns (workload, TTFT deadline per request, end-to-end deadline per request), deadlines as absolute times."""
    from fleetwise.catalog import get_model

    max_total = get_model(cfg.model).max_context
    if trace is not None:
        fitted, ptype, _ = fit_edge_trace(cfg, trace, rng, load)
        arr, order = fitted.arrival_s, np.arange(len(fitted))
        prompt, output = fitted.prompt_tokens, fitted.output_tokens
    else:
        parts = []
        for ti, t in enumerate(cfg.types):
            w = _trace(t.trace, max_total)
            span = float(w.arrival_s[-1] - w.arrival_s[0]) or 1.0
            speed = (cfg.rate_rps * t.rate_share) / (len(w) / span)  # time compression to reach the type's rate
            seg_trace = cfg.segment_s * speed  # trace seconds one segment covers
            lo, hi = (0.0, cfg.train_fraction * span) if not held_out else (cfg.train_fraction * span, span)
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
                 name="edge")
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
        self.n_features = 12 + 3 * (len(sim.replicas) - 1)

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

    def _prefill_batch(self, view: LaneView, b: int) -> tuple | None:
        """The first min(b, waiting) waiting requests if their prompts fit (KV and max_running), else None."""
        waiting = view.waiting
        k = min(b, len(waiting))
        if k == 0 or b > self.cfg.max_running or len(view.running) + len(view.prefilling) + k > self.cfg.max_running:
            return None
        free = view.free_blocks
        bs = view.block_tokens
        out = []
        for i, rid in enumerate(waiting):
            if i >= k:
                break
            need = -(-view.context(rid) // bs)
            if need > free:
                return None
            free -= need
            out.append((rid, view.prefill_left(rid)))
        return tuple(out)

    # ---------------------------------------------------------------- the MDP interface
    def mask(self, view: LaneView) -> np.ndarray:
        cfg = self.cfg
        m = np.zeros(cfg.num_actions, dtype=bool)
        waiting = len(view.waiting)
        prev = 0
        for i, b in enumerate(cfg.prefill_sizes):
            if waiting > prev and self._prefill_batch(view, b) is not None:
                m[i] = True
            prev = b
        j = len(cfg.prefill_sizes)
        m[j] = bool(view.running)
        if waiting:
            head = view.waiting[0]
            m[j + 1] = not view.offloaded(head) and self.offload_target(view, head) >= 0
        m[j + 2] = not view.running  # idling while sequences decode only delays them (a decode step costs
        return m                     # about the same for any batch size on these memory-bound engines)

    def plan(self, view: LaneView, action: int) -> BatchPlan:
        cfg = self.cfg
        j = len(cfg.prefill_sizes)
        if action < j:
            prev = cfg.prefill_sizes[action - 1] if action else 0
            batch = self._prefill_batch(view, cfg.prefill_sizes[action]) if len(view.waiting) > prev else None
            if batch is None:
                raise ValueError(f"action {action} (prefill {cfg.prefill_sizes[action]}) is masked")
            return BatchPlan(decode=bool(view.running), prefill=batch)
        if action == j:
            return DECODE
        if action == j + 1:
            head = view.waiting[0]
            return BatchPlan(offload=((head, self.offload_target(view, head)),))
        return BatchPlan(wait_s=cfg.wait_s)

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
        k = 12
        for r in sim.replicas:
            if r.index == ri:
                continue
            o[k] = min(len(r.waiting) / 32.0, 1.0)
            o[k + 1] = min(len(r.lanes[0].running) / cfg.max_running, 1.0)
            o[k + 2] = min(self.backlog_s(r.index, now) / 20.0, 1.0)
            k += 3
        return o

    def outcome(self, rid: int) -> int:
        """+1 on time, 0 late, -1 dropped."""
        t = self.sim.client_completion_s(rid)
        if t != t:  # NaN: not completed
            return -1
        return 1 if t <= self._e2e_dl[rid] + 1e-9 else 0


class EdgePolicyBatcher:
    """A trained policy (anything with ``predict(obs, action_masks=..., deterministic=True)``, e.g. MaskablePPO)
    as a ``Batcher`` in the same simulator; it decides every iteration (not stationary)."""

    stationary = False

    def __init__(self, model, view: EdgeView):
        self.model = model
        self.view = view

    def plan(self, lane: LaneView) -> BatchPlan:
        obs = self.view.observe(lane)
        mask = self.view.mask(lane)
        a, _ = self.model.predict(obs, action_masks=mask, deterministic=True)
        return self.view.plan(lane, int(a))


def evaluate(cfg: EdgeConfig, make_batcher, seeds: Sequence[int], held_out: bool = True,
             trace: Workload | None = None, load: float | None = None) -> list[dict]:
    """Run one policy on the segments drawn by ``seeds``; per seed the deadline metrics and the summary.

    ``make_batcher(view)`` returns a Batcher (a heuristic, or ``EdgePolicyBatcher``)."""
    from fleetwise.control.controller import Controller
    from fleetwise.metrics.summary import summarize
    from fleetwise.policies import make
    from fleetwise.workload.slo import SLOClass

    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        w, ttft_dl, e2e_dl = edge_workload(cfg, rng, held_out, trace, load)
        sim = build_edge_sim(cfg, w, seed, learned=False)  # run() sets stationarity from the batcher
        view = EdgeView(cfg, sim, ttft_dl, e2e_dl)
        batcher = make_batcher(view)
        rec = sim.run(Controller(router=make("router", "nearest_region"), batcher=batcher))
        on_time = sum(1 for rid in range(len(w)) if view.outcome(rid) == 1)
        slo = [SLOClass(t.name, t.ttft_s, t.tpot_s) for t in cfg.types]
        s = summarize(rec, sim.replicas, slo_classes=slo, with_ideal=False)
        out.append({"seed": seed, "requests": len(w), "on_time": on_time,
                    "deadline_rps": on_time / cfg.segment_s, "goodput_rps": s["goodput_rps"],
                    "ttft_p99_s": s["ttft_p99_s"], "e2e_p99_s": s["e2e_p99_s"], "completed": s["completed"],
                    "dropped": len(w) - s["completed"],  # unfinished at the horizon, or rejected
                    "offloaded": int(np.frombuffer(sim.hops, dtype=np.int8).sum())})
    return out


def with_batch_limit(cfg: EdgeConfig, b: int) -> EdgeConfig:
    """The same scenario with batches capped at ``b``: prefill sizes above ``b`` are masked and at most ``b``
    sequences decode at once (the action space is unchanged, so a trained policy still applies)."""
    return replace(cfg, max_running=b)
