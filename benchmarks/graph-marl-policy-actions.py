"""What a Graph-MARL checkpoint's networks do: one validation segment (seed 500, 5 minutes) replayed with the
networks as saved (the last update's, not the chosen ones), each epoch's most likely allowed correction per agent;
prints how often each correction was chosen, the mean probability of the chosen one, and the Lagrange multipliers.
Quoted in docs/graph-marl.md ("Smaller updates": why a failed run stays failed). Seconds.

Usage: python benchmarks/graph-marl-policy-actions.py CHECKPOINT.pt"""

from __future__ import annotations

import sys

import numpy as np
import torch

from fleetwise.envs.graph_marl import make_env
from fleetwise.learn.graph_marl import AGENTS, _dist_stats, _masks, _sizes, build_networks, load_checkpoint
from fleetwise.worlds.multicloud import GraphMARLConfig


def main() -> None:
    ck = load_checkpoint(sys.argv[1])
    env = make_env(GraphMARLConfig(), split="validation", duration_s=300.0)
    a = ck["args"]
    nets = build_networks(a["kind"], env.layout, _sizes(env), env.state_dim, a["hidden"], a["gnn_layers"])
    nets.load_state_dict(ck["nets"])
    nets.eval()
    obs, _ = env.reset(seed=500)
    counts = {ag: np.zeros(_sizes(env)[ag][1], int) for ag in AGENTS}
    top = {ag: [] for ag in AGENTS}
    while env.agents:
        o = obs[AGENTS[0]]
        x, ea = torch.as_tensor(o["x"]).unsqueeze(0), torch.as_tensor(o["edge_attr"]).unsqueeze(0)
        mk = _masks(env)
        with torch.no_grad():
            lg = nets.logits(x, ea)
            acts, _, _ = _dist_stats(lg, masks=mk)
        for ag in AGENTS:
            np.add.at(counts[ag], acts[ag][0].numpy().ravel(), 1)
            top[ag].append(float(torch.softmax(lg[ag].masked_fill(~mk[ag], -1e9), -1)[0].max(-1).values.mean()))
        obs, _, _, _, _ = env.step({ag: acts[ag][0].numpy() for ag in AGENTS})
    print(f"{sys.argv[1]}: update {ck['update']}; corrections chosen (count per index, 0 = the rule's decision)")
    for ag in AGENTS:
        print(f"  {ag:7s} {counts[ag].tolist()}  mean probability of the chosen one {np.mean(top[ag]):.3f}")
    print("  multipliers (per class):", [round(g["lam"], 1) for g in ck["lagrange"]])


if __name__ == "__main__":
    main()
