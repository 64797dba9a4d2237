"""The RL scaler against slo_aware on whole ServeGen days that nothing in its making used (docs/autoscaling.md):
training windows come from days 2-6, the choice and the gate from days 7-10 (day 7 alone until 2026-12-06), the test
of ``reproduce platform`` is day 1 (on which the frontier probe's hand-set corrections were also tried), so days 11-14
are held out from all of it. Each
day is the platform scenario's whole day with that day's ServeGen rates (same fleet, faults at the same hours), one
run per day and scaler, paired by day.

    PYTHONPATH=src python benchmarks/rl-scaler-heldout-days.py --checkpoint results/platform-rl/platform/rl_scaler.npz \\
        [--days 11-14] [--seed 0] [--probe "NAME|NAME"]

``--probe`` adds variants of benchmarks/scaler-frontier-probe.py (e.g. a hand-set correction with memory) for
comparison. ``rl_lifted_hours`` gives, per day, how many hours the checkpoint kept each model's N+1 zone spread
lifted (where its saving comes from). About 40-70 s of one core per whole-day run."""

import argparse
import importlib.util
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

KEYS = ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests")


def one(args):
    name, day, seed, checkpoint = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.platform.windows import DAY, windowed
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    if name == "slo_aware":
        scaler = {"name": "slo_aware"}
    elif name == "rl":
        scaler = {"name": "rl", "checkpoint": checkpoint}
    else:
        spec = importlib.util.spec_from_file_location("probe", Path(__file__).with_name("scaler-frontier-probe.py"))
        probe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(probe)
        scaler = probe.make_scaler(name)
    sc = parse_scenario(windowed(base, 0.0, DAY, day=day - 1), where=f"ServeGen day {day}")
    p = run_platform(sc, seed, scaler=scaler, monitor=False)
    row = {k: float(p.summary[k]) for k in KEYS}
    log = getattr(getattr(p.scaler, "correction", None), "lift_log", None)  # the rl scaler's lifts and restores
    if log is not None:
        row["lifted_hours"] = lifted_hours(log, DAY)
    return name, day, row


def lifted_hours(log, end_s: float) -> dict[str, float]:
    """Hours of the day each model's N+1 spread was lifted, from ``CorrectedSLOAware.lift_log`` ((time, model,
    lifted) at each lift and each restore); a spread still lifted at the end counts to ``end_s``."""
    since: dict[str, float] = {}
    out: dict[str, float] = {}
    for t, m, lifted in sorted(log, key=lambda e: e[0]):
        out.setdefault(m, 0.0)
        if lifted and m not in since:
            since[m] = t
        elif not lifted and m in since:
            out[m] += (min(t, end_s) - since.pop(m)) / 3600.0
    for m, t in since.items():
        out[m] += max(end_s - t, 0.0) / 3600.0
    return {m: round(h, 2) for m, h in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="", help="the RL scaler's checkpoint (none: slo_aware and --probe only)")
    ap.add_argument("--days", default="11-14", help="1-based ServeGen days, as A-B or A,B,C")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probe", default="", help="variants of the frontier probe, separated by |")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    from fleetwise.learn.scaler_cem import parse_days

    try:
        days = [d + 1 for d in parse_days(a.days)]  # (1-based, as given)
    except ValueError as e:
        ap.error(f"--days {e}")
    from fleetwise.metrics.stats import mean_ci, paired_change

    names = ["slo_aware"] + (["rl"] if a.checkpoint else []) + [p for p in a.probe.split("|") if p]
    if len(names) == 1:
        ap.error("give --checkpoint, --probe or both")
    with ProcessPoolExecutor(a.workers) as ex:
        rows = list(ex.map(one, [(n, d, a.seed, a.checkpoint) for n in names for d in days]))
    by = {n: {d: r for m, d, r in rows if m == n} for n in names}
    out = {"days": days, "seed": a.seed}
    for n in names:
        out[n] = {k: mean_ci([by[n][d][k] for d in days]).mean for k in KEYS}
    for n in names[1:]:
        ch = paired_change({d: by["slo_aware"][d]["cost_per_mtok_usd"] for d in days},
                           {d: by[n][d]["cost_per_mtok_usd"] for d in days})
        da = mean_ci([100 * (by[n][d]["slo_attainment"] - by["slo_aware"][d]["slo_attainment"]) for d in days])
        do = mean_ci([by[n][d]["oscillations"] - by["slo_aware"][d]["oscillations"] for d in days])
        out[f"{n}_vs_slo_aware"] = {
            "cost_per_mtok_change_pct": [round(100 * v, 2) for v in (ch.mean, ch.lo, ch.hi)],
            "slo_attainment_diff_points": [round(v, 3) for v in (da.mean, da.lo, da.hi)],
            "oscillations_added": [round(v, 1) for v in (do.mean, do.lo, do.hi)],
            "per_day": {d: [round(100 * (by[n][d]["cost_per_mtok_usd"] / by["slo_aware"][d]["cost_per_mtok_usd"] - 1), 2),
                            round(100 * (by[n][d]["slo_attainment"] - by["slo_aware"][d]["slo_attainment"]), 3),
                            by[n][d]["oscillations"] - by["slo_aware"][d]["oscillations"]] for d in days}}
        if all("lifted_hours" in by[n][d] for d in days):  # how long each model's spread was lifted, per day
            out[f"{n}_lifted_hours"] = {d: by[n][d]["lifted_hours"] for d in days}
    print(json.dumps(out, default=float, indent=1))


if __name__ == "__main__":
    main()
