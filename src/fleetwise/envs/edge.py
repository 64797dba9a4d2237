"""Edge batching (the world: ``fleetwise.worlds.edge``): several edge nodes with small GPUs, users attached to nodes, a backhaul between them.

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

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fleetwise.control.controller import Controller
from fleetwise.workload.request import Workload
from fleetwise.worlds.edge import EdgeConfig, EdgeView, build_edge_sim, edge_workload


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
        on_time = late = dropped = 0
        dp = sim.run_until(float("inf"), self._ctl, stop=("batch",))
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
        self._lane = dp.view if dp is not None else None  # the LaneView of the lane that decides
        return reward, {"on_time": on_time, "late": late, "dropped": dropped}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        from fleetwise.policies import make

        rng = self.np_random
        w, ttft_dl, e2e_dl = edge_workload(self.cfg, rng, self.held_out, self.trace)
        sim = build_edge_sim(self.cfg, w, int(rng.integers(2**31)), learned=True)
        sim.completions = []
        self.view = EdgeView(self.cfg, sim, ttft_dl, e2e_dl)
        self._ctl = Controller(router=make("router", "nearest_region"), batcher=None)  # batches: the agent
        self._last_t = 0.0
        _, info = self._next()
        obs = self.view.observe(self._lane) if self._lane is not None else np.zeros(self.observation_space.shape, np.float32)
        self._last_t = sim.now
        info.update(tau=0.0, time_s=sim.now, node=self._lane.replica if self._lane else -1)
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
        info.update(tau=tau, time_s=sim.now, node=self._lane.replica if self._lane else -1)
        if self._lane is None:
            return np.zeros(self.observation_space.shape, np.float32), reward, True, False, info
        return self.view.observe(self._lane), reward, False, False, info


