"""Reproduction: Q-learning vs SARSA vs a fixed policy for GPU count × parallelism (docs/allocation.md).

Protocol: PlanetLab VM-days (real CPU traces). Training: the first ``train_vms`` VMs (by name) of the first
``train_days`` days. Evaluation: other VMs (held out: names after the training ones) on the remaining days, or
the user's traces (``--eval-trace``). Per seed every learner is trained from scratch; labels are the one-step
oracle's action in each visited state; metrics per seed, then mean and 95% t interval over seeds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fleetwise.errors import InputError
from fleetwise.policies.allocation_model import N_ACTIONS, AllocationConfig, AllocationCore

POLICIES = ("q_learning", "sarsa", "fixed", "oracle", "dqn", "random")
METRICS = ("accuracy", "precision", "recall", "f1", "mean_total_reward")
PAPER = {  # the paper's reported figures (abstract)
    "q_learning": {"accuracy": 0.85, "precision": 0.83, "f1": 0.84, "mean_total_reward": 26.7},
    "sarsa": {"accuracy": 0.79, "precision": 0.76, "f1": 0.77, "mean_total_reward": 22.4},
    "fixed": {"accuracy": 0.74, "precision": 0.71, "f1": 0.72, "mean_total_reward": 19.6},
}


@dataclass(frozen=True)
class Protocol:
    seeds: int = 10
    train_days: int = 5
    train_vms: int = 40  # per training day
    eval_vms: int = 40  # per evaluation day (held-out VMs)
    q_steps: int = 600_000
    dqn_steps: int = 30_000
    fixed_grid: float = 0.05
    episode_steps: int | None = None


FULL = Protocol()
QUICK = Protocol(seeds=3, train_days=5, train_vms=20, eval_vms=10, q_steps=300_000, dqn_steps=8_000, fixed_grid=0.1)


# ------------------------------------------------------------------------------------------ metrics
def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Accuracy and support-weighted precision, recall and F1 (sklearn's ``average="weighted"``,
    zero_division=0), over the classes present in either array."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if len(y_true) == 0:
        raise ValueError("no labels")
    classes = np.union1d(y_true, y_pred)
    support = np.array([(y_true == c).sum() for c in classes], float)
    tp = np.array([((y_true == c) & (y_pred == c)).sum() for c in classes], float)
    pred_n = np.array([(y_pred == c).sum() for c in classes], float)
    prec = np.divide(tp, pred_n, out=np.zeros_like(tp), where=pred_n > 0)
    rec = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    f1 = np.divide(2 * prec * rec, prec + rec, out=np.zeros_like(tp), where=(prec + rec) > 0)
    w = support / support.sum()
    return {"accuracy": float((y_true == y_pred).mean()), "precision": float((w * prec).sum()),
            "recall": float((w * rec).sum()), "f1": float((w * f1).sum())}


def confusion(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    m = np.zeros((N_ACTIONS, N_ACTIONS), np.int64)
    np.add.at(m, (np.asarray(y_true), np.asarray(y_pred)), 1)
    return m


# ------------------------------------------------------------------------------------------ evaluation
def evaluate(policy, core: AllocationCore, series: Sequence[np.ndarray], seed: int) -> dict[str, Any]:
    """Run ``policy`` on every series (one episode each, in lockstep so batch policies predict once per step).
    Returns labels (oracle, canonical), actions (canonical) and the total reward of each episode."""
    from fleetwise.policies.allocators import canonical

    rng = np.random.default_rng(seed)
    eps = [core.episode(s, rng) for s in series]
    feas = np.flatnonzero(core.table.feasible)
    dep = feas[rng.integers(len(feas), size=len(eps))]
    T = max(e.T for e in eps)
    totals = np.zeros(len(eps))
    y_true, y_pred = [], []
    batch = hasattr(policy, "allocate_batch")
    for t in range(T):
        live = [i for i, e in enumerate(eps) if t < e.T]
        obs = np.stack([core.observation(eps[i], t, int(dep[i])) for i in live])
        acts = policy.allocate_batch(obs) if batch else np.array([policy.allocate(o) for o in obs])
        for k, i in enumerate(live):
            a = int(acts[k])
            y_true.append(core.oracle_action_at(eps[i], t, int(dep[i])))
            y_pred.append(a)
            totals[i] += core.reward(eps[i], t, int(dep[i]), a)
            dep[i] = a
    yt, yp = canonical(np.array(y_true)), canonical(np.array(y_pred))
    return {"y_true": yt, "y_pred": yp, "episode_rewards": totals}


# ------------------------------------------------------------------------------------------ data
def _split(proto: Protocol) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    from fleetwise.workload.cpu import planetlab_days

    days = planetlab_days()
    names = sorted(days)
    train_days, eval_days = names[:proto.train_days], names[proto.train_days:]
    train = [s for d in train_days for _, s in sorted(days[d].items())[:proto.train_vms]]
    train_names = {vm for d in train_days for vm in sorted(days[d])[:proto.train_vms]}
    ev = []
    for d in eval_days:
        held = [s for vm, s in sorted(days[d].items()) if vm not in train_names]
        # spread the held-out picks over the day's VMs (deterministic)
        idx = np.linspace(0, len(held) - 1, min(proto.eval_vms, len(held))).astype(int)
        ev += [held[i] for i in idx]
    return train, ev, {"train_days": train_days, "eval_days": eval_days, "train_series": len(train),
                       "eval_series": len(ev)}


def _ci(values: Sequence[float]) -> tuple[float, list[float]]:
    from fleetwise.metrics.stats import mean_ci

    c = mean_ci(values)
    return c.mean, [c.lo, c.hi]


def fit_cpu_series(series: Sequence[np.ndarray], load: float | None, cfg: AllocationConfig | None = None
                   ) -> tuple[list[np.ndarray], AllocationConfig, list[str]]:
    """A user's CPU series fitted to the allocation task (docs/allocation.md). With ``load`` each series is scaled
    so that its busiest window demands ``load`` x the host's capacity (the largest capacity any deployment
    reaches; the environment's ``peak_rps`` is 0.9 of it): a series keeps its shape and nothing is clipped. (A
    window is a decision on its own, with no queue carried to the next, so the peak is what can overload the host;
    scaling the *mean* to 0.7 clips 22% of the PlanetLab windows at the peak rate.) ``load=None`` ("real") reads
    the utilisation as the fraction of the peak rate. Either way the series are used as they are
    (``normalize="none"``), not min-max normalised as the training VMs are (whose peaks sit at 0.9 x capacity).
    Returns (series, evaluation config, lines describing the fit)."""
    cfg = cfg or AllocationConfig()
    ecfg = cfg.with_(normalize="none")
    if cfg.peak_rps is not None:
        raise InputError("fit_cpu_series: a fixed peak_rps has no capacity to scale to; use peak_rps=None")
    lines = [f"{len(series)} CPU series, {int(np.median([len(x) for x in series]))} windows (median) each"]
    if load is None:
        lines.append("load real: CPU utilisation = the fraction of the peak demand (0.9 x the host's capacity)")
        return [np.asarray(x, float) for x in series], ecfg, lines
    if not 0 < load <= 1 / 0.9:
        raise InputError(f"--load {load:g}: the allocation task's demand peaks at 0.9 x the host's capacity; "
                         f"expected a load in (0, 1.11]")
    out, factors, means, idle = [], [], [], 0
    for x in series:
        x = np.asarray(x, float)
        peak = float(x.max()) if len(x) else 0.0
        if peak <= 0:
            idle += 1
            out.append(x)
            continue
        f = load / (0.9 * peak)  # busiest window: load x capacity = load / 0.9 x the peak rate
        y = np.clip(x * f, 0.0, 1.0)
        out.append(y)
        factors.append(f)
        means.append(0.9 * float(y.mean()))
    if factors:
        lines.append(f"load {load:g}: each series scaled so that its busiest window demands {load:g} x the host's "
                     f"capacity (scale factor median {np.median(factors):.2f}, range {min(factors):.2f}-"
                     f"{max(factors):.2f}); mean demand {np.mean(means):.2f} x capacity")
    if idle:
        lines.append(f"{idle} series with zero utilisation kept at 0")
    return out, ecfg, lines


def run_protocol(proto: Protocol, cfg: AllocationConfig | None = None, eval_series: Sequence[np.ndarray] | None = None,
                 train_series: Sequence[np.ndarray] | None = None, policies: Sequence[str] = POLICIES,
                 progress: bool = True, eval_cfg: AllocationConfig | None = None) -> dict[str, Any]:
    """Train and evaluate every policy for ``proto.seeds`` seeds. Returns per-policy per-seed metrics,
    summed confusion matrices and learning curves. ``eval_cfg``: the evaluation episodes' configuration when it
    differs from training's (a user's fitted series: ``fit_cpu_series``)."""
    from fleetwise.envs.allocation import AllocationEnv
    from fleetwise.learn import tabular
    from fleetwise.policies.allocators import FixedThreshold, Oracle, RandomAllocator

    cfg = cfg or AllocationConfig(episode_steps=proto.episode_steps)
    meta: dict[str, Any] = {}
    if train_series is None or eval_series is None:
        tr, ev, meta = _split(proto)
        train_series = train_series if train_series is not None else tr
        eval_series = eval_series if eval_series is not None else ev
    core = AllocationCore(cfg)
    ecore = core if eval_cfg is None else AllocationCore(eval_cfg)
    per: dict[str, dict[str, list[float]]] = {p: {m: [] for m in METRICS} for p in policies}
    conf = {p: np.zeros((N_ACTIONS, N_ACTIONS), np.int64) for p in policies}
    curves: dict[str, list[list[tuple[int, float]]]] = {p: [] for p in policies}
    walls: dict[str, float] = {p: 0.0 for p in policies}
    fixed_rules = []
    from fleetwise.reproduce.common import progress as reproduce_progress

    prog = reproduce_progress(counts=True)[1] if progress else None
    task = prog.add_task("allocation: train + evaluate", total=proto.seeds * len(policies)) if prog else None
    if prog:
        prog.start()
    try:
        for seed in range(proto.seeds):
            env = AllocationEnv(cfg, list(train_series))
            for name in policies:
                t0 = time.perf_counter()
                if name in ("q_learning", "sarsa"):
                    pol = tabular.train(env, tabular.TabularArgs(total_steps=proto.q_steps, seed=seed,
                                                                 log_every=proto.q_steps // 20), algo=name)
                    curves[name].append(pol.curve)
                elif name == "dqn":
                    from fleetwise.learn import dqn

                    env.reset(seed=seed)
                    pol = dqn.train(env, dqn.DQNArgs(total_timesteps=proto.dqn_steps, seed=seed,
                                                     log_every=max(1000, proto.dqn_steps // 10)))
                    curves[name].append(pol.curve)
                elif name == "fixed":
                    pol = FixedThreshold.fit(core, train_series, np.random.default_rng(seed), proto.fixed_grid)
                    fixed_rules.append(repr(pol))
                elif name == "oracle":
                    pol = Oracle(cfg)
                elif name == "random":
                    pol = RandomAllocator(seed)
                else:
                    raise InputError(f"unknown allocator {name!r}; expected one of {', '.join(POLICIES)}")
                res = evaluate(pol, ecore, eval_series, seed=10_000 + seed)
                walls[name] += time.perf_counter() - t0
                m = classification_metrics(res["y_true"], res["y_pred"])
                m["mean_total_reward"] = float(res["episode_rewards"].mean())
                for k in METRICS:
                    per[name][k].append(m[k])
                conf[name] += confusion(res["y_true"], res["y_pred"])
                if prog:
                    prog.advance(task)
    finally:
        if prog:
            prog.stop()
    return {"per_seed": per, "confusion": conf, "curves": curves, "wall_s": walls, "meta": meta,
            "fixed_rules": fixed_rules, "config": cfg}


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, ms in raw["per_seed"].items():
        row: dict[str, Any] = {}
        for k, vals in ms.items():
            mean, ci = _ci(vals)
            row[k] = mean
            row[f"{k}_ci95"] = ci
        row["seeds"] = len(ms["accuracy"])
        out[name] = row
    return out


def _write_outputs(raw: dict[str, Any], db: str | None, tag: str, scenario: str = "planetlab") -> dict[str, str]:
    """Every policy's per-seed metrics and the learning curves into the results store (``fleetwise report`` shows
    them, each policy paired with ``fixed``, the paper's hand-written rule; only the curves were stored, so the
    report of this reproduction had no table), confusion matrices as PNGs beside it."""
    written: dict[str, str] = {}
    from fleetwise.reproduce.common import out_dir as _out_dir
    from fleetwise.reproduce.common import store_meta, store_rows

    out_dir = _out_dir(db, "allocation")
    if db:
        from fleetwise.experiments.store import Store

        for name, ms in raw["per_seed"].items():
            rows = [{"seed": i, **{k: float(ms[k][i]) for k in METRICS}} for i in range(len(ms["accuracy"]))]
            store_rows(db, "reproduce-allocation", scenario, name, rows, level="allocator", params={"run": tag})
        store_meta(db, "reproduce-allocation", baseline="fixed", level="allocator",
                   metrics=("accuracy", "f1", "mean_total_reward"))
        store = Store(db)
        for name, runs in raw["curves"].items():
            for seed, curve in enumerate(runs):
                if curve:
                    steps, vals = zip(*curve)
                    store.add_learning_curve(name, steps, vals, metric="episode_return",
                                             run_id=f"allocation-{tag}-{name}-seed{seed}")
        written["db"] = str(db)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fleetwise.policies.allocation_model import ACTIONS, CANON

    keep = sorted(set(CANON.tolist()))
    labels = [f"{n}{p[0]}" if n > 1 else "1" for n, p in (ACTIONS[i] for i in keep)]
    for name, m in raw["confusion"].items():
        sub = m[np.ix_(keep, keep)].astype(float)
        rown = sub / np.maximum(sub.sum(axis=1, keepdims=True), 1)
        fig, ax = plt.subplots(figsize=(5.2, 4.6))
        im = ax.imshow(rown, cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(len(keep)), labels, rotation=45)
        ax.set_yticks(range(len(keep)), labels)
        ax.set_xlabel("policy action")
        ax.set_ylabel("oracle label")
        ax.set_title(f"{name}: confusion vs oracle (row-normalised)", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        p = out_dir / f"confusion_{name}{'_' + tag if tag != 'full' else ''}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written[f"confusion_{name}"] = str(p)
    return written


def run(quick: bool = False, seeds: int | None = None, eval_trace: str | None = None,
        db: str | None = None, load: float | str = 0.7, column: str | int | None = None,
        policies: Sequence[str] | None = None) -> dict[str, Any]:
    """``eval_trace``: CPU series (workload/cpu.py) fitted at ``load`` (``fit_cpu_series``; "real": as they are);
    ``column``: their CPU column (header name or 1-based index); ``policies``: a subset (tests)."""
    from fleetwise.reproduce.common import check_run_args

    check_run_args({"policies": POLICIES}, seeds=seeds, eval_trace=eval_trace, db=db, load=load, column=column,
                   policies=policies)
    proto = QUICK if quick else FULL
    if seeds is not None:
        proto = replace(proto, seeds=int(seeds))
    eval_series = eval_cfg = None
    fit_lines: list[str] = []
    if eval_trace is not None:
        from fleetwise.reproduce.common import fit_load
        from fleetwise.workload.cpu import read_cpu_traces

        cfg = AllocationConfig(episode_steps=proto.episode_steps)
        eval_series, eval_cfg, fit_lines = fit_cpu_series(
            list(read_cpu_traces(eval_trace, column=column, window_s=cfg.window_s).values()),
            fit_load(load), cfg)
        fit_lines = [f"--eval-trace {eval_trace}: replaces the held-out VMs; each seed trains the learners anew "
                     f"and draws its own bandwidth and noise paths"] + fit_lines
    t0 = time.perf_counter()
    raw = run_protocol(proto, eval_series=eval_series, eval_cfg=eval_cfg,
                       policies=tuple(policies) if policies else POLICIES)
    result = summarize(raw)
    files = _write_outputs(raw, db, "quick" if quick else "full",
                           scenario="planetlab" if eval_trace is None else Path(str(eval_trace)).name)
    result["_meta"] = {
        "seeds": proto.seeds, "quick": quick, "eval": eval_trace or "held-out PlanetLab VMs and days",
        **{k: v for k, v in raw["meta"].items()}, "q_steps": proto.q_steps, "dqn_steps": proto.dqn_steps,
        "fixed_rules": sorted(set(raw["fixed_rules"])), "wall_s": round(time.perf_counter() - t0, 1),
        "model": raw["config"].model, "gpu": raw["config"].gpu, "files": files,
        "load": load if eval_trace is not None else None,
    }
    if eval_trace is not None:
        result["_trace_fit"] = fit_lines
    return result


def render(result: dict[str, Any]):
    from rich.table import Table

    meta = result.get("_meta", {})
    load = f" at load {meta['load']}" if meta.get("load") is not None else ""
    t = Table(title=f"GPU-count x parallelism allocation ({meta.get('model')} on {meta.get('gpu')}; "
                    f"{meta.get('seeds')} seed{'' if meta.get('seeds') == 1 else 's'}; eval: {meta.get('eval')}{load}); "
                    "mean [95% CI], paper in ()")
    t.add_column("policy")
    for m in METRICS:
        t.add_column(m, justify="right")
    for name in POLICIES:
        if name not in result:
            continue
        row = result[name]
        cells = []
        for m in METRICS:
            lo, hi = row[f"{m}_ci95"]
            fmt = "{:.1f}" if m == "mean_total_reward" else "{:.3f}"
            s = f"{fmt.format(row[m])} [{fmt.format(lo)}, {fmt.format(hi)}]"
            if name in PAPER and m in PAPER[name]:
                s += f" ({PAPER[name][m]})"
            cells.append(s)
        t.add_row(name, *cells)
    return t


def bench() -> dict[str, float]:
    """Environment steps per second of the tabular trainer's lean path (one core), and of gymnasium's step."""
    from fleetwise.envs.allocation import AllocationEnv
    from fleetwise.learn import tabular
    from fleetwise.policies.allocation_model import synthetic_series

    rng = np.random.default_rng(0)
    series = [synthetic_series(rng) for _ in range(20)]
    try:
        from fleetwise.workload.cpu import planetlab_days

        series = [s for d in planetlab_days(days=["20110303"], max_vms=20).values() for s in d.values()]
    except InputError:
        pass
    env = AllocationEnv(AllocationConfig(), series)
    tabular.train(env, tabular.TabularArgs(total_steps=5_000))  # warm-up (table built, caches)
    n = 300_000
    t0 = time.perf_counter()
    tabular.train(env, tabular.TabularArgs(total_steps=n, seed=1), algo="q_learning")
    q_rate = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    tabular.train(env, tabular.TabularArgs(total_steps=n, seed=1), algo="sarsa")
    s_rate = n / (time.perf_counter() - t0)
    env.reset(seed=0)
    m = 20_000
    t0 = time.perf_counter()
    for i in range(m):
        _, _, term, trunc, _ = env.step(i % N_ACTIONS)
        if term or trunc:
            env.reset()
    g_rate = m / (time.perf_counter() - t0)
    return {"q_learning_steps_per_s": q_rate, "sarsa_steps_per_s": s_rate, "gym_env_steps_per_s": g_rate}
