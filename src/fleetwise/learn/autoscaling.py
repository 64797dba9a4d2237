"""Training and evaluation of the RL scaler (issue 8) on ``fleetwise/Autoscaling-v0``.

- ``train_autoscaler(timesteps, seed, config)``: Stable-Baselines3 PPO (``MlpPolicy``, a small net) on the
  embedded scenario's training windows; saves a .zip that the registered scaler ``rl``
  (``fleetwise.policies.scalers_rl``) loads: ``{"name": "rl", "checkpoint": "path.zip"}``.
- ``evaluate(policies, seeds)``: every policy through ``fleetwise.platform.run_platform`` on the same held-out
  scenarios (ServeGen windows from the last 20% of the trace), one per seed, plus the environment's episode
  return (the RL objective) from the same run driven through the env; mean and 95% bootstrap CI over seeds.

Command line (docs/autoscaling.md, "RL scaler")::

    python -m fleetwise.learn.autoscaling train --timesteps 61500 --n-envs 2 --subproc
    python -m fleetwise.learn.autoscaling evaluate --seeds 5 --json results/autoscaling/eval.json

(with OMP_NUM_THREADS=1; both default to results/autoscaling/rl_scaler.zip).

torch and stable-baselines3 are imported inside the functions (importing this module stays light).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fleetwise.envs.autoscaling import AutoscalingConfig, AutoscalingEnv, cached_servegen

HEURISTICS = ("static", "hpa", "slo_aware", "predictive")
# the capacity scalers without their N+1 zone redundancy (the RL scaler does not provide it either)
VARIANTS = {"slo_aware/no-zr": {"name": "slo_aware", "zone_redundant": False},
            "predictive/no-zr": {"name": "predictive", "zone_redundant": False}}
METRICS = ("slo_attainment", "cost_per_mtok_usd", "cost_usd", "lost_requests", "oscillations", "scale_events",
           "episode_return")
EVAL_SEED0 = 1000  # held-out evaluation seeds: 1000, 1001, ... (windows from the held-out part of the trace)


@dataclass
class TrainConfig:
    """PPO settings. One episode of the default scenario is about 41 epochs (steps)."""

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
    save_path: str | None = None
    max_wall_s: float | None = None  # stop early (at the end of a step) after this much wall time
    verbose: bool = False  # a line per rollout on stderr (timesteps, episode return, SLO, cost, wall time)


def _make_env(scenario, cfg: AutoscalingConfig, factory: Callable[[], Any] | None = None) -> Callable[[], Any]:
    def make():
        from stable_baselines3.common.monitor import Monitor

        return Monitor(factory() if factory is not None else AutoscalingEnv(scenario, cfg))

    return make


def train_autoscaler(timesteps: int, seed: int = 0, config: TrainConfig | None = None,
                     progress: Callable[[int, dict], None] | None = None):
    """Train PPO on Autoscaling-v0 for ``timesteps`` epochs; save to ``config.save_path`` (.zip) when given.
    Returns the model (``model.curve``: [(timesteps, episode return, SLO attainment, cost USD)])."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    cfg = config or TrainConfig()
    torch.set_num_threads(1)
    fns = [_make_env(cfg.scenario, cfg.env, cfg.make_env) for _ in range(cfg.n_envs)]
    venv = SubprocVecEnv(fns) if cfg.subproc and cfg.n_envs > 1 else DummyVecEnv(fns)
    venv.seed(seed)
    model = PPO("MlpPolicy", venv, learning_rate=cfg.learning_rate, n_steps=cfg.n_steps,
                batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                clip_range=cfg.clip_range, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, seed=seed, device="cpu",
                policy_kwargs={"net_arch": list(cfg.net_arch)}, verbose=0)
    curve: list[tuple[int, float, float, float]] = []
    t0 = time.perf_counter()

    class Log(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    curve.append((self.num_timesteps, float(ep["r"]), float(info.get("slo_attainment", math.nan)),
                                  float(info.get("cost_usd", math.nan))))
            return cfg.max_wall_s is None or time.perf_counter() - t0 < cfg.max_wall_s

        def _on_rollout_end(self) -> None:
            last = curve[-12:]
            stats = {"episodes": len(curve), "wall_s": time.perf_counter() - t0}
            if last:
                stats.update(ret=float(np.mean([c[1] for c in last])), slo=float(np.mean([c[2] for c in last])),
                             cost=float(np.mean([c[3] for c in last])))
            if progress is not None:
                progress(self.num_timesteps, stats)
            if cfg.verbose:
                msg = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items())
                print(f"[autoscaling ppo] t={self.num_timesteps}/{timesteps} {msg}", file=sys.stderr, flush=True)

    try:
        model.learn(total_timesteps=int(timesteps), callback=Log())
    finally:
        venv.close()
    model.curve = curve
    model.train_wall_s = time.perf_counter() - t0
    if cfg.save_path:
        out = Path(cfg.save_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        model.save(str(out))
    return model


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
    from fleetwise.platform import run_platform

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
    """Per policy and metric: mean and 95% bootstrap CI over seeds (fleetwise.metrics.stats)."""
    from fleetwise.metrics.stats import bootstrap_ci

    out: dict[str, dict] = {}
    for name, rs in rows.items():
        d: dict[str, Any] = {"seeds": len(rs)}
        for k in METRICS:
            ci = bootstrap_ci([r[k] for r in rs if k in r])
            d[k] = {"mean": ci.mean, "lo": ci.lo, "hi": ci.hi}
        out[name] = d
    return out


def paired(rows: dict[str, list[dict]], policy: str = "rl") -> dict[str, dict]:
    """``policy`` against every other, paired by seed: the difference in SLO attainment (points of the
    fraction) and the relative change in cost per million tokens, mean and 95% bootstrap CI."""
    from fleetwise.metrics.stats import bootstrap_ci, paired_change

    mine = {r["seed"]: r for r in rows.get(policy, [])}
    out: dict[str, dict] = {}
    for name, rs in rows.items():
        if name == policy:
            continue
        base = {r["seed"]: r for r in rs if r["seed"] in mine}
        d = bootstrap_ci([mine[k]["slo_attainment"] - b["slo_attainment"] for k, b in base.items()])
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
    t = sub.add_parser("train", help="train PPO on Autoscaling-v0 and save the policy (.zip)")
    t.add_argument("--timesteps", type=int, default=20_000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", default="results/autoscaling/rl_scaler.zip")
    t.add_argument("--n-envs", type=int, default=1)
    t.add_argument("--subproc", action="store_true", help="environments in worker processes")
    t.add_argument("--max-minutes", type=float, default=None, help="stop training after this much wall time")
    e = sub.add_parser("evaluate", help="the RL scaler against the heuristics on held-out seeds")
    e.add_argument("--checkpoint", default="results/autoscaling/rl_scaler.zip")
    e.add_argument("--seeds", type=int, default=5)
    e.add_argument("--seed0", type=int, default=EVAL_SEED0)
    e.add_argument("--scalers", default=",".join(HEURISTICS + tuple(VARIANTS)),
                   help=f"registered names, or {', '.join(VARIANTS)}")
    e.add_argument("--json", default=None, help="write the rows and the summary here")
    a = ap.parse_args(argv)
    if a.cmd == "train":
        cfg = TrainConfig(n_envs=a.n_envs, subproc=a.subproc, save_path=a.out, verbose=True,
                          max_wall_s=None if a.max_minutes is None else 60.0 * a.max_minutes)
        model = train_autoscaler(a.timesteps, a.seed, cfg)
        print(f"saved {a.out} ({model.num_timesteps} timesteps, {model.train_wall_s:.0f} s, {len(model.curve)} "
              f"episodes)")
        curve = Path(a.out).with_suffix(".curve.json")
        curve.write_text(json.dumps({"config": asdict(cfg), "curve": model.curve}, default=str))
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
