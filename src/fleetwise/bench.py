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
    rec = b.run(router)
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
