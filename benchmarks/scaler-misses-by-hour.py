"""Where an RL scaler checkpoint loses SLO attainment against slo_aware (docs/autoscaling.md, "What limits it"): one
whole ServeGen day of the platform scenario, the same seed for both, the requests that missed their SLO class's
TTFT or TPOT target (or did not complete) counted by arrival hour and by SLO class, and the checkpoint's extra
misses; and where it adds scaling reversals (oscillations), by model and hour, with the hours of its lifts of the
zone spread and of their restores.

    PYTHONPATH=src FLEETWISE_DATA=../shared/data python benchmarks/scaler-misses-by-hour.py \\
        --checkpoint results/platform-rl/platform/rl_scaler.npz [--day 1] [--seed 0]

About 30 s of one core per run, the two runs side by side.
"""

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor


def one(args: tuple) -> dict:
    scaler, day, seed = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np

    from fleetwise.platform.windows import DAY, windowed
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, build, parse_scenario, read_yaml
    from fleetwise.workload.slo import get_slo

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    sc = parse_scenario(windowed(base, 0.0, DAY, day=day - 1), where=f"ServeGen day {day}")
    classes = [get_slo(n) for n in build(sc, seed).workload.slo_classes]  # (the summary's SLO targets, by class)
    p = run_platform(sc, seed, scaler=scaler, monitor=False)
    r = p.records
    ttft = np.array([c.ttft_s for c in classes])[r.slo_class]
    tpot = np.array([c.tpot_s for c in classes])[r.slo_class]
    with np.errstate(invalid="ignore"):
        met = r.completed.astype(bool) & (r.ttft_s <= ttft) & (np.nan_to_num(r.tpot_s, nan=0.0) <= tpot)
    hour = np.minimum((r.arrival_s // 3600).astype(int), 23)
    reversals: dict[str, list[int]] = {}
    for t, m in p.flap_log:
        reversals.setdefault(m, [0] * 24)[min(int(t // 3600), 23)] += 1
    lifts: dict[str, dict[str, list[int]]] = {}
    for t, m, lifted in getattr(getattr(p.scaler, "correction", None), "lift_log", ()):  # (the rl scaler's)
        lifts.setdefault(m, {"lifted": [], "restored": []})["lifted" if lifted else "restored"].append(int(t // 3600))
    return {"slo_attainment": p.summary["slo_attainment"], "requests": int(len(met)),
            "cost_per_mtok_usd": p.summary["cost_per_mtok_usd"], "reversals_by_hour": reversals, "lifts": lifts,
            "misses_by_hour": np.bincount(hour, ~met, 24).astype(int).tolist(),
            "misses_by_class": {c.name: int((~met & (r.slo_class == k)).sum()) for k, c in enumerate(classes)},
            "requests_by_class": {c.name: int((r.slo_class == k).sum()) for k, c in enumerate(classes)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--day", type=int, default=1, help="1-based ServeGen day (1: the test day)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    jobs = [({"name": "slo_aware"}, a.day, a.seed), ({"name": "rl", "checkpoint": a.checkpoint}, a.day, a.seed)]
    with ProcessPoolExecutor(2) as ex:
        rule, rl = ex.map(one, jobs)
    print(json.dumps({
        "day": a.day, "seed": a.seed, "requests": rule["requests"],
        "slo_attainment": {"slo_aware": round(rule["slo_attainment"], 5), "rl": round(rl["slo_attainment"], 5)},
        "misses": {"slo_aware": sum(rule["misses_by_hour"]), "rl": sum(rl["misses_by_hour"])},
        "misses_by_class": {"slo_aware": rule["misses_by_class"], "rl": rl["misses_by_class"]},
        "requests_by_class": rule["requests_by_class"],
        "extra_misses_by_hour": [b - x for x, b in zip(rule["misses_by_hour"], rl["misses_by_hour"])],
        "extra_misses_by_class": {k: rl["misses_by_class"][k] - v for k, v in rule["misses_by_class"].items()},
        "cost_per_mtok_usd": {n: round(x["cost_per_mtok_usd"], 4) for n, x in (("slo_aware", rule), ("rl", rl))},
        "reversals": {n: {m: sum(h) for m, h in x["reversals_by_hour"].items()} for n, x in (("slo_aware", rule),
                                                                                              ("rl", rl))},
        "extra_reversals_by_hour": {m: [b - a for a, b in zip(rule["reversals_by_hour"].get(m, [0] * 24),
                                                               rl["reversals_by_hour"].get(m, [0] * 24))]
                                    for m in sorted(set(rule["reversals_by_hour"]) | set(rl["reversals_by_hour"]))},
        "rl_lifts_by_hour": rl["lifts"]}))


if __name__ == "__main__":
    main()
