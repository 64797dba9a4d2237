"""What the paper reproductions share: their output folder, progress bars and load argument, the spread over
seeds, and storing evaluation rows in the results store."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Iterable, Sequence


def out_dir(db: str | None, name: str) -> Path:
    """The reproduction's folder for plots, checkpoints and ``result.json``: beside the results store (``db``), or
    ``results/NAME``; created."""
    d = (Path(db).parent if db else Path("results")) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def check_run_args(choices: dict | None = None, **kw) -> None:
    """The reproductions' Python ``run(...)`` arguments, as the CLI checks its options, before any work: one
    InputError line names the argument (found by fuzzing, 2026-12-06: ``db="/proc/x"`` failed after the training,
    ``topologies=5`` and ``cem=5`` were TypeErrors deep inside, ``scalers=["nosuch"]`` was dropped and then
    crashed, ``load="abc"`` was a float() error, an ``address`` without the Ray backend was ignored).
    ``choices``: for a list argument, its allowed names (None: any non-empty names)."""
    import math
    import os

    from fleetwise.errors import InputError
    from fleetwise.limits import MAX_SPAN_S

    check_counts(**{k: kw[k] for k in ("seeds", "train_seeds", "workers") if k in kw})
    for k in ("updates", "episodes_per_update", "timesteps"):
        v = kw.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10**9):
            raise InputError(f"{k}={v!r}: expected an integer from 1 to 10^9")
    for k in ("db", "eval_trace", "rl_checkpoint"):
        v = kw.get(k)
        if v is not None and (not isinstance(v, (str, os.PathLike)) or not str(v).strip()):
            raise InputError(f"{k}={v!r}: expected a path")
    if kw.get("db"):
        from fleetwise.experiments.store import check_writable_file

        check_writable_file(kw["db"], "results store (db)")
    if "load" in kw:
        v = kw["load"]
        if not (v == "real" or (not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v <= 10)):
            raise InputError(f"load={v!r}: expected a fraction of the capacity in (0, 10] or 'real'")
    v = kw.get("segment_s")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 1 <= v <= 7 * 86_400):
        raise InputError(f"segment_s={v!r}: expected 1 s to 7 days")
    for k, allowed in (choices or {}).items():
        v = kw.get(k)
        if v is None:
            continue
        among = f" from: {', '.join(allowed)}" if allowed else ""
        if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
            raise InputError(f"{k}={v!r}: expected a non-empty list of names{among}")
        bad = [x for x in v if not isinstance(x, str) or not x.strip() or (allowed and x not in allowed)]
        if bad:
            raise InputError(f"{k}: {bad[0]!r} is not one of: {', '.join(allowed)}" if allowed else
                             f"{k}: {bad[0]!r} is not a name")
    if kw.get("cem") is not None and not isinstance(kw["cem"], dict):
        raise InputError(f"cem={kw['cem']!r}: expected a mapping of the CEM budget's fields")
    w = kw.get("window")
    if w is not None and not (isinstance(w, (list, tuple)) and len(w) == 2
                              and all(not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)
                                      for x in w) and 0 <= w[0] < w[1] <= MAX_SPAN_S):
        raise InputError(f"window={w!r}: expected (start, end) seconds with 0 <= start < end")
    if kw.get("address") and kw.get("backend", "local") != "ray":
        raise InputError("address applies to backend='ray'")
    if kw.get("column") is not None and kw.get("eval_trace") is None:
        raise InputError("column applies to eval_trace (the CPU series' column)")


def check_counts(**counts) -> None:
    """The Python API's counts (``seeds``, ``train_seeds``, ``workers``), as the CLI bounds them: each None or an
    integer from 1 to MAX_SEEDS (MAX_WORKERS for ``workers``); ``seeds=0`` ran nothing and ``seeds=-1`` was a
    negative slice deep in a run. One InputError line names the argument."""
    from fleetwise.errors import InputError
    from fleetwise.limits import MAX_SEEDS, MAX_WORKERS

    for name, v in counts.items():
        hi = MAX_WORKERS if name == "workers" else MAX_SEEDS
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi):
            raise InputError(f"{name}={v!r}: expected an integer from 1 to {hi:,} (docs/limits.md)")


def fit_load(load: float | str) -> float | None:
    """``--load`` for the trace fit (fleetwise.workload.adapt): a fraction of the capacity, or None for "real"."""
    return None if load == "real" else float(load)


def progress(enabled: bool = True, counts: bool = False):
    """``(console, Progress)``: rich progress bars on stderr, shown only on a terminal and when ``enabled``, gone
    when done; ``counts`` adds an M/N column."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, markup=False)
    cols = [TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
            *([MofNCompleteColumn()] if counts else []), TimeElapsedColumn()]
    return console, Progress(*cols, console=console, transient=True, disable=not (enabled and console.is_terminal))


def pooled_rows(rows: list[dict], metrics: Iterable[str]) -> list[dict]:
    """One row per evaluation unit with each metric's mean over its rows (``metrics.stats.unit_means``: a learned
    policy has a row per training seed on each segment or day, not independent samples; its interval is over the
    units, as ``reproduce batching`` has always computed it; the variation between training runs is reported per
    training seed beside it)."""
    from fleetwise.metrics.stats import unit_means

    metrics = list(metrics)
    means = {m: unit_means(rows, m) for m in metrics}
    return [{"seed": u, **{m: means[m][u] for m in metrics}} for u in dict.fromkeys(r["seed"] for r in rows)]


def summarize_rows(rows: list[dict], metrics: Iterable[str]) -> dict:
    """Per metric the mean over seeds and its 95% t interval (``<metric>_ci95``), plus ``seeds``."""
    from fleetwise.metrics.stats import mean_ci

    out: dict = {}
    for k in metrics:
        ci = mean_ci([r[k] for r in rows])
        out[k] = ci.mean
        out[f"{k}_ci95"] = [ci.lo, ci.hi]
    out["seeds"] = len(rows)
    return out


def store_meta(db: str | None, experiment: str, *, baseline: str, level: str, metrics: Sequence[str]) -> None:
    """Name the reproduction's rule (``baseline``, a policy of ``level``) and its headline ``metrics`` in the store,
    so that ``fleetwise report`` pairs every policy with that rule and shows those metrics first."""
    if not db:
        return
    from fleetwise.experiments.store import Store

    Store(db).set_meta(experiment, {"baseline": json.dumps({"batcher" if level == "batcher" else "router": baseline}),
                                    "metrics": json.dumps(list(metrics))})


def store_rows(db: str | None, experiment: str, scenario: str, policy: str, rows: list[dict], *,
               level: str = "router", params: dict | None = None) -> None:
    """One ``runs`` row per evaluated seed (numeric fields as metrics), so ``fleetwise report`` shows them; a row
    of the same experiment, scenario, parameters, policy, seed (and training seed) stored before is replaced.
    ``level`` says which decision level the policy acts at (stored in ``level``, its name in ``policy``; a router
    or batcher also goes in that column, so the report's tables group by it)."""
    if not db:
        return
    from fleetwise.experiments.runner import code_version
    from fleetwise.experiments.store import Store

    version = code_version()
    res = []
    for r in rows:
        key = f"{experiment}|{scenario}|{json.dumps(params or {}, sort_keys=True)}|{policy}|{r['seed']}"
        if "train_seed" in r:  # a learned policy's row per (training seed, segment)
            key += f"|train{r['train_seed']}"
        router, batcher = (policy, "-") if level != "batcher" else ("-", policy)
        res.append({"run_id": hashlib.sha256(key.encode()).hexdigest()[:20], "experiment": experiment,
                    "scenario": scenario, "scenario_hash": "", "params": json.dumps(params or {}, sort_keys=True),
                    "router": router, "router_params": "{}", "batcher": batcher, "batcher_params": "{}",
                    "router_label": router, "batcher_label": batcher, "seed": r["seed"],
                    "requests": r.get("requests"), "code_version": version, "wall_s": 0.0, "status": "ok",
                    "finished_at": time.time(), "level": level, "policy": policy,
                    "scaler": policy if level == "scaler" else None,
                    "metrics": {k: v for k, v in r.items() if isinstance(v, (int, float)) and k != "seed"}})
    Store(db).write(res, replace=True)  # (run again, a reproduction's rows are its latest results)
