"""Same seed, same numbers across hosts: a fingerprint of a short training run to compare between machines.

Runs the first UPDATES (default 10) MAPPO updates of Graph-MARL at the full budget's arguments (training seed 2,
validation every 5 updates; the same job as `benchmarks/graph-marl-kl-probe.py graph 2 UPDATES none`), then prints
the CPU kernels torch ran, the first and last update's KL divergence at full precision, the validation scores and
a SHA-256 of the trained networks' parameters. Two hosts that print the same hash trained the same networks, bit
for bit. With the kernels pinned at import (fleetwise/floats.py, the default) every x86-64 host with AVX2 should
print the hash quoted in docs/experiments.md ("Same seed, same numbers"); `FLEETWISE_NATIVE_KERNELS=1` prints the
host's own. About 45 s of one CPU.

Usage: python benchmarks/same-numbers.py [UPDATES]"""

from __future__ import annotations

import fleetwise  # noqa: F401  (first: pins the kernels before numpy and torch load)

import hashlib
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace

from fleetwise.learn.graph_marl import MAPPOArgs, ValidationWindows, load_checkpoint, train_job
from fleetwise.reproduce.graph_marl import _budget, _train_args
from fleetwise.worlds.multicloud import GraphMARLConfig


def main() -> None:
    updates = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    bud = _budget(False)
    args = replace(_train_args(bud, "graph", 2), updates=updates, target_kl=None)
    cfg = GraphMARLConfig()
    val = ValidationWindows(cfg, range(500, 500 + bud["val_seeds"]), MAPPOArgs().train_segment_s)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "same-numbers.pt")
        r = train_job({"name": "graph", "cfg": cfg, "args": asdict(args), "ckpt": ckpt, "validation": val})
        nets = load_checkpoint(ckpt)["nets"]
    wall = time.perf_counter() - t0
    h = hashlib.sha256()
    for k in sorted(nets):
        h.update(k.encode())
        h.update(nets[k].detach().cpu().numpy().tobytes())
    import torch

    kl = r["info"]["kl"]
    print(f"torch kernels: {torch.backends.cpu.get_cpu_capability()}; pinned: "
          f"{'no (FLEETWISE_NATIVE_KERNELS)' if os.environ.get('FLEETWISE_NATIVE_KERNELS') else 'yes'}")
    print(f"{updates} updates in {wall:.1f} s; KL at update 0: {kl[0][0]!r}, at update {len(kl) - 1}: {kl[-1][0]!r}")
    print("validation:", "  ".join(f"{st}: {v!r}" for st, v in r["info"]["validation_curve"]))
    print("networks sha256:", h.hexdigest())


if __name__ == "__main__":
    main()
