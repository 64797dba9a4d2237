"""Benchmarks run as commands (``fleetwise bench ...``); their output goes into docs/ with the command."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Callable


def _one(n: int, scenario: str, router: str) -> dict:
    """Simulate ``n`` requests of ``scenario`` in this process; wall time of the simulation and peak RSS."""
    import resource
    import time

    from fleetwise.scenario import build, load_scenario

    sc = load_scenario(scenario)
    t0 = time.perf_counter()
    b = build(sc, sc.seed, num_requests=n)
    t_build = time.perf_counter() - t0
    ctl = b.controller(router)
    t0, c0 = time.perf_counter(), time.process_time()
    rec = b.sim.run(ctl)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    s = b.summary(rec)
    t_sum = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    # cpu_req_per_s: per CPU second of this process, steadier than wall time on a shared machine
    return {"requests_per_s": n / wall, "cpu_req_per_s": n / cpu, "peak_rss_mb": rss_mb, "wall_s": wall,
            "build_s": t_build,
            "summary_s": t_sum, "events": b.sim.events, "completed": s["completed"],
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"], "tpot_p50_s": s["tpot_p50_s"]}


def scaled_scenario(scenario: str, replicas: int):
    """``scenario`` with ``replicas`` replicas in all and its arrival rate scaled by the same factor, so that the
    load per replica stays the scenario's (a Poisson ``rate_rps``, a diurnal ``mean_rate_rps`` or a trace's
    ``time_scale``). Several deployments keep their shares of the fleet (largest remainders; e.g. the three regions
    of ``multi-region``)."""
    from fleetwise.errors import InputError
    from fleetwise.scenario import Scenario, load_scenario

    d = load_scenario(scenario).model_dump()
    deps = d["deployments"]
    if not deps or any(not x["replicas"] for x in deps):
        raise InputError(f"--replicas: scenario {scenario!r} must have deployments with replicas > 0")
    if replicas < len(deps):
        raise InputError(f"--replicas {replicas}: scenario {scenario!r} has {len(deps)} deployments; give at least "
                         "one replica each")
    n0 = sum(x["replicas"] for x in deps)
    shares = [replicas * x["replicas"] // n0 for x in deps]
    for k in sorted(range(len(deps)), key=lambda k: (-(replicas * deps[k]["replicas"] % n0), k))[:replicas - sum(shares)]:
        shares[k] += 1
    if min(shares) < 1:
        raise InputError(f"--replicas {replicas}: too few for the {len(deps)} deployments of scenario {scenario!r}")
    for x, r in zip(deps, shares):
        x["replicas"] = r
    w = d["workload"]
    if "rate_rps" in w:
        w["rate_rps"] = w["rate_rps"] * replicas / n0
    elif "mean_rate_rps" in w:
        w["mean_rate_rps"] = w["mean_rate_rps"] * replicas / n0
    elif w.get("kind") == "trace":
        w["time_scale"] = w.get("time_scale", 1.0) * n0 / replicas
    else:
        raise InputError(f"--replicas: cannot scale the load of workload kind {w.get('kind')!r} "
                         f"(scenario {scenario!r}); use a Poisson or trace workload")
    return Scenario.model_validate(d)


def _fleet_one(replicas: int, n: int, scenario: str, router: str) -> dict:
    """Simulate ``n`` requests of ``scenario`` scaled to ``replicas`` replicas at the same load per replica."""
    import gc
    import resource
    import time

    from fleetwise.scenario import build

    sc = scaled_scenario(scenario, replicas)
    b = build(sc, sc.seed, num_requests=n)
    ctl = b.controller(router)
    # what was built before the run (the fleet, the workload, imported modules) is moved out of the cyclic
    # collector's generations, so that its passes during the run do not walk the fleet again and again (the
    # collector took about 10% of a 10,000-replica run, nothing at 4; freezing about halves that); every size alike
    gc.freeze()
    t0, c0 = time.perf_counter(), time.process_time()
    rec = b.sim.run(ctl)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    # cpu_req_per_s: the same per CPU second of this process, steadier than wall time on a shared machine
    return {"replicas": replicas, "requests": len(b.workload), "req_per_s": len(b.workload) / wall,
            "peak_rss_mb": rss_mb, "wall_s": wall, "cpu_req_per_s": len(b.workload) / cpu, "events": b.sim.events,
            "completed": int(rec.completed.sum()), "replicas_used": int(len(set(rec.replica.tolist()) - {-1}))}


def fleet_speed(replicas: list[int], n: int, scenario: str = "vidur-parity", router: str = "least_outstanding_tokens",
                repeat: int = 1, on_run: Callable[[int, int], None] | None = None) -> list[dict]:
    """Simulated requests per wall-second against the number of replicas, each fleet size in a fresh process.

    ``repeat`` rounds, each running every size once in order, so that the runs of one round are close in time:
    on a shared machine the host's speed drifts, and a ratio of two sizes is steadier within a round than across
    them. Each size's row is its median run by ``req_per_s`` (the other figures are that run's), with
    ``req_per_s_runs`` (every round's rate), ``ratio_to_first_runs`` (every round's rate over the first size's rate
    in the same round) and ``ratio_to_first`` (their median). ``on_run(done, total)`` after each run."""
    runs: list[list[dict]] = [[] for _ in replicas]
    total = repeat * len(replicas)
    for k in range(repeat):
        for i, r in enumerate(replicas):
            code = (f"import json; from fleetwise.bench import _fleet_one; "
                    f"print(json.dumps(_fleet_one({int(r)}, {int(n)}, {scenario!r}, {router!r})))")
            runs[i].append(_child(code, f"bench run with {r} replicas"))
            if on_run is not None:
                on_run(k * len(replicas) + i + 1, total)
    res = []
    for rows in runs:
        rates = [x["req_per_s"] for x in rows]
        ratios = [x["req_per_s"] / f["req_per_s"] for x, f in zip(rows, runs[0])]
        row = dict(sorted(rows, key=lambda x: x["req_per_s"])[(len(rows) - 1) // 2])  # (the lower median)
        row |= {"req_per_s_runs": rates, "ratio_to_first_runs": ratios,
                "ratio_to_first": float(statistics.median(ratios))}
        res.append(row)
    return res


def _child(code: str, what: str) -> dict:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if p.returncode != 0:
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        if last.startswith("fleetwise.errors.InputError: "):  # bad input found in the child: its one line
            from fleetwise.errors import InputError

            raise InputError(last.split(": ", 1)[1])
        raise RuntimeError(f"{what} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def sim_speed(sizes: list[int], scenario: str = "vidur-parity", router: str = "round_robin",
              on_done=None) -> dict[str, dict]:
    """Each size in a fresh interpreter, so that peak memory is that run's alone; ``on_done(size)`` after each."""
    res = {}
    for n in sizes:
        code = f"import json; from fleetwise.bench import _one; print(json.dumps(_one({int(n)}, {scenario!r}, {router!r})))"
        res[str(n)] = _child(code, f"bench run with {n} requests")
        if on_done is not None:
            on_done(n)
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
        store = Store(None)
        res = run_sweep(runs, store, workers=w)
        wall = time.perf_counter() - t0
        if res.ok != len(runs):  # (an AssertionError traceback before): one line with the first run's error
            from fleetwise.errors import InputError

            f = store.runs(where="status = 'failed'")[0]
            raise InputError(f"bench sweep: {res.failed} of {len(runs)} runs failed; the first: {f['error']}")
        out[f"{label}_wall_s"] = wall
        out[f"{label}_runs_per_min"] = len(runs) / wall * 60.0
    out["speedup"] = out["sequential_wall_s"] / out["pool_wall_s"]
    return out
