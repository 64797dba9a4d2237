"""Does Graph-MARL's GNN actor learn when training is not stopped early? One Graph-MARL training job at the full
budget (100 MAPPO updates x 4 episodes, the 5 validation segments of `reproduce graph-marl`), with the recipe's
arguments overridden from the command line; prints the validation curve (episodes, score), the gate on validation
and the multipliers. Quoted in docs/graph-marl.md. About 5 minutes of CPU per run.

Usage: python benchmarks/graph-marl-slow-actor-probe.py NAME '{"patience": 20}'
       python benchmarks/graph-marl-slow-actor-probe.py NAME '{"patience": 40, "updates": 200, "bc_target": 0.7}'
       python benchmarks/graph-marl-slow-actor-probe.py NAME '{"updates": 200, "bc_target": 0.7, "patience": 40,
                                                              "val_segments": 10, "p99_per_segment": true}'
       python benchmarks/graph-marl-slow-actor-probe.py NAME --test   (the chosen checkpoint of run NAME on the
                                                                       10 held-out test segments, against static)
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from fleetwise.learn.graph_marl import MAPPOArgs, ValidationWindows, train_job
from fleetwise.worlds.multicloud import GraphMARLConfig


def test(name: str) -> None:
    import numpy as np

    from fleetwise.envs.graph_marl import evaluate
    from fleetwise.learn.graph_marl import load_trained
    from fleetwise.metrics.stats import paired_change

    cfg = GraphMARLConfig()
    seeds = list(range(1000, 1010))
    st = {r["seed"]: r for r in evaluate(cfg, "static", seeds)}
    rows = {r["seed"]: r for r in evaluate(cfg, load_trained(f"/tmp/graph-marl-probe-{name}.pt", cfg), seeds)}
    print(name, "per segment P99 (policy / static):",
          [f"{rows[s]['latency_p99_s']:.2f}/{st[s]['latency_p99_s']:.2f}" for s in seeds])
    print(name, "per segment cost (policy / static):",
          [f"{rows[s]['cost_usd']:.1f}/{st[s]['cost_usd']:.1f}" for s in seeds])
    for k in ("latency_p99_s", "cost_usd", "slo_attainment"):
        ch = paired_change({s: st[s][k] for s in st}, {s: rows[s][k] for s in rows})
        print(name, k, round(float(np.mean([r[k] for r in rows.values()])), 3),
              f"vs static {ch.mean:+.1%} [{ch.lo:+.1%}, {ch.hi:+.1%}]")


def main() -> None:
    if sys.argv[2] == "--test":
        test(sys.argv[1])
        return
    name, over = sys.argv[1], json.loads(sys.argv[2])
    cfg = GraphMARLConfig()
    nval, per_seg = over.pop("val_segments", 5), over.pop("p99_per_segment", False)
    val = ValidationWindows(cfg, range(500, 500 + nval), MAPPOArgs().train_segment_s, p99_per_segment=per_seg)
    over.setdefault("updates", 100)
    args = MAPPOArgs(kind="graph", episodes_per_update=4, **over)
    r = train_job({"name": name, "cfg": cfg, "args": asdict(args), "ckpt": f"/tmp/graph-marl-probe-{name}.pt",
                   "validation": val})
    info = r["info"]
    print(name, "updates", info["update"], "early stopped", info["early_stopped"], "best step", info["best_step"])
    print("validation", [(a, round(b, 3)) for a, b in info["validation_curve"]])
    print("gate", (info["validation"] or {}).get("gate"))
    print("multipliers", [(round(g["target"], 3), round(g["lam"], 3)) for g in info["lagrange"]])


if __name__ == "__main__":
    main()
