"""``fleetwise reproduce batching``: DISPPO vs batching baselines at edge nodes (docs/batching.md).

Protocol (the shared recipe, ``fleetwise.learn.recipe``): DISPPO's action adjusts the best rule,
``offload_greedy`` (chunked prefill + offloading from the slowest node; the zero action is the rule). Each variant
(DISPPO with its time-aware discount, and the ablation with a per-step discount) is warm-started at the rule by
behaviour cloning and trained by PPO on a distribution of segments (the paper's mix at several rates, and single
traces fitted to the edge at several loads) drawn from the first 60% of each trace's time span, with the TTFT
deadline attainment as a constraint (a Lagrange multiplier); the checkpoint is chosen on validation segments (60-70%)
and gated against the rule there (``recipe.gate``, written into its model card). Every policy is then evaluated
on the same held-out segments (the last 30%), one per seed: requests completed within their deadline per
second (the paper's objective), goodput, TTFT/E2E P99 (mean and 95% t interval over seeds), the paired change of
each learned policy against the best baseline, and a sweep across batch-size limits. Training jobs (variants x
training seeds) run on the sweep backends (``recipe.run_jobs``).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from fleetwise.workload.adapt import WARN_SHARE
from fleetwise.worlds.edge import RULE

BASELINES = {
    "static": ("static", {"max_batch": 8}),
    "vllm": ("vllm", {"max_num_seqs": 32}),
    "decode_first": ("decode_first", {"max_num_seqs": 32}),
    "sarathi": ("sarathi", {"chunk_tokens": 512, "max_num_seqs": 32}),
    "offload_greedy": ("offload_greedy", {}),  # the edge world's rule (it reads the neighbours): worlds.edge
}
VARIANTS = {"disppo": True, "ppo_no_tau": False}  # name -> time-aware discount
PAPER_NOTE = "the paper's abstract gives no figures; it reports DISPPO ahead of traditional methods"
BATCH_SIZES = (1, 2, 4, 8, 16, 32)


LEARNERS = ("cem", "ppo")  # cem: learn.batching_cem (the default); ppo: learn.disppo, the paper's SMDP PPO
CEM_BUDGET = {True: {"iterations": 8, "population": 16, "elite": 4, "segments": 6},
              False: {"iterations": 12, "population": 16, "elite": 4, "segments": 8}}


def _budget(quick: bool, learner: str = "cem") -> dict:
    if quick:
        # early stopping off: PPO's greedy policy first leaves the rule at 110,592 steps (seed 0, 2026-12-06), so
        # within 150,000 steps an early stop could only ever stop at the rule (DISPPOArgs.early_stop_after)
        b = {"timesteps": 150_000, "seeds": 5, "sweep_seeds": 2, "train_segment_s": 120.0, "train_seeds": 1,
             "variants": ("disppo",), "early_stop_after": 1.0}  # the ablation only at the full budget (2 cores)
    else:
        b = {"timesteps": 400_000, "seeds": 10, "sweep_seeds": 3, "train_segment_s": 120.0, "train_seeds": 3,
             "variants": tuple(VARIANTS), "early_stop_after": 0.5}
    if learner == "cem":  # the ablation is about PPO's discount: PPO only
        b.update(variants=("disppo",), timesteps=None, cem=dict(CEM_BUDGET[quick]))
    return b


def _batcher(name: str, params: dict, b: int | None = None):
    from fleetwise.policies import make

    if name == "offload_greedy":
        from fleetwise.worlds.edge import OffloadGreedy

        return OffloadGreedy
    p = dict(params)
    if b is not None:
        if name == "static":
            p["max_batch"] = b
        else:
            p["max_num_seqs"] = b
    return lambda view: make("batcher", name, p)


def _summ(rows: list[dict]) -> dict:
    from fleetwise.reproduce.common import summarize_rows

    out = summarize_rows(rows, ("deadline_rps", "goodput_rps", "ttft_p99_s", "e2e_p99_s"))
    out["offloaded_per_segment"] = float(np.mean([r["offloaded"] for r in rows]))
    out["dropped_share"] = _dropped(rows)
    return out


def _dropped(rows: list[dict]) -> float:
    """Share of the requests not completed (unfinished at the horizon or rejected): no setting asks for those."""
    n = sum(r["requests"] for r in rows)
    return float(sum(r.get("dropped", 0) for r in rows) / n) if n else 0.0


def validation_windows(cfg, quick: bool) -> list:
    """Validation segments (the 60-70% part of each trace's span): the paper's mix at its rate and at a light
    rate, and mooncake's long prompts fitted to the edge at load 0.7 (name, config, seed, trace, load)."""
    from fleetwise.worlds.edge import trace_part

    n = 2 if quick else 3
    wins = [(f"mix@{cfg.rate_rps:g}/{k}", cfg, 2000 + k, None, None) for k in range(n)]
    light = replace(cfg, rate_rps=1.2)
    wins += [(f"mix@1.2/{k}", light, 2100 + k, None, None) for k in range(n - 1)]
    part = trace_part("mooncake", "validation", cfg)
    wins += [(f"mooncake@0.7/{k}", cfg, 2200 + k, part, 0.7) for k in range(n - 1)]
    return wins


def train_job(job: dict) -> dict:
    """One training job (a variant and a training seed) on the recipe; returns the policy (numpy), its learning
    curve, the validation gate and the checkpoint path (when ``job["checkpoint"]``). Runs in a worker process."""
    from fleetwise.envs.edge import EdgeBatchingEnv, TrainMix
    from fleetwise.learn.disppo import DISPPOArgs, EdgeValidation, NumpyPolicy, train
    from fleetwise.worlds.edge import EdgeConfig, OffloadGreedy

    cfg = EdgeConfig()
    tcfg = replace(cfg, segment_s=job["train_segment_s"])
    val = EdgeValidation(validation_windows(cfg, job["quick"]), OffloadGreedy,
                         _batcher(*BASELINES["sarathi"]))
    target = float(np.mean([r["ttft_attainment"] for r in val.rule.values()]))
    if job.get("learner", "ppo") == "cem":
        return _train_cem(job, cfg, val, target)
    args = DISPPOArgs(total_timesteps=job["timesteps"], time_aware=job["time_aware"], seed=job["seed"],
                      ttft_target=target, early_stop_after=job.get("early_stop_after", 0.5))
    mix = TrainMix()
    key = _ppo_job_key(tcfg, mix, args, val)
    if job.get("checkpoint") and (old := _reuse_ppo(job, key, target)) is not None:
        return old
    model, curve, wall = train(lambda: EdgeBatchingEnv(tcfg, mix=mix), args, validation=val)
    g = val.gate(model)
    ckpt = None
    if job.get("checkpoint"):
        from fleetwise.learn.export import export_sb3

        training = {"data": "edge segments, first 60% of each trace's span: the paper's mix at "
                            f"{mix.rate_range[0]:g}-{mix.rate_range[1]:g} req/s, and {', '.join(mix.traces)} fitted at "
                            f"load {mix.load_range[0]:g}-{mix.load_range[1]:g}", "timesteps": job["timesteps"],
                    "seed": job["seed"], "time_aware": job["time_aware"], "ttft_attainment_target": target,
                    "best_step": curve["best_step"], "wall_s": wall, "job_key": key, "curve": curve}
        ckpt = str(export_sb3(model, job["checkpoint"], level="batcher", policy=job["name"], rule=RULE,
                              training=training, validation=g))
    return {"name": job["name"], "seed": job["seed"], "policy": NumpyPolicy(model), "curve": curve, "gate": g,
            "wall_s": wall, "checkpoint": ckpt, "ttft_target": target}


def _ppo_job_key(tcfg, mix, args, val) -> str:
    """What determines a PPO training job's result (as ``learn.batching_cem.job_key`` for CEM): the training
    segments' edge scenario, the training mix, PPO's arguments (budget, seed, discount, the recipe's settings) and
    the validation windows. A checkpoint whose model card carries the same key is reused instead of training."""
    import hashlib
    import json
    from dataclasses import asdict

    doc = {"edge": asdict(tcfg), "mix": asdict(mix), "ppo": asdict(args),
           "validation": [[str(x) for x in w[:3]] + [str(w[4])] for w in val.windows], "version": 1}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _reuse_ppo(job: dict, key: str, target: float) -> dict | None:
    """The result of an earlier PPO job with the same key, from its checkpoint and model card (the safe loader:
    arrays and JSON only), or None: the policy, its gate and its learning curve, without training again."""
    from fleetwise.learn.disppo import NumpyPolicy
    from fleetwise.learn.recipe import trained_by

    card = trained_by(job["checkpoint"], "batcher", key, None)
    if card is None:
        return None
    try:
        t = card.training
        c = t["curve"]
        curve = {"episodes": [tuple(v) for v in c["episodes"]], "lagrange": [tuple(v) for v in c["lagrange"]],
                 "validation": [tuple(v) for v in c["validation"]], "bc_loss": list(c["bc_loss"]),
                 "best_step": int(c["best_step"])}
        wall = float(t["wall_s"])
    except (KeyError, TypeError, ValueError):  # a card without a well-formed curve: train again
        return None
    return {"name": job["name"], "seed": job["seed"], "policy": NumpyPolicy.from_checkpoint(job["checkpoint"]),
            "curve": curve, "gate": dict(card.validation or {}), "wall_s": wall,
            "checkpoint": job["checkpoint"], "ttft_target": target, "reused": True}


def _train_cem(job: dict, cfg, val, target: float) -> dict:
    """A training job of ``learn.batching_cem``: the same returned shape as PPO's (curve: validation score and the
    multiplier against training segments simulated; no episode returns)."""
    from fleetwise.learn.batching_cem import BatchingCEMConfig, train_batching_cem

    bcfg = BatchingCEMConfig(seed=job["seed"], **job["cem"])
    r = train_batching_cem(cfg, val, bcfg, out=job.get("checkpoint"), policy_name=job["name"], reuse=True)
    curve = {"episodes": [], "validation": r["validation_curve"], "lagrange": r["lagrange"], "bc_loss": [],
             "best_step": r["best_step"], "iterations": r["curve"]}
    return {"name": job["name"], "seed": job["seed"], "policy": r["policy"], "curve": curve, "gate": r["gate"],
            "wall_s": r["wall_s"], "checkpoint": r.get("checkpoint"), "ttft_target": target, "learner": "cem",
            "segments_simulated": r["segments_simulated"], "reused": bool(r.get("reused"))}


def run(quick: bool = False, seeds: int | None = None, eval_trace: str | None = None, db: str | None = None,
        progress: bool = True, load: float | str = 0.7, timesteps: int | None = None, sweep: bool = True,
        train_seeds: int | None = None, backend: str = "local", workers: int | None = 1, learner: str = "cem",
        cem: dict | None = None, address: str | None = None) -> dict:
    """``load``: with ``eval_trace``, its rate as a fraction of the edge's capacity (fleetwise.workload.adapt) or
    "real"; ``learner``: ``cem`` (default) or ``ppo``; ``timesteps`` (PPO), ``cem`` (CEM budget overrides) and
    ``sweep=False`` shrink the budget (tests)."""
    from fleetwise.reproduce.common import check_run_args

    check_run_args(seeds=seeds, train_seeds=train_seeds, workers=workers, eval_trace=eval_trace, db=db, load=load,
                   timesteps=timesteps, cem=cem, backend=backend, address=address)
    from fleetwise.learn.recipe import run_jobs
    from fleetwise.metrics.stats import paired_change
    from fleetwise.reproduce.common import fit_load as _fit_load
    from fleetwise.reproduce.common import out_dir as _out_dir
    from fleetwise.reproduce.common import progress as _progress
    from fleetwise.reproduce.common import store_meta, store_rows
    from fleetwise.worlds.edge import EdgeConfig, EdgePolicyBatcher, evaluate, with_batch_limit

    if learner not in LEARNERS:
        raise ValueError(f"learner {learner!r}: expected one of {', '.join(LEARNERS)}")
    bud = _budget(quick, learner)
    if cem and learner == "cem":
        bud["cem"].update(cem)
    if timesteps is not None and learner == "ppo":
        bud["timesteps"] = int(timesteps)
    if train_seeds is not None:
        bud["train_seeds"] = int(train_seeds)
    n_seeds = seeds or bud["seeds"]
    cfg = EdgeConfig()
    trace = None
    scenario = "edge-3-nodes"
    eval_seeds = list(range(1000, 1000 + n_seeds))
    fit_load = _fit_load(load)
    fit_lines: list[str] = []
    if eval_trace is not None:
        from fleetwise.worlds.edge import fit_edge_trace
        from fleetwise.workload.spec import load_trace

        trace = load_trace(eval_trace)
        scenario = f"edge-3-nodes:{Path(eval_trace).name}@{load}"
        # every evaluation seed's segment fitted now, before any training (seed 1001's failed after it)
        rep = [fit_edge_trace(cfg, trace, np.random.default_rng(s), fit_load)[2] for s in eval_seeds][0]
        fit_lines = [f"--eval-trace {eval_trace}: replaces the segments' arrivals and lengths; each seed its own "
                     f"{cfg.segment_s:g} s segment"] + [f"seed {eval_seeds[0]}: {ln}" for ln in rep.lines()]
    out_dir = _out_dir(db, "batching")
    console, bars = _progress(progress)
    result: dict = {}
    with bars as prog:
        jobs = [{"name": name, "time_aware": ta, "seed": s, "timesteps": bud["timesteps"], "quick": quick,
                 "early_stop_after": bud["early_stop_after"],
                 "train_segment_s": bud["train_segment_s"], "learner": learner, "cem": bud.get("cem"),
                 "checkpoint": str(out_dir / f"{name}-seed{s}.npz") if db else None}
                for name, ta in VARIANTS.items() if name in bud["variants"] for s in range(bud["train_seeds"])]
        task = prog.add_task(f"training {len(jobs)} jobs", total=len(jobs))
        trained = run_jobs(train_job, jobs, backend=backend, workers=workers, address=address,
                           on_result=lambda _r: prog.advance(task))
        models: dict[str, list] = {}
        for tr in trained:
            name = tr["name"]
            models.setdefault(name, []).append(tr["policy"])
            r = result.setdefault(name, {"train_wall_s": 0.0, "train_timesteps": bud["timesteps"],
                                         "train_seeds": bud["train_seeds"], "gates": [], "curves": [],
                                         "learner": learner})
            r["train_wall_s"] += tr["wall_s"]
            if "segments_simulated" in tr:
                r["train_segments_simulated"] = r.get("train_segments_simulated", 0) + tr["segments_simulated"]
            r["gates"].append(tr["gate"])
            c = tr["curve"]
            r["curves"].append({"seed": tr["seed"], "validation": c["validation"], "lagrange": c["lagrange"],
                                "bc_loss": c["bc_loss"], "best_step": c["best_step"],
                                "episodes": c["episodes"], "ttft_target": tr["ttft_target"],
                                "iterations": c.get("iterations", [])})
            if tr["checkpoint"]:
                r.setdefault("checkpoints", []).append(tr["checkpoint"])
            if db:
                from fleetwise.experiments.store import Store

                st = Store(db)
                run_id = f"seed{tr['seed']}"
                if c["episodes"]:
                    st.add_learning_curve(name, [s for s, _ in c["episodes"]], [v for _, v in c["episodes"]],
                                          "episode_return", run_id)
                if c["validation"]:
                    st.add_learning_curve(name, [s for s, _ in c["validation"]], [v for _, v in c["validation"]],
                                          "validation_deadline_rps", run_id)
                if c["lagrange"]:
                    st.add_learning_curve(name, [s for s, *_ in c["lagrange"]], [lam for _, lam, _ in c["lagrange"]],
                                          "ttft_lambda", run_id)
                if c.get("iterations"):  # CEM: the training elite's change against the rule, per iteration
                    st.add_learning_curve(name, [x["segments_simulated"] for x in c["iterations"]],
                                          [x["train_elite_change"] for x in c["iterations"]],
                                          "train_elite_deadline_rps_change", run_id)
        for name, r in result.items():
            r["gate_passed"] = [g["passed"] for g in r["gates"]]

        def run_learned(ecfg, pols, seeds_):  # per segment: the mean over the training seeds' policies
            per = [evaluate(ecfg, lambda view, m=m: EdgePolicyBatcher(m, view), seeds_, trace=trace, load=fit_load,
                            fit_cfg=cfg) for m in pols]
            out = []
            for k in range(len(seeds_)):
                row = dict(per[0][k])
                for key in ("on_time", "deadline_rps", "goodput_rps", "ttft_p99_s", "e2e_p99_s", "completed",
                            "dropped", "offloaded", "ttft_attainment"):
                    row[key] = float(np.mean([p[k][key] for p in per]))
                out.append(row)
            return out

        rows: dict[str, list[dict]] = {}
        task = prog.add_task("evaluating", total=len(models) + len(BASELINES))
        for name, pols in models.items():
            rows[name] = run_learned(cfg, pols, eval_seeds)
            prog.advance(task)
        for name, (bname, params) in BASELINES.items():
            rows[name] = evaluate(cfg, _batcher(bname, params), eval_seeds, trace=trace, load=fit_load)
            prog.advance(task)
        for name, r in rows.items():
            result.setdefault(name, {}).update(_summ(r))
            store_rows(db, "reproduce-batching", scenario, name, r, level="batcher")
        store_meta(db, "reproduce-batching", baseline=RULE, level="batcher",
                   metrics=("deadline_rps", "goodput_rps", "ttft_p99_s", "e2e_p99_s"))
        # an overloaded run (> 1% of the requests dropped) is never called the best baseline
        overloaded = sorted(n for n, r in rows.items() if _dropped(r) > WARN_SHARE)
        fair = [n for n in BASELINES if n not in overloaded]
        best = max(fair or list(BASELINES), key=lambda n: result[n]["deadline_rps"])
        result["_meta"] = {"best_baseline": best if fair else None, "overloaded": overloaded,
                           "load": load if eval_trace is not None else None, "scenario": scenario,
                           "rule": RULE, "train_seeds": bud["train_seeds"], "timesteps": bud["timesteps"],
                           "learner": learner, "checkpoints_passed": {n: result[n]["gate_passed"] for n in models}}
        # the ceiling: every request of a segment within its deadline, as a paired change against the rule
        seg_s = cfg.segment_s
        ceil = paired_change({r["seed"]: r["deadline_rps"] for r in rows[RULE]},
                             {r["seed"]: r["requests"] / seg_s for r in rows[RULE]})
        result["_meta"]["ceiling_vs_rule_change"] = ceil.mean
        result["_meta"]["ceiling_vs_rule_change_ci95"] = [ceil.lo, ceil.hi]
        for name in models:
            for other, key in ((best, "vs_best_baseline"), (RULE, "vs_rule"), ("sarathi", "vs_sarathi")):
                ch = paired_change({r["seed"]: r["deadline_rps"] for r in rows[other]},
                                   {r["seed"]: r["deadline_rps"] for r in rows[name]})
                if key == "vs_best_baseline":
                    result[name]["vs_best_baseline"] = best
                result[name][f"{key}_change"] = ch.mean
                result[name][f"{key}_change_ci95"] = [ch.lo, ch.hi]
        if "ppo_no_tau" in rows and "disppo" in rows:
            ch = paired_change({r["seed"]: r["deadline_rps"] for r in rows["ppo_no_tau"]},
                               {r["seed"]: r["deadline_rps"] for r in rows["disppo"]})
            result["disppo"]["vs_ablation_change"] = ch.mean
            result["disppo"]["vs_ablation_change_ci95"] = [ch.lo, ch.hi]
        # batch-size sweep: the same policies with batches capped at b
        sweep_seeds = eval_seeds[: bud["sweep_seeds"]]
        task = prog.add_task("batch-size sweep", total=len(BATCH_SIZES))
        for b in BATCH_SIZES if sweep else ():
            bcfg = with_batch_limit(cfg, b)
            for name, pols in models.items():
                r = run_learned(bcfg, pols, sweep_seeds)
                result[name].setdefault("batch_sweep", {})[str(b)] = float(np.mean([x["deadline_rps"] for x in r]))
            for name, (bname, params) in BASELINES.items():
                r = evaluate(bcfg, _batcher(bname, params, b), sweep_seeds, trace=trace, load=fit_load, fit_cfg=cfg)
                result[name].setdefault("batch_sweep", {})[str(b)] = float(np.mean([x["deadline_rps"] for x in r]))
            prog.advance(task)
    if eval_trace is not None:
        result["_trace_fit"] = fit_lines
    if sweep:
        _plot_sweep(result, out_dir / "throughput-vs-batch-size.png")
    _plot_curves(result, out_dir / "learning-curves.png")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _plot_curves(result: dict, path: Path) -> None:
    """Learning curves of every learned variant: episode return (a moving mean), the validation score and the
    TTFT constraint's multiplier against training steps."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    learned = [(n, r) for n, r in result.items() if not n.startswith("_") and r.get("curves")]
    if not learned:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(12, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
    for name, r in learned:
        for c in r["curves"]:
            lab = f"{name} seed {c['seed']}"
            ep = c["episodes"]
            if c.get("iterations"):  # CEM: no episodes; the training elite's paired change against the rule
                axes[0].plot([x["segments_simulated"] for x in c["iterations"]],
                             [x["train_elite_change"] for x in c["iterations"]], marker=".", label=lab)
            elif ep:
                x = np.array([s for s, _ in ep], float)
                y = np.array([v for _, v in ep], float)
                k = max(1, len(y) // 20)
                axes[0].plot(x[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid"), label=lab)
            if c["validation"]:
                axes[1].plot([s for s, _ in c["validation"]], [v for _, v in c["validation"]], marker="o", label=lab)
            if c["lagrange"]:
                axes[2].plot([s for s, *_ in c["lagrange"]], [lam for _, lam, _ in c["lagrange"]], label=lab)
    cem = any(r.get("learner") == "cem" for _, r in learned)
    first = "training elite: deadline req/s vs the rule on its segments" if cem else "episode return (moving mean)"
    for ax, t in zip(axes, (first, "validation score (deadline req/s)", "TTFT constraint multiplier")):
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("training segments simulated (CEM)" if cem else "training steps")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.subplots_adjust(left=0.05, right=0.98, top=0.9, bottom=0.14, wspace=0.25)
    fig.savefig(path)


def _plot_sweep(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(6.5, 4.0), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, r in result.items():
        if name.startswith("_"):
            continue
        sw = r.get("batch_sweep")
        if sw:
            xs = [int(b) for b in sw]
            ax.plot(xs, [sw[str(b)] for b in xs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size limit (requests)")
    ax.set_ylabel("requests within deadline per second")
    ax.set_title("Edge batching: throughput within deadline vs batch size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.12, right=0.97, top=0.9, bottom=0.13)
    fig.savefig(path)


def render(result: dict):
    from rich.table import Table

    meta = result.get("_meta", {})
    over = meta.get("overloaded") or []
    where = "held-out segments" if not meta.get("load") else f"{meta.get('scenario')} at load {meta.get('load')}"
    note = ""
    if over:
        note = (f"; overloaded (> 1% dropped), never the best baseline: {', '.join(over)}"
                + ("" if meta.get("best_baseline") else "; every baseline overloaded: no best"))
    if meta.get("ceiling_vs_rule_change") is not None:
        note += (f"; every request within its deadline would be {meta['ceiling_vs_rule_change']:+.1%} vs "
                 f"{meta.get('rule', RULE)} (the ceiling)")
    t = Table(title=f"Edge batching ({where}): mean [95% CI] over seeds; {PAPER_NOTE}{note}")
    for c in ("policy", "deadline req/s", "goodput req/s", "TTFT p99 s", "E2E p99 s", "offloaded/segment",
              "dropped", "vs best baseline", "gate vs rule (validation)"):
        t.add_column(c, justify="right" if c != "policy" else "left", no_wrap=True)

    def ci(r, k, f="{:.3f}"):
        lo, hi = r[f"{k}_ci95"]
        return f"{f.format(r[k])} [{f.format(lo)}, {f.format(hi)}]" if lo == lo else f.format(r[k])

    for name, r in result.items():
        if name.startswith("_"):
            continue
        vs = ""
        if "vs_best_baseline_change" in r:
            lo, hi = r["vs_best_baseline_change_ci95"]
            vs = f"{r['vs_best_baseline_change']:+.1%} [{lo:+.1%}, {hi:+.1%}] vs {r['vs_best_baseline']}"
            if not meta.get("best_baseline", True):
                vs += " (overloaded)"
        drop = r.get("dropped_share")
        gates = r.get("gate_passed")
        gate = f"passed {sum(gates)}/{len(gates)}" if gates else ""
        t.add_row(name, ci(r, "deadline_rps"), ci(r, "goodput_rps"), ci(r, "ttft_p99_s", "{:.2f}"),
                  ci(r, "e2e_p99_s", "{:.2f}"), f"{r['offloaded_per_segment']:.1f}",
                  "-" if drop is None else f"{drop:.1%}" + (" OVERLOADED" if name in over else ""), vs, gate)
    return t


def bench() -> dict:
    """Environment steps per second (random feasible actions, one core) and DISPPO training speed (PPO alone:
    no warm start, no validation)."""
    from fleetwise.envs.edge import EdgeBatchingEnv
    from fleetwise.learn.disppo import DISPPOArgs, train
    from fleetwise.worlds.edge import EdgeConfig

    env = EdgeBatchingEnv(EdgeConfig())
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    n = 0
    t0 = time.perf_counter()
    bounds = np.concatenate([[0], np.cumsum(env.cfg.action_nvec)])
    while time.perf_counter() - t0 < 5.0:
        m = env.action_masks()  # a feasible choice per dimension (a 2-element action here, for the 3 dimensions
        # since offload_greedy, was refused and ran the rule's action: the figure was the rule's speed)
        a = np.array([rng.choice(np.flatnonzero(m[lo:hi])) for lo, hi in zip(bounds[:-1], bounds[1:])])
        _, _, term, _, _ = env.step(a)
        n += 1
        if term:
            env.reset(seed=n)
    steps_per_s = n / (time.perf_counter() - t0)
    cfg = replace(EdgeConfig(), segment_s=120.0)
    _, curve, wall = train(lambda: EdgeBatchingEnv(cfg), DISPPOArgs(total_timesteps=50_000, bc_episodes=0))
    return {"env_steps_per_s": steps_per_s, "train_timesteps": 50_000, "train_wall_s": wall,
            "train_steps_per_s": 50_000 / wall}
