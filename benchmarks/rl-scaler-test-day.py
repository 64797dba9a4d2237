"""RL scaler checkpoints against slo_aware on one whole ServeGen day (default: day 1, the test day of ``reproduce
platform``) over more seeds than ``reproduce platform``'s 5, paired by seed: the same runs (seeds 0, 1, ... of
that day; the first 5 are reproduce platform's), to narrow the intervals. docs/autoscaling-log.md ("On more seeds").

    PYTHONPATH=src python benchmarks/rl-scaler-test-day.py --seeds 20 \\
        --checkpoint default=results/platform-rl-calm_price_hold/platform/rl_scaler.npz \\
        [--checkpoint NAME=PATH ...] [--day 1] [--json OUT]

Prints, per checkpoint, the change of cost per million tokens and of oscillations (paired_change) and the SLO
attainment difference in points (bootstrap over seeds) against slo_aware, mean [95% CI], and the requests lost;
then the mean figures of each scaler. About 50 s of one core per whole-day run (2026-12-05: 3 scalers x 20 seeds
in 24 min 13 s on 2 CPUs).
"""

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor

KEYS = ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests")


def one(args):
    name, path, day, seed = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.platform.windows import DAY, windowed
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    scaler = {"name": "slo_aware"} if path is None else {"name": "rl", "checkpoint": path}
    sc = parse_scenario(windowed(base, 0.0, DAY, day=day - 1), where=f"ServeGen day {day}")
    s = run_platform(sc, seed, scaler=scaler, monitor=False).summary
    return name, seed, {k: float(s[k]) for k in KEYS}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", action="append", required=True, help="NAME=PATH of an RL scaler checkpoint")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--day", type=int, default=1, help="1-based ServeGen day")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="", help="write every run's figures here")
    a = ap.parse_args()
    cks = dict(c.partition("=")[::2] for c in a.checkpoint)
    if any(not p for p in cks.values()):
        ap.error("--checkpoint: expected NAME=PATH")
    from fleetwise.metrics.stats import mean_ci, paired_change

    seeds = list(range(a.seeds))
    names = {"slo_aware": None} | cks
    with ProcessPoolExecutor(a.workers) as ex:
        rows = list(ex.map(one, [(n, p, a.day, s) for s in seeds for n, p in names.items()]))
    by = {(n, s): r for n, s, r in rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{n}|{s}": r for (n, s), r in by.items()}, f, indent=1)
    rule = {s: by[("slo_aware", s)] for s in seeds}
    for n in cks:
        ch = paired_change({s: rule[s]["cost_per_mtok_usd"] for s in seeds}, {s: by[(n, s)]["cost_per_mtok_usd"] for s in seeds})
        da = mean_ci([100 * (by[(n, s)]["slo_attainment"] - rule[s]["slo_attainment"]) for s in seeds])
        oc = paired_change({s: rule[s]["oscillations"] for s in seeds}, {s: by[(n, s)]["oscillations"] for s in seeds})
        print(f"{n} vs slo_aware, day {a.day}, {len(seeds)} seeds: cost per M tokens {ch.mean:+.1%} [{ch.lo:+.1%}, "
              f"{ch.hi:+.1%}]; SLO attainment {da.mean:+.3f} [{da.lo:+.3f}, {da.hi:+.3f}] points; oscillations "
              f"{oc.mean:+.1%} [{oc.lo:+.1%}, {oc.hi:+.1%}]; lost {sum(by[(n, s)]['lost_requests'] for s in seeds):g}")
    for n in names:
        print(n, {k: round(sum(by[(n, s)][k] for s in seeds) / len(seeds), 4) for k in KEYS})


if __name__ == "__main__":
    main()
