"""The RL scaler against slo_aware on a real trace training never saw (issue 17: "on the other real traces at load
0.7, neither learned policy worse than its rule"): the trace in place of the platform scenario's arrivals and
lengths over reproduce platform --quick --eval-trace's window (09:30-11:30, with the zone outage), fitted to
``--load`` of the fleet (fleetwise.workload.adapt), 5 seeds, paired by seed; ``per_seed`` in the JSON lists each
seed's pair.

    PYTHONPATH=src python benchmarks/rl-scaler-eval-trace.py --checkpoint results/platform-rl/platform/rl_scaler.npz \
        [--trace azure-code] [--load 0.7] [--seeds 5]
"""

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--trace", default="azure-code")
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.metrics.stats import mean_ci, paired_change
    from fleetwise.reproduce.platform import _one, _workloads, with_trace
    from fleetwise.scenario import SCENARIO_DIR, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    data, lines = with_trace(base, a.trace, a.load, 9.5 * 3600.0, 11.5 * 3600.0)
    seeds = list(range(a.seeds))
    wls, _ = _workloads(data, seeds)
    jobs = {"slo_aware": ("slo_aware", {}), "rl": ("rl", {"checkpoint": a.checkpoint})}
    tasks = [(data, s, n, sc, p, wls[s]) for n, (sc, p) in jobs.items() for s in seeds]
    with ProcessPoolExecutor(a.workers) as ex:
        rows = list(ex.map(_one, tasks))
    by = {n: {r["seed"]: r for r in rows if r["label"] == n} for n in jobs}
    out = {"trace": a.trace, "load": a.load, "fit": lines, "requests": by["rl"][0]["requests"]}
    for n in jobs:
        out[n] = {k: mean_ci([by[n][s][k] for s in seeds]).mean for k in
                  ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests")}
    ch = paired_change({s: by["slo_aware"][s]["cost_per_mtok_usd"] for s in seeds},
                       {s: by["rl"][s]["cost_per_mtok_usd"] for s in seeds})
    d = mean_ci([by["rl"][s]["slo_attainment"] - by["slo_aware"][s]["slo_attainment"] for s in seeds])
    out["rl_vs_slo_aware"] = {"cost_per_mtok_change": [ch.mean, ch.lo, ch.hi],
                              "slo_attainment_diff_points": [d.mean * 100, d.lo * 100, d.hi * 100]}
    out["per_seed"] = [{"seed": s, "cost_per_mtok_change": by["rl"][s]["cost_per_mtok_usd"]
                        / by["slo_aware"][s]["cost_per_mtok_usd"] - 1,
                        "slo_attainment_diff_points": 100 * (by["rl"][s]["slo_attainment"]
                                                             - by["slo_aware"][s]["slo_attainment"]),
                        "oscillations": [by["slo_aware"][s]["oscillations"], by["rl"][s]["oscillations"]]}
                       for s in seeds]
    print(json.dumps(out, default=float, indent=1))


if __name__ == "__main__":
    main()
