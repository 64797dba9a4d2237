"""What the Graph-MARL input guard reads (docs/graph-marl.md, "The run-time monitor"): the share of long requests
(over 1,500 prompt + output tokens) among each 30-s epoch's arrivals (`worlds.multicloud.epoch_long_share`), as
quantiles over the epochs of the training segments a default training run draws (seed 0, 400 updates: the guard's
threshold is their maximum), the validation and held-out test segments, and arXiv and Mooncake at load 0.7, with
the share of epochs above the threshold. Workloads only: nothing is simulated.

Usage: PYTHONPATH=src python benchmarks/graph-marl-long-share-probe.py [TRAIN_SEED]   (about 30 s)
"""

from __future__ import annotations

import sys

import numpy as np

from fleetwise.learn.graph_marl import training_episode_seeds
from fleetwise.reproduce.graph_marl import _budget, _train_args
from fleetwise.workload.spec import load_trace
from fleetwise.worlds.multicloud import GraphMARLConfig, epoch_long_share, multicloud_workload


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    cfg = GraphMARLConfig()
    bud = _budget(False)
    args = _train_args(bud, "graph", seed)

    def shares(ws) -> np.ndarray:
        out = np.concatenate([epoch_long_share(w, cfg.epoch_s) for w in ws])
        return out[np.isfinite(out)]

    train = shares(multicloud_workload(cfg, np.random.default_rng(s), False, args.train_segment_s)
                   for s in training_episode_seeds(args, args.updates))
    thr = float(train.max())
    sets = {f"training segments (seed {seed}, {args.updates} updates)": train,
            "validation segments (500-504)": shares(multicloud_workload(cfg, np.random.default_rng(s), False,
                                                                        args.train_segment_s, split="validation")
                                                    for s in range(500, 500 + bud["val_seeds"])),
            "test segments (1000-1009)": shares(multicloud_workload(cfg, np.random.default_rng(s), True)
                                                for s in range(1000, 1010))}
    for name in ("arxiv-summarization", "mooncake"):
        tr = load_trace(name)
        sets[f"{name} @0.7 (1000-1009)"] = shares(multicloud_workload(cfg, np.random.default_rng(s), True, trace=tr,
                                                                      load=0.7) for s in range(1000, 1010))
    print(f"threshold (the training epochs' highest share): {thr:.3f}")
    print("| epochs | count | p5 / p50 / p95 | max | above the threshold |")
    print("|---|---:|---|---:|---:|")
    for name, x in sets.items():
        q = np.percentile(x, [5, 50, 95])
        print(f"| {name} | {len(x)} | {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f} | {x.max():.3f} | "
              f"{(x > thr).mean():.0%} |")


if __name__ == "__main__":
    main()
