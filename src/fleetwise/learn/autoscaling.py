"""Training and evaluation of the RL scaler (issue 8) on ``fleetwise/Autoscaling-v0``.

- ``train_autoscaler(timesteps, seed, config)``: the recipe (docs/learning.md) with Stable-Baselines3 PPO
  (``MlpPolicy``, a small net) on the embedded scenario's training windows: behaviour cloning to the rule
  (``slo_aware``: the centre action), PPO on the Lagrangian of "minimise cost s.t. SLO attainment >= target",
  checkpoint choice on validation windows and the gate's result in the model card; saves SB3's .zip (to resume
  training) and, beside it, the fleetwise checkpoint ``path.npz`` + ``path.card.json`` that the registered scaler ``rl`` (``fleetwise.policies.scalers_rl``)
  loads: ``{"name": "rl", "checkpoint": "path.npz"}``.
- ``evaluate(policies, seeds)``: every policy through ``fleetwise.run.run_platform`` on the same held-out
  scenarios (ServeGen windows from the last 20% of the trace), one per seed, plus the environment's episode
  return (the RL objective) from the same run driven through the env; mean and 95% t interval over seeds.

Command line (docs/autoscaling.md, "RL scaler")::

    python -m fleetwise.learn.autoscaling train --timesteps 61500 --n-envs 2 --subproc [--seeds 3 --backend ray]
    python -m fleetwise.learn.autoscaling evaluate --seeds 5 --json results/autoscaling/eval.json

(with OMP_NUM_THREADS=1; train writes results/autoscaling/rl_scaler.zip and .npz, evaluate reads the .npz).

torch and stable-baselines3 are imported inside the functions (importing this module stays light).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fleetwise.envs.autoscaling import AutoscalingConfig, AutoscalingEnv, cached_servegen
from fleetwise.floats import check_torch

HEURISTICS = ("static", "hpa", "slo_aware", "predictive")
# the capacity scalers without their N+1 zone redundancy (the RL scaler does not provide it either)
VARIANTS = {"slo_aware/no-zr": {"name": "slo_aware", "zone_redundant": False},
            "predictive/no-zr": {"name": "predictive", "zone_redundant": False}}
METRICS = ("slo_attainment", "cost_per_mtok_usd", "cost_usd", "lost_requests", "oscillations", "scale_events",
           "episode_return")
EVAL_SEED0 = 1000  # held-out evaluation seeds: 1000, 1001, ... (windows from the held-out part of the trace)


@dataclass
class TrainConfig:
    """PPO settings and the recipe's (docs/learning.md). One episode of the default scenario is about 41 epochs."""

    env: AutoscalingConfig = field(default_factory=AutoscalingConfig)
    scenario: Any = None  # None: the embedded scenario (a fresh training window per episode)
    make_env: Callable[[], Any] | None = None  # builds the (unwrapped) environment instead of AutoscalingEnv
    n_envs: int = 1
    subproc: bool = False  # environments in worker processes (SubprocVecEnv) instead of DummyVecEnv
    n_steps: int = 246  # per environment and rollout: 6 episodes of the default scenario
    batch_size: int = 82
    n_epochs: int = 10
    learning_rate: float = 5e-4
    gamma: float = 0.95  # per epoch (30 s): a horizon of ~20 epochs, several cold starts
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    net_arch: tuple[int, ...] = (64, 64)
    # 2. warm start: behaviour cloning to the rule's action (the centre) on bc_episodes episodes, until the policy
    # gives the centre this probability per group (stochastic still: PPO keeps exploring around the rule)
    bc_episodes: int = 2
    bc_max_epochs: int = 50
    bc_target_prob: float = 0.8
    # 3. the constraint SLO attainment >= env.slo_target: dual ascent on the multiplier after every rollout
    lagrange_lr: float = 0.5  # per point (0.01) of attainment below the target
    lagrange_ki: float = 0.0
    # 4. validation: the deterministic policy against the rule on these windows every val_every rollouts; the best
    # parameters are kept (checkpoint choice) and training stops after `patience` checks without improvement
    val_seeds: tuple[int, ...] = ()
    make_val_env: Callable[[], Any] | None = None  # None: AutoscalingEnv(scenario, env, held_out=True)
    val_every: int = 1
    patience: int = 4
    # the share of the budget's rollouts before early stopping may stop training (Validator.min_checks): BC leaves
    # the deterministic policy at the rule, and PPO moved it only after 48 checks (23,616 steps) of the documented
    # 61,500-step run, so 4 checks without improvement stopped every run at the rule (1,970 steps; docs)
    early_stop_after: float = 0.5
    slo_tolerance: float = 0.002  # the gate: attainment at most this much (0.2 points) below the rule's
    save_path: str | None = None
    max_wall_s: float | None = None  # stop early (at the end of a step) after this much wall time
    verbose: bool = False  # a line per rollout on stderr (timesteps, episode return, SLO, cost, lambda, wall time)


def _make_env(scenario, cfg: AutoscalingConfig, factory: Callable[[], Any] | None = None) -> Callable[[], Any]:
    def make():
        from stable_baselines3.common.monitor import Monitor

        return Monitor(factory() if factory is not None else AutoscalingEnv(scenario, cfg))

    return make


def run_windows(make_env: Callable[[], Any], seeds: Sequence[int], act: Callable[[Any, np.ndarray], Any]
                ) -> dict[int, dict]:
    """Per seed one episode of ``make_env()`` with ``act(env, obs)`` choosing each action: {seed: {cost_usd,
    slo_attainment, lost_requests, moved}} (the env's own measures)."""
    out: dict[int, dict] = {}
    env = make_env()
    base = getattr(env, "unwrapped", env)
    for sd in seeds:
        obs, info = env.reset(seed=int(sd))
        moved = 0
        done = base.scale_obs is None
        while not done:
            obs, _, term, trunc, info = env.step(act(base, obs))
            moved += int(info.get("moved", 0))
            done = term or trunc
        out[int(sd)] = {"cost_usd": float(info["cost_usd"]), "slo_attainment": float(info["slo_attainment"]),
                        "lost_requests": int(info.get("lost_requests", 0)), "moved": moved,
                        "oscillations": int(info.get("oscillations", 0))}
    env.close()
    return out


def gate_result(policy: dict[int, dict], rule: dict[int, dict], tolerance: float, best_step: int | None = None
                ) -> dict[str, Any]:
    """The deployment gate (``recipe.gate``) on paired validation windows: cost against the rule (lower is
    better; passes when the whole 95% interval is a saving) with the constraints that the SLO attainment is at most
    ``tolerance`` below the rule's (the lower bound of the paired difference's 95% interval, as the CEM scaler's
    gate has it; until 2026-12-07 the mean), no request is lost and no oscillation is added over the windows (as
    the CEM scaler's gate; a PPO checkpoint that saved 5% on held-out windows reversed its targets 4.5 times as
    often as the rule)."""
    from fleetwise.learn.recipe import gate, mean_ci

    keys = sorted(set(policy) & set(rule))
    d = mean_ci([policy[k]["slo_attainment"] - rule[k]["slo_attainment"] for k in keys])
    added = int(sum(policy[k].get("oscillations", 0) - rule[k].get("oscillations", 0) for k in keys))
    lower = d[1] if math.isfinite(d[1]) else d[0]  # (one window: no interval, its difference)
    ok = bool(lower >= -tolerance and all(policy[k]["lost_requests"] == 0 for k in keys) and added <= 0)
    g = gate({k: policy[k]["cost_usd"] for k in keys}, {k: rule[k]["cost_usd"] for k in keys}, lower_is_better=True,
             constraint_ok=ok)
    g.update(metric="cost_usd", rule=RULE_NAME, slo_attainment_diff=[float(x) for x in d],
             slo_tolerance=float(tolerance), oscillations_added=added, windows_seeds=[int(k) for k in keys])
    if best_step is not None:
        g["best_step"] = int(best_step)
    return _json_safe(g)


def _json_safe(v):
    """NaN / infinite -> None (a model card is strict JSON; an interval over one window is undefined)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


RULE_NAME = "slo_aware"


def train_autoscaler(timesteps: int, seed: int = 0, config: TrainConfig | None = None,
                     progress: Callable[[int, dict], None] | None = None):
    """The recipe (fleetwise.learn.recipe) on Autoscaling-v0: behaviour cloning to the rule's action, then PPO for
    ``timesteps`` epochs with the SLO constraint's multiplier updated after every rollout, checkpoint choice on
    ``config.val_seeds`` and the gate's result in the model card; save to ``config.save_path`` (.zip, and the
    served checkpoint beside it with suffix .npz) when given.
    Returns the model: ``model.curve`` [(timesteps, episode return, SLO attainment, cost USD, lambda)],
    ``model.val_curve`` [(timesteps, score)], ``model.bc_losses``, ``model.validation`` (the gate or None)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from fleetwise.learn.recipe import Lagrangian, Validator, behaviour_clone, quiet_logger, rule_demonstrations

    cfg = config or TrainConfig()
    torch.set_num_threads(1)
    check_torch(torch)  # the kernels pinned at import (fleetwise/floats.py)
    fns = [_make_env(cfg.scenario, cfg.env, cfg.make_env) for _ in range(cfg.n_envs)]
    venv = SubprocVecEnv(fns) if cfg.subproc and cfg.n_envs > 1 else DummyVecEnv(fns)
    venv.seed(seed)
    model = PPO("MlpPolicy", venv, learning_rate=cfg.learning_rate, n_steps=cfg.n_steps,
                batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                clip_range=cfg.clip_range, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, seed=seed, device="cpu",
                policy_kwargs={"net_arch": list(cfg.net_arch)}, verbose=0)
    quiet_logger(model)
    t0 = time.perf_counter()
    # 2. warm start at the rule
    bc_losses: list[float] = []
    if cfg.bc_episodes > 0:
        obs, acts = rule_demonstrations(fns[0], cfg.bc_episodes, seed=10_000 + seed)
        ngroups = acts.shape[1]
        for k in range(cfg.bc_max_epochs):
            bc_losses += behaviour_clone(model, obs, acts, epochs=1, seed=seed + k)
            if math.exp(-bc_losses[-1] / ngroups) >= cfg.bc_target_prob:
                break
    # 3. the constraint
    lag = Lagrangian(target=cfg.env.slo_target, lr=cfg.lagrange_lr, ki=cfg.lagrange_ki, lam=cfg.env.lam,
                     scale=0.01, hinge=False)
    venv.env_method("set_lambda", lag.lam)
    # 4. validation: the rule's results once, the policy's at every check
    val_make = cfg.make_val_env or (lambda: AutoscalingEnv(cfg.scenario, cfg.env, held_out=True))
    val: dict[str, Any] = {"rule": None, "best": None}

    def det(model_):
        return lambda env, o: model_.predict(o, deterministic=True)[0]

    def score(model_) -> float:
        pol = run_windows(val_make, cfg.val_seeds, det(model_))
        val["last"] = pol
        g = gate_result(pol, val["rule"], cfg.slo_tolerance)
        short = max(0.0, -cfg.slo_tolerance - g["slo_attainment_diff"][0])
        change = g["change"] if g["change"] is not None else 0.0
        return -change - 10.0 * short / 0.01 - (0.0 if g["constraint_ok"] else 1.0)

    if not 0.0 <= cfg.early_stop_after <= 1.0:
        raise ValueError(f"TrainConfig.early_stop_after {cfg.early_stop_after!r}: expected a share from 0 to 1")
    rollouts = math.ceil(int(timesteps) / (cfg.n_steps * max(1, cfg.n_envs)))
    validator = Validator(score, patience=cfg.patience,
                          min_checks=int(cfg.early_stop_after * rollouts / max(1, cfg.val_every)))
    if cfg.val_seeds:
        val["rule"] = run_windows(val_make, cfg.val_seeds, lambda env, o: env.rule_action())
        validator.check(model, 0)
        val["best"] = val["last"]
    curve: list[tuple[int, float, float, float, float]] = []

    class Log(BaseCallback):
        rollouts = 0
        keep = True
        seen = 0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    curve.append((self.num_timesteps, float(ep["r"]), float(info.get("slo_attainment", math.nan)),
                                  float(info.get("cost_usd", math.nan)), float(lag.lam)))
            return self.keep and (cfg.max_wall_s is None or time.perf_counter() - t0 < cfg.max_wall_s)

        def _on_rollout_end(self) -> None:
            self.rollouts += 1
            new = curve[self.seen:]
            self.seen = len(curve)
            if new:  # dual ascent on what this rollout's episodes measured
                lag.update(float(np.mean([c[2] for c in new])), self.num_timesteps)
                self.training_env.env_method("set_lambda", lag.lam)
            if cfg.val_seeds and self.rollouts % max(1, cfg.val_every) == 0:
                prev = validator.best
                self.keep = validator.check(self.model, self.num_timesteps)
                if validator.best > prev:
                    val["best"] = val["last"]
            last = curve[-12:]
            stats = {"episodes": len(curve), "wall_s": time.perf_counter() - t0, "lam": lag.lam}
            if last:
                stats.update(ret=float(np.mean([c[1] for c in last])), slo=float(np.mean([c[2] for c in last])),
                             cost=float(np.mean([c[3] for c in last])))
            if validator.curve:
                stats["val"] = validator.curve[-1][1]
            if progress is not None:
                progress(self.num_timesteps, stats)
            if cfg.verbose:
                msg = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items())
                print(f"[autoscaling ppo] t={self.num_timesteps}/{timesteps} {msg}", file=sys.stderr, flush=True)

    try:
        model.learn(total_timesteps=int(timesteps), callback=Log())
    finally:
        venv.close()
    validation = None
    if cfg.val_seeds:
        validator.restore(model)  # checkpoint choice on validation windows
        validation = gate_result(val["best"], val["rule"], cfg.slo_tolerance, validator.best_step)
    model.curve = curve
    model.val_curve = list(validator.curve)
    model.lagrangian = list(lag.history)
    model.bc_losses = bc_losses
    model.validation = validation
    model.train_wall_s = time.perf_counter() - t0
    if cfg.save_path:
        from fleetwise.learn.export import export_sb3

        out = Path(cfg.save_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        model.save(str(out))  # SB3's zip: to resume training (it unpickles on load: never served)
        # what the scaler "rl" loads: the same policy as a checkpoint that runs no code on load
        export_sb3(model, out.with_suffix(".npz"), level="scaler", policy="rl", rule=cfg.env.rule,
                   training={"env": "fleetwise/Autoscaling-v0", "action": "residual",
                             "rule_params": dict(cfg.env.rule_params), "deltas": list(cfg.env.deltas),
                             "slo_target": cfg.env.slo_target, "lambda": lag.lam, "timesteps": int(timesteps),
                             "seed": int(seed), "bc_epochs": len(bc_losses), "val_seeds": list(cfg.val_seeds),
                             "wall_s": round(model.train_wall_s, 1), "episodes": len(curve)},
                   validation=validation)
    return model


def train_job(job: dict) -> dict:
    """One training job (``recipe.run_jobs``: a worker process or a Ray task): ``{"timesteps", "seed", "config":
    TrainConfig, "progress": optional callback (in-process jobs only)}`` -> the saved checkpoint, the learning curve
    and the gate's result."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = job.get("config") or TrainConfig()
    model = train_autoscaler(int(job["timesteps"]), int(job.get("seed", 0)), cfg, progress=job.get("progress"))
    return {"seed": int(job.get("seed", 0)), "timesteps": int(model.num_timesteps),
            "checkpoint": str(Path(cfg.save_path).with_suffix(".npz")) if cfg.save_path else None,
            "curve": model.curve, "val_curve": model.val_curve, "lagrangian": model.lagrangian,
            "bc_losses": model.bc_losses, "validation": model.validation, "wall_s": model.train_wall_s}


# --------------------------------------------------------------------------------------------- evaluation
def _scaler(spec):
    from fleetwise.policies import make
    from fleetwise.scenario import PolicyRef

    ref = PolicyRef.model_validate(spec)
    return make("scaler", ref.name, ref.params, where="scaler: ")


def episode_return(spec, seed: int, held_out: bool = True, config: AutoscalingConfig | None = None,
                   scenario=None) -> tuple[float, dict]:
    """A scaler (registered name or {name, params}) driven through the environment: (episode return, last info)."""
    env = AutoscalingEnv(scenario, config, held_out=held_out)
    env.reset(seed=seed)
    sc = _scaler(spec)
    total, info = 0.0, {}
    while env.scale_obs is not None:
        _, r, term, trunc, info = env.step_targets(sc.scale(env.scale_obs))
        total += r
        if term or trunc:
            break
    return total, info


def evaluate(policies: dict[str, Any], seeds: Sequence[int], held_out: bool = True,
             config: AutoscalingConfig | None = None, scenario=None, log: bool = False) -> dict[str, list[dict]]:
    """Each policy (name -> scaler spec) on the episode scenario of every seed through ``run_platform``.
    Per policy a list of rows: seed, the summary's metrics, and the env's episode return of the same run."""
    from fleetwise.run import run_platform

    cfg = config or AutoscalingConfig()
    env = AutoscalingEnv(scenario, cfg, held_out=held_out)
    rows: dict[str, list[dict]] = {}
    for name, spec in policies.items():
        for seed in seeds:
            t = time.perf_counter()
            with cached_servegen():
                p = run_platform(env.scenario_for(seed), seed, scaler=spec, monitor=False)
            s = p.summary
            ret, info = episode_return(spec, seed, held_out, cfg, scenario)
            row = {"seed": int(seed), **{k: float(s[k]) for k in METRICS if k in s}, "episode_return": ret,
                   "requests": int(s["requests"]), "spot_preemptions": int(s["spot_preemptions"]),
                   "replica_hours": float(s["replica_hours"]), "ttft_p99_s": float(s["ttft_p99_s"]),
                   "env_slo_attainment": float(info.get("slo_attainment", math.nan))}
            rows.setdefault(name, []).append(row)
            if log:
                print(f"[autoscaling eval] {name} seed={seed} slo={row['slo_attainment']:.4f} "
                      f"$/Mtok={row['cost_per_mtok_usd']:.4f} lost={row['lost_requests']:.0f} "
                      f"osc={row['oscillations']:.0f} return={ret:.2f} ({time.perf_counter() - t:.1f} s)",
                      file=sys.stderr, flush=True)
    return rows


def summarize(rows: dict[str, list[dict]]) -> dict[str, dict]:
    """Per policy and metric: mean and 95% t interval over seeds (fleetwise.metrics.stats)."""
    from fleetwise.metrics.stats import mean_ci

    out: dict[str, dict] = {}
    for name, rs in rows.items():
        d: dict[str, Any] = {"seeds": len(rs)}
        for k in METRICS:
            ci = mean_ci([r[k] for r in rs if k in r])
            d[k] = {"mean": ci.mean, "lo": ci.lo, "hi": ci.hi}
        out[name] = d
    return out


def paired(rows: dict[str, list[dict]], policy: str = "rl") -> dict[str, dict]:
    """``policy`` against every other, paired by seed: the difference in SLO attainment (points of the
    fraction) and the relative change in cost per million tokens, mean and 95% t interval."""
    from fleetwise.metrics.stats import mean_ci, paired_change

    mine = {r["seed"]: r for r in rows.get(policy, [])}
    out: dict[str, dict] = {}
    for name, rs in rows.items():
        if name == policy:
            continue
        base = {r["seed"]: r for r in rs if r["seed"] in mine}
        d = mean_ci([mine[k]["slo_attainment"] - b["slo_attainment"] for k, b in base.items()])
        c = paired_change({k: b["cost_per_mtok_usd"] for k, b in base.items()},
                          {k: mine[k]["cost_per_mtok_usd"] for k in base})
        out[name] = {"slo_attainment_diff": [d.mean, d.lo, d.hi], "cost_per_mtok_change": [c.mean, c.lo, c.hi]}
    return out


def render(summary: dict[str, dict]) -> str:
    def f(m, fmt):
        lo, hi = m["lo"], m["hi"]
        if lo != lo:
            return fmt.format(m["mean"])
        return f"{fmt.format(m['mean'])} [{fmt.format(lo)}, {fmt.format(hi)}]"

    lines = ["| scaler | SLO attainment | cost $/Mtok | cost $ | lost | oscillations | episode return |",
             "|---|---|---|---|---|---|---|"]
    for name, d in summary.items():
        lines.append(f"| {name} | {f(d['slo_attainment'], '{:.4f}')} | {f(d['cost_per_mtok_usd'], '{:.4f}')} | "
                     f"{f(d['cost_usd'], '{:.2f}')} | {d['lost_requests']['mean']:.0f} | "
                     f"{f(d['oscillations'], '{:.1f}')} | {f(d['episode_return'], '{:.2f}')} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fleetwise.learn.autoscaling", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train PPO on Autoscaling-v0 (the recipe) and save the policy (.zip + .npz)")
    t.add_argument("--timesteps", type=int, default=20_000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--seeds", type=int, default=1, help="training seeds seed, seed+1, ...: one job each "
                   "(OUT gets a -sN suffix when more than one)")
    t.add_argument("--backend", default="local", help="where the jobs run: local (processes) or ray")
    t.add_argument("--address", default=None, help="with --backend ray: the cluster's address")
    t.add_argument("--out", default="results/autoscaling/rl_scaler.zip")
    t.add_argument("--n-envs", type=int, default=1)
    t.add_argument("--subproc", action="store_true", help="environments in worker processes")
    t.add_argument("--val-seeds", type=int, default=4, help="validation windows (held-out seeds 2000, 2001, ...)")
    t.add_argument("--slo-target", type=float, default=AutoscalingConfig.slo_target)
    t.add_argument("--max-minutes", type=float, default=None, help="stop training after this much wall time")
    e = sub.add_parser("evaluate", help="the RL scaler against the heuristics on held-out seeds")
    e.add_argument("--checkpoint", default="results/autoscaling/rl_scaler.npz")
    e.add_argument("--seeds", type=int, default=5)
    e.add_argument("--seed0", type=int, default=EVAL_SEED0)
    e.add_argument("--scalers", default=",".join(HEURISTICS + tuple(VARIANTS)),
                   help=f"registered names, or {', '.join(VARIANTS)}")
    e.add_argument("--json", default=None, help="write the rows and the summary here")
    a = ap.parse_args(argv)
    if a.cmd == "train":
        from fleetwise.learn.recipe import run_jobs

        jobs = []
        for k in range(a.seeds):
            out = Path(a.out) if a.seeds == 1 else Path(a.out).with_name(f"{Path(a.out).stem}-s{a.seed + k}.zip")
            cfg = TrainConfig(env=AutoscalingConfig(slo_target=a.slo_target), n_envs=a.n_envs, subproc=a.subproc,
                              save_path=str(out), verbose=True, val_seeds=tuple(range(2000, 2000 + a.val_seeds)),
                              max_wall_s=None if a.max_minutes is None else 60.0 * a.max_minutes)
            jobs.append({"timesteps": a.timesteps, "seed": a.seed + k, "config": cfg})
        for job, res in zip(jobs, run_jobs(train_job, jobs, backend=a.backend, address=a.address,
                                           workers=min(len(jobs), os.cpu_count() or 1))):
            v = res["validation"] or {}
            print(f"saved {res['checkpoint']} ({res['timesteps']} timesteps, {res['wall_s']:.0f} s, "
                  f"{len(res['curve'])} episodes); gate: {'passed' if v.get('passed') else 'NOT passed'} "
                  f"(cost vs {RULE_NAME} {v.get('change', math.nan):+.1%}, SLO attainment "
                  f"{(v.get('slo_attainment_diff') or [math.nan])[0]:+.4f})")
            curve = Path(job["config"].save_path).with_suffix(".curve.json")
            curve.write_text(json.dumps({"config": asdict(job["config"]), **{k: res[k] for k in (
                "curve", "val_curve", "lagrangian", "bc_losses", "validation")}}, default=str))
        return 0
    policies: dict[str, Any] = {"rl": {"name": "rl", "checkpoint": a.checkpoint}}
    for n in [s for s in a.scalers.split(",") if s]:
        policies[n] = VARIANTS.get(n, n)
    rows = evaluate(policies, list(range(a.seed0, a.seed0 + a.seeds)), log=True)
    summ = summarize(rows)
    print(render(summ))
    pairs = paired(rows, "rl")
    for name, p in pairs.items():
        d, c = p["slo_attainment_diff"], p["cost_per_mtok_change"]
        print(f"rl vs {name} (paired by seed): SLO attainment {d[0]:+.4f} [{d[1]:+.4f}, {d[2]:+.4f}], "
              f"cost per Mtok {c[0]:+.1%} [{c[1]:+.1%}, {c[2]:+.1%}]")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"rows": rows, "summary": summ, "paired": pairs}, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
