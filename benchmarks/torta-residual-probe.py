"""What TORTA's residual action can buy over least_loaded, without learning: fixed actions of ResidualPlanner
(docs/torta-log.md, "What limits it (then)") on held-out days 1000-1002, paired by day against the zero action
(= least_loaded + affinity_greedy). About 1 min of one core.

Usage: PYTHONPATH=src python benchmarks/torta-residual-probe.py [TOPOLOGY ...]   (default: all four)
"""

import sys

import numpy as np

from fleetwise.policies.planners import ResidualPlanner
from fleetwise.worlds.torta import TortaConfig, build_replicas, evaluate, make_fleet

DAYS = [1000, 1001, 1002]


def fixed(a):
    def mk(c):
        p = ResidualPlanner(c)
        p.set_action(np.asarray(a, float), n=len(a) - 3)  # the n + 3 layout: one util weight for every request
        return p
    return mk


for topo in sys.argv[1:] or ["backbone", "grid", "random_geometric", "ring"]:
    cfg = TortaConfig(topology=topo)
    fleet = make_fleet(cfg)
    _, srv = build_replicas(cfg, fleet)
    n = len(fleet.names)
    rule = evaluate(cfg, ResidualPlanner, "affinity_greedy", DAYS)
    usd = np.bincount(srv.region, srv.gpu_usd_per_s, n) / srv.region_speed  # USD per token of capacity
    z = np.clip((usd - usd.mean()) / usd.std(), -3, 3)
    probes = {"rtt weight 1 (a_n=0.25)": np.r_[np.zeros(n), 0.25, 0, 0], "rtt weight 2 (a_n=0.5)": np.r_[np.zeros(n), 0.5, 0, 0],
              "completion weight 0.5": np.r_[np.zeros(n), 0, 0.25, 0], "completion weight 1": np.r_[np.zeros(n), 0, 0.5, 0],
              "cheap regions first, 0.2 s per sd": np.r_[np.clip(0.1 * z, -1, 1), 0, 0, 0],
              "cheap regions first, 0.6 s per sd": np.r_[np.clip(0.3 * z, -1, 1), 0, 0, 0],
              "pack onto busy regions, util weight -0.1": np.r_[np.zeros(n), 0, 0, -0.1],
              "pack onto busy regions, util weight -0.15": np.r_[np.zeros(n), 0, 0, -0.15],
              "spread by utilisation, util weight +0.1": np.r_[np.zeros(n), 0, 0, 0.1]}
    print(f"{topo}: least_loaded response {np.mean([r['response_time_mean_s'] for r in rule]):.2f} s, "
          f"cost {np.mean([r['cost_usd'] for r in rule]):.3f} USD per day")
    for name, a in probes.items():
        rows = evaluate(cfg, fixed(a), "affinity_greedy", DAYS)
        ch = {m: np.mean([x[m] / y[m] - 1 for x, y in zip(rows, rule)]) for m in ("response_time_mean_s", "cost_usd", "load_cv")}
        print(f"  {name:36s} response {ch['response_time_mean_s']:+.1%}  cost {ch['cost_usd']:+.1%}  load CV {ch['load_cv']:+.1%}",
              flush=True)
