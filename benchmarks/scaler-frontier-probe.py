"""What fixed corrections of slo_aware buy on the platform scenario's test day (docs/autoscaling.md, "RL scaler"):
the cost / SLO attainment trade-off a learned correction has to beat. Each variant runs the whole of ServeGen day 1
(seed 0 unless --seeds) through the same CorrectedSLOAware the RL scaler runs, paired with slo_aware itself.

    PYTHONPATH=src python benchmarks/scaler-frontier-probe.py [--seeds 0,1] [--workers 2]

About 3 minutes of one core per whole-day run (9 variants per seed)."""

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

VARIANTS = {  # name: (slo_aware parameters, {"o.i": weight | "o.b": bias} of the linear correction)
    "slo_aware": ({}, None),
    "zero correction": ({}, {}),
    "headroom 0": ({"headroom": 0.0}, None),
    "need x 0.74 (a0 = -1)": ({}, {"0.b": -1.0}),
    "no N+1 below 0.2 replicas of need": ({}, {"1.b": 1.0, "1.1": -20.0}),
    "no N+1 below 0.8 replicas of need": ({}, {"1.b": 1.0, "1.1": -5.0}),  # (feature 1 is need in replicas / 4)
    "no N+1 below 2 replicas of need": ({}, {"1.b": 1.0, "1.1": -2.0}),
    "no N+1 below 4 replicas of need": ({}, {"1.b": 1.0, "1.1": -1.0}),
    "no N+1 ever": ({}, {"1.b": 1.0}),
}


def one(args):
    name, seed = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.policies.scaler_correction import N_FEATURES, CorrectedSLOAware, LinearCorrection
    from fleetwise.reproduce.platform import DAY, windowed
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    params, spec = VARIANTS[name]
    if spec is None:
        scaler = {"name": "slo_aware", **params}
    else:
        w, b = np.zeros((2, N_FEATURES)), np.zeros(2)
        for k, v in spec.items():
            o, i = k.split(".")
            if i == "b":
                b[int(o)] = v
            else:
                w[int(o), int(i)] = v
        scaler = CorrectedSLOAware(LinearCorrection(w, b), **params)
    s = run_platform(parse_scenario(windowed(base, 0.0, DAY)), seed, scaler=scaler, monitor=False).summary
    return name, seed, {k: s[k] for k in ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    with ProcessPoolExecutor(a.workers) as ex:
        res = list(ex.map(one, [(n, s) for n in VARIANTS for s in seeds]))
    by = {(n, s): r for n, s, r in res}
    for n in VARIANTS:
        rs = [by[n, s] for s in seeds]
        ref = [by["slo_aware", s] for s in seeds]
        dc = np.mean([r["cost_per_mtok_usd"] / q["cost_per_mtok_usd"] - 1 for r, q in zip(rs, ref)])
        da = np.mean([r["slo_attainment"] - q["slo_attainment"] for r, q in zip(rs, ref)])
        do = np.mean([r["oscillations"] - q["oscillations"] for r, q in zip(rs, ref)])
        print(json.dumps({"variant": n, "seeds": seeds, "cost_per_mtok_change": round(float(dc), 4),
                          "slo_attainment_diff_points": round(float(da) * 100, 3), "oscillations_added": float(do),
                          "lost": sum(r["lost_requests"] for r in rs)}))


if __name__ == "__main__":
    main()
