"""Autoscaling as an MDP over the platform layer (issue 8): ``AutoscalingEnv`` (``fleetwise/Autoscaling-v0``).

One step is one scaling epoch. ``reset(seed)`` builds the scenario, attaches the platform with no scaler
(``Platform(built, scaler=None)``) and runs the simulator, answering its "route" and "batch" decision points
with the scenario's router and batcher, until the first "scale" decision point; ``step(action)`` answers it
and runs on to the next one. The same observation function (:func:`features`) and action mapping
(:func:`residual_targets`, on the rule's targets) serve the deployed scaler ``rl``
(``fleetwise.policies.scalers_rl``), so a trained policy acts through ``run_platform`` exactly as in training.

Scenario
    The constructor's ``scenario`` (a Scenario, a built-in name or a dict) or, by default, the embedded
    :func:`default_scenario`: Llama-3-8B on L40S GPUs, one on-demand group (us-east-1a) and one spot group
    (us-east-1b, availability from the AWS spot trace of that zone), 0-6 replicas each, cold start 75 s, and
    a bursty three-tenant workload over a ``window_s`` window: ServeGen ``m-large`` chat arrivals (x
    ``rate_scale``, interactive SLO, Azure conversation lengths), an MMPP ``api`` tenant (standard SLO) and a
    Poisson ``batch`` tenant. The seed picks the ServeGen window start and the spot-trace offset: from the
    first ``train_fraction`` of the 14-day trace for training, from the rest with ``held_out=True``
    (evaluation). Episodes are ~41 epochs of 30 s.

Observation
    ``Box(-5, 5, (max_groups * 19 + 2,), float32)``, from the ScaleObs and the rule's targets for it. Per group,
    in the platform's order (padded with zeros to ``max_groups``), with ``cap = max_replicas`` and ``u`` = one
    replica's ``capacity_rps`` (1 when unknown):

    ====  =============================================================================================
    0     1 (a group; 0 = padding)
    1     1 for a spot pool
    2-4   ready / cap, starting / cap, draining / cap
    5     log1p(waiting per ready replica) / log1p(100) (waiting includes requests held for a replica)
    6-7   busy (GPU-busy fraction of ready replicas), kv_used
    8     model demand ``arrivals_rps / (u * cap)``
    9     demand trend ``(arrivals_rps - mean of the last 4 history_rps) / (u * cap)``
    10-11 ``ttft_p90 / slo_ttft``, ``tpot_p90 / slo_tpot`` (0 when NaN: nothing completed)
    12    price per replica / the most expensive group's
    13    available / cap (1 when the pool is unlimited)
    14    (ready + starting) / cap (what the group has now)
    15    model coverage: the model's (ready + starting) x capacity over its demand (4 when no demand)
    16    cold start / (10 epochs)
    17    the rule's target / cap (the action corrects it)
    18    (the rule's target - (ready + starting)) / cap
    ====  =============================================================================================

    then ``sin``, ``cos`` of ``obs.time_s`` over 24 h. All values clipped to [-5, 5].

Action
    The policy contains its rule (``fleetwise.learn.recipe``): every epoch the rule (``cfg.rule``, default
    ``slo_aware``, a fresh instance per episode) answers first, and the action corrects its target.
    ``MultiDiscrete([len(deltas)] * max_groups)``: per group a change of ``deltas`` (default -2..+2) replicas
    added to the rule's target (:func:`residual_targets`); a changed target is clamped to ``[min_replicas,
    min(max_replicas, available)]`` (the platform clamps again); actions of padding slots are ignored. The centre
    action (``rule_action()``: a change of 0 everywhere) gives the rule's targets unchanged, decision for decision.
    Safety rules restore what a change broke, for a model with demand (arrivals or waiting requests): its
    on-demand groups keep ``on_demand_floor`` (default 1) replicas, since spot capacity can vanish at once, and
    its targets never add up to zero (so requests are never held to the horizon, i.e. lost).

Reward (per epoch, :class:`AutoscalingConfig`)
    The Lagrangian of "minimise cost subject to SLO attainment >= ``slo_target``":
    ``-reward_scale * (cost + lam * slo_weight * (missed - (1 - slo_target)) + wait_weight * backlog
    + change_weight * moved)`` where ``lam`` is the Lagrange multiplier (``set_lambda``; training updates it by
    dual ascent from the attainment each rollout measured, ``recipe.Lagrangian``) and

    - ``cost``: GPU cost of the replicas alive during the epoch (``num_gpus x price_usd_per_gpu_hour x``
      seconds alive between ``start_s`` and ``stop_s``, billed from the start of provisioning; kept
      incrementally), divided by the cost of one replica of the most expensive group for one epoch
      (``cost_scale_usd_per_hour``, default that price): one on-demand replica-epoch costs 1. The last step
      bills until the platform is done (the last request ended), not until the simulator's last timer;
    - ``missed``: fraction of the requests that ended during the epoch and missed their SLO (TTFT or TPOT
      target of their class, as ``slo_attainment`` counts it: TTFT includes half the network round trip;
      a rejected request misses); an epoch below the allowed ``1 - slo_target`` earns the slack back;
    - ``backlog``: requests waiting or held at the end of the epoch per request that arrived during it
      (capped at ``max_backlog``): scaling to zero under load is punished before completions show it;
    - ``moved``: replicas added or removed by the answer (|target - (ready + starting)| summed over groups),
      a small price on churn (flapping between scale-up and scale-down).

    The constraint holds only with the multiplier a trainer updates: a plain ``gym.make`` keeps ``lam`` at its
    start, 1, and at that price a policy may trade SLOs for cost. Measured (fuzzing, 2026-12-06; window 300 s,
    seeds 1 and 6): all-minimum actions scored -14.6 and -18.3 against the rule's -23.7 and -18.6 at SLO
    attainment 0.976 and 0.958, below the 0.98 target. Train with ``learn.autoscaling.train_autoscaler`` (dual
    ascent on ``lam``), or update it with ``set_lambda`` as a ``recipe.Lagrangian`` does.

Episode end
    ``terminated`` when the platform is done (every request ended, the simulator's ``advance`` returns None);
    ``truncated`` after ``max_epochs`` steps.

Info
    ``time_s``, ``epoch_cost_usd``, ``cost_usd`` (so far), ``ended``, ``met``, ``slo_attainment`` (met / ended
    so far), ``lam``, ``missed_fraction``, ``backlog``, ``moved``, ``lost_requests`` (requests not served by the
    horizon; must stay 0), ``targets`` (the last answer, {group key: replicas}).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fleetwise.envs import checked_action, checked_render_mode
from fleetwise.errors import InputError
from fleetwise.workload.readers import cached_servegen  # noqa: F401  (re-exported)
from fleetwise.policies.scaler_features import (  # noqa: F401  (re-exported: the env's observation and action)
    N_GLOBAL_FEATURES,
    N_GROUP_FEATURES,
    OBS_CLIP,
    RULE,
    centre_action,
    check_deltas,
    features,
    residual_targets,
    symmetric_deltas,
    targets_from_action,
)

SERVEGEN_SPAN_S = 1_209_600.0  # m-large: 14 days of 600-s windows
SPOT_TRACE_SPAN_S = 547_060.0  # aws-04-19-2023/us-east-1b_intel_64 (the "auto" trace of us-east-1b)


# --------------------------------------------------------------------------------------------- scenario
def default_scenario(start_s: float = 36_000.0, spot_offset_s: float = 0.0, window_s: float = 1200.0,
                     rate_scale: float = 0.025):
    """The embedded scenario: one model, an on-demand and a spot group, a bursty three-tenant workload over
    ``window_s`` seconds: ServeGen ``m-large`` chat arrivals from ``start_s`` of its trace (interactive), an
    MMPP ``api`` tenant (standard) and a Poisson ``batch`` tenant."""
    from fleetwise.scenario import parse_scenario

    common = {"model": "llama-3-8b", "gpu": "l40s", "provision_s": 60, "storage": "nfs"}
    return parse_scenario({
        "name": "autoscaling-rl",
        "description": "Autoscaling-v0 default: Llama-3-8B on L40S, on-demand + spot, ServeGen chat + api + batch",
        "fleet": {"topology": "backbone", "regions": ["us-east-1"]},
        "deployments": [
            {**common, "replicas": 2, "min_replicas": 0, "max_replicas": 6, "zone": "us-east-1a"},
            {**common, "replicas": 0, "min_replicas": 0, "max_replicas": 6, "zone": "us-east-1b", "pool": "spot",
             "spot_trace": "auto", "spot_offset_s": float(spot_offset_s)},
        ],
        "workload": {"kind": "mix", "max_total_tokens": 8192, "parts": [
            {"tenant": "chat", "workload": {
                "kind": "servegen", "servegen_model": "m-large", "start_s": float(start_s),
                "end_s": float(start_s) + window_s, "rate_scale": rate_scale, "slo_class": "interactive",
                "lengths": {"kind": "trace", "trace": "azure-conv"}}},
            {"tenant": "api", "workload": {"kind": "mmpp", "base_rate_rps": 0.4, "burst_rate_rps": 3.0,
                                           "mean_base_s": 300.0, "mean_burst_s": 120.0, "duration_s": window_s,
                                           "slo_class": "standard"}},
            {"tenant": "batch", "workload": {"kind": "poisson", "rate_rps": 0.25, "duration_s": window_s,
                                             "slo_class": "batch"}},
        ]},
        "scaler": "hpa",
        "platform": {"epoch_s": 30, "drain_s": 600},
    })


def _check_window(window_s: float, train_fraction: float, held_out: bool) -> None:
    """A window of ``window_s`` fits in the part of the trace episodes draw from (a longer one failed in numpy)."""
    part = SERVEGEN_SPAN_S * ((1.0 - train_fraction) if held_out else train_fraction)
    if not window_s <= part:
        raise InputError(f"AutoscalingConfig.window_s = {window_s:g}: longer than the "
                         f"{'held-out' if held_out else 'training'} part of the {SERVEGEN_SPAN_S:.0f}-s trace "
                         f"({part:.0f} s at train_fraction {train_fraction:g}: the "
                         f"{'last' if held_out else 'first'} {(1.0 - train_fraction) if held_out else train_fraction:.0%})")


def episode_scenario(seed: int, held_out: bool = False, window_s: float = 1200.0, train_fraction: float = 0.8,
                     rate_scale: float = 0.025):
    """The default scenario for one seed: the ServeGen window start (whole minutes) and the spot-trace offset
    drawn from ``seed``; windows from the first ``train_fraction`` of the trace, or from the rest when
    ``held_out``."""
    _check_window(window_s, train_fraction, held_out)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 808]))
    cut = train_fraction * SERVEGEN_SPAN_S
    lo, hi = (cut, SERVEGEN_SPAN_S - window_s) if held_out else (0.0, cut - window_s)
    start = 60.0 * math.floor(rng.uniform(lo, hi) / 60.0)
    spot = 60.0 * math.floor(rng.uniform(0.0, SPOT_TRACE_SPAN_S) / 60.0)
    return default_scenario(start, spot, window_s, rate_scale)


def resolve_scenario(scenario):
    """A Scenario from a Scenario, a built-in name / path, or a dict (None stays None: the default)."""
    from fleetwise.scenario import Scenario, load_scenario, parse_scenario

    if scenario is None or isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return parse_scenario(scenario)
    if isinstance(scenario, str):
        return load_scenario(scenario)
    raise InputError(f"scenario: expected a Scenario, a built-in name or a mapping, got {type(scenario).__name__}")


def build_cached(scenario, seed: int):
    """``fleetwise.scenario.build`` with ServeGen rates cached (the same result, faster)."""
    from fleetwise.scenario import build

    with cached_servegen():
        return build(scenario, seed)


# --------------------------------------------------------------------------------------------- env
@dataclass(frozen=True)
class AutoscalingConfig:
    """Environment settings: the embedded scenario's window, the action and the reward weights."""

    max_groups: int = 4
    deltas: tuple[int, ...] = (-2, -1, 0, 1, 2)
    window_s: float = 1200.0  # embedded scenario: arrivals over this many seconds
    rate_scale: float = 0.025  # embedded scenario: ServeGen rate multiplier (about 1.5-12 requests/s)
    train_fraction: float = 0.8  # embedded scenario: training windows from this first part of the trace
    cost_scale_usd_per_hour: float | None = None  # None: one replica of the most expensive group
    rule: str = RULE  # the registered scaler whose targets the action corrects
    rule_params: dict = field(default_factory=dict)
    slo_target: float = 0.98  # the constraint: SLO attainment >= slo_target (fraction of ended requests)
    lam: float = 1.0  # the Lagrange multiplier of the constraint (training updates it: set_lambda)
    slo_weight: float = 40.0  # reward units of one missed-fraction point at lam = 1
    wait_weight: float = 2.0
    change_weight: float = 0.2
    on_demand_floor: int = 1  # safety rule of the action mapping (targets_from_action)
    max_backlog: float = 5.0
    reward_scale: float = 0.1
    max_epochs: int = 400

    def __post_init__(self) -> None:
        """Values the reward or the window cannot take, refused naming the field (train_fraction=0 failed in numpy,
        lam=inf and reward_scale=NaN gave NaN rewards, slo_target=2 was taken)."""
        for k in ("window_s", "rate_scale", "reward_scale"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"AutoscalingConfig.{k} = {v!r}: expected a finite number > 0")
        for k in ("lam", "slo_weight", "wait_weight", "change_weight", "max_backlog"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                raise InputError(f"AutoscalingConfig.{k} = {v!r}: expected a finite number >= 0")
        if not 0 < self.train_fraction <= 1:
            raise InputError(f"AutoscalingConfig.train_fraction = {self.train_fraction!r}: expected in (0, 1]")
        if not 0 < self.slo_target <= 1:
            raise InputError(f"AutoscalingConfig.slo_target = {self.slo_target!r}: expected in (0, 1]")
        for k in ("max_groups", "max_epochs", "on_demand_floor"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (0 if k == "on_demand_floor" else 1):
                raise InputError(f"AutoscalingConfig.{k} = {v!r}: expected a whole number >= "
                                 f"{0 if k == 'on_demand_floor' else 1}")
        c = self.cost_scale_usd_per_hour  # (NaN gave NaN rewards, -1 paid for spending, 0 meant None)
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0):
            raise InputError(f"AutoscalingConfig.cost_scale_usd_per_hour = {c!r}: expected None or a finite number > 0")
        object.__setattr__(self, "deltas", check_deltas(self.deltas, "AutoscalingConfig.deltas"))
        _check_window(self.window_s, self.train_fraction, False)  # (the held-out part: the env, which knows)


class AutoscalingEnv(gym.Env):
    """``fleetwise/Autoscaling-v0`` (docs/autoscaling.md): one step is one scaling epoch of the platform layer. The
    action is a replica change per group (``config.deltas``) on top of the rule's targets; ``rule_action()`` (a
    change of 0 everywhere) reproduces the rule. The module docstring gives the observation and the reward."""

    metadata = {"render_modes": []}

    def __init__(self, scenario=None, config: AutoscalingConfig | None = None, held_out: bool = False,
                 router=None, batcher=None, render_mode: str | None = None):
        self.render_mode = checked_render_mode(render_mode, "Autoscaling-v0")
        if config is not None and not isinstance(config, AutoscalingConfig):
            raise InputError(f"Autoscaling-v0: config {config!r:.60}: expected an AutoscalingConfig")
        self.cfg = config if config is not None else AutoscalingConfig()
        self.scenario = resolve_scenario(scenario)
        if not isinstance(held_out, (bool, np.bool_)):  # ("x" was taken as True)
            raise InputError(f"Autoscaling-v0: held_out {held_out!r}: expected True or False")
        self.held_out = bool(held_out)
        if self.scenario is None:
            _check_window(self.cfg.window_s, self.cfg.train_fraction, self.held_out)
        self.router, self.batcher = router, batcher
        n = self.cfg.max_groups * N_GROUP_FEATURES + N_GLOBAL_FEATURES
        self.observation_space = spaces.Box(-OBS_CLIP, OBS_CLIP, shape=(n,), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete([len(self.cfg.deltas)] * self.cfg.max_groups)
        self.platform = None
        self.sim = None
        self._dp = None
        self.lam = float(self.cfg.lam)
        self.rule = None
        self.rule_targets: dict[str, int] = {}

    # ---------------------------------------------------------------- the recipe (fleetwise.learn.recipe)
    def rule_action(self) -> np.ndarray:
        """The action that reproduces the rule exactly: a change of 0 in every group."""
        return centre_action(self.cfg.max_groups, self.cfg.deltas)

    def set_lambda(self, lam: float) -> None:
        """The constraint's Lagrange multiplier (from ``recipe.Lagrangian``; also reachable as a VecEnv method): a
        finite number, negative ones taken as 0 (infinity gave infinite rewards, NaN was taken as 0)."""
        if (isinstance(lam, bool) or not isinstance(lam, (int, float, np.integer, np.floating))
                or not math.isfinite(lam)):
            raise InputError(f"Autoscaling-v0: lambda {lam!r}: expected a finite number")
        self.lam = max(0.0, float(lam))

    def _make_rule(self):
        from fleetwise.policies import make

        return make("scaler", self.cfg.rule, dict(self.cfg.rule_params), where="Autoscaling-v0 rule: ")

    def _observe(self) -> np.ndarray:
        """The rule answers the pending decision point first (its state advances once per epoch, as when it
        scales on its own); the observation includes its targets."""
        obs = self._dp.payload
        self.rule_targets = {str(k): int(v) for k, v in self.rule.scale(obs).items()}
        return features(obs, self.cfg.max_groups, self.rule_targets)

    # ---------------------------------------------------------------- scenario and simulator
    def scenario_for(self, seed: int):
        """The scenario of an episode: the constructor's, or the embedded one for ``seed``."""
        if self.scenario is not None:
            return self.scenario
        c = self.cfg
        return episode_scenario(seed, self.held_out, c.window_s, c.train_fraction, c.rate_scale)

    def _advance(self):
        """Run the simulator, answering route/batch decisions, up to the next scale decision (None: done)."""
        return self.sim.run_until(math.inf, self._ctl, stop=("scale",))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        from fleetwise.platform.runner import Platform

        ep_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))
        self.episode_seed = ep_seed
        sc = self.scenario_for(ep_seed)
        built = build_cached(sc, ep_seed)
        self.platform = p = Platform(built, scaler=None, seed=ep_seed, monitor=False)
        self.sim = sim = built.sim
        self._ctl = built.controller(self.router, self.batcher)
        if len(p.groups) > self.cfg.max_groups:
            raise InputError(f"Autoscaling-v0: the scenario has {len(p.groups)} scaling groups; max_groups is "
                             f"{self.cfg.max_groups}")
        w = sim.workload
        from fleetwise.workload.slo import get_slo

        slo = [get_slo(n) for n in w.slo_classes]
        self._ttft_t = [c.ttft_s for c in slo]
        self._tpot_t = [c.tpot_s for c in slo]
        self._cls = w.slo_class.tolist()
        prices = [g.price_usd_per_hour for g in p.groups]
        scale = self.cfg.cost_scale_usd_per_hour or (max(prices) if prices and max(prices) > 0 else 1.0)
        self._cost_unit = scale * p.spec.epoch_s / 3600.0  # USD of one reference replica for one epoch
        self._seen = 0
        self._met = self._ended = 0
        self._closed_cost = 0.0
        self._open: list[int] = []
        self._n_reps = 0
        self._cost = 0.0
        self._arrived = sum(sim.arrived)
        self._steps = 0
        self._cost = self._billed()
        self.rule = self._make_rule()
        self.rule_targets = {}
        self._dp = self._advance()
        info = self._info(0.0, 0.0, 0.0, {})
        if self._dp is None:  # nothing to scale (an empty workload)
            p.finish()
            return np.zeros(self.observation_space.shape, np.float32), info
        return self._observe(), info

    def _billed(self, until: float | None = None) -> float:
        """GPU cost (USD) of every replica up to now (or ``until``); stopped replicas are summed once."""
        sim = self.sim
        reps = sim.replicas
        for i in range(self._n_reps, len(reps)):
            self._open.append(i)
        self._n_reps = len(reps)
        now = sim.now if until is None else until
        running = 0.0
        still = []
        for i in self._open:
            r = reps[i]
            rate = r.gpu_usd_per_s
            if r.stop_s is not None:
                self._closed_cost += rate * max(0.0, min(r.stop_s, now) - r.start_s)
            else:
                running += rate * max(0.0, now - r.start_s)
                still.append(i)
        self._open = still
        return self._closed_cost + running

    def _ended_since(self) -> tuple[int, int]:
        """(ended, met their SLO) among requests that ended since the last call."""
        sim = self.sim
        log = sim.completions
        ended = met = 0
        status, ft, cs, arr, net, out = sim.status, sim.first_token_s, sim.completion_s, sim.arrival, sim.net_s, \
            sim.output
        cls, tt, tp = self._cls, self._ttft_t, self._tpot_t
        for rid in log[self._seen:]:
            ended += 1
            if status[rid] != 1:
                continue
            c = cls[rid]
            half = net[rid] / 2.0
            ttft = ft[rid] + half - arr[rid]
            o = out[rid]
            tpot = (cs[rid] - ft[rid]) / (o - 1) if o > 1 else 0.0
            if ttft <= tt[c] and tpot <= tp[c]:
                met += 1
        self._seen = len(log)
        return ended, met

    def _lost(self) -> int:
        from fleetwise.sim.records import REJECT_REASONS

        st = np.frombuffer(self.sim.status, dtype=np.int8)
        rs = np.frombuffer(self.sim.reason, dtype=np.int8)
        return int((st == 0).sum() + ((st == 2) & (rs == REJECT_REASONS.index("horizon"))).sum())

    def _info(self, epoch_cost: float, missed: float, backlog: float, targets: dict) -> dict:
        return {"time_s": float(self.sim.now), "epoch_cost_usd": float(epoch_cost), "cost_usd": float(self._cost),
                "ended": int(self._ended), "met": int(self._met),
                "slo_attainment": float(self._met / self._ended) if self._ended else 1.0,
                "missed_fraction": float(missed), "backlog": float(backlog), "lost_requests": 0,
                "targets": dict(targets), "episode_seed": int(self.episode_seed), "lam": float(self.lam),
                # direction reversals of a model's total target so far (the platform's, as results count them)
                "oscillations": int(self.platform.flaps) if self.platform is not None else 0}

    @property
    def scale_obs(self):
        """The pending ScaleObs (None when the episode is over)."""
        return None if self._dp is None else self._dp.payload

    def step(self, action):
        if self._dp is None:
            raise RuntimeError("call reset() before step()" if self.sim is None else "episode is over; call reset()")
        # an action outside the space is refused, naming it, as in Allocation-v0 and Torta-v0 (NaN was cast to a
        # scale-down, 99 clamped to +2 and a short array padded, with no flag)
        action = checked_action(self.action_space, action)
        return self.step_targets(residual_targets(self._dp.payload, action, self.cfg.deltas, self.rule_targets,
                                                  self.cfg.on_demand_floor))

    def step_targets(self, targets: dict[str, int]):
        """``step`` with the answer given as targets {group key: replicas} (e.g. a heuristic scaler's), so
        any scaler can be scored with this environment's reward."""
        if self._dp is None:
            raise RuntimeError("call reset() before step()" if self.sim is None else "episode is over; call reset()")
        self.platform.check_targets(targets)  # (a refused answer changes nothing: the episode goes on)
        targets = {} if targets is None else targets  # (None: no change, as a scaler's None answer)
        cfg = self.cfg
        moved = 0
        for g in self._dp.payload.groups:
            if g.key in targets:
                moved += abs(int(targets[g.key]) - max(0, g.ready) - max(0, g.starting))
        self.sim.apply(targets)
        self._dp = self._advance()
        self._steps += 1
        done = self._dp is None
        until = None
        if done:  # bill until the platform was done: the last request ended (or the last arrival)
            cs = np.frombuffer(self.sim.completion_s, dtype=np.float64)
            last = float(np.nanmax(cs)) if len(cs) and not np.isnan(cs).all() else 0.0
            until = max(self.platform.end_s, last)
            self.platform.finish()
        cost = self._billed(until)
        epoch_cost, self._cost = cost - self._cost, cost
        ended, met = self._ended_since()
        self._ended += ended
        self._met += met
        missed = (ended - met) / ended if ended else 0.0
        arrived = sum(self.sim.arrived)
        new = arrived - self._arrived
        self._arrived = arrived
        if done:
            backlog = 0.0
        else:
            waiting = sum(max(0, g.waiting) for g in self._dp.payload.groups)
            backlog = min(cfg.max_backlog, waiting / max(new, 1))
        # the Lagrangian of "minimise cost s.t. SLO attainment >= slo_target": the multiplier prices the epoch's
        # missed fraction against the allowed one (slack is paid for: the exact Lagrangian, not a hinge)
        slo_term = self.lam * cfg.slo_weight * ((missed - (1.0 - cfg.slo_target)) if ended else 0.0)
        penalty = (epoch_cost / self._cost_unit + slo_term + cfg.wait_weight * backlog + cfg.change_weight * moved)
        reward = -cfg.reward_scale * penalty
        info = self._info(epoch_cost, missed, backlog, targets)
        info["moved"] = moved
        if done:
            info["lost_requests"] = self._lost()
            return np.zeros(self.observation_space.shape, np.float32), float(reward), True, False, info
        truncated = self._steps >= cfg.max_epochs
        return self._observe(), float(reward), False, truncated, info
