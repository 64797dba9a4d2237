"""What the guard of TORTA's trained planners reads (docs/torta.md, "A guard on the share of long requests"): per
kind of day, the share of requests over 1,500 prompt + output tokens among those that arrived in the last K slots
(K = 1, 2, 3; the world reports it over the routed ones, ``SlotObs.long_share``, K = ``LONG_SHARE_SLOTS``), its
quantiles over the slots, and the share of slots above the highest value of 32 training days (8 iterations x 4
days at loads 0.45/0.55/0.7/0.45, seeds as a CEM run of training seed 0 draws them): the slots a guard with that
threshold hands to the rule. Workloads only, nothing simulated.

    PYTHONPATH=src python benchmarks/torta-long-share-probe.py [--topology grid]   (about 1 min on one core)
"""

import argparse
import importlib.util
from pathlib import Path

import numpy as np

KINDS = ("held-out", "held-out@0.7", "azure-conv", "mooncake", "arxiv-summarization")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="grid")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("shift", Path(__file__).with_name("torta-trace-shift-probe.py"))
    shift = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shift)
    from fleetwise.control.views import LONG_TOKENS
    from fleetwise.learn.torta_cem import TRAIN_SEED0
    from fleetwise.worlds.torta import HOURS, TortaConfig

    slot_s = TortaConfig(topology=a.topology).slot_s

    def shares(w, k):
        slot = np.minimum((w.arrival_s // slot_s).astype(int), HOURS - 1)
        long_ = np.bincount(slot, (w.prompt_tokens + w.output_tokens) > LONG_TOKENS, HOURS)
        n = np.bincount(slot, None, HOURS)
        return np.array([long_[max(0, s - k):s].sum() / n[max(0, s - k):s].sum()
                         for s in range(1, HOURS) if n[max(0, s - k):s].sum()])

    loads = (0.45, 0.55, 0.7, 0.45)
    train = [shift._day(a.topology, f"train@{loads[j]}", TRAIN_SEED0 + 100 * it + j)
             for it in range(1, 9) for j in range(4)]
    days = {kind: [shift._day(a.topology, kind, d) for d in shift.DAYS] for kind in KINDS}
    for k in (1, 2, 3):
        tr = np.concatenate([shares(w, k) for w in train])
        print(f"K = {k} slots: training days p5 / p50 / p95 {np.quantile(tr, [0.05, 0.5, 0.95]).round(3).tolist()}, "
              f"max {tr.max():.3f}")
        for kind, ws in days.items():
            s = np.concatenate([shares(w, k) for w in ws])
            print(f"  {kind:20s} p5 / p50 / p95 {np.quantile(s, [0.05, 0.5, 0.95]).round(3).tolist()}, "
                  f"above the training max: {np.mean(s > tr.max()):.0%} of slots")


if __name__ == "__main__":
    main()
