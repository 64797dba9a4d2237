"""Benchmarks run as commands (``fleetwise bench ...``); their output goes into docs/ with the command."""

from __future__ import annotations

import json
import subprocess
import sys


def _one(n: int, scenario: str, router: str) -> dict:
    """Simulate ``n`` requests of ``scenario`` in this process; wall time of the simulation and peak RSS."""
    import resource
    import time

    from fleetwise.scenario import build, load_scenario

    sc = load_scenario(scenario)
    t0 = time.perf_counter()
    b = build(sc, sc.seed, num_requests=n)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    rec = b.sim.run(b.controller(router))
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = b.summary(rec)
    t_sum = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"requests_per_s": n / wall, "peak_rss_mb": rss_mb, "wall_s": wall, "build_s": t_build,
            "summary_s": t_sum, "events": b.sim.events, "completed": s["completed"],
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"], "tpot_p50_s": s["tpot_p50_s"]}


def sim_speed(sizes: list[int], scenario: str = "vidur-parity", router: str = "round_robin") -> dict[str, dict]:
    """Each size in a fresh interpreter, so that peak memory is that run's alone."""
    res = {}
    for n in sizes:
        code = f"import json; from fleetwise.bench import _one; print(json.dumps(_one({int(n)}, {scenario!r}, {router!r})))"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"bench run with {n} requests failed:\n{p.stderr[-2000:]}")
        res[str(n)] = json.loads(p.stdout.strip().splitlines()[-1])
    return res


def sweep_throughput(spec: str = "default", workers: int | None = None) -> dict[str, float]:
    """Runs per minute of one experiment run one after another vs on the local process pool."""
    import os
    import time

    from fleetwise.experiments.runner import run_sweep
    from fleetwise.experiments.spec import expand, load_experiment
    from fleetwise.experiments.store import Store

    runs = expand(load_experiment(spec))
    workers = workers or os.cpu_count() or 1
    out: dict[str, float] = {"runs": len(runs), "workers": workers}
    for label, w in (("sequential", 1), ("pool", workers)):
        t0 = time.perf_counter()
        res = run_sweep(runs, Store(None), workers=w)
        wall = time.perf_counter() - t0
        assert res.ok == len(runs), f"{res.failed} runs failed"
        out[f"{label}_wall_s"] = wall
        out[f"{label}_runs_per_min"] = len(runs) / wall * 60.0
    out["speedup"] = out["sequential_wall_s"] / out["pool_wall_s"]
    return out
