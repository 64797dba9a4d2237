"""Executing runs: a local process pool (default) or Ray tasks, writing each result to the store as it ends.

A run that raises is stored as failed with its error and does not stop the sweep. Runs already stored as 'ok'
are skipped, so a sweep killed midway and started again completes with exactly one row per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fleetwise.errors import InputError, check_replaceable
from fleetwise.execution import check_workers, run_local, run_ray
from fleetwise.experiments.spec import Run

QUANTILES = np.linspace(0.0, 100.0, 101)
MAX_TIMELINE_BUCKETS = 240


def code_version() -> str:
    import fleetwise

    v = fleetwise.__version__
    try:
        h = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                           text=True, timeout=5)
        if h.returncode == 0 and h.stdout.strip():
            v += "+" + h.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return v


_VERSION: str | None = None


def execute_run(run: Run) -> dict:
    """Simulate one run; never raises (errors are returned as a failed result)."""
    global _VERSION
    if _VERSION is None:
        _VERSION = code_version()
    t0 = time.perf_counter()
    res = {
        "run_id": run.run_id, "experiment": run.experiment, "scenario": run.scenario_name,
        "scenario_hash": run.scenario_hash, "params": json.dumps(run.params, sort_keys=True), "router": run.router,
        "router_params": json.dumps(run.router_params, sort_keys=True), "batcher": run.batcher,
        "batcher_params": json.dumps(run.batcher_params, sort_keys=True), "router_label": run.policy.get("router"),
        "batcher_label": run.policy.get("batcher"), "seed": run.seed, "requests": run.requests,
        "code_version": _VERSION, "level": run.level, "policy": run.policy_label,
        "scaler": (run.scenario.get("scaler") or {}).get("name"),
    }
    try:
        from fleetwise.run import run_scenario
        from fleetwise.scenario import PolicyRef, parse_scenario

        sc = parse_scenario(run.scenario, where=f"run {run.run_id}")
        r = run_scenario(sc, run.seed, router=PolicyRef(name=run.router, params=run.router_params),
                         batcher=PolicyRef(name=run.batcher, params=run.batcher_params), num_requests=run.requests,
                         sim_overrides={"timeline_bucket_s": run.timeline_bucket_s})
        b, rec, s = r.built, r.records, r.summary
        res["metrics"] = s
        done = rec.completed
        q = {}
        for name, x in (("ttft_s", rec.ttft_s[done]), ("e2e_s", rec.e2e_s[done]), ("tpot_s", rec.tpot_s[done])):
            x = x[~np.isnan(x)]
            if len(x):
                q[name] = (QUANTILES.tolist(), np.percentile(x, QUANTILES).tolist())
        res["quantiles"] = q
        if run.timeline_bucket_s:
            w, util = b.sim.utilisation_timeline()
            if util.shape[1] > MAX_TIMELINE_BUCKETS:  # coarsen to keep the store small
                f = -(-util.shape[1] // MAX_TIMELINE_BUCKETS)
                pad = (-util.shape[1]) % f
                util = np.pad(util, ((0, 0), (0, pad))).reshape(util.shape[0], -1, f).mean(axis=2)
                w *= f
            res["timeline"] = (w, util.tolist())
        if run.records_dir:
            _write_records(rec, Path(run.records_dir) / f"{run.run_id}.parquet")
        res["status"] = "ok"
    except BaseException as e:  # noqa: BLE001 - a failed run is data, not a crash
        if isinstance(e, KeyboardInterrupt):
            raise
        res["status"] = "failed"
        from fleetwise.errors import InputError

        if isinstance(e, InputError):  # the input's fault, said in its own words (no type, no source line)
            res["error"] = str(e)
        else:
            tb = traceback.extract_tb(e.__traceback__)
            where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
            res["error"] = f"{type(e).__name__}: {e}{where}"
    res["wall_s"] = time.perf_counter() - t0
    res["finished_at"] = time.time()
    return res


def _write_records(rec, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.table({k: v for k, v in rec.as_dict().items()}), tmp)
    os.replace(tmp, path)  # never a half-written file


@dataclass
class SweepResult:
    total: int
    skipped: int
    ok: int
    failed: int
    wall_s: float


def run_sweep(runs: list[Run], store, *, backend: str = "local", workers: int | None = None,
              address: str | None = None, on_progress: Callable[[int, int], None] | None = None,
              batch_write_s: float = 0.5) -> SweepResult:
    """Run what is not stored yet and store each result; ``on_progress(done, total)`` after each run."""
    check_workers(workers)
    if isinstance(runs, (str, bytes)) or not all(isinstance(r, Run) for r in runs):
        raise InputError(f"runs {runs!r:.60}: expected a list of Run (fleetwise.experiments.expand)")
    if not (hasattr(store, "done_ids") and hasattr(store, "write")):
        raise InputError(f"store {store!r:.60}: expected a fleetwise.experiments.Store")
    t0 = time.perf_counter()
    done_ids = store.done_ids()
    todo = [r for r in runs if r.run_id not in done_ids]
    skipped = len(runs) - len(todo)
    ok = failed = 0
    pending_writes: list[dict] = []
    last_write = time.monotonic()

    def collect(res: dict, final: bool = False) -> None:
        nonlocal ok, failed, last_write
        if res is not None:
            pending_writes.append(res)
            if res["status"] == "ok":
                ok += 1
            else:
                failed += 1
        if pending_writes and (final or time.monotonic() - last_write >= batch_write_s):
            store.write(pending_writes)
            pending_writes.clear()
            last_write = time.monotonic()
        if on_progress and res is not None:
            on_progress(ok + failed, len(todo))

    try:
        if not todo:
            pass
        elif backend == "local":
            run_local(todo, workers, collect, execute_run)
        elif backend == "ray":
            run_ray(todo, workers, address, collect, execute_run)
        else:
            raise InputError(f"--backend {backend!r}: expected local or ray")
    finally:
        collect(None, final=True)  # whatever finished is stored, also on Ctrl-C
    return SweepResult(total=len(runs), skipped=skipped, ok=ok, failed=failed, wall_s=time.perf_counter() - t0)
