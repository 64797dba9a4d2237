"""Edge batching: several edge nodes with small GPUs, users attached to nodes, a backhaul between them.

``EdgeBatchingEnv`` (``fleetwise/EdgeBatching-v0``) is a semi-Markov decision process over the fleet
simulator: a decision is due whenever a node's engine is free; the agent runs a prefill batch, a decode step,
offloads a waiting request to a neighbour, or waits. The time between two decisions is the sojourn time
``tau`` (``info["tau"]``); DISPPO discounts by ``gamma ** tau``.

Observation
    ``Box(0, 1, (12 + 3 * (nodes - 1),), float32)`` for the node that must decide (all features scaled to [0, 1]):

    ====  =====================================================================================
    0     waiting requests / 32
    1     decoding sequences / ``max_running``
    2     KV cache in use (fraction)
    3     prompt tokens of the request at the head of the queue / 8192
    4     TTFT slack of the head of the queue: ``(ttft deadline - now - its prefill time) / 20 s``, mapped to [0, 1]
    5     smallest TTFT slack among waiting requests, same scale
    6     smallest end-to-end slack among decoding sequences (deadline - now - remaining tokens x step time)
    7     fraction of decoding sequences whose end-to-end deadline is already at risk
    8     prompt tokens waiting / 16384
    9     this node's prefill speed (tokens/s / 10,000)
    10    this node's decode step time for its current batch (s / 0.2)
    11    whether the head of the queue may still be offloaded
    12+   per neighbour: waiting / 32, decoding / ``max_running``, estimated backlog (s / 20)
    ====  =====================================================================================

Action
    ``Discrete(len(prefill_sizes) + 3)``: ``prefill_sizes[i]`` = prefill the first ``b`` waiting requests (FCFS,
    whole prompts; fewer if fewer wait) in one iteration that also carries the decode step of the sequences
    already decoding (prefill and decode "piggybacked", as continuous batching does), then ``decode`` (one step for every decoding sequence), ``offload``
    (the head of the queue to the neighbour with the smallest estimated backlog), ``wait`` (idle ``wait_s`` or
    until the queue changes). ``action_masks()`` marks the feasible ones: a prefill batch needs enough waiting
    requests, KV blocks for their prompts and room under ``max_running``; decode needs a decoding sequence;
    offload needs a waiting request that was not offloaded before and a neighbour whose KV cache can hold it;
    wait is allowed only when nothing is decoding (idling then only delays the decoding sequences). A masked
    action is not an error: it runs decode (or wait when nothing decodes) and sets ``info["invalid_action"]``.

Reward
    Per request that ended since the last decision: ``+1`` when it completed within its end-to-end deadline
    (``ttft_s + (output tokens - 1) x tpot_s`` of its type), ``-miss_penalty`` when it completed late,
    ``-drop_penalty`` when it was rejected.

Episode End
    Terminated when every request of the trace segment has ended. No truncation (segments are finite).

Info
    ``tau`` (seconds since the previous decision), ``node``, ``time_s``, ``on_time``, ``late``, ``dropped``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fleetwise.control.protocols import DECODE, BatchPlan
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
        caps = [capacity_rps(PerfModel(get_gpu(n.gpu), model), p, o, main.ttft_s, main.tpot_s,
                             max_num_seqs=cfg.max_running, gpu_memory_utilization=cfg.gpu_memory_utilization)
                for n in cfg.nodes]
        k = int(np.argmin(np.asarray(caps) / users))
        return caps[k] / users[k], (f"the busiest node {cfg.nodes[k].name} ({caps[k]:.3g} req/s for its "
                                     f"{users[k]:.0%} of the users) sets it")

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
    """Per-simulation constants and helpers shared by the environment and the trained-policy batcher."""

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
        for r in sim.replicas:
            p = r.perf
            self.prefill_tps.append(1024.0 / p.iteration_time_s(1024, 1024.0 * 1024.0, 0, 0))
            self.step_s.append([p.decode_coeffs(b)[0] if b else 0.0 for b in range(self.cfg.max_running + 1)])
        self.n_features = 12 + 3 * (len(sim.replicas) - 1)

    # ---------------------------------------------------------------- helpers
    def backlog_s(self, ri: int, now: float) -> float:
        return self.sim.replicas[ri].outstanding_tokens(now) / self.prefill_tps[ri]

    def offload_target(self, lane, rid: int, now: float) -> int:
        sim = self.sim
        best, best_t = -1, math.inf
        for r in sim.replicas:
            if r.index == lane.replica.index or not sim.fits(rid, r.index):
                continue
            t = self.backlog_s(r.index, now)
            if t < best_t:
                best, best_t = r.index, t
        return best

    def _prefill_batch(self, lane, b: int) -> tuple | None:
        """The first min(b, waiting) waiting requests if their prompts fit (KV and max_running), else None."""
        sim = self.sim
        rep = lane.replica
        k = min(b, len(rep.waiting))
        if k == 0 or b > self.cfg.max_running or len(lane.running) + len(lane.prefilling) + k > self.cfg.max_running:
            return None
        free = lane.cap_blocks - lane.used_blocks
        bs = lane.block_tokens
        out = []
        for i, rid in enumerate(rep.waiting):
            if i >= k:
                break
            need = -(-sim.ctx[rid] // bs)
            if need > free:
                return None
            free -= need
            out.append((rid, sim.ctx[rid] - sim.pf[rid]))
        return tuple(out)

    # ---------------------------------------------------------------- the MDP interface
    def mask(self, lane) -> np.ndarray:
        cfg, sim = self.cfg, self.sim
        m = np.zeros(cfg.num_actions, dtype=bool)
        waiting = len(lane.replica.waiting)
        prev = 0
        for i, b in enumerate(cfg.prefill_sizes):
            if waiting > prev and self._prefill_batch(lane, b) is not None:
                m[i] = True
            prev = b
        j = len(cfg.prefill_sizes)
        m[j] = bool(lane.running)
        if waiting:
            head = lane.replica.waiting[0]
            m[j + 1] = not sim.hops[head] and self.offload_target(lane, head, sim.now) >= 0
        m[j + 2] = not lane.running  # idling while sequences decode only delays them (a decode step costs
        return m                     # about the same for any batch size on these memory-bound engines)

    def plan(self, lane, action: int) -> BatchPlan:
        cfg = self.cfg
        j = len(cfg.prefill_sizes)
        if action < j:
            prev = cfg.prefill_sizes[action - 1] if action else 0
            batch = self._prefill_batch(lane, cfg.prefill_sizes[action]) if len(lane.replica.waiting) > prev else None
            if batch is None:
                raise ValueError(f"action {action} (prefill {cfg.prefill_sizes[action]}) is masked")
            return BatchPlan(decode=bool(lane.running), prefill=batch)
        if action == j:
            return DECODE
        if action == j + 1:
            head = lane.replica.waiting[0]
            return BatchPlan(offload=((head, self.offload_target(lane, head, self.sim.now)),))
        return BatchPlan(wait_s=cfg.wait_s)

    def observe(self, lane) -> np.ndarray:
        sim, cfg = self.sim, self.cfg
        now = sim.now
        rep = lane.replica
        ri = rep.index
        o = np.zeros(self.n_features, dtype=np.float32)
        waiting = rep.waiting
        tps = self.prefill_tps[ri]
        nrun = len(lane.running)
        o[0] = min(len(waiting) / 32.0, 1.0)
        o[1] = min(nrun / cfg.max_running, 1.0)
        o[2] = lane.used_blocks / lane.cap_blocks if lane.cap_blocks else 1.0
        step = self.step_s[ri][min(nrun, cfg.max_running)] if nrun else self.step_s[ri][1]

        def slack(x: float) -> float:  # seconds -> [0, 1], 0.5 = no slack left
            return min(max(0.5 + x / 40.0, 0.0), 1.0)

        if waiting:
            head = waiting[0]
            o[3] = min(sim.ctx[head] / 8192.0, 1.0)
            o[4] = slack(self._ttft_dl[head] - now - sim.ctx[head] / tps)
            tok = 0
            worst = math.inf
            for rid in waiting:
                c = sim.ctx[rid]
                tok += c
                s = self._ttft_dl[rid] - now - c / tps
                if s < worst:
                    worst = s
            o[5] = slack(worst)
            o[8] = min(tok / 16384.0, 1.0)
            o[11] = 0.0 if sim.hops[head] else 1.0
        else:
            o[4] = o[5] = 1.0
        if nrun:
            worst = math.inf
            risk = 0
            steps = lane.steps
            for rid in lane.running:
                g = sim.gen_join[rid] + steps - sim.join_step[rid]
                s = self._e2e_dl[rid] - now - (sim.output[rid] - g) * step
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
            l0 = r.lanes[0]
            o[k] = min(len(r.waiting) / 32.0, 1.0)
            o[k + 1] = min(len(l0.running) / cfg.max_running, 1.0)
            o[k + 2] = min(self.backlog_s(r.index, now) / 20.0, 1.0)
            k += 3
        return o

    def outcome(self, rid: int) -> int:
        """+1 on time, 0 late, -1 dropped."""
        sim = self.sim
        if sim.status[rid] != 1:
            return -1
        return 1 if sim.completion_s[rid] + sim.net_s[rid] / 2.0 <= self._e2e_dl[rid] + 1e-9 else 0


class EdgeBatchingEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, config: EdgeConfig | None = None, held_out: bool = False, trace: Workload | None = None):
        self.cfg = config or EdgeConfig()
        self.held_out = held_out
        self.trace = trace
        n = len(self.cfg.nodes)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(12 + 3 * (n - 1),), dtype=np.float32)
        self.action_space = spaces.Discrete(self.cfg.num_actions)
        self.view: EdgeView | None = None
        self._lane = None
        self._last_t = 0.0

    def action_masks(self) -> np.ndarray:
        if self._lane is None:
            m = np.zeros(self.cfg.num_actions, dtype=bool)
            m[-1] = True
            return m
        return self.view.mask(self._lane)

    def _next(self) -> tuple[float, dict]:
        """Advance to the next batch decision, routing arrivals to their own node; reward of what ended."""
        sim, view = self.view.sim, self.view
        reward = 0.0
        on_time = late = dropped = 0
        while True:
            dp = sim.advance()
            if dp is not None and dp.kind == "route":
                sim.apply(self._router.route(dp))
                continue
            break
        for rid in sim.completions:
            o = view.outcome(rid)
            if o == 1:
                on_time += 1
            elif o == 0:
                late += 1
            else:
                dropped += 1
        sim.completions.clear()
        reward = on_time - self.cfg.miss_penalty * late - self.cfg.drop_penalty * dropped
        self._lane = dp.lane if dp is not None else None
        return reward, {"on_time": on_time, "late": late, "dropped": dropped}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        from fleetwise.control.registry import make

        rng = self.np_random
        w, ttft_dl, e2e_dl = edge_workload(self.cfg, rng, self.held_out, self.trace)
        sim = build_edge_sim(self.cfg, w, int(rng.integers(2**31)), learned=True)
        sim.completions = []
        self.view = EdgeView(self.cfg, sim, ttft_dl, e2e_dl)
        self._router = make("router", "nearest_region")
        self._last_t = 0.0
        _, info = self._next()
        obs = self.view.observe(self._lane) if self._lane is not None else np.zeros(self.observation_space.shape, np.float32)
        self._last_t = sim.now
        info.update(tau=0.0, time_s=sim.now, node=self._lane.replica.index if self._lane else -1)
        return obs, info

    def step(self, action):
        sim = self.view.sim
        if self._lane is None:
            raise RuntimeError("episode is over; call reset()")
        action = int(action)
        m = self.view.mask(self._lane)
        invalid = not (0 <= action < len(m) and m[action])
        if invalid:  # a masked action runs the default instead: decode if anything decodes, else wait
            action = len(self.cfg.prefill_sizes) + (0 if m[len(self.cfg.prefill_sizes)] else 2)
        sim.apply(self.view.plan(self._lane, action))
        reward, info = self._next()
        info["invalid_action"] = invalid
        tau = sim.now - self._last_t
        self._last_t = sim.now
        info.update(tau=tau, time_s=sim.now, node=self._lane.replica.index if self._lane else -1)
        if self._lane is None:
            return np.zeros(self.observation_space.shape, np.float32), reward, True, False, info
        return self.view.observe(self._lane), reward, False, False, info


class EdgePolicyBatcher:
    """A trained policy (anything with ``predict(obs, action_masks=..., deterministic=True)``, e.g. MaskablePPO)
    as a ``Batcher`` in the same simulator; it decides every iteration (not stationary)."""

    stationary = False

    def __init__(self, model, view: EdgeView):
        self.model = model
        self.view = view

    def plan(self, lane, sim) -> BatchPlan:
        obs = self.view.observe(lane)
        mask = self.view.mask(lane)
        a, _ = self.model.predict(obs, action_masks=mask, deterministic=True)
        return self.view.plan(lane, int(a))


def evaluate(cfg: EdgeConfig, make_batcher, seeds: Sequence[int], held_out: bool = True,
             trace: Workload | None = None, load: float | None = None) -> list[dict]:
    """Run one policy on the segments drawn by ``seeds``; per seed the deadline metrics and the summary.

    ``make_batcher(view)`` returns a Batcher (a heuristic, or ``EdgePolicyBatcher``)."""
    from fleetwise.control.controller import Controller
    from fleetwise.control.registry import make
    from fleetwise.metrics.summary import summarize
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
