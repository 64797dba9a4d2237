"""The RL scaler's hand-written starts (scaler_cem.INITS) against slo_aware on whole ServeGen days, paired by day:
how a start's thresholds are chosen without the validation days (7-10), the test day (1) or the held-out days (11-14).
The default days are the training days 2-6. (docs/autoscaling.md, "The hold" in "What limits it".)

    PYTHONPATH=src python benchmarks/scaler-inits-on-days.py [--inits calm_lift,calm_hold] [--days 2-6] [--seeds 0] \\
        [--variant NAME=INIT:OUT:FEATURE=VALUE[,OUT:FEATURE=VALUE...]] [--rule-params JSON] ...

``--rule-params '{"upscale_window_s": 60}'``: the candidates correct slo_aware with those parameters, and that
slo_aware is a candidate too ("rule+params"); the baseline is always slo_aware's defaults (docs/autoscaling-log.md,
"The rule's one-epoch spikes"). A variant is an init with the named parameters set (e.g.
``share10=calm_hold:4:10=0,4:8=20,4:b=-2``: the hold's gate open while the last hour was more than 10% calm). Prints, per candidate, the mean cost change, attainment
difference and oscillations added against slo_aware with 95% intervals over the runs (paired by day and seed), and
each run's figures. About 30 s of one core per whole-day run (2026-12-04: the rule and 5 candidates on days 2-6 in
430 s on 2 CPUs).
"""

import argparse
import json
import os


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inits", default="calm_lift,calm_hold")
    ap.add_argument("--days", default="2-6", help="1-based ServeGen days, as A-B or A,B,C")
    ap.add_argument("--seeds", default="0", help="run seeds, as A,B,C: one whole-day run per day and seed")
    ap.add_argument("--variant", action="append", default=[], help="NAME=INIT:OUT:FEATURE=VALUE[,...]")
    ap.add_argument("--rule-params", default="{}",
                    help='JSON: slo_aware\'s parameters under the candidates (e.g. \'{"upscale_window_s": 60}\'); '
                         'given, slo_aware with them is a candidate too ("rule+params"). The baseline stays slo_aware')
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.execution import run_tasks
    from fleetwise.learn import scaler_cem as S
    from fleetwise.metrics.stats import mean_ci, paired_change
    from fleetwise.platform.windows import DAY
    from fleetwise.scenario import SCENARIO_DIR, read_yaml

    from fleetwise.learn.scaler_cem import parse_days

    try:
        days = [d + 1 for d in parse_days(a.days)]  # (1-based, as given)
    except ValueError as e:
        ap.error(f"--days {e}")
    rule_params = json.loads(a.rule_params)
    if not isinstance(rule_params, dict):
        ap.error("--rule-params: expected a JSON object")
    cands = {"rule+params": None} if rule_params else {}
    cands |= {n: S.init_params(n) for n in a.inits.split(",") if n}
    for v in a.variant:
        name, _, spec = v.partition("=")
        init, _, sets = spec.partition(":")
        p = S.init_params(init)
        for item in sets.split(","):
            key, _, val = item.rpartition("=")
            p[S.free_index([key], S.INIT_OUTPUTS[init])[0]] = float(val)
        cands[name] = p
    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    seeds = [int(x) for x in a.seeds.split(",")]
    wins = [(d - 1, 0.0, sd) for d in days for sd in seeds]
    keys = [f"{d}#{sd}" if len(seeds) > 1 else str(d) for d in days for sd in seeds]
    items = [(base, w, DAY, None, {}) for w in wins]
    items += [(base, w, DAY, p, rule_params) for p in cands.values() for w in wins]
    flat = run_tasks(S.window_run, items, workers=a.workers)
    n = len(wins)
    rule = flat[:n]
    out = {"days": days, "seeds": seeds, "rule_params": rule_params}
    for k, name in enumerate(cands, start=1):
        runs = flat[k * n:(k + 1) * n]
        ch = paired_change({d: r["cost_per_mtok_usd"] for d, r in zip(keys, rule)},
                           {d: r["cost_per_mtok_usd"] for d, r in zip(keys, runs)})
        da = mean_ci([100 * (r["slo_attainment"] - q["slo_attainment"]) for r, q in zip(runs, rule)])
        do = mean_ci([r["oscillations"] - q["oscillations"] for r, q in zip(runs, rule)])
        out[name] = {
            "cost_per_mtok_change_pct": [round(100 * v, 2) for v in (ch.mean, ch.lo, ch.hi)],
            "slo_attainment_diff_points": [round(v, 3) for v in (da.mean, da.lo, da.hi)],
            "oscillations_added_per_run": [round(v, 1) for v in (do.mean, do.lo, do.hi)],
            "lost_requests": sum(r["lost_requests"] for r in runs),
            "per_day": {d: [round(100 * (r["cost_per_mtok_usd"] / q["cost_per_mtok_usd"] - 1), 2),
                            round(100 * (r["slo_attainment"] - q["slo_attainment"]), 3),
                            r["oscillations"] - q["oscillations"]] for d, r, q in zip(keys, runs, rule)}}
    print(json.dumps(out, default=float, indent=1))


if __name__ == "__main__":
    main()
