"""Where a scaler's oscillations (reversals of a model's total target) and cost come from, per model: slo_aware and
the RL scaler's hand-written starts (scaler_cem.INITS) on whole ServeGen days or on a real trace over
reproduce platform --quick --eval-trace's window (09:30-11:30, the zone outage), one run each.
(docs/autoscaling-log.md, "Where the oscillation clause stands".)

    PYTHONPATH=src python benchmarks/scaler-oscillations-by-model.py [--where 1,7,azure-code@0.7] \\
        [--inits rule,calm_lift,calm_lift_only] [--seed 0]

``--where``: 1-based ServeGen days (a whole day each) and TRACE@LOAD windows. Prints one JSON line per run: total
oscillations, per model, the rises of each model's total target and how many of them were undone one scale-down
window later, cost per million tokens, SLO attainment and the cost (USD) by model.
"""

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor


def one(item: tuple) -> dict:
    where, seed, init = item
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.learn import scaler_cem as S
    from fleetwise.platform.windows import DAY, windowed, with_trace
    from fleetwise.policies import make
    from fleetwise.policies.scaler_correction import CorrectedSLOAware
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    if "@" in where:
        trace, _, load = where.rpartition("@")
        data, _ = with_trace(base, trace, float(load), 9.5 * 3600.0, 11.5 * 3600.0)
    else:
        data = windowed(base, 0.0, DAY, day=int(where) - 1)
    from fleetwise.platform.runner import Platform

    rule = S.ScalerCEMConfig().rule_params
    scaler = (make("scaler", S.RULE, dict(rule)) if init == "rule"
              else CorrectedSLOAware(S.params_policy(S.init_params(init)), **rule))
    changes: list = []  # (time, model, total target before, after): each change of a model's total target
    set_targets = Platform.set_targets

    def logged(self, targets):
        before = {m: sum(g.target for g in gs) for m, gs in self.model_groups.items()}
        set_targets(self, targets)
        for m, gs in self.model_groups.items():
            after = sum(g.target for g in gs)
            if after != before[m]:
                changes.append((self.sim.now, gs[0].model, before[m], after))

    Platform.set_targets = logged
    try:
        p = run_platform(parse_scenario(data, where=where), seed, scaler=scaler, monitor=False)
    finally:
        Platform.set_targets = set_targets
    s = p.summary
    # a rise undone one scale-down window later (the next change of the model's target, a fall, 300-330 s on):
    # a one-epoch need kept for the window (docs/autoscaling-log.md, "The rule's one-epoch spikes")
    window = float(rule.get("downscale_window_s", 300.0))
    rises, undone = {}, {}
    for k, (t, m, b, a) in enumerate(changes):
        if a <= b:
            continue
        rises[m] = rises.get(m, 0) + 1
        nxt = next((c for c in changes[k + 1:] if c[1] == m), None)
        if nxt is not None and nxt[3] < nxt[2] and window <= nxt[0] - t <= window + 30.0:
            undone[m] = undone.get(m, 0) + 1
    return {"where": where, "seed": seed, "scaler": init, "oscillations": s["oscillations"],
            "oscillations_by_model": p.flaps_by_model, "rises_by_model": rises,
            "rises_undone_after_the_window_by_model": undone,
            "cost_per_mtok_usd": round(s["cost_per_mtok_usd"], 4),
            "slo_attainment": round(s["slo_attainment"], 4),
            "cost_usd_by_model": {k: round(v, 1) for k, v in p.cost_breakdown()["model"].items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--where", default="1,azure-code@0.7")
    ap.add_argument("--inits", default="rule,calm_lift,calm_lift_only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    items = [(w, a.seed, i) for w in a.where.split(",") for i in a.inits.split(",")]
    with ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(one, items):
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
