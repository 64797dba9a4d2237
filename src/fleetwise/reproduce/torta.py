"""``fleetwise reproduce torta``: RL + optimal transport across regions with a switching-aware micro layer
(docs/torta.md).

Protocol, per topology: train the TORTA agent (temporal observation) and the reactive PPO ablation (current state
only) on training days (first 70% of the length traces and ServeGen days); evaluate every policy on the same
held-out days (one day per seed); report mean / P95 / P99 response time, load CV, cost, switches and migrations
(mean and 95% bootstrap CI over seeds), and TORTA's paired change against the best baseline per metric.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from fleetwise.reproduce.common import store_rows

PAPER = {"response_time": "-15% (up to)", "load_balance": "+4-5%", "cost": "-10% to -20%"}
METRICS = ("response_time_mean_s", "response_time_p95_s", "response_time_p99_s", "load_cv", "load_std",
           "cost_usd", "cost_gpu_usd", "cost_energy_usd", "cost_egress_usd", "switches", "migrations", "rejected")
BASELINES = ("round_robin", "nearest", "least_loaded", "ot_capacity", "reactive_ppo")


def _budget(quick: bool) -> dict:
    if quick:
        return {"timesteps": 960, "seeds": 5}
    return {"timesteps": 4800, "seeds": 8}


def _summ(rows: list[dict]) -> dict:
    from fleetwise.reproduce.common import summarize_rows

    return summarize_rows(rows, METRICS)


def policies(models: dict) -> dict:
    """name -> (planner factory, micro allocator)."""
    from fleetwise.policies.planners import (
        LeastLoadedPlanner,
        NearestPlanner,
        PolicyPlanner,
        RoundRobinPlanner,
        ot_capacity,
    )

    out = {"round_robin": (RoundRobinPlanner, "affinity_greedy"), "nearest": (NearestPlanner, "affinity_greedy"),
           "least_loaded": (LeastLoadedPlanner, "affinity_greedy"), "ot_capacity": (ot_capacity, "affinity_greedy")}
    if "reactive_ppo" in models:
        # the ablation differs from TORTA only in what its planner sees (no history, no time of day)
        out["reactive_ppo"] = (lambda cfg, m=models["reactive_ppo"]: PolicyPlanner(cfg, m, False), "torta_match")
    if "torta" in models:
        out["torta"] = (lambda cfg, m=models["torta"]: PolicyPlanner(cfg, m, True), "torta_match")
        out["torta_no_micro"] = (lambda cfg, m=models["torta"]: PolicyPlanner(cfg, m, True), "least_loaded_server")
        out["torta_greedy_micro"] = (lambda cfg, m=models["torta"]: PolicyPlanner(cfg, m, True), "affinity_greedy")
    return out


def run(quick: bool = False, seeds: int | None = None, eval_trace: str | None = None, db: str | None = None,
        progress: bool = True, topologies=None, timesteps: int | None = None) -> dict:
    from rich.console import Console

    from fleetwise.envs.torta import TOPOLOGIES, TortaConfig, TortaEnv, evaluate
    from fleetwise.experiments.stats import paired_change
    from fleetwise.learn.torta import TortaArgs, train

    bud = _budget(quick)
    n_seeds = seeds or bud["seeds"]
    steps = timesteps or bud["timesteps"]
    trace = None
    tag = ""
    if eval_trace is not None:
        from fleetwise.workload.spec import load_trace

        trace = load_trace(eval_trace)
        tag = f":{Path(eval_trace).name}"
    console = Console(stderr=True)
    eval_seeds = list(range(1000, 1000 + n_seeds))
    result: dict = {}
    extras: dict = {}
    for topo in topologies or TOPOLOGIES:
        cfg = TortaConfig(topology=topo)
        models, info = {}, {}
        for name, temporal in (("torta", True), ("reactive_ppo", False)):
            c = replace(cfg, temporal=temporal)
            model, curve, wall = train(lambda c=c: TortaEnv(c), TortaArgs(total_timesteps=steps, seed=0))
            models[name] = model
            info[name] = {"train_wall_s": wall, "train_timesteps": steps}
            if progress:
                console.print(f"[{topo}] trained {name}: {steps} slots in {wall:.1f} s")
            if db:
                from fleetwise.experiments.store import Store

                Store(db).add_learning_curve(f"torta/{topo}/{name}", [s for s, _ in curve], [r for _, r in curve],
                                             "episode_return")
        rows = {}
        for name, (mk, micro) in policies(models).items():
            rows[name] = evaluate(cfg, mk, micro, eval_seeds, held_out=True, trace=trace,
                                  keep_day=name in ("torta", "nearest", "least_loaded"))
            store_rows(db, "reproduce-torta", f"torta-{topo}{tag}", name, rows[name], level="router",
                       params={"topology": topo})
        res = {name: _summ(r) for name, r in rows.items()}
        for name in info:
            res[name].update(info[name])
        # paired changes of TORTA against the best baseline per metric (lower is better for each)
        changes = {}
        for metric in ("response_time_mean_s", "load_cv", "cost_usd"):
            best = min(BASELINES, key=lambda b: res[b][metric])
            ch = paired_change({r["seed"]: r[metric] for r in rows[best]}, {r["seed"]: r[metric] for r in rows["torta"]})
            changes[metric] = {"vs": best, "change": ch.mean, "ci95": [ch.lo, ch.hi]}
        ch = paired_change({r["seed"]: r["response_time_mean_s"] for r in rows["reactive_ppo"]},
                           {r["seed"]: r["response_time_mean_s"] for r in rows["torta"]})
        changes["vs_reactive_ppo_response_time"] = {"vs": "reactive_ppo", "change": ch.mean, "ci95": [ch.lo, ch.hi]}
        res["torta"]["changes"] = changes
        result[topo] = res
        extras[topo] = {n: rows[n][0] for n in ("torta", "nearest", "least_loaded")}
        if progress:
            console.print(f"[{topo}] evaluated {len(rows)} policies x {n_seeds} days")
    out_dir = Path(db).parent / "torta" if db else Path("results") / "torta"
    _plots(result, extras, out_dir)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _plots(result: dict, extras: dict, out_dir: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    topos = list(result)
    # response time over the day (first held-out day)
    fig = Figure(figsize=(4.2 * len(topos), 3.4), dpi=100)
    FigureCanvasAgg(fig)
    for k, topo in enumerate(topos):
        ax = fig.add_subplot(1, len(topos), k + 1)
        for name, row in extras[topo].items():
            ax.plot([s["latency_mean_s"] for s in row["slots"]], label=name)
        ax.set_title(topo)
        ax.set_xlabel("hour of day (UTC slot)")
        ax.set_ylabel("mean response time s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "response-time-over-day.png")
    # cost breakdown
    fig = Figure(figsize=(4.2 * len(topos), 3.6), dpi=100)
    FigureCanvasAgg(fig)
    for k, topo in enumerate(topos):
        ax = fig.add_subplot(1, len(topos), k + 1)
        names = list(result[topo])
        bottom = np.zeros(len(names))
        for part in ("cost_gpu_usd", "cost_energy_usd", "cost_egress_usd"):
            v = np.array([result[topo][n][part] for n in names])
            ax.bar(range(len(names)), v, bottom=bottom, label=part.replace("cost_", "").replace("_usd", ""))
            bottom += v
        ax.set_xticks(range(len(names)), names, rotation=60, fontsize=6)
        ax.set_title(topo)
        ax.set_ylabel("USD per simulated day")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "cost-breakdown.png")
    # transport plans: TORTA's mean plan per topology
    fig = Figure(figsize=(3.6 * len(topos), 3.4), dpi=100)
    FigureCanvasAgg(fig)
    for k, topo in enumerate(topos):
        ax = fig.add_subplot(1, len(topos), k + 1)
        plans = extras[topo]["torta"].get("plans") or []
        if plans:
            im = ax.imshow(np.mean(np.asarray(plans), 0), cmap="viridis")
            fig.colorbar(im, ax=ax, fraction=0.046)
        ax.set_title(f"{topo}: mean OT plan")
        ax.set_xlabel("serving region")
        ax.set_ylabel("origin region")
    fig.tight_layout()
    fig.savefig(out_dir / "transport-plans.png")


def render(result: dict):
    from rich.console import Group
    from rich.table import Table

    tables = []
    for topo, res in result.items():
        t = Table(title=f"TORTA on {topo} (held-out days): mean [95% CI] over seeds; paper: response time "
                        f"{PAPER['response_time']}, load balance {PAPER['load_balance']}, cost {PAPER['cost']}")
        for c in ("policy", "resp mean s", "resp p99 s", "load CV", "cost USD", "switches", "migrations", "rejected"):
            t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)

        def ci(r, k, f="{:.2f}"):
            lo, hi = r[f"{k}_ci95"]
            return f"{f.format(r[k])} [{f.format(lo)}, {f.format(hi)}]" if lo == lo else f.format(r[k])

        for name, r in res.items():
            t.add_row(name, ci(r, "response_time_mean_s"), ci(r, "response_time_p99_s"), ci(r, "load_cv", "{:.3f}"),
                      ci(r, "cost_usd", "{:.3f}"), f"{r['switches']:.0f}", f"{r['migrations']:.0f}",
                      f"{r['rejected']:.0f}")
        tables.append(t)
        lines = Table(title=f"{topo}: TORTA, paired change by seed")
        for c in ("metric", "vs", "change [95% CI]"):
            lines.add_column(c)
        for m, ch in res["torta"]["changes"].items():
            lo, hi = ch["ci95"]
            lines.add_row(m, ch["vs"], f"{ch['change']:+.1%} [{lo:+.1%}, {hi:+.1%}]")
        tables.append(lines)
    return Group(*tables)


def bench() -> dict:
    """Environment steps (planning slots) per second with random actions, one core."""
    from fleetwise.envs.torta import TortaEnv

    env = TortaEnv()
    env.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 5.0:
        _, _, term, _, _ = env.step(env.action_space.sample())
        n += 1
        if term:
            env.reset(seed=n)
    return {"env_steps_per_s": n / (time.perf_counter() - t0)}
