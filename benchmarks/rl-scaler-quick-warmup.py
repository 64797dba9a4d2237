"""Did a warm-up change what ``reproduce platform --quick`` showed for the RL scaler while it evaluated
09:30-11:30 (docs/autoscaling-log.md, "A quick window with calm hours")? That window (day 1, the zone outage) starts
cold: no replica history, no scaler memory. Here each run starts at ``--starts`` hours instead and only that window
is counted: the cost accrued from 09:30 (the monitor's cumulative cost per group) per million tokens of the requests
that arrived from 09:30 and completed, and the scaling reversals from 09:30. slo_aware and the checkpoint, 5 seeds,
paired by seed.

    PYTHONPATH=src python benchmarks/rl-scaler-quick-warmup.py --checkpoint results/platform-rl/platform/rl_scaler.npz \\
        [--starts 9.5,7.5] [--seeds 5]

(About 1 minute on 2 CPUs for the two starts.)"""

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

WINDOW = (9.5 * 3600.0, 11.5 * 3600.0)


def one(args):
    name, seed, start_h, checkpoint = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.platform.windows import windowed
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    ws = start_h * 3600.0
    sc = parse_scenario(windowed(base, ws, WINDOW[1], day=0), where="platform window")
    scaler = {"name": "slo_aware"} if name == "slo_aware" else {"name": "rl", "checkpoint": checkpoint}
    p = run_platform(sc, seed, scaler=scaler, monitor=True)
    t0 = WINDOW[0] - ws  # the quick window's start, in the run's clock
    tab = p.monitor.table()
    t, cost, grp = np.asarray(tab["time_s"], float), np.asarray(tab["cost_usd"], float), np.asarray(tab["group"])
    spent = 0.0
    for g in set(grp.tolist()):
        m = grp == g
        spent += cost[m][-1] - (np.interp(t0, t[m], cost[m]) if t0 > 0 else 0.0)
    r = p.records
    done = r.completed & (r.arrival_s >= t0)
    tokens = float((r.prompt_tokens + r.output_tokens)[done].sum())
    return name, seed, start_h, spent / tokens * 1e6, sum(1 for ft, _ in p.flap_log if ft >= t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--starts", default="9.5,7.5", help="hours of day 1 at which the runs start (<= 9.5)")
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    starts = [float(x) for x in a.starts.split(",")]
    if any(not 0.0 <= s <= WINDOW[0] / 3600.0 for s in starts):
        ap.error(f"--starts {a.starts}: expected hours from 0 to {WINDOW[0] / 3600:g}")
    from fleetwise.metrics.stats import paired_change

    jobs = [(n, s, h, a.checkpoint) for h in starts for n in ("slo_aware", "rl") for s in range(a.seeds)]
    with ProcessPoolExecutor(2) as ex:
        rows = list(ex.map(one, jobs))
    by = {(n, s, h): (c, f) for n, s, h, c, f in rows}
    for h in starts:
        ch = paired_change({s: by["slo_aware", s, h][0] for s in range(a.seeds)},
                           {s: by["rl", s, h][0] for s in range(a.seeds)})
        fr = np.mean([by["rl", s, h][1] for s in range(a.seeds)])
        fs = np.mean([by["slo_aware", s, h][1] for s in range(a.seeds)])
        print(f"start {h:g} h: cost per M tokens 09:30-11:30, rl vs slo_aware {ch.mean:+.2%} "
              f"[{ch.lo:+.2%}, {ch.hi:+.2%}]; reversals from 09:30 {fr:.1f} against {fs:.1f}")


if __name__ == "__main__":
    main()
