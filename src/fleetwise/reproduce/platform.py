"""``fleetwise reproduce platform``: autoscaling policies on a day of bursty multi-tenant load with a zone
outage, a degraded link, a GPU failure and spot preemptions from real traces (docs/platform.md).

Protocol: the built-in scenario ``platform`` (ServeGen day 1, Azure lengths, two AWS regions, on-demand and spot
pools). Every scaler runs the same day with the same seeds (a seed draws the arrivals inside ServeGen's
10-minute windows and the simulator's randomness); the RL scaler is trained on other ServeGen days (2-6; chosen
and gated on 7-10) and evaluated on day 1. Reported per scaler: SLO attainment, cost per million tokens, scaling
oscillations (a group's target reversing direction), requests lost (must be 0), P99 TTFT, mean and 95% CI over
seeds, and the paired change against the HPA-like scaler; plus the best scaler with its spot pools replaced by on-demand ones
(what spot saves). ``--quick`` evaluates the first 12 hours of the day (the calm night, then the zone outage at
10:00; with ``--eval-trace`` the 2 hours around the outage, 09:30-11:30) and trains the RL scaler less.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.learn.scaler_cem import CEM_BUDGETS, TRAIN_DAYS, VAL_DAYS
from fleetwise.platform.windows import DAY, windowed, with_trace  # noqa: F401  (re-exported)

METRICS = ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests", "ttft_p99_s", "ttft_mean_s",
           "e2e_mean_s", "cost_usd", "replica_hours", "spot_preemptions", "retried_requests", "recovery_s_max",
           "scale_events", "rejected_unconfigured", "faults")
# the scalers compared; hpa follows Kubernetes' HPA on GPU utilisation (DCGM_FI_DEV_GPU_UTIL), its usual setup
SCALERS: dict[str, tuple[str, dict]] = {
    "static": ("static", {}),
    "hpa": ("hpa", {"metric": "busy", "target": 0.7}),
    "hpa_kv": ("hpa", {"metric": "kv", "target": 0.7}),
    "slo_aware": ("slo_aware", {}),
    "predictive": ("predictive", {}),
}
PAPERS = {
    "aibrix": "AIBrix vs HPA: -11.5% latency, 33% fewer oscillations",
    "skyserve": "SkyServe: -43% cost with spot vs all on-demand",
}


def _budget(quick: bool) -> dict:
    # rl: the RL scaler's CEM budget (fleetwise.learn.scaler_cem.CEM_BUDGETS). window: the part of the test day
    # evaluated; trace_window: the same with --eval-trace, where a real trace fitted to a load of the fleet is far
    # denser than the scenario's arrivals (the whole day at load 0.7: 1.4 M requests a run). --quick evaluates the
    # first half of the day, from the calm night through the 10:00 zone outage: the RL scaler saves where a model
    # stays calm for an hour, which two busy hours never show (docs/autoscaling-log.md, "A quick window with calm
    # hours")
    if quick:
        return {"seeds": 5, "window": (0.0, DAY / 2), "trace_window": (9.5 * 3600.0, 11.5 * 3600.0),
                "rl": CEM_BUDGETS["quick"]}
    return {"seeds": 5, "window": (0.0, DAY), "trace_window": (0.0, DAY), "rl": CEM_BUDGETS["full"]}


def on_demand_only(data: dict) -> dict:
    """The same scenario with every spot pool turned into an on-demand one."""
    d = json.loads(json.dumps(data))
    for dep in d["deployments"]:
        if dep.get("pool") == "spot":
            dep["pool"] = "on_demand"
            dep.pop("spot_trace", None)
            dep.pop("spot_offset_s", None)
    return d


def _one(args) -> dict:
    """One evaluation run (in a worker process)."""
    data, seed, label, scaler, params, workload = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.run import run_platform
    from fleetwise.scenario import parse_scenario

    sc = parse_scenario(data, where="platform scenario")
    t0 = time.perf_counter()
    p = run_platform(sc, seed, scaler={"name": scaler, **params}, workload=workload, monitor=seed == 0)
    s = p.summary
    row = {k: float(s.get(k, math.nan)) for k in METRICS}
    row.update(seed=seed, requests=len(p.records), wall_s=time.perf_counter() - t0, label=label)
    if seed == 0:
        row["_monitor"] = p.monitor.table() if p.monitor is not None else None
        row["_events"] = p.events
        row["_cost"] = p.cost_breakdown()
        row["_faults"] = [{"t": f.time_s, "kind": f.kind, "target": f.target, "replicas": f.replicas,
                           "requests": f.requests, "recovered_s": f.recovered_s} for f in p.faults]
    return row


def _workloads(data: dict, seeds: list[int]) -> tuple[dict[int, Any], dict[int, list[str]]]:
    """Per seed the workload and the lines of its trace fit (empty without a trace)."""
    from fleetwise.scenario import build, parse_scenario

    sc = parse_scenario(data, where="platform scenario")
    out, fits = {}, {}
    for s in seeds:
        b = build(sc, s)
        out[s] = b.workload
        fits[s] = [ln for r in b.adaptations for ln in r.lines()]
    return out, fits


def run(quick: bool = False, seeds: int | None = None, eval_trace: str | None = None, db: str | None = None,
        progress: bool = True, scalers: list[str] | None = None, workers: int | None = None,
        load: float | str = 0.7, window: tuple[float, float] | None = None,
        rl_checkpoint: str | None = None) -> dict:
    """``window``: (start, end) seconds of the day to evaluate (default: the budget's; tests use a short one);
    ``load``: with ``eval_trace``, the trace's rate as a fraction of the fleet's capacity, or "real";
    ``rl_checkpoint``: evaluate this RL scaler checkpoint (``NAME.npz`` + ``NAME.card.json``) instead of training
    one; its gate is its model card's."""
    from fleetwise.reproduce.common import check_run_args

    check_run_args({"scalers": (*SCALERS, "rl")}, seeds=seeds, workers=workers, eval_trace=eval_trace, db=db,
                   load=load, scalers=scalers, window=window, rl_checkpoint=rl_checkpoint)
    from fleetwise.execution import run_tasks
    from fleetwise.metrics.stats import paired_change
    from fleetwise.reproduce.common import out_dir as _out_dir
    from fleetwise.reproduce.common import progress as _progress
    from fleetwise.reproduce.common import store_meta, store_rows, summarize_rows
    from fleetwise.scenario import SCENARIO_DIR, read_yaml

    bud = _budget(quick)
    n_seeds = seeds or bud["seeds"]
    eval_seeds = list(range(n_seeds))
    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    ws, we = window or bud["trace_window" if eval_trace is not None else "window"]
    data = windowed(base, ws, we, day=0)
    scen_name = "platform" + (f"[{ws / 3600:g}h-{we / 3600:g}h]" if (ws, we) != (0.0, DAY) else "")
    fit_lines: list[str] = []
    if eval_trace is not None:
        data, fit_lines = with_trace(base, eval_trace, load, ws, we)
        scen_name = f"platform:{Path(eval_trace).name}@{load}" + (f"[{ws / 3600:g}h-{we / 3600:g}h]"
                                                                   if (ws, we) != (0.0, DAY) else "")
        _workloads(data, eval_seeds[:1])  # a bad trace fails here, before any training
    names = list(scalers or SCALERS)
    want_rl = "rl" in names or scalers is None
    given = _given_rl(rl_checkpoint) if rl_checkpoint is not None and want_rl else None  # (checked before any run)
    out_dir = _out_dir(db, "platform")
    console, bars = _progress(progress)
    result: dict = {}
    with bars as prog:
        jobs = {n: SCALERS[n] for n in names if n in SCALERS}
        gates: dict[str, dict] = {}
        if want_rl:
            ckpt, validation = given or _train_rl(base, bud, out_dir, prog, workers)
            jobs["rl"] = ("rl", {"checkpoint": str(ckpt)})
            gates["rl"] = {"checkpoint": str(ckpt), "passed": bool((validation or {}).get("passed")),
                           "validation": validation, "trained": given is None}
        t = prog.add_task("building workloads", total=None)
        wls, fits = _workloads(data, eval_seeds)
        prog.remove_task(t)
        if eval_trace is not None:
            fit_lines += [f"seed {eval_seeds[0]}: {ln}" for ln in fits[eval_seeds[0]]]
        tasks = [(data, s, n, sc, params, wls[s]) for n, (sc, params) in jobs.items() for s in eval_seeds]
        task = prog.add_task(f"{len(jobs)} scalers x {n_seeds} seeds", total=len(tasks) + n_seeds)
        rows: dict[str, list[dict]] = {n: [] for n in jobs}
        nw = workers or min(len(tasks), max(1, os.cpu_count() or 1))

        def collect(r: dict) -> None:
            rows[r["label"]].append(r)
            prog.advance(task)

        # one worker runs in this process; more are spawned, not forked (this process may hold torch's or DuckDB's
        # threads, and a fork of it can crash or hang)
        run_tasks(_one, tasks, workers=nw, on_result=collect, spawn=True)
        # the best scaler without spot: what the spot pools save
        best = _best(rows) or _least_overloaded(rows)
        od = on_demand_only(data)
        od_label = f"{best}+on_demand_only"
        rows[od_label] = []
        sc, params = jobs[best]
        run_tasks(_one, [(od, s, od_label, sc, params, wls[s]) for s in eval_seeds], workers=nw, on_result=collect,
                  spawn=True)
    for name, rs in rows.items():
        rs.sort(key=lambda r: r["seed"])
        result[name] = summarize_rows(rs, METRICS)
        result[name]["requests"] = int(np.mean([r["requests"] for r in rs]))
        store_rows(db, "reproduce-platform", scen_name, name, [{k: v for k, v in r.items() if not k.startswith("_")}
                                                              for r in rs], level="scaler")
    if "slo_aware" in rows:  # the rule the RL scaler corrects
        store_meta(db, "reproduce-platform", baseline="slo_aware", level="scaler",
                   metrics=("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests"))
    ref = "hpa" if "hpa" in rows else None
    for name, rs in rows.items():
        if ref is None or name == ref:
            continue
        for k in ("cost_per_mtok_usd", "ttft_mean_s", "e2e_mean_s", "oscillations"):
            ch = paired_change({r["seed"]: r[k] for r in rows[ref]}, {r["seed"]: r[k] for r in rs})
            result[name][f"vs_hpa_{k}_change"] = ch.mean
            result[name][f"vs_hpa_{k}_change_ci95"] = [ch.lo, ch.hi]
        d = [b["slo_attainment"] - a["slo_attainment"] for a, b in zip(rows[ref], rs)]
        from fleetwise.metrics.stats import mean_ci

        ci = mean_ci(d)
        result[name]["vs_hpa_slo_attainment_diff"] = ci.mean
        result[name]["vs_hpa_slo_attainment_diff_ci95"] = [ci.lo, ci.hi]
    if "rl" in rows and "slo_aware" in rows:  # the learned scaler against the rule it contains, paired by seed
        from fleetwise.metrics.stats import mean_ci

        for k in ("cost_per_mtok_usd", "oscillations"):
            ch = paired_change({r["seed"]: r[k] for r in rows["slo_aware"]}, {r["seed"]: r[k] for r in rows["rl"]})
            result["rl"][f"vs_slo_aware_{k}_change"] = ch.mean
            result["rl"][f"vs_slo_aware_{k}_change_ci95"] = [ch.lo, ch.hi]
        ci = mean_ci([b["slo_attainment"] - a["slo_attainment"] for a, b in zip(rows["slo_aware"], rows["rl"])])
        result["rl"]["vs_slo_aware_slo_attainment_diff"] = ci.mean
        result["rl"]["vs_slo_aware_slo_attainment_diff_ci95"] = [ci.lo, ci.hi]
    named = _best({k: v for k, v in rows.items() if "+" not in k})
    spot_ref = named or _least_overloaded({k: v for k, v in rows.items() if "+" not in k})
    od_label = f"{spot_ref}+on_demand_only"
    if od_label in rows:
        ch = paired_change({r["seed"]: r["cost_usd"] for r in rows[od_label]},
                           {r["seed"]: r["cost_usd"] for r in rows[spot_ref]})
        result[spot_ref]["spot_vs_on_demand_cost_change"] = ch.mean
        result[spot_ref]["spot_vs_on_demand_cost_change_ci95"] = [ch.lo, ch.hi]
    overloaded = sorted(n for n, rs in rows.items() if _overloaded(rs))
    for name, g in gates.items():
        if name in result:
            result[name]["gate_passed"] = g["passed"]
    result["_meta"] = {"gates": gates, "scenario": scen_name, "best": named, "seeds": n_seeds, "papers": PAPERS,
                       "overloaded": overloaded, "load": load if eval_trace is not None else None,
                       "faults": rows[spot_ref][0].get("_faults"), "cost_breakdown": rows[spot_ref][0].get("_cost")}
    best = spot_ref
    if eval_trace is not None:
        result["_trace_fit"] = fit_lines
    _plots(rows, result, best, out_dir)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1, default=float))
    return result


def _overloaded(rs: list[dict]) -> bool:
    """More than 1% of the requests rejected for reasons no setting asked for (context, KV, queue, horizon)."""
    from fleetwise.workload.adapt import WARN_SHARE

    n = sum(r.get("requests", 0) for r in rs)
    return n > 0 and sum(r.get("rejected_unconfigured", 0.0) for r in rs) > WARN_SHARE * n


def _least_overloaded(rows: dict[str, list[dict]]) -> str:
    return min(rows, key=lambda n: sum(r.get("rejected_unconfigured", 0.0) for r in rows[n]))


def _best(rows: dict[str, list[dict]]) -> str | None:
    """The cheapest scaler (cost per million tokens) among those whose SLO attainment is at least the HPA's
    (or, with no HPA, the highest attainment). Overloaded runs (``_overloaded``) are never best: None when
    every scaler's run was."""
    mean = {n: (float(np.mean([r["slo_attainment"] for r in rs])), float(np.mean([r["cost_per_mtok_usd"] for r in rs])))
            for n, rs in rows.items() if rs and not _overloaded(rs)}
    if not mean:
        return None
    if "hpa" in mean:
        floor = mean["hpa"][0]
        ok = [n for n, (a, _) in mean.items() if a >= floor - 1e-12]
        return min(ok, key=lambda n: mean[n][1])
    return max(mean, key=lambda n: (mean[n][0], -mean[n][1]))




def _given_rl(path: str) -> tuple[Path, dict | None]:
    """A trained RL scaler checkpoint to evaluate: loaded and checked here, before any run, as the scaler loads it
    (one line for a file that is missing, not a checkpoint, or not an RL scaler); (its path, its card's gate)."""
    from fleetwise.policies import make

    sc = make("scaler", "rl", {"checkpoint": str(path)}, where="--rl-checkpoint: ")
    card = sc.model.card
    return Path(sc.checkpoint), (card.validation if card is not None else None)


def _train_rl(base: dict, bud: dict, out_dir: Path, prog, workers: int | None = None) -> tuple[Path, dict | None]:
    """Train the RL scaler (the model-level correction of slo_aware, by CEM: fleetwise.learn.scaler_cem) on windows
    of ServeGen days 2-6, choose its parameters and gate it on windows of days 7-10 (never the evaluation day);
    (checkpoint, the gate's result). numpy only: no extra needed."""
    from fleetwise.learn.scaler_cem import ScalerCEMConfig, train_scaler_cem

    cfg = ScalerCEMConfig(train_days=list(TRAIN_DAYS), val_days=list(VAL_DAYS), **bud["rl"])
    task = prog.add_task("training the RL scaler (CEM)", total=cfg.iterations * cfg.searches)
    res = train_scaler_cem(base, cfg, out_dir / "rl_scaler", workers=workers,
                           progress=lambda it, row: prog.update(task, completed=it))
    (out_dir / "rl_scaler.curve.json").write_text(json.dumps(
        {"validation": res["gate"]} | {k: res[k] for k in ("curve", "best_iteration", "best_search", "kept", "params",
                                                          "config", "wall_s")},
        default=float))
    return Path(res["checkpoint"]), res["gate"]


def _plots(rows: dict, result: dict, best: str, out_dir: Path) -> None:
    from fleetwise.platform.monitor import Monitor, plot_monitor, plot_pareto

    pts = []
    for n, r in result.items():
        if n.startswith("_"):
            continue
        pts.append((n, r["cost_per_mtok_usd"], r["slo_attainment"], r["cost_per_mtok_usd_ci95"],
                    r["slo_attainment_ci95"]))
    plot_pareto(pts, out_dir / "pareto-cost-vs-slo.png")
    for n in {best, "hpa"} & set(rows):
        r0 = rows[n][0]
        if r0.get("_monitor") is not None:
            mon = Monitor.from_table(r0["_monitor"])
            plot_monitor(mon, out_dir / f"monitor-{n}.png", title=f"{n}: replicas, queues, KV, cost (seed 0)",
                         events=r0.get("_events"))
            if n == best:
                mon.to_prometheus(out_dir / f"monitor-{n}.prom")
                try:
                    mon.to_parquet(out_dir / f"monitor-{n}.parquet")
                except Exception:  # pyarrow (the parquet extra) missing: the plot and the text export remain
                    pass


def render(result: dict):
    from rich.table import Table

    meta = result.get("_meta", {})
    over = meta.get("overloaded") or []
    best_s = meta.get("best") or "none (every run overloaded)"
    t = Table(title=f"Autoscaling on {meta.get('scenario', 'platform')}: mean [95% CI] over {meta.get('seeds')} "
                    f"seeds; best = {best_s}" + (f"; overloaded (> 1% rejected, never best): {', '.join(over)}"
                                                  if over else ""))
    for c in ("scaler", "SLO attainment", "$/M tokens", "oscillations", "lost", "unconfigured rejections",
              "TTFT p99 s", "vs HPA: $/Mtok", "vs HPA: latency", "vs HPA: oscillations", "gate passed"):
        t.add_column(c, justify="left" if c == "scaler" else "right", no_wrap=True)

    def ci(r, k, f="{:.3f}"):
        lo, hi = r[f"{k}_ci95"]
        return f"{f.format(r[k])} [{f.format(lo)}, {f.format(hi)}]" if lo == lo else f.format(r[k])

    def ch(r, k):
        if f"vs_hpa_{k}_change" not in r:
            return ""
        lo, hi = r[f"vs_hpa_{k}_change_ci95"]
        return f"{r[f'vs_hpa_{k}_change']:+.1%} [{lo:+.1%}, {hi:+.1%}]"

    for name, r in result.items():
        if name.startswith("_"):
            continue
        rej = r.get("rejected_unconfigured")
        rej_s = "-" if rej is None else f"{rej:.0f}" + (" OVERLOADED" if name in over else "")
        t.add_row(name, ci(r, "slo_attainment"), ci(r, "cost_per_mtok_usd", "{:.2f}"), ci(r, "oscillations", "{:.1f}"),
                  f"{r['lost_requests']:.0f}", rej_s, ci(r, "ttft_p99_s", "{:.2f}"), ch(r, "cost_per_mtok_usd"),
                  ch(r, "e2e_mean_s"), ch(r, "oscillations"),
                  "" if "gate_passed" not in r else ("yes" if r["gate_passed"] else "no"))
    notes = []
    for name, g in (meta.get("gates") or {}).items():
        v = g.get("validation") or {}
        ci = v.get("ci95") or [None, None]
        fmt = (lambda x: "n/a" if x is None else f"{x:+.1%}")
        verdict = "passed" if g["passed"] else "NOT passed"
        given = ", given by --rl-checkpoint, not trained here" if g.get("trained") is False else ""
        notes.append(f"checkpoint {Path(g['checkpoint']).name} ({name}{given}): gate {verdict}"
                     f" on validation windows (cost vs {v.get('rule', 'its rule')} {fmt(v.get('change'))} "
                     f"[{fmt(ci[0])}, {fmt(ci[1])}]); `fleetwise serve` refuses a checkpoint that did not pass "
                     "unless --force")
    rl = result.get("rl") or {}
    if "vs_slo_aware_cost_per_mtok_usd_change" in rl:
        c, (clo, chi) = rl["vs_slo_aware_cost_per_mtok_usd_change"], rl["vs_slo_aware_cost_per_mtok_usd_change_ci95"]
        a, (alo, ahi) = rl["vs_slo_aware_slo_attainment_diff"], rl["vs_slo_aware_slo_attainment_diff_ci95"]
        notes.append(f"rl vs slo_aware (paired by seed): $/Mtok {c:+.1%} [{clo:+.1%}, {chi:+.1%}], SLO attainment "
                     f"{a * 100:+.2f} points [{alo * 100:+.2f}, {ahi * 100:+.2f}]")
    best = meta.get("best") or next((n for n in result if "spot_vs_on_demand_cost_change" in result.get(n, {})), None)
    if notes:
        t.caption = "; ".join(notes)
    if best and "spot_vs_on_demand_cost_change" in result.get(best, {}):
        r = result[best]
        lo, hi = r["spot_vs_on_demand_cost_change_ci95"]
        spot = (f"{best} with spot vs the same scaler all on-demand: cost {r['spot_vs_on_demand_cost_change']:+.1%} "
                f"[{lo:+.1%}, {hi:+.1%}] (SkyServe reports -43%); AIBrix reports -11.5% latency and 33% fewer "
                f"oscillations vs HPA")
        t.caption = f"{t.caption}\n{spot}" if notes else spot
    return t


def bench() -> dict:
    """Platform simulation speed: one hour of the platform scenario with the slo_aware scaler."""
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    sc = parse_scenario(windowed(base, 9 * 3600.0, 10 * 3600.0))
    t0 = time.perf_counter()
    p = run_platform(sc, 0, scaler="slo_aware", monitor=False)
    wall = time.perf_counter() - t0
    return {"requests": len(p.records), "wall_s": wall, "requests_per_s": len(p.records) / wall,
            "events": p.sim.events}
