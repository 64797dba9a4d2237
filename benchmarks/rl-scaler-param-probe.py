"""The RL scaler's parameters moved one at a time, judged on ServeGen days 7-10 (the validation days, in turn): ``--windows``
windows of ``--hours`` hours drawn as the validation's (seed 200) and as many as the gate's (seed 300), paired with
slo_aware on each window. What does a parameter of a checkpoint move? (No test day is read.) The defaults, 4 + 4
two-hour windows, are the full budget's validation and gate before they moved to whole days (on 2 CPUs, the start,
the checkpoint and two variants took 52 s).

    PYTHONPATH=src python benchmarks/rl-scaler-param-probe.py --checkpoint results/platform-rl/platform/rl_scaler.npz \
        [--variant NAME=OUT:FEATURE=VALUE[,OUT:FEATURE=VALUE...]] ... [--hours 2] [--windows 4]

Each variant is the checkpoint with the named parameters set ("0:b": a[0]'s bias, "0:11": a[0]'s weight on
feature 11; scaler_cem.free_index's names). The start (``calm_lift``) and the checkpoint itself are always run.
Prints one line per candidate: log cost ratio, attainment difference, oscillations added, lost requests, on the
validation windows, the gate windows and all eight.
"""

import argparse
import json
import os
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--variant", action="append", default=[], help="NAME=OUT:FEATURE=VALUE[,...]")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.execution import run_tasks
    from fleetwise.learn import scaler_cem as S
    from fleetwise.scenario import SCENARIO_DIR, read_yaml
    from fleetwise.workload.readers import cached_servegen

    z = np.load(a.checkpoint)  # (a numpy archive of arrays: nothing is unpickled)
    kept = np.concatenate([z["layer0_w"].ravel(), z["layer0_b"]]).astype(np.float64)
    outputs = len(z["layer0_b"])
    cands = {"start (calm_lift)": S.init_params("calm_lift"), "checkpoint": kept}
    for v in a.variant:
        name, _, spec = v.partition("=")
        p = kept.copy()
        for item in spec.split(","):
            key, _, val = item.rpartition("=")
            p[S.free_index([key], outputs)[0]] = float(val)
        cands[name] = p
    cfg = S.ScalerCEMConfig(**S.CEM_BUDGETS["full"] | {"window_s": a.hours * 3600.0})
    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    t0 = time.perf_counter()
    with cached_servegen():
        parts = {"validation": S.windows(cfg.val_days, a.windows, cfg.window_s, 200, in_turn=True),
                 "gate": S.windows(cfg.val_days, a.windows, cfg.window_s, 300, in_turn=True)}
        wins = [w for ws in parts.values() for w in ws]
        allw = S._Windows(base, wins, cfg, lambda items: run_tasks(S.window_run, items, workers=a.workers),
                          cfg.window_s)
        runs = allw.runs(list(cands.values()))
    n = a.windows
    for name, r in zip(cands, runs):
        out = {}
        for part, sl in (("validation", slice(0, n)), ("gate", slice(n, None)), ("all", slice(None))):
            out[part] = {k: round(v, 4) for k, v in S.compare_runs(r[sl], allw.rule[sl]).items()}
        print(name, json.dumps(out), flush=True)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
