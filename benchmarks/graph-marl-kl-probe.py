"""How far one MAPPO update moves each agent's policy: the first UPDATES updates of a learned variant of `reproduce
graph-marl` at the full budget (the same arguments as `benchmarks/graph-marl-full.sh`, validation included), then
each update's approximate KL divergence from the rollout's policy, per agent's joint action (Stable-Baselines3's
estimate, measured before each gradient step; the last one of the update is kept: `info["kl"]`) and the gradient
steps taken, and the validation score every 5 updates. Quoted in docs/graph-marl.md ("Smaller updates"). About 3 s
of one CPU per update. The floating-point kernels are pinned at import (fleetwise/floats.py, since 2e9fc6a; the
runs quoted before it used the host's own): `FLEETWISE_NATIVE_KERNELS=1` before the command runs the host's.

Usage: python benchmarks/graph-marl-kl-probe.py KIND SEED UPDATES [TARGET_KL|none]
(KIND: graph, flat or ippo; TARGET_KL defaults to the variant's full-budget value, none)."""

from __future__ import annotations

import fleetwise  # noqa: F401  (first: pins the kernels before numpy and torch load, fleetwise/floats.py)

import os
import sys
from dataclasses import asdict, replace

import numpy as np

from fleetwise.learn.graph_marl import MAPPOArgs, ValidationWindows, train_job
from fleetwise.reproduce.graph_marl import _budget, _train_args
from fleetwise.worlds.multicloud import GraphMARLConfig


def main() -> None:
    kind, seed, updates = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    bud = _budget(False)
    args = replace(_train_args(bud, kind, seed), updates=updates)
    if len(sys.argv) > 4:
        args = replace(args, target_kl=None if sys.argv[4] == "none" else float(sys.argv[4]))
    cfg = GraphMARLConfig()
    val = ValidationWindows(cfg, range(500, 500 + bud["val_seeds"]), MAPPOArgs().train_segment_s)
    native = "-native" if os.environ.get("FLEETWISE_NATIVE_KERNELS") else ""  # (other kernels: own checkpoint)
    ckpt = f"/tmp/graph-marl-kl-probe-{kind}-s{seed}-u{updates}-kl{args.target_kl}{native}.pt"
    r = train_job({"name": kind, "cfg": cfg, "args": asdict(args), "ckpt": ckpt, "validation": val})
    kl = r["info"]["kl"]
    print(f"{kind} seed {seed}, learning rate {args.learning_rate}, target_kl {args.target_kl}, {updates} updates")
    print("update: largest agent KL (nats) / gradient steps")
    print("  ".join(f"{i}: {k:.3f}/{s}" for i, (k, s) in enumerate(kl)))
    ks = np.array([k for k, _ in kl])
    print(f"median {np.median(ks):.3f}, max {ks.max():.3f} (update {int(ks.argmax())}), updates above 0.5: "
          f"{int((ks > 0.5).sum())}, stopped early: {sum(s < args.n_epochs for _, s in kl)}")
    curve = r["info"]["validation_curve"]
    per = curve[1][0] // args.val_every if len(curve) > 1 else 1  # environment steps per update
    print("validation score by update:", "  ".join(f"{int(st // per)}: {v:.3f}" for st, v in curve))


if __name__ == "__main__":
    main()
