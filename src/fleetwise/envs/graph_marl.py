"""Multi-cloud LLM serving as a cooperative multi-agent environment (Graph-MARL-CloudLLM, docs/graph-marl.md).
The world is ``fleetwise.worlds.multicloud``; the graph encoding ``fleetwise.envs.graph_encoding``.

Three clouds x two regions, each region with three GPU pools (a pool = GPU type x model variant; all replicas
a pool may ever run are built up front and switched on/off by the GPU-allocation agent, so the simulator's
replica set stays fixed). Request classes (chat, code, batch) arrive from real traces at the regions; every
control epoch (``epoch_s`` simulated seconds) four agents act together and the fleet simulator runs the epoch.

Agents (PettingZoo ``ParallelEnv``, all cooperative, one shared team reward)

    ========  ===========================================  =================================================
    agent     action (``MultiDiscrete``), a correction       meaning of the world decision it corrects
              of the rule ``least_loaded`` (0: the rule's)
    ========  ===========================================  =================================================
    cloud     per class: ``clouds + 1`` (shift)             serve the class in that cloud; last = any cloud
    model     per class: ``variants`` (shift)               model variant (8B / 70B) the class is served by
    gpu       per pool: 4 (0 rule, 1 one replica fewer,     0 hold, 1 scale down (drain), 2 add on-demand,
              2 one more on-demand, 3 one more spot)        3 add spot (when the region has spot capacity)
    router    per class: 3 (shift)                          request routing rule: 0 latency-first (RTT + queue),
                                                            1 least-loaded, 2 cost-first (price/token + queue)
    ========  ===========================================  =================================================

The all-zero action is the rule, decision for decision (``rule_action()``; tested). ``action_masks()`` gives the
corrections allowed now: none that leaves a request class without a ready replica (``multicloud_rules``).
``step_raw(decision)`` applies a world decision directly (how the hand-written rules are evaluated).

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
    The service level is not in it as a constraint: the trainer (``learn.graph_marl``) adds one per class (SLO
    attainment >= the rule's - 0.01, a multiplier per class by dual ascent). On the plain env, a policy may trade
    SLOs for cost: the gpu agent answering "one replica fewer" every epoch scored 15.2 and 13.2 against the rule's
    12.7 and 10.0 (segments 0 and 2) at code-class attainment 0.18 and 0.11 (fuzzing, 2026-12-06).

Episode end
    All agents truncate after ``segment_s / epoch_s`` epochs; the last step also drains the remaining requests
    (up to ``drain_s``; requests not finished then count as dropped).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from fleetwise.envs.graph_encoding import (
    EDGE_TYPES,
    F_EDGE,
    F_NODE,
    NODE_TYPES,
    GraphLayout,
    graph_features,
    graph_layout,
)
from fleetwise.workload.request import Workload
from fleetwise.worlds.multicloud import (
    AGENTS,
    ROUTE_RULES,
    GraphMARLConfig,
    MultiCloud,
    multicloud_workload,
    region_of,
)
from fleetwise.worlds.multicloud_rules import HEURISTICS, RULE, action_masks, compose, heuristic, rule_decision

__all__ = ["AGENTS", "EDGE_TYPES", "F_EDGE", "F_NODE", "HEURISTICS", "NODE_TYPES", "GraphLayout", "GraphMARLConfig",
           "MultiCloud", "evaluate", "graph_features", "graph_layout", "heuristic", "make_env", "multicloud_workload"]


# ---------------------------------------------------------------------- PettingZoo environment
def _pz():
    from gymnasium import spaces
    from pettingzoo import ParallelEnv

    return spaces, ParallelEnv


def make_env(config: GraphMARLConfig | None = None, held_out: bool = False, trace: Workload | None = None,
             duration_s: float | None = None, load: float | None = None, split: str | None = None,
             render_mode: str | None = None):
    """The PettingZoo parallel environment (class built lazily so the module imports without pettingzoo).
    ``trace`` replaces the classes' arrivals, fitted at ``load`` (``worlds.multicloud.fit_multicloud_trace``);
    ``split``: train, validation or test segments (None: test when ``held_out``, else train)."""
    from fleetwise.errors import InputError
    from fleetwise.worlds.multicloud import GraphMARLConfig

    # the arguments' types and ranges, named (trace="x" was an AttributeError at reset, duration_s=1e12 a
    # MemoryError; found by fuzzing, 2026-12-06)
    for name, v, t in (("config", config, GraphMARLConfig), ("trace", trace, Workload)):
        if v is not None and not isinstance(v, t):
            raise InputError(f"make_env {name}: expected a {t.__name__}, got {type(v).__name__}")
    if duration_s is not None and (isinstance(duration_s, bool) or not isinstance(duration_s, (int, float))
                                   or not 1.0 <= duration_s <= 7 * 86_400.0):
        raise InputError(f"make_env duration_s {duration_s!r}: expected 1 s to 7 days")
    if load is not None and (isinstance(load, bool) or not isinstance(load, (int, float)) or not 0 < load <= 10):
        raise InputError(f"make_env load {load!r}: expected a fraction of the capacity in (0, 10]")
    if not isinstance(held_out, (bool, np.bool_)):  # ("x" was taken as True)
        raise InputError(f"make_env held_out {held_out!r}: expected True or False")
    if split is not None and split not in ("train", "validation", "test"):
        raise InputError(f"make_env split {split!r}: expected train, validation, test or None")
    if render_mode is not None:
        raise InputError(f"make_env render_mode {render_mode!r}: this environment renders nothing (render_modes: [])")
    return _env_class()(config, held_out, trace, duration_s, load, split)


@functools.lru_cache(maxsize=1)
def _env_class():
    spaces, ParallelEnv = _pz()

    class MultiCloudMARLEnv(ParallelEnv):
        __doc__ = __doc__
        metadata = {"name": "fleetwise_multicloud_v0", "render_modes": []}

        render_mode = None

        def __init__(self, config=None, held_out=False, trace=None, duration_s=None, load=None, split=None):
            self.cfg = config or GraphMARLConfig()
            self.held_out, self.trace, self.duration_s, self.load = held_out, trace, duration_s, load
            self.split = split
            cfg = self.cfg
            clouds = cfg.clouds
            region_cloud = [clouds.index(region_of(r).cloud) for r in cfg.regions]
            pool_region, inst_pool = [], []
            for ri, r in enumerate(cfg.regions):
                for spec in cfg.pools[region_of(r).cloud]:
                    inst_pool += [len(pool_region)] * spec.max_replicas
                    pool_region.append(ri)
            self.layout = graph_layout(len(clouds), len(cfg.regions), region_cloud, pool_region, inst_pool,
                                       len(cfg.classes))
            for arr in (self.layout.node_type, self.layout.edge_index, self.layout.edge_type):
                arr.setflags(write=False)  # handed to every agent at every step: an in-place edit raises
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

        def _agent(self, agent):
            if agent not in self._act:  # (a bare KeyError for the actions, any name for the observations)
                raise ValueError(f"agent {agent!r}: no such agent (agents: {', '.join(self.possible_agents)})")
            return agent

        def observation_space(self, agent):
            return self._obs if self._agent(agent) else None

        def action_space(self, agent):
            return self._act[self._agent(agent)]

        @property
        def state_space(self):
            return self._state_space

        def _observe(self):
            self._base = rule_decision(self.mc, RULE)  # the rule's decision in this state (the action corrects it)
            x, ea = graph_features(self.mc, self.layout, self._base["gpu"])
            self._x = x
            x, ea = np.clip(x, -10, 10), np.clip(ea, -10, 10)
            lay = self.layout  # (read-only arrays); each agent its own dict and feature arrays: an agent or a
            # replay buffer that edits its observation in place changed every agent's
            return {a: {"x": x if i == 0 else x.copy(), "node_type": lay.node_type, "edge_index": lay.edge_index,
                        "edge_type": lay.edge_type, "edge_attr": ea if i == 0 else ea.copy()}
                    for i, a in enumerate(self.agents)}

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
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
                raise ValueError(f"seed {seed!r}: expected an integer >= 0")  # (1.5: numpy's SeedSequence error)
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            rng = self._rng
            w = multicloud_workload(self.cfg, rng, self.held_out, self.duration_s, self.trace, self.load, self.split)
            self.mc = MultiCloud(self.cfg, w, int(rng.integers(2**31)))
            self.agents = list(self.possible_agents)
            obs = self._observe()
            return obs, {a: {} for a in self.agents}

        def rule_action(self):
            """The action that reproduces the rule (``least_loaded``) exactly: no correction."""
            return {a: np.zeros(self._act[a].shape, np.int64) for a in self.possible_agents}

        def handover_action(self, placement: bool = False, restore: bool = False):
            """The rule's action as the run-time monitor hands over to it mid-segment (``TrainedPolicy.handover``):
            with ``placement``, every request class keeps the cloud and model variant it is served by now (the
            cyclic shifts from the rule's choices to the world's current ones; ``compose`` keeps the rule's choice
            where the current one has no ready replica), so the rule moves no class onto pools the learned policy
            switched off; with ``restore``, every pool with no replica on adds one (on-demand), restoring the
            rule's own floor of one replica per pool, from which its threshold scaling (which never wakes an empty
            pool) can react. Neither: exactly :meth:`rule_action`."""
            if self.mc is None:
                raise RuntimeError("call reset() before handover_action()")
            a, mc = self.rule_action(), self.mc
            if placement:
                a["cloud"] = (np.asarray(mc.cloud_choice, np.int64) - self._base["cloud"]) % (len(mc.clouds) + 1)
                a["model"] = (np.asarray(mc.variant, np.int64) - self._base["model"]) % len(mc.cfg.variants)
            if restore:
                for pi, p in enumerate(mc.pools):
                    if not any(mc.inst[i].on for i in p.replicas):
                        a["gpu"][pi] = 2  # one more than the rule's hold (compose: an on-demand replica)
            return a

        def action_masks(self):
            """Per agent (factors, choices) booleans: the corrections allowed in the current state."""
            if self.mc is None:
                raise RuntimeError("call reset() before action_masks()")
            return action_masks(self.mc, RULE, self._base)

        def step(self, actions):
            """Every agent's correction of the rule; the world applies the composed decision."""
            if self.mc is None:
                raise RuntimeError("call reset() before step()")
            if not self.agents:
                raise RuntimeError("episode is over; call reset()")
            return self.step_raw(compose(self.mc, self._checked(actions), RULE, self._base))

        def _checked(self, actions) -> dict:
            """``actions`` as ``compose`` reads them, or a ValueError naming the agent: a mapping from agents to
            their spaces' integer arrays (an agent left out keeps the rule's choice). A float, a wrong shape or a
            correction out of range used to be taken modulo the choices or broadcast."""
            from fleetwise.envs import checked_action

            if not isinstance(actions, dict):
                raise ValueError(f"actions {type(actions).__name__}: expected a dict from agent to action")
            unknown = sorted(set(actions) - set(self.possible_agents), key=str)
            if unknown:
                raise ValueError(f"actions for {unknown}: no such agent (agents: {', '.join(self.possible_agents)})")
            out = {}
            for agent, act in actions.items():
                try:
                    out[agent] = checked_action(self._act[agent], act)
                except ValueError as e:
                    raise ValueError(f"agent {agent}: {e}") from None
            return out

        def _checked_raw(self, decision: dict) -> dict:
            """A world decision as ``MultiCloud.act`` reads it, or a ValueError naming the key: integer codes, one
            per class (cloud, model, router) or per pool (gpu), each within its codes. Out-of-range codes were
            clipped and a NaN cast to the smallest code; an unknown key was ignored."""
            from fleetwise.worlds.multicloud import ROUTE_RULES

            mc = self.mc
            nc = len(self.cfg.classes)
            codes = {"cloud": (nc, len(mc.clouds) + 1, "class", "a cloud, or any"),
                     "model": (nc, len(self.cfg.variants), "class", "a model variant"),
                     "router": (nc, len(ROUTE_RULES), "class", ", ".join(ROUTE_RULES)),
                     "gpu": (len(mc.pools), 4, "pool", "hold, one fewer, add on-demand, add spot")}
            out = {}
            for k, v in decision.items():
                if k not in codes:
                    raise ValueError(f"decision key {k!r}: expected some of {', '.join(codes)}")
                n, hi, per, what = codes[k]
                a = np.asarray(v)
                if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer):
                    raise ValueError(f"decision {k!r}: expected {n} integer codes (one per {per}), got "
                                     f"{a.dtype} of shape {a.shape}")
                if n and (a.min() < 0 or a.max() >= hi):
                    raise ValueError(f"decision {k!r}: codes in 0..{hi - 1} ({what}), got {a.min()}..{a.max()}")
                out[k] = a.astype(np.int64)
            return out

        def step_raw(self, decision):
            """Apply a world decision (cloud, model, gpu codes, router per ``MultiCloud.act``) directly."""
            mc = self.mc
            if mc is None:
                raise RuntimeError("call reset() before step_raw()")
            if not self.agents:
                raise RuntimeError("episode is over; call reset()")
            if not isinstance(decision, dict):  # (None was an AttributeError in MultiCloud.act)
                raise ValueError(f"decision {type(decision).__name__}: expected a dict of the world's codes "
                                 "(cloud, model, gpu, router), as heuristic() returns")
            mc.act(self._checked_raw(decision))
            last = mc.epoch + 1 >= self.n_epochs
            r = mc.run_epoch(final=last)
            ended = last or mc.done
            obs = self._observe()
            rew = {a: r for a in self.agents}
            info = {a: {"time_s": mc.sim.now, "epoch": mc.epoch, "class_ok": mc.cls_ok.copy(),
                        "class_ended": mc.cls_ended.copy(), "class_ttft": list(mc.cls_ttft)} for a in self.agents}
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


def evaluate(cfg: GraphMARLConfig, policy, seeds: Sequence[int], held_out: bool = True,
             trace: Workload | None = None, duration_s: float | None = None, load: float | None = None,
             split: str | None = None) -> list[dict]:
    """Run ``policy`` on the held-out segments drawn by ``seeds`` (or those of ``split``); per seed the metrics.

    ``policy``: a heuristic name (its world decisions, ``step_raw``), or a callable ``(env, obs, state) ->
    actions`` (a trained policy: corrections of the rule). A policy with a run-time monitor (``fallback``) also
    reports ``rule_epochs``: the epochs of the segment from which its SLO fallback handed decisions to the rule;
    one with an input guard (``guard``) ``guarded_epochs`` of its ``epochs`` decisions."""
    out = []
    for seed in seeds:
        env = make_env(cfg, held_out=held_out, trace=trace, duration_s=duration_s, load=load, split=split)
        obs, _ = env.reset(seed=seed)
        if hasattr(policy, "reset"):
            policy.reset(seed)
        m = None
        while env.agents:
            if isinstance(policy, str):
                obs, _, _, _, info = env.step_raw(heuristic(policy, env.mc))
            else:
                obs, _, _, _, info = env.step(policy(env, obs, env.state()))
            m = next(iter(info.values())).get("metrics", m)
        fb, gd = getattr(policy, "fallback", None), getattr(policy, "guard", None)
        out.append({"seed": seed, **m, **({"rule_epochs": fb.rule_steps} if fb is not None else {}),
                    **({"guarded_epochs": gd.guarded, "epochs": gd.steps} if gd is not None else {})})
    return out
