"""Edge batching (the world: ``fleetwise.worlds.edge``): several edge nodes with small GPUs, users attached to nodes, a backhaul between them.

``EdgeBatchingEnv`` (``fleetwise/EdgeBatching-v0``) is a semi-Markov decision process over the fleet
simulator: a decision is due whenever a node's engine is free; the agent adjusts the rule ``offload_greedy``
(chunked prefill + offloading from the slowest node): the chunk budget of the iteration and whether to offload
the head of the queue to a neighbour. The time between two decisions is the sojourn time
``tau`` (``info["tau"]``); DISPPO discounts by ``gamma ** tau``.

Observation
    ``Box(0, 1, (16 + 3 * (nodes - 1),), float32)`` for the node that must decide (all features scaled to [0, 1]):

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
    12    prompt tokens left of partly prefilled requests / 8192
    13    whether the rule (offload_greedy) offloads the head of the queue now
    14    this node's estimated backlog (outstanding tokens / prefill speed, s / 20)
    15    whether the rule's offload test passes at this node (whichever node it is): its backlog exceeds the
          least-backlogged neighbour's that can hold the head of the queue by ``offload_margin_s``
    16+   per neighbour: waiting / 32, decoding / ``max_running``, estimated backlog (s / 20)
    ====  =====================================================================================

Action
    ``MultiDiscrete([len(chunk_sizes), 3, 2])``: an adjustment of the rule ``offload_greedy``
    (``fleetwise.worlds.edge.OffloadGreedy``), whose own decision is ``[0, 0, 0]``:

    - chunk: the prompt-token budget of this iteration, ``chunk_sizes[i]`` (Sarathi-style chunked prefill, index
      0 = the rule's 512 tokens; a budget of 0 = a decode step only);
    - offload: 0 = the rule's decision, 1 = never (keep the head of the queue here), 2 = offload the head of the
      queue now, to the neighbour with the smallest estimated backlog;
    - queue order of new prompts: 0 = FCFS (the rule's), 1 = deadline (those that can still meet their TTFT
      deadline first, earliest deadline first; ``EdgeView.deadline_order``).

    ``action_masks()`` marks the choices that differ from the rule's: a chunk other than the rule's needs prompt
    tokens to prefill (a budget of 0 needs a decoding sequence), "never" needs the rule to offload, "now" needs
    the rule not to and a neighbour whose KV cache can hold the head, "deadline" two waiting requests.
    ``rule_action()`` is ``[0, 0, 0]``, always
    allowed; a masked choice runs the rule's and sets ``info["invalid_action"]``.

Reward
    Per request that ended since the last decision: ``+1`` when it completed within its end-to-end deadline
    (``ttft_s + (output tokens - 1) x tpot_s`` of its type), ``-miss_penalty`` when it completed late,
    ``-drop_penalty`` when it was rejected or unfinished, and ``-ttft_lambda`` when its first token missed the
    TTFT deadline (the Lagrange multiplier of the TTFT constraint, ``fleetwise.learn.recipe.Lagrangian``, set by
    the trainer between rollouts; 0 by default).

Episode End
    Terminated when every request of the trace segment has ended. No truncation (segments are finite).

Info
    ``tau`` (seconds since the previous decision), ``node``, ``time_s``, ``on_time``, ``late``, ``dropped``,
    ``ttft_missed``; at the end of an episode ``ttft_attainment`` and ``deadline_rps`` of the segment.

Segments
    ``reset()`` draws a segment of the split (``split``: train, validation or test windows of each trace's time
    span) from ``mix`` (:class:`TrainMix`: the paper's request mix at a rate drawn from a range, or one
    trace's training part fitted to the edge at a load drawn from a range), or replays a user's ``trace``;
    ``reset(options={"segment_seed": s})`` runs exactly the segment ``fleetwise.worlds.edge.evaluate`` runs for
    seed ``s``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fleetwise.control.controller import Controller
from fleetwise.envs import checked_action, checked_render_mode
from fleetwise.workload.request import Workload
from fleetwise.worlds.edge import SPLITS, EdgeConfig, EdgeView, TrainMix, n_features, segment


class EdgeBatchingEnv(gym.Env):
    """DISPPO's semi-Markov environment (``fleetwise/EdgeBatching-v0``, docs/batching.md): one step is one batch
    decision of one edge node, with the time until the next decision in ``info["tau"]``. The action corrects
    ``offload_greedy`` (``[0, 0, 0]`` is the rule); ``action_masks()`` marks the allowed choices (sb3-contrib's
    MaskablePPO), and a masked choice runs the rule's, flagged in ``info["invalid_action"]``."""

    metadata = {"render_modes": []}

    def __init__(self, config: EdgeConfig | None = None, held_out: bool | str = False, trace: Workload | None = None,
                 mix: TrainMix | None = None, load: float | None = None, render_mode: str | None = None):
        self.render_mode = checked_render_mode(render_mode, "EdgeBatching-v0")
        # the arguments' types, named (trace="x" and mix="x" were AttributeErrors at the first reset)
        for name, v, t in (("config", config, EdgeConfig), ("trace", trace, Workload), ("mix", mix, TrainMix)):
            if v is not None and not isinstance(v, t):
                raise TypeError(f"EdgeBatchingEnv {name}: expected a {t.__name__}, got {type(v).__name__}")
        if load is not None and (isinstance(load, bool) or not isinstance(load, (int, float)) or not 0 < load <= 10):
            raise ValueError(f"EdgeBatchingEnv load {load!r}: expected a fraction of the capacity in (0, 10]")
        if not isinstance(held_out, (bool, np.bool_)) and held_out not in SPLITS:  # (named the wrong argument)
            raise ValueError(f"EdgeBatchingEnv held_out {held_out!r}: expected True, False or one of "
                             f"{', '.join(SPLITS)}")
        self.cfg = config or EdgeConfig()
        self.held_out = held_out
        self.trace = trace
        self.load = load
        self.mix = mix
        n = len(self.cfg.nodes)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n_features(n),), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(list(self.cfg.action_nvec))
        self.ttft_lambda = 0.0
        self.view: EdgeView | None = None
        self._lane = None
        self._last_t = 0.0

    def rule_action(self) -> np.ndarray:
        """The action that reproduces offload_greedy: [0, 0, 0]."""
        return np.zeros(len(self.cfg.action_nvec), dtype=np.int64)

    def action_masks(self) -> np.ndarray:
        if self._lane is None:
            nvec = self.cfg.action_nvec
            m = np.zeros(sum(nvec), dtype=bool)
            m[np.concatenate([[0], np.cumsum(nvec)[:-1]])] = True  # index 0 of every dimension
            return m
        return self.view.mask(self._lane)

    def _next(self) -> tuple[float, dict]:
        """Advance to the next batch decision, routing arrivals to their own node; reward of what ended."""
        sim, view = self.view.sim, self.view
        on_time = late = dropped = missed = 0
        dp = sim.run_until(float("inf"), self._ctl, stop=("batch",))
        for rid in sim.completions:
            o = view.outcome(rid)
            if o == 1:
                on_time += 1
            elif o == 0:
                late += 1
            else:
                dropped += 1
            if not view.ttft_ok(rid):
                missed += 1
        sim.completions.clear()
        self._stats[0] += on_time
        self._stats[1] += missed
        reward = (on_time - self.cfg.miss_penalty * late - self.cfg.drop_penalty * dropped
                  - self.ttft_lambda * missed)
        self._lane = dp.view if dp is not None else None  # the LaneView of the lane that decides
        return reward, {"on_time": on_time, "late": late, "dropped": dropped, "ttft_missed": missed}

    def _draw(self, rng: np.random.Generator) -> EdgeView:
        mix = self.mix
        if mix is None or self.trace is not None:
            return segment(self.cfg, int(rng.integers(2**31)), self.held_out, self.trace, self.load, learned=True)
        cfg, seed, part, load = mix.draw(self.cfg, rng, self.held_out)
        return segment(cfg, seed, self.held_out, part, load, learned=True)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        from fleetwise.policies import make

        if options and "segment_seed" in options:
            s = options["segment_seed"]
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s < 2**63:
                raise ValueError(f"options['segment_seed'] {s!r}: expected an integer from 0 to 2^63 - 1")
            self.view = segment(self.cfg, int(s), self.held_out, self.trace, self.load, learned=True)
        else:
            self.view = self._draw(self.np_random)
        sim = self.view.sim
        sim.completions = []
        self._stats = [0, 0]
        self._ctl = Controller(router=make("router", "nearest_region"), batcher=None)  # batches: the agent
        self._last_t = 0.0
        _, info = self._next()
        obs = self.view.observe(self._lane) if self._lane is not None else np.zeros(self.observation_space.shape, np.float32)
        self._last_t = sim.now
        info.update(tau=0.0, time_s=sim.now, node=self._lane.replica if self._lane else -1)
        return obs, info

    def step(self, action):
        if self.view is None:
            raise RuntimeError("call reset() before step()")
        sim = self.view.sim
        if self._lane is None:
            raise RuntimeError("episode is over; call reset()")
        # an action outside the space is refused, naming it, as in the other environments (None, "abc", NaN, 1.7
        # and 99 ran the rule's action with a flag, which hid the caller's bug); a choice in the space that the
        # mask forbids runs the rule's choice instead (per dimension), flagged
        a = checked_action(self.action_space, action)
        m = self.action_masks()
        nvec = self.cfg.action_nvec
        off = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        ok = [bool(m[off[i] + a[i]]) for i in range(len(nvec))]
        invalid = not all(ok)
        if invalid:
            a = np.where(ok, a, 0)
        sim.apply(self.view.plan(self._lane, a))
        reward, info = self._next()
        info["invalid_action"] = invalid
        tau = sim.now - self._last_t
        self._last_t = sim.now
        info.update(tau=tau, time_s=sim.now, node=self._lane.replica if self._lane else -1)
        if self._lane is None:
            n = max(sim.n, 1)
            info.update(ttft_attainment=1.0 - self._stats[1] / n,
                        deadline_rps=self._stats[0] / self.cfg.segment_s)
            return np.zeros(self.observation_space.shape, np.float32), reward, True, False, info
        return self.view.observe(self._lane), reward, False, False, info
