"""The frontier probe's hand-set corrections with memory on the RL scaler's own windows (docs/autoscaling.md, "Why
the learned policy does not find even that"): the full budget's 4 training windows (ServeGen days 2-6), its 4
validation windows and its 4 gate windows (days 7-10, in turn), each paired with slo_aware, as the CEM search scores them:
mean log cost-per-token ratio, mean SLO attainment difference, oscillations added over the windows.

    PYTHONPATH=src python benchmarks/scaler-calm-on-cem-windows.py ["NAME|NAME"]

NAME: a "calm" variant of benchmarks/scaler-frontier-probe.py (default: the two "calm 20 min, restore at 0.7
replicas, 60 min between lifts" variants). About 1 minute on 2 cores."""

import importlib.util
import math
import os
import sys
from pathlib import Path

import numpy as np

PROBE = Path(__file__).with_name("scaler-frontier-probe.py")
DEFAULT = ("calm 20 min, restore at 0.7 replicas, 60 min between lifts, 15-min hold|"
           "calm 20 min, restore at 0.7 replicas, 60 min between lifts")


def run_one(item):
    base, (day, start, seed), window_s, name = item
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.platform.windows import windowed
    from fleetwise.run import run_platform
    from fleetwise.scenario import parse_scenario
    from fleetwise.workload.readers import cached_servegen

    if name is None:
        scaler = {"name": "slo_aware"}
    else:
        spec = importlib.util.spec_from_file_location("probe", PROBE)
        probe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(probe)
        scaler = probe.calm_lift(**probe.CALM[name])
    sc = parse_scenario(windowed(base, start, start + window_s, day=day), where="platform window")
    with cached_servegen():
        s = run_platform(sc, seed, scaler=scaler, monitor=False).summary
    return {k: float(s[k]) for k in ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests")}


def main() -> None:
    from fleetwise.execution import run_tasks
    from fleetwise.learn.scaler_cem import CEM_BUDGETS, TRAIN_DAYS, VAL_DAYS, ScalerCEMConfig, windows
    from fleetwise.scenario import SCENARIO_DIR, read_yaml

    names = (sys.argv[1] if len(sys.argv) > 1 else DEFAULT).split("|")
    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    cfg = ScalerCEMConfig(train_days=list(TRAIN_DAYS), val_days=list(VAL_DAYS), **CEM_BUDGETS["full"])
    sets = {"train": windows(cfg.train_days, cfg.train_windows, cfg.window_s, 100 + cfg.seed),  # as _train draws them
            "validation": windows(cfg.val_days, cfg.val_windows, cfg.window_s, 200, in_turn=True),
            "gate": windows(cfg.val_days, cfg.gate_windows, cfg.window_s, 300, in_turn=True)}
    for sname, wins in sets.items():
        res = run_tasks(run_one, [(base, w, cfg.window_s, n) for n in [None, *names] for w in wins], backend="local",
                        workers=2)
        k = len(wins)
        rule = res[:k]
        for i, n in enumerate(names):
            r = res[(i + 1) * k:(i + 2) * k]
            per = [round(100 * (a["cost_per_mtok_usd"] / b["cost_per_mtok_usd"] - 1), 1) for a, b in zip(r, rule)]
            lc = np.mean([math.log(a["cost_per_mtok_usd"] / b["cost_per_mtok_usd"]) for a, b in zip(r, rule)])
            da = np.mean([a["slo_attainment"] - b["slo_attainment"] for a, b in zip(r, rule)])
            do = sum(a["oscillations"] - b["oscillations"] for a, b in zip(r, rule))
            print(f"{sname}: {n}: cost per window {per} %, mean log ratio {lc:.4f}, attainment {100 * da:+.3f} pt, "
                  f"oscillations added {do:+g} (the rule's: {sum(b['oscillations'] for b in rule):g}), "
                  f"lost {sum(a['lost_requests'] for a in r):g}", flush=True)


if __name__ == "__main__":
    main()
