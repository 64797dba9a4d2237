"""TORTA's macro agent: Stable-Baselines3 PPO over ``TortaEnv`` (one step per planning slot), on the shared recipe
(``fleetwise.learn.recipe``, docs/torta.md):

1. the residual environment (``kind="residual"``): a zero action is ``least_loaded`` + ``affinity_greedy``;
2. warm start: behaviour cloning on the rule's demonstrations, then the output layer set to zero (the mean action
   is exactly the rule's, 0) and the policy's spread reset to ``init_std`` so PPO explores around the rule;
3. GPU + energy cost is the objective, response time a constraint (a point below the rule's on the same
   training day: the env runs the rule beside the policy; ``Lagrangian``, dual ascent after every rollout);
   ``objective="response"`` swaps the two (cost no more than the rule's on validation days);
4. checkpoint choice and early stopping on validation days (training distribution, seeds disjoint from
   training and test), against the rule paired by day (``Validator``), after every update;
5. the gate (``gate``) on further validation days, written into the model card by the caller, run with the guard
   as deployed: the highest share of long requests of a slot in the training days (``long_share_max`` in the log;
   ``ResidualPlanner.long_share_max``: after a slot with more, the rule plans), as the CEM learner's.

``train(make_env, args) -> (model, curve, wall_s)``; ``curve`` is (timestep, episode return) pairs; with
``validation`` the model comes back at its best validation checkpoint and ``model.fleetwise_log`` holds the
validation curve, the multiplier's history and the gate. torch / SB3 are imported lazily; one thread.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TortaArgs:
    total_timesteps: int = 6000
    n_steps: int = 240  # 10 days per rollout
    batch_size: int = 60
    n_epochs: int = 10
    learning_rate: float = 3e-4
    gamma: float = 0.9  # per slot (one hour of the day)
    gae_lambda: float = 0.9
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    net_arch: tuple[int, ...] = (64, 64)
    seed: int = 0
    # the recipe (residual environments only)
    bc_episodes: int = 2  # days of the rule's demonstrations
    bc_epochs: int = 30
    init_std: float = 0.1  # the policy's spread after behaviour cloning (0.2 s of bias)
    rest_std: float | None = 0.01  # the spread of the entries other than the util weights (None: init_std): their
    # noise costs response time in every slot (0.2 s of random bias per region at 0.1), the util weight's much less
    objective: str = "cost"  # "cost": min cost s.t. response time <= the rule's; "response": the other way round
    cost_tolerance: float = 0.0  # objective "response": slot cost <= (1 + tol) x the rule's on validation days
    response_tolerance: float = -0.01  # objective "cost": response time <= (1 + tol) x the rule's (paired): a point
    # of margin, since 4 validation days do not pin the response time to within a point
    gate_response_ci_hi: float = 0.01  # objective "cost": the gate wants response time's CI upper bound <= +1%
    lagrangian_lr: float = 0.5
    val_days: int = 4  # validation days for checkpoint choice (0: none)
    gate_days: int = 4  # further validation days for the gate
    val_every: int = 1  # rollouts between validations
    patience: int = 4
    min_delta: float = 0.005  # a later checkpoint replaces the warm start only if 0.5 points better on validation


VAL_SEED0 = 500_000  # validation days: seeds 500000.. (training days draw from the env's RNG, test 1000..)


def day_metrics(cfg, make_planner, days, held_out: bool = False) -> dict:
    """Metrics of one planner (+ affinity_greedy, which its action may tune) on ``days``: {day: metrics}."""
    from fleetwise.worlds.torta import evaluate

    return {r["seed"]: r for r in evaluate(cfg, make_planner, "affinity_greedy", list(days), held_out=held_out)}


def rule_planner(cfg):
    from fleetwise.policies.planners import LeastLoadedPlanner

    return LeastLoadedPlanner(cfg)


def paired_mean_change(policy: dict, rule: dict, metric: str) -> float:
    return float(np.mean([policy[d][metric] / rule[d][metric] - 1.0 for d in rule]))


def train(make_env, args: TortaArgs, progress=None, validation: bool = False):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.monitor import Monitor

    from fleetwise.floats import check_torch
    from fleetwise.learn.recipe import (Lagrangian, Validator, behaviour_clone, gate, quiet_logger, rule_demonstrations,
                                        sb3_callback)

    torch.set_num_threads(1)
    check_torch(torch)  # the kernels pinned at import (fleetwise/floats.py)
    env = Monitor(make_env())
    base = env.unwrapped
    residual = getattr(base, "kind", "ot") == "residual"
    if residual:
        base.objective = args.objective
    curve: list[tuple[int, float]] = []
    log: dict = {}
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs,
                learning_rate=args.learning_rate, gamma=args.gamma, gae_lambda=args.gae_lambda,
                clip_range=args.clip_coef, ent_coef=args.ent_coef, seed=args.seed, device="cpu", verbose=0,
                policy_kwargs={"net_arch": list(args.net_arch)})
    quiet_logger(model)
    t0 = time.perf_counter()
    validator = None
    if residual:
        obs, act = rule_demonstrations(make_env, args.bc_episodes, seed=args.seed + 10_000)
        log["bc_loss"] = behaviour_clone(model, obs, act, epochs=args.bc_epochs, seed=args.seed)
        with torch.no_grad():
            model.policy.log_std.fill_(math.log(args.init_std))
            if args.rest_std is not None:  # every entry but the last two (the util weights, ResidualPlanner)
                model.policy.log_std[:-2].fill_(math.log(args.rest_std))
            # the rule's action is 0 everywhere: cloning only brings the mean action *near* 0, and a small mean
            # action is a bias that changes decisions; a zero output layer makes the warm start the rule itself
            model.policy.action_net.weight.zero_()
            model.policy.action_net.bias.zero_()
        if validation and args.val_days > 0:
            from fleetwise.policies.planners import ResidualPlanner

            cfg, temporal = base.cfg, base.cfg.temporal
            vdays = range(VAL_SEED0, VAL_SEED0 + args.val_days)
            rule_v = day_metrics(cfg, rule_planner, vdays)
            if args.objective == "cost":  # paired in the env: the day's response time / the rule's - 1 <= tol
                base.lagrangian = Lagrangian(target=args.response_tolerance, sense="<=", lr=args.lagrangian_lr,
                                             scale=0.05, hinge=False)
            else:  # the rule's slot cost (GPU + energy, as the env counts it) on the validation days
                target = float(np.mean([(m["cost_gpu_usd"] + m["cost_energy_usd"]) / base.ref_cost / 24.0
                                        for m in rule_v.values()])) * (1.0 + args.cost_tolerance)
                base.lagrangian = Lagrangian(target=target, sense="<=", lr=args.lagrangian_lr, scale=0.05 * target,
                                             hinge=False)

            def score(m):
                pol = day_metrics(cfg, lambda c: ResidualPlanner(c, m, temporal), vdays)
                resp = paired_mean_change(pol, rule_v, "response_time_mean_s")
                cost = paired_mean_change(pol, rule_v, "cost_usd")
                if args.objective == "cost":
                    return -cost - 10.0 * max(0.0, resp - args.response_tolerance)
                return -resp - max(0.0, cost - args.cost_tolerance)

            validator = Validator(score, patience=args.patience, min_delta=args.min_delta)
            validator.check(model, 0)  # the warm start itself (about the rule) is a candidate
    day_measured: list[float] = []  # what the constraint measures per training day: response change or cost ratio
    measured = "day_response_change" if args.objective == "cost" else "day_cost_ratio"
    long_shares: list[float] = []  # per training day: its highest share of long requests of a slot (the guard's)

    def on_episode(info):
        curve.append((int(model.num_timesteps), float(info["episode"]["r"])))
        if measured in info:
            day_measured.append(float(info[measured]))
        share = (info.get("day_metrics") or {}).get("long_share_max")
        if share is not None and math.isfinite(float(share)):
            long_shares.append(float(share))
        if progress is not None:
            progress(model.num_timesteps)

    def on_rollout(m, steps):
        lag = getattr(base, "lagrangian", None)
        if lag and day_measured:
            lag.update(float(np.mean(day_measured)), steps)
            day_measured.clear()
        return True

    # validation after each update (SB3's rollout end comes before the update it feeds), the last one after learn
    cb = sb3_callback(every_rollouts=args.val_every, on_rollout=on_rollout, on_episode=on_episode,
                      on_update=None if validator is None else validator.check)
    model.learn(total_timesteps=args.total_timesteps, callback=cb)
    if validator is not None and cb.keep_going and validator.curve[-1][0] != model.num_timesteps:
        validator.check(model, model.num_timesteps)
    # the guard's threshold: the highest share of long requests of a slot in the training days (None: no day ended)
    guard = max(long_shares) if residual and long_shares else None
    log["long_share_max"] = guard
    if validator is not None:
        validator.restore(model)
        log["validation_curve"] = validator.curve
        log["best_step"] = validator.best_step
        from fleetwise.policies.planners import ResidualPlanner

        cfg, temporal = base.cfg, base.cfg.temporal
        gdays = range(VAL_SEED0 + args.val_days, VAL_SEED0 + args.val_days + args.gate_days)
        from fleetwise.metrics.stats import paired_change

        rule_g = day_metrics(cfg, rule_planner, gdays)
        pol_g = day_metrics(cfg, lambda c: ResidualPlanner(c, model, temporal, guard), gdays)  # (as deployed)
        cost_ch = paired_mean_change(pol_g, rule_g, "cost_usd")
        resp = paired_change({d: m["response_time_mean_s"] for d, m in rule_g.items()},
                             {d: m["response_time_mean_s"] for d, m in pol_g.items()})
        metric = "cost_usd" if args.objective == "cost" else "response_time_mean_s"
        ok = (resp.hi <= args.gate_response_ci_hi) if args.objective == "cost" else (cost_ch <= args.cost_tolerance + 1e-9)
        g = gate({d: m[metric] for d, m in pol_g.items()}, {d: m[metric] for d, m in rule_g.items()}, constraint_ok=ok)
        g.update(rule="least_loaded", metric=metric, days=list(gdays), cost_change=cost_ch,
                 response_change=resp.mean, response_ci95=[resp.lo, resp.hi],
                 selection_days=list(range(VAL_SEED0, VAL_SEED0 + args.val_days)), best_step=validator.best_step)
        log["gate"] = g
    lag = getattr(base, "lagrangian", None)
    if lag:
        log["lagrangian"] = [list(h) for h in lag.history]
        log["cost_target" if args.objective == "response" else "response_change_target"] = lag.target
    model.fleetwise_log = log
    return model, curve, time.perf_counter() - t0
