"""``fleetwise reproduce graph-marl``: heterogeneous-GNN MAPPO vs flat MAPPO, independent PPO and heuristics
on a three-cloud fleet (docs/graph-marl.md).

Protocol: train each learned variant on segments from the first 70% of every trace (same updates, same seeds,
same budget); evaluate every policy on the same held-out segments (the last 30%), one segment per seed; report
P50/P99 latency (TTFT as the user sees it, network included), throughput, GPU utilization, cost (USD and per
million tokens), SLO attainment and mean model quality, mean and 95% bootstrap CI over seeds, and the paired
change of Graph-MARL against the flat-MARL baseline (the paper's comparison).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from fleetwise.reproduce.common import store_rows
from fleetwise.workload.adapt import WARN_SHARE

PAPER = {"latency_p99_s": (0.271, 0.194), "cost_change": -0.177, "gpu_util": 0.869}
PAPER_NOTE = "paper (vs MARL baseline): P99 271 -> 194 ms, cost -17.7%, GPU utilization 86.9%"
LEARNED = {"graph_marl": "graph", "flat_marl": "flat", "ippo": "ippo"}
METRICS = ("latency_p50_s", "latency_p99_s", "e2e_p99_s", "throughput_rps", "gpu_util", "cost_usd",
           "cost_per_mtok_usd", "slo_attainment", "quality")


def _budget(quick: bool) -> dict:
    if quick:
        return {"updates": 35, "episodes_per_update": 4, "seeds": 5}
    return {"updates": 100, "episodes_per_update": 4, "seeds": 10}


def _summ(rows: list[dict]) -> dict:
    from fleetwise.reproduce.common import summarize_rows

    out = summarize_rows(rows, METRICS)
    out["dropped_per_segment"] = float(np.mean([r["dropped"] for r in rows]))
    out["dropped_share"] = float(sum(r["dropped"] for r in rows) / max(1, sum(r["requests"] for r in rows)))
    return out


def run(quick: bool = False, seeds: int | None = None, eval_trace: str | None = None, db: str | None = None,
        progress: bool = True, load: float | str = 0.7, updates: int | None = None,
        segment_s: float | None = None, episodes_per_update: int | None = None) -> dict:
    """``load``: with ``eval_trace``, its rate as a fraction of the starting fleet's capacity
    (fleetwise.workload.adapt) or "real"; ``updates`` and ``segment_s`` (evaluation segments) shrink the
    budget (tests)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fleetwise.envs.graph_marl import (
        HEURISTICS,
        GraphMARLConfig,
        evaluate,
        make_env,
    )
    from fleetwise.metrics.stats import paired_change
    from fleetwise.learn.graph_marl import MAPPOArgs, train

    bud = _budget(quick)
    if updates is not None:
        bud["updates"] = int(updates)
    if episodes_per_update is not None:
        bud["episodes_per_update"] = int(episodes_per_update)
    n_seeds = seeds or bud["seeds"]
    cfg = GraphMARLConfig()
    trace, scenario = None, "multicloud-3x2"
    eval_seeds = list(range(1000, 1000 + n_seeds))
    fit_load = None if load == "real" else float(load)
    fit_lines: list[str] = []
    if eval_trace is not None:
        from fleetwise.worlds.multicloud import fit_multicloud_trace
        from fleetwise.workload.spec import load_trace

        trace = load_trace(eval_trace)
        scenario = f"multicloud-3x2:{Path(eval_trace).name}@{load}"
        # what the first evaluation segment replays (the env draws it from the same seed)
        rep = fit_multicloud_trace(cfg, trace, np.random.default_rng(eval_seeds[0]), segment_s, fit_load)[2]
        fit_lines = [f"--eval-trace {eval_trace}: replaces the segments' arrivals and lengths; each seed its own "
                     f"segment"] + [f"seed {eval_seeds[0]}: {ln}" for ln in rep.lines()]
    out_dir = Path(db).parent / "graph-marl" if db else Path("results") / "graph-marl"
    console = Console(stderr=True)
    result: dict = {}
    rows: dict[str, list[dict]] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True, disable=not (progress and console.is_terminal)) as prog:
        policies = {}
        for name, kind in LEARNED.items():
            task = prog.add_task(f"training {name}", total=bud["updates"])
            args = MAPPOArgs(kind=kind, updates=bud["updates"], episodes_per_update=bud["episodes_per_update"])
            ckpt = out_dir / f"{kind}-u{args.updates}x{args.episodes_per_update}-s{args.seed}.pt"
            pol, curve, info = train(lambda: make_env(cfg, duration_s=args.train_segment_s), args, ckpt_path=ckpt,
                                     resume=True, progress=lambda u, task=task: prog.update(task, completed=u))
            policies[name] = pol
            result[name] = {"train_wall_s": info["wall_s"], "train_env_steps": info["env_steps"],
                            "train_updates": info["update"]}
            if db and curve:
                from fleetwise.experiments.store import Store

                Store(db).add_learning_curve(name, [s for s, _ in curve], [r for _, r in curve], "episode_return")
        task = prog.add_task("evaluating", total=len(policies) + len(HEURISTICS))
        for name, pol in policies.items():
            rows[name] = evaluate(cfg, pol, eval_seeds, trace=trace, duration_s=segment_s, load=fit_load)
            prog.advance(task)
        for h in HEURISTICS:
            rows[h] = evaluate(cfg, h, eval_seeds, trace=trace, duration_s=segment_s, load=fit_load)
            prog.advance(task)
    for name, r in rows.items():
        result.setdefault(name, {}).update(_summ(r))
        store_rows(db, "reproduce-graph-marl", scenario, name, r, level="multicloud")
    base = {r["seed"]: r for r in rows["flat_marl"]}
    for name in rows:
        if name == "flat_marl":
            continue
        for k in ("latency_p99_s", "cost_usd", "gpu_util", "slo_attainment"):
            ch = paired_change({s: base[s][k] for s in base}, {r["seed"]: r[k] for r in rows[name]})
            result[name][f"vs_flat_{k}_change"] = ch.mean
            result[name][f"vs_flat_{k}_change_ci95"] = [ch.lo, ch.hi]
    result["_meta"] = {"scenario": scenario, "load": load if eval_trace is not None else None,
                       "overloaded": sorted(n for n in rows if result[n]["dropped_share"] > WARN_SHARE)}
    if eval_trace is not None:
        result["_trace_fit"] = fit_lines
    _plot_tradeoff(result, out_dir / "cost-latency.png")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _plot_tradeoff(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(6.5, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, r in result.items():
        if name.startswith("_") or "cost_usd" not in r:
            continue
        x, y = r["cost_usd"], r["latency_p99_s"] * 1000
        (xl, xh), (yl, yh) = r["cost_usd_ci95"], r["latency_p99_s_ci95"]
        xerr = [[x - xl], [xh - x]] if xl == xl else None
        yerr = [[y - yl * 1000], [yh * 1000 - y]] if yl == yl else None
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, marker="o" if name in LEARNED else "s", capsize=3, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("cost per held-out segment (USD)")
    ax.set_ylabel("P99 latency (TTFT, ms)")
    ax.set_title("Multi-cloud serving: cost vs P99 latency (mean, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.13, right=0.97, top=0.9, bottom=0.13)
    fig.savefig(path)


def render(result: dict):
    from rich.table import Table

    meta = result.get("_meta", {})
    over = meta.get("overloaded") or []
    where = "held-out segments" if not meta.get("load") else f"{meta.get('scenario')} at load {meta.get('load')}"
    t = Table(title=f"Graph-MARL-CloudLLM ({where}): mean [95% CI] over seeds; {PAPER_NOTE}"
                    + (f"; overloaded (> 1% dropped): {', '.join(over)}" if over else ""))
    for c in ("policy", "P50 ms", "P99 ms", "thr req/s", "GPU util", "cost USD", "USD/Mtok", "SLO", "quality",
              "dropped", "vs flat_marl: P99 / cost"):
        t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)

    def ci(r, k, scale=1.0, f="{:.1f}"):
        lo, hi = r[f"{k}_ci95"]
        v = f.format(r[k] * scale)
        return f"{v} [{f.format(lo * scale)}, {f.format(hi * scale)}]" if lo == lo else v

    for name, r in result.items():
        if name.startswith("_") or "latency_p99_s" not in r:
            continue
        vs = ""
        if "vs_flat_latency_p99_s_change" in r:
            a, (al, ah) = r["vs_flat_latency_p99_s_change"], r["vs_flat_latency_p99_s_change_ci95"]
            b, (bl, bh) = r["vs_flat_cost_usd_change"], r["vs_flat_cost_usd_change_ci95"]
            vs = f"{a:+.0%} [{al:+.0%}, {ah:+.0%}] / {b:+.1%} [{bl:+.1%}, {bh:+.1%}]"
        t.add_row(name, ci(r, "latency_p50_s", 1000, "{:.0f}"), ci(r, "latency_p99_s", 1000, "{:.0f}"),
                  f"{r['throughput_rps']:.2f}", ci(r, "gpu_util", 1, "{:.2f}"), ci(r, "cost_usd"),
                  f"{r['cost_per_mtok_usd']:.2f}", ci(r, "slo_attainment", 1, "{:.3f}"), f"{r['quality']:.3f}",
                  f"{r.get('dropped_share', 0.0):.1%}" + (" OVERLOADED" if name in over else ""), vs)
    t.add_row("paper: MARL baseline", "", "271", "", "", "", "", "", "", "", "")
    t.add_row("paper: Graph-MARL", "", "194", "", "0.869", "", "", "", "", "", "-28% / -17.7%")
    return t


def bench() -> dict:
    """Graph-actor inference time vs graph size (100 to 10,000 nodes), and environment epochs per second."""
    from fleetwise.envs.graph_marl import GraphMARLConfig, heuristic, make_env
    from fleetwise.learn.graph_marl import inference_time_vs_nodes

    scaling = inference_time_vs_nodes((100, 300, 1000, 3000, 10000))
    env = make_env(GraphMARLConfig())
    env.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 5.0:
        if not env.agents:
            env.reset(seed=n)
        env.step(heuristic("least_loaded", env.mc))
        n += 1
    return {"env_epochs_per_s": n / (time.perf_counter() - t0), "inference_vs_nodes": scaling}
