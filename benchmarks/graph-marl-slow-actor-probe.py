"""Does Graph-MARL's GNN actor learn when training is not stopped early? One Graph-MARL training job at the full
budget (100 MAPPO updates x 4 episodes, the 5 validation segments of `reproduce graph-marl`), with the recipe's
arguments overridden from the command line; prints the validation curve (episodes, score), the gate on validation
and the multipliers. Quoted in docs/graph-marl.md. About 5 minutes of CPU per run.

Usage: python benchmarks/graph-marl-slow-actor-probe.py NAME '{"patience": 20}'
       python benchmarks/graph-marl-slow-actor-probe.py NAME '{"patience": 20, "bc_target": 0.7}'
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from fleetwise.learn.graph_marl import MAPPOArgs, ValidationWindows, train_job
from fleetwise.worlds.multicloud import GraphMARLConfig


def main() -> None:
    name, over = sys.argv[1], json.loads(sys.argv[2])
    cfg = GraphMARLConfig()
    val = ValidationWindows(cfg, range(500, 505), MAPPOArgs().train_segment_s)
    args = MAPPOArgs(kind="graph", updates=100, episodes_per_update=4, **over)
    r = train_job({"name": name, "cfg": cfg, "args": asdict(args), "ckpt": f"/tmp/graph-marl-probe-{name}.pt",
                   "validation": val})
    info = r["info"]
    print(name, "updates", info["update"], "early stopped", info["early_stopped"], "best step", info["best_step"])
    print("validation", [(a, round(b, 3)) for a, b in info["validation_curve"]])
    print("gate", (info["validation"] or {}).get("gate"))
    print("multipliers", [(round(g["target"], 3), round(g["lam"], 3)) for g in info["lagrange"]])


if __name__ == "__main__":
    main()
