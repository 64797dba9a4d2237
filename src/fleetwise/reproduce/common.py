"""What the paper reproductions share: their output folder, progress bars and load argument, the spread over
seeds, and storing evaluation rows in the results store."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Iterable


def out_dir(db: str | None, name: str) -> Path:
    """The reproduction's folder for plots, checkpoints and ``result.json``: beside the results store (``db``), or
    ``results/NAME``; created."""
    d = (Path(db).parent if db else Path("results")) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


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

    console = Console(stderr=True)
    cols = [TextColumn("[bold]{task.description}"), BarColumn(), *([MofNCompleteColumn()] if counts else []),
            TimeElapsedColumn()]
    return console, Progress(*cols, console=console, transient=True, disable=not (enabled and console.is_terminal))


def summarize_rows(rows: list[dict], metrics: Iterable[str]) -> dict:
    """Per metric the mean over seeds and its 95% bootstrap interval (``<metric>_ci95``), plus ``seeds``."""
    from fleetwise.metrics.stats import bootstrap_ci

    out: dict = {}
    for k in metrics:
        ci = bootstrap_ci([r[k] for r in rows])
        out[k] = ci.mean
        out[f"{k}_ci95"] = [ci.lo, ci.hi]
    out["seeds"] = len(rows)
    return out


def store_rows(db: str | None, experiment: str, scenario: str, policy: str, rows: list[dict], *,
               level: str = "router", params: dict | None = None) -> None:
    """One ``runs`` row per evaluated seed (numeric fields as metrics), so ``fleetwise report`` shows them.
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
    Store(db).write(res)
