"""``fleetwise reproduce torta``: RL + optimal transport across regions with a switching-aware micro layer
(docs/torta.md).

Protocol, per topology: train K TORTA agents (temporal observation) and K reactive agents (current state only;
the ablation, named ``reactive_ppo`` whichever the learner), training seeds 0..K-1, on training days (first 70% of
the length traces and ServeGen days), with the CEM learner (``fleetwise.learn.torta_cem``, the default) or PPO
(``fleetwise.learn.torta``, the paper's; ``learner="ppo"``);
evaluate every policy on the same held-out days (one day per seed); report mean / P95 / P99 response time, load
CV, cost, switches and migrations (mean and 95% t interval over days, and over training seeds for the RL
policies), and TORTA's paired change against the best baseline per metric and against the reactive PPO.
Trained agents are saved under ``<results>/torta/checkpoints`` as the fleetwise checkpoint ``.npz`` +
``.card.json`` that ``fleetwise serve --checkpoint`` loads (evaluated here too), and for PPO also SB3's ``.zip``
(evaluated here: this run wrote it).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from fleetwise.reproduce.common import store_meta, store_rows
from fleetwise.workload.adapt import WARN_SHARE

PAPER = {"response_time": "-15% (up to)", "load_balance": "+4-5%", "cost": "-10% to -20%"}
METRICS = ("response_time_mean_s", "response_time_p95_s", "response_time_p99_s", "load_cv", "load_std",
           "cost_usd", "cost_gpu_usd", "cost_energy_usd", "cost_egress_usd", "switches", "migrations", "rejected")
BASELINES = ("round_robin", "nearest", "least_loaded", "least_loaded_pack_short", "ot_capacity", "reactive_ppo")
RULES = ("least_loaded", "least_loaded_pack_short")  # TORTA's paired change against each: changes.vs_<rule>
MAX_UNSERVED = 0.001  # a baseline counts as "best" only if it served all but 0.1% of the requests


def _budget(quick: bool) -> dict:
    """Test days, training seeds, and each learner's budget: PPO slots, CEM iterations x population x days."""
    if quick:
        return {"timesteps": 1920, "seeds": 5, "train_seeds": 1,
                "cem": {"iterations": 6, "population": 10, "train_days": 4}}
    return {"timesteps": 4800, "seeds": 8, "train_seeds": 3,
            "cem": {"iterations": 8, "population": 12, "train_days": 4}}


LEARNERS = ("cem", "ppo")  # cem: fleetwise.learn.torta_cem (the default); ppo: fleetwise.learn.torta (the paper's)


AGENTS = {"torta": True, "reactive_ppo": False}  # name -> temporal observation
# evaluated policy -> the trained agent it runs (the ablations reuse TORTA's agent)
USES_AGENT = {"torta": "torta", "torta_no_micro": "torta", "torta_match_micro": "torta", "reactive_ppo": "reactive_ppo"}
KEEP_DAY = ("torta", "nearest", "least_loaded")  # whose first day is drawn over the day


def _summ(rows: list[dict]) -> dict:
    from fleetwise.reproduce.common import pooled_rows, summarize_rows

    out = summarize_rows(pooled_rows(rows, METRICS), METRICS)  # (over days: a learned policy's training seeds
    # averaged on each, ``unit_means``)
    out["rejected_share"] = float(sum(r["rejected"] for r in rows) / max(1, sum(r["requests"] for r in rows)))
    # slots whose plan a trained planner's guard handed to the rule (ResidualPlanner.long_share_max)
    out["guarded_slot_share"] = float(sum(r.get("guarded_slots", 0) for r in rows)
                                      / max(1, sum(r.get("slots_planned", 0) for r in rows)))
    return out


def policies(models: dict) -> dict:
    """name -> (planner factory, micro allocator)."""
    from fleetwise.policies.planners import (
        LeastLoadedPlanner,
        NearestPlanner,
        PackShortPlanner,
        ResidualPlanner,
        RoundRobinPlanner,
        ot_capacity,
    )

    out = {"round_robin": (RoundRobinPlanner, "affinity_greedy"), "nearest": (NearestPlanner, "affinity_greedy"),
           "least_loaded": (LeastLoadedPlanner, "affinity_greedy"),
           "least_loaded_pack_short": (PackShortPlanner, "affinity_greedy"),
           "ot_capacity": (ot_capacity, "affinity_greedy")}
    if "reactive_ppo" in models:
        # the ablation differs from TORTA only in what its planner sees (no history, no time of day)
        out["reactive_ppo"] = (lambda cfg, m=models["reactive_ppo"]: ResidualPlanner(cfg, m, False),
                               "affinity_greedy")
    if "torta" in models:
        # TORTA: a residual on least_loaded + affinity_greedy (its action also sets the greedy micro's slack);
        # the ablations swap the micro allocator under the same macro policy
        out["torta"] = (lambda cfg, m=models["torta"]: ResidualPlanner(cfg, m, True), "affinity_greedy")
        out["torta_no_micro"] = (lambda cfg, m=models["torta"]: ResidualPlanner(cfg, m, True), "least_loaded_server")
        out["torta_match_micro"] = (lambda cfg, m=models["torta"]: ResidualPlanner(cfg, m, True), "torta_match")
    return out


def _train_cem(job: tuple) -> tuple:
    """Train one agent by CEM (``fleetwise.learn.torta_cem``) and save its fleetwise checkpoint (``path``, .npz);
    a checkpoint already there that the same job trained (its card's ``job_key``) is reused instead."""
    from fleetwise.learn.torta_cem import TortaCEMConfig, train_torta_cem
    from fleetwise.worlds.torta import TortaConfig

    topo, name, budget, seed, path = job
    cfg = replace(TortaConfig(topology=topo), temporal=AGENTS[name])
    res = train_torta_cem(cfg, TortaCEMConfig(seed=seed, **budget), out=path, policy_name=name, reuse=True)
    log = {k: res[k] for k in ("validation_curve", "lagrangian", "response_change_target", "gate", "best_step",
                               "days_simulated", "objective", "constraint_target")}
    obj = "response" if res["objective"] == "response" else "cost"
    log["curve_metric"] = f"minus_elite_{obj}_change_vs_least_loaded"
    log["reused"] = bool(res.get("reused"))
    curve = [(r["days_simulated"], -r[f"train_elite_{obj}_change"]) for r in res["curve"]]
    return topo, name, seed, res["checkpoint"], curve, round(float(res["wall_s"]), 1), log  # (as the card has it)


def _train_job(job: tuple) -> tuple:
    """Train one agent (a worker process or in-process) and save it; returns its learning curve. ``job``:
    ``(learner, topology, agent, budget, seed, path)``; the budget is PPO's slots or CEM's config fields."""
    if job[0] == "cem":
        return _train_cem(job[1:])
    from fleetwise.envs.torta import TortaConfig, TortaEnv
    from fleetwise.learn.export import export_sb3
    from fleetwise.learn.torta import TortaArgs, train
    from fleetwise.policies.planners import ResidualPlanner

    topo, name, steps, seed, path = job[1:]
    args = TortaArgs(total_timesteps=steps, seed=seed)
    cfg = replace(TortaConfig(topology=topo), temporal=AGENTS[name])
    model, curve, wall = train(lambda: TortaEnv(cfg), args, validation=True)
    log = model.fleetwise_log
    model.save(path)  # SB3's zip: evaluated below, in this run (it unpickles on load: never served)
    export_sb3(model, Path(path).with_suffix(".npz"), level="planner", policy=name, rule="least_loaded",
               training={"topology": topo, "timesteps": int(steps), "seed": int(seed), "wall_s": round(wall, 1),
                         "days": "training days (first 70% of the traces and ServeGen days)",
                         "warm_start": f"behaviour cloning, {args.bc_episodes} days of the rule; output layer zero",
                         **({"objective": "GPU + energy cost (paired with the rule, slot by slot)",
                             "constraint": "response time <= the rule's on the same day (Lagrangian)"}
                            if args.objective == "cost" else
                            {"objective": "response time", "constraint": "slot cost <= the rule's (Lagrangian, "
                             f"target {log.get('cost_target', float('nan')):.4f} of all-servers cost)"}),
                         "best_step": log.get("best_step"), "residual_extra": ResidualPlanner.EXTRA,
                         # the guard: a slot after one with more long requests than any training slot is planned
                         # by the rule (ResidualPlanner.long_share_max), as for the CEM learner's checkpoints
                         "long_share_max": log.get("long_share_max")},
               validation=log.get("gate"))
    return topo, name, seed, path, curve, wall, log


def _load_ppo(ckpt: str):
    """This run's PPO agent (SB3's zip, which unpickles on load: only files this run wrote, never served) with the
    model card of its export beside it, so that it plans with the guard it was gated with (``card``:
    ``ResidualPlanner`` reads ``training.long_share_max`` from it)."""
    from stable_baselines3 import PPO

    from fleetwise.control.checkpoint import card_path, read_card

    model = PPO.load(ckpt, device="cpu")
    side = card_path(Path(ckpt).with_suffix(".npz"))
    model.card = read_card(side) if side.exists() else None
    return model


def _eval_job(job: tuple) -> tuple:
    """Evaluate one policy (with one trained agent where it needs one) on the evaluation days."""
    from fleetwise.worlds.torta import TortaConfig, evaluate

    topo, name, ckpt, train_seed, eval_seeds, trace, keep_day, load = job
    models = {}
    if ckpt is not None and str(ckpt).endswith(".npz"):  # a fleetwise checkpoint (numpy; nothing unpickled)
        from fleetwise.policies.planners import load_torta_checkpoint

        models[USES_AGENT[name]] = load_torta_checkpoint(ckpt)[0]
    elif ckpt is not None:  # SB3's zip, written by this run's PPO training
        models[USES_AGENT[name]] = _load_ppo(ckpt)
    mk, micro = policies(models)[name]
    rows = evaluate(TortaConfig(topology=topo), mk, micro, eval_seeds, held_out=True, trace=trace, keep_day=keep_day,
                    load=load)
    for r in rows:
        if train_seed is not None:
            r["train_seed"] = train_seed
    return topo, name, train_seed, rows


def _gate_row(log: dict) -> dict:
    g = log.get("gate") or {}
    return {"passed": bool(g.get("passed", False)), "metric": g.get("metric"), "change": g.get("change"),
            "ci95": g.get("ci95"), "cost_change": g.get("cost_change"), "response_change": g.get("response_change"),
            "response_ci95": g.get("response_ci95"), "cost_ci95": g.get("cost_ci95"), "best_step": g.get("best_step")}


def _gate_text(g: dict) -> str:
    ci = g.get("ci95") or [math.nan, math.nan]
    if g.get("metric") == "cost_usd":
        rc = g.get("response_ci95") or [math.nan, math.nan]
        return (f": cost {g['change']:+.1%} [{ci[0]:+.1%}, {ci[1]:+.1%}], response time "
                f"{g['response_change']:+.1%} [{rc[0]:+.1%}, {rc[1]:+.1%}]")
    return f": response time {g['change']:+.1%} [{ci[0]:+.1%}, {ci[1]:+.1%}], cost {g['cost_change']:+.1%}"


def _changes(rows: dict, train_seeds: int) -> dict:
    """TORTA's paired changes (lower is better for each metric): against the best baseline per metric (among
    the baselines that left at most ``MAX_UNSERVED`` of the requests unserved), paired by day, a trained policy's
    value of a day being the mean of its training seeds' (``metrics.stats.unit_means``: rows of one day are not
    independent samples, so the interval is over days); against the reactive PPO too, plus the mean change of
    each training seed on its own."""
    from fleetwise.metrics.stats import paired_change
    from fleetwise.metrics.stats import unit_means

    def by_key(rs, m):
        return {(r.get("train_seed", 0), r["seed"]): r[m] for r in rs}

    out = {}
    ks = range(train_seeds)
    # a baseline that leaves requests unserved is cheap for that reason: no like-for-like best
    complete = [b for b in BASELINES if np.mean([r["rejected"] / max(r["requests"], 1) for r in rows[b]])
                <= MAX_UNSERVED]
    for metric in ("response_time_mean_s", "load_cv", "cost_usd"):
        best = min(complete or list(BASELINES), key=lambda b: np.mean([r[metric] for r in rows[b]]))
        ch = paired_change(unit_means(rows[best], metric), unit_means(rows["torta"], metric))
        # every baseline left requests unserved: the least bad one, named as such (no "best" on such a run)
        vs = best if complete else f"{best} (every baseline left > {MAX_UNSERVED:.1%} unserved: no best)"
        out[metric] = {"vs": vs, "change": ch.mean, "ci95": [ch.lo, ch.hi]}
    # against the rule TORTA's action adjusts (issue 17's acceptance), and the size-aware rule written from the same
    # residual by hand, paired by (training seed, day)
    for rule in RULES:
        out[f"vs_{rule}"] = {}
        for metric in ("response_time_mean_s", "load_cv", "cost_usd"):
            ch = paired_change(unit_means(rows[rule], metric), unit_means(rows["torta"], metric))
            out[f"vs_{rule}"][metric] = {"change": ch.mean, "ci95": [ch.lo, ch.hi]}
    m = "response_time_mean_s"
    ch = paired_change(unit_means(rows["reactive_ppo"], m), unit_means(rows["torta"], m))
    base, other = by_key(rows["reactive_ppo"], m), by_key(rows["torta"], m)
    per_seed = [paired_change({d: v for (k, d), v in base.items() if k == s},
                              {d: v for (k, d), v in other.items() if k == s}).mean for s in ks]
    out["vs_reactive_ppo_response_time"] = {"vs": "reactive_ppo", "change": ch.mean, "ci95": [ch.lo, ch.hi],
                                            "by_train_seed": per_seed}
    return out


def run(quick: bool = False, seeds: int | None = None, eval_trace: str | None = None, db: str | None = None,
        progress: bool = True, topologies=None, timesteps: int | None = None, train_seeds: int | None = None,
        workers: int | None = None, load: float | str = 0.7, learner: str = "cem", cem: dict | None = None,
        backend: str = "local", address: str | None = None) -> dict:
    """Train ``train_seeds`` agents of each kind per topology (seeds 0..K-1) with ``learner`` (``LEARNERS``; ``cem``
    overrides the budget's CEM fields, e.g. for tests), evaluate every policy on the same held-out days, and
    summarise. Training and evaluation jobs run on the sweep backends (``recipe.run_jobs``: ``workers`` local
    processes, or Ray tasks with ``backend="ray"``, ``address`` for a cluster, whose nodes must all see ``db``'s
    folder: checkpoints are written there). The RL policies' rows are one per (training seed, day), so their
    intervals include the spread between training runs."""
    from fleetwise.reproduce.common import check_run_args

    check_run_args({"topologies": None}, seeds=seeds, train_seeds=train_seeds, workers=workers,
                   eval_trace=eval_trace, db=db, load=load, topologies=topologies, timesteps=timesteps, cem=cem,
                   backend=backend, address=address)
    import os

    from fleetwise.learn.recipe import run_jobs
    from fleetwise.reproduce.common import fit_load as _fit_load
    from fleetwise.reproduce.common import out_dir as _out_dir
    from fleetwise.reproduce.common import progress as _progress
    from fleetwise.worlds.torta import TOPOLOGIES

    if learner not in LEARNERS:
        from fleetwise.errors import InputError

        raise InputError(f"--learner {learner!r}: expected one of {', '.join(LEARNERS)}")
    bud = _budget(quick)
    n_seeds = seeds or bud["seeds"]
    steps = timesteps or bud["timesteps"]
    n_train = train_seeds or bud["train_seeds"]
    nw = workers or len(os.sched_getaffinity(0))
    trace = None
    tag = ""
    fit_load = _fit_load(load)
    console, bars = _progress(progress, counts=True)
    eval_seeds = list(range(1000, 1000 + n_seeds))
    topos = list(topologies or TOPOLOGIES)
    fit_lines: list[str] = []
    if eval_trace is not None:
        from fleetwise.worlds.torta import (
            MEAN_TOKENS,
            SERVICE_EFFICIENCY,
            TortaConfig,
            build_replicas,
            make_fleet,
            torta_workload,
        )
        from fleetwise.workload.spec import load_trace

        trace = load_trace(eval_trace)
        tag = f":{Path(eval_trace).name}@{load}"
        fit_lines.append(f"--eval-trace {eval_trace}: replaces the held-out days' arrivals and lengths; each seed "
                         f"draws its own window of the trace for its day")
        for t in topos:  # what the first evaluation day of each topology replays
            cfg_t = TortaConfig(topology=t)
            fleet = make_fleet(cfg_t)
            _, srv = build_replicas(cfg_t, fleet)
            reps: list = []
            for s in eval_seeds:  # every evaluation day fitted now, before any training (a later one could fail)
                torta_workload(cfg_t, fleet, float(srv.region_speed.sum() / MEAN_TOKENS * SERVICE_EFFICIENCY),
                               np.random.default_rng(s), True, trace, fit_load, report=reps)
            fit_lines += [f"{t}, seed {eval_seeds[0]}: {ln}" for ln in reps[0].lines()]
    out_dir = _out_dir(db, "torta")
    ckpt_dir = out_dir / "checkpoints"
    ckpt_dir.mkdir(exist_ok=True)
    ckpts: dict = {}
    info: dict = {}
    logs: dict = {}
    with bars as prog:
        if learner == "cem":
            cem_budget = bud["cem"] | (cem or {})
            train_jobs = [("cem", t, name, cem_budget, k, str(ckpt_dir / f"{t}-{name}-seed{k}.npz"))
                          for t in topos for name in AGENTS for k in range(n_train)]
            what = (f"CEM, {cem_budget['iterations']} iterations x {cem_budget['population']} candidates x "
                    f"{cem_budget['train_days']} days each")
        else:
            train_jobs = [("ppo", t, name, steps, k, str(ckpt_dir / f"{t}-{name}-seed{k}.zip"))
                          for t in topos for name in AGENTS for k in range(n_train)]
            what = f"PPO, {steps} slots each"
        task = prog.add_task(f"training {len(train_jobs)} agents ({what})", total=len(train_jobs))

        def trained(res):
            topo, name, k, path, curve, wall, log = res
            ckpts[(topo, name, k)] = path
            info.setdefault((topo, name), {})[k] = wall
            logs[(topo, name, k)] = log
            if db:
                from fleetwise.experiments.store import Store

                key = f"torta/{topo}/{name}" + (f"/seed{k}" if k else "")
                st = Store(db)
                st.add_learning_curve(key, [s for s, _ in curve], [r for _, r in curve],
                                      log.get("curve_metric", "episode_return"))
                vc = log.get("validation_curve") or []
                if vc:
                    st.add_learning_curve(key + "/validation", [s for s, _ in vc], [v for _, v in vc],
                                          "minus_change_vs_least_loaded")
                lg = log.get("lagrangian") or []
                if lg:
                    st.add_learning_curve(key + "/lambda", [h[0] for h in lg], [h[1] for h in lg], "lagrange_multiplier")
            prog.advance(task)

        run_jobs(_train_job, train_jobs, backend=backend, workers=nw, address=address, on_result=trained)
        # (a CEM job whose checkpoint this very job trained before, e.g. for the same budget on another
        # --eval-trace, reuses it: same world, agent, budget and seed, its card's job_key)
        reused = {k for k, log in logs.items() if log.get("reused")}
        if progress:
            if reused:
                console.print(f"reused {len(reused)} of the {len(train_jobs)} agents already trained in {ckpt_dir} "
                              "(the same world, budget and seed; delete them to train again)", markup=False)
            for (topo, name), walls in info.items():
                new = [w for k, w in walls.items() if (topo, name, k) not in reused]
                if new:
                    console.print(f"[{topo}] trained {len(new)} x {name} ({what}) in {np.mean(new):.1f} s each",
                                  markup=False)
        eval_jobs = []
        for t in topos:
            for name in policies(dict.fromkeys(AGENTS)):
                if name in USES_AGENT:
                    eval_jobs += [(t, name, ckpts[(t, USES_AGENT[name], k)], k, eval_seeds, trace,
                                   name in KEEP_DAY and k == 0, fit_load) for k in range(n_train)]
                else:
                    eval_jobs.append((t, name, None, None, eval_seeds, trace, name in KEEP_DAY, fit_load))
        task = prog.add_task(f"evaluating {len(eval_jobs)} policy runs x {n_seeds} days", total=len(eval_jobs))
        rows: dict = {t: {} for t in topos}

        def evaluated(res):
            topo, name, _, rs = res
            rows[topo].setdefault(name, []).extend(rs)
            prog.advance(task)

        run_jobs(_eval_job, eval_jobs, backend=backend, workers=nw, address=address, on_result=evaluated)
    result: dict = {}
    extras: dict = {}
    for topo in topos:
        rs_t = rows[topo]
        for name in rs_t:
            rs_t[name].sort(key=lambda r: (r.get("train_seed", 0), r["seed"]))
        res = {}
        for name, rs in rs_t.items():
            res[name] = _summ(rs)
            if name in USES_AGENT:
                res[name]["train_seeds"] = n_train
                res[name]["response_time_mean_s_by_train_seed"] = [
                    float(np.mean([r["response_time_mean_s"] for r in rs if r["train_seed"] == k]))
                    for k in range(n_train)]
            for k in sorted({r.get("train_seed") for r in rs}, key=lambda x: -1 if x is None else x):
                params = {"topology": topo} | ({} if k is None else {"train_seed": k})
                store_rows(db, "reproduce-torta", f"torta-{topo}{tag}", name,
                           [{c: v for c, v in r.items() if c not in ("slots", "plans")} for r in rs
                            if r.get("train_seed") == k], level="planner", params=params)
        for name in AGENTS:
            walls = list(info.get((topo, name), {}).values()) or [float("nan")]
            res[name].update({"train_wall_s": float(np.mean(walls)), "learner": learner,
                              "reused_checkpoints": sum((topo, name, k) in reused for k in range(n_train))})
            if learner == "cem":
                res[name]["train_days_simulated"] = logs.get((topo, name, 0), {}).get("days_simulated")
                res[name]["objective"] = logs.get((topo, name, 0), {}).get("objective")
            else:
                res[name]["train_timesteps"] = steps
            # the deployment gate of each checkpoint (validation days, against least_loaded, paired by day)
            res[name]["gate"] = [_gate_row(logs.get((topo, name, k), {})) for k in range(n_train)]
            res[name]["validation_curve"] = [logs.get((topo, name, k), {}).get("validation_curve", [])
                                             for k in range(n_train)]
        res["torta"]["changes"] = _changes(rs_t, n_train)
        result[topo] = res
        extras[topo] = {n: next(r for r in rs_t[n] if "slots" in r) for n in KEEP_DAY}
    store_meta(db, "reproduce-torta", baseline="least_loaded", level="planner",
               metrics=("response_time_mean_s", "response_time_p99_s", "load_cv", "cost_usd", "switches", "rejected"))
    _plots(result, extras, out_dir)
    learning_plot(result, out_dir)
    if eval_trace is not None:
        result["_trace_fit"] = fit_lines
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    if progress:
        console.print(f"checkpoints: {ckpt_dir} (serve one with `fleetwise serve --checkpoint-dir {ckpt_dir} "
                      "--checkpoint NAME.npz`)", markup=False)
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


def learning_plot(result: dict, out_dir: Path) -> Path:
    """``learning-curves.png``: per topology, each agent's validation score after each update (PPO) or iteration
    (CEM), one line per training seed; 0 is the rule (the warm start), higher is better."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    topos = [t for t in result if not t.startswith("_")]
    fig = Figure(figsize=(4.2 * len(topos), 3.4), dpi=100)
    FigureCanvasAgg(fig)
    for k, topo in enumerate(topos):
        ax = fig.add_subplot(1, len(topos), k + 1)
        for name, style in zip(AGENTS, ("-", "--")):
            for seed, curve in enumerate(result[topo].get(name, {}).get("validation_curve") or []):
                if curve:
                    ax.plot([c[0] for c in curve], [c[1] for c in curve], style, marker=".",
                            label=f"{name} seed {seed}")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_title(topo)
        ax.set_xlabel("iteration (CEM) or slots (PPO)")
        ax.set_ylabel("validation score vs least_loaded")
        ax.legend(fontsize=6)
    fig.tight_layout()
    out = Path(out_dir) / "learning-curves.png"
    fig.savefig(out)
    return out


def render(result: dict):
    from rich.console import Group
    from rich.table import Table

    tables = []
    for topo, res in result.items():
        if topo.startswith("_"):
            continue
        t = Table(title=f"TORTA on {topo} (held-out days): mean [95% CI] over seeds; paper: response time "
                        f"{PAPER['response_time']}, load balance {PAPER['load_balance']}, cost {PAPER['cost']}")
        for c in ("policy", "resp mean s", "resp p99 s", "load CV", "cost USD", "switches", "migrations", "rejected"):
            t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)

        def ci(r, k, f="{:.2f}"):
            lo, hi = r[f"{k}_ci95"]
            return f"{f.format(r[k])} [{f.format(lo)}, {f.format(hi)}]" if lo == lo else f.format(r[k])

        for name, r in res.items():
            share = r.get("rejected_share", 0.0)
            t.add_row(name, ci(r, "response_time_mean_s"), ci(r, "response_time_p99_s"), ci(r, "load_cv", "{:.3f}"),
                      ci(r, "cost_usd", "{:.3f}"), f"{r['switches']:.0f}", f"{r['migrations']:.0f}",
                      f"{r['rejected']:.0f}" + (f" ({share:.1%}) OVERLOADED" if share > WARN_SHARE else ""))
        tables.append(t)
        lines = Table(title=f"{topo}: TORTA, paired change by (training seed, day)")
        for c in ("metric", "vs", "change [95% CI]"):
            lines.add_column(c)
        for m, ch in res["torta"]["changes"].items():
            if m.startswith("vs_") and m[3:] in RULES:
                label = "least_loaded (the rule)" if m == "vs_least_loaded" else m[3:]
                for mm, c2 in ch.items():
                    lo, hi = c2["ci95"]
                    lines.add_row(mm, label, f"{c2['change']:+.1%} [{lo:+.1%}, {hi:+.1%}]")
                continue
            lo, hi = ch["ci95"]
            txt = f"{ch['change']:+.1%} [{lo:+.1%}, {hi:+.1%}]"
            if ch.get("by_train_seed"):
                txt += "; by training seed " + ", ".join(f"{x:+.1%}" for x in ch["by_train_seed"])
            lines.add_row(m, ch["vs"], txt)
        gs = res["torta"].get("guarded_slot_share")
        if gs:  # (the guard: slots after one with more long requests than any training slot, by the rule)
            lines.add_row("slots planned by the rule (the guard)", "", f"{gs:.1%}")
        for g in res["torta"].get("gate", []):
            lines.add_row("gate (validation days)", "least_loaded",
                          ("PASSED" if g["passed"] else "NOT PASSED") + (_gate_text(g) if g.get("change") is not None
                                                                         else ""))
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
