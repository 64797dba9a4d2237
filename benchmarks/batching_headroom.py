"""How much the edge action space holds beyond the rule: fixed (state-independent) adjustments of offload_greedy,
and the ceiling (every request of a segment within its deadline). Quoted in docs/batching.md.

By default on the validation segments of `fleetwise reproduce batching --quick` (never the test segments; about
1 minute of CPU). With `--test N`: on the first N held-out test segments of `reproduce batching` (seeds 1000..),
the segments its tables report, to show how far from the ceiling the rule and a fixed adjustment are there (no
choice is made on them).

Usage: python benchmarks/batching_headroom.py [--test N]
"""

from __future__ import annotations

import numpy as np

from fleetwise.reproduce.batching import validation_windows
from fleetwise.worlds.edge import EdgeConfig, evaluate


class Fixed:
    """A fixed action (chunk index, offload index[, queue order index]) each decision; a masked choice falls back
    to the rule's."""

    stationary = False

    def __init__(self, view, fn):
        self.view, self.fn = view, fn

    def plan(self, lane):
        m = self.view.mask(lane)
        nc, no = len(self.view.cfg.chunk_sizes), 3
        c, o, *q = self.fn(self.view, lane)
        q = q[0] if q else 0
        return self.view.plan(lane, (c if m[c] else 0, o if m[nc + o] else 0, q if m[nc + no + q] else 0))


def offload_any(view, lane, margin_s=1.0) -> int:
    """The rule's offload test applied at every node, not only the slowest: 2 ("now") when it passes."""
    if lane.waiting and not lane.offloaded(lane.waiting[0]):
        to = view.offload_target(lane, lane.waiting[0])
        if to >= 0 and view.backlog_s(lane.replica, lane.time_s) > view.backlog_s(to, lane.time_s) + margin_s:
            return 2
    return 0


def test_segments(n: int) -> None:
    """The rule, its ceiling and the best fixed adjustments on the first ``n`` test segments (paired changes)."""
    from fleetwise.worlds.edge import OffloadGreedy

    cfg = EdgeConfig()
    seeds = list(range(1000, 1000 + n))
    best = lambda v, ln: (2, offload_any(v, ln))  # noqa: E731  chunk 128 + offload from any node
    rule = evaluate(cfg, OffloadGreedy, seeds)
    fixed = evaluate(cfg, lambda view: Fixed(view, best), seeds)
    best_edf = lambda v, ln: (2, offload_any(v, ln), 1)  # noqa: E731  ... + queue order "deadline"
    edf = evaluate(cfg, lambda view: Fixed(view, best_edf), seeds)
    print("| test segment | requests | offload_greedy on time | ceiling vs rule | chunk 128 + offload from any node "
          "| ... + deadline queue order |")
    print("|---|---|---|---|---|---|")
    for r, f, e in zip(rule, fixed, edf):
        print(f"| {r['seed']} | {r['requests']} | {r['on_time']} | {r['requests'] / r['on_time'] - 1:+.1%} | "
              f"{f['on_time'] / r['on_time'] - 1:+.1%} | {e['on_time'] / r['on_time'] - 1:+.1%} |")
    ceil = np.mean([r["requests"] / r["on_time"] - 1 for r in rule])
    fx = np.mean([f["on_time"] / r["on_time"] - 1 for r, f in zip(rule, fixed)])
    ex = np.mean([e["on_time"] / r["on_time"] - 1 for r, e in zip(rule, edf)])
    print(f"| mean | | | {ceil:+.1%} | {fx:+.1%} | {ex:+.1%} |")


def main() -> None:
    import sys

    if "--test" in sys.argv:
        test_segments(int(sys.argv[sys.argv.index("--test") + 1]))
        return
    cfg = EdgeConfig()
    wins = validation_windows(cfg, quick=True)
    variants = {"offload_greedy (zero action)": lambda v, ln: (0, 0)}
    for ci, c in enumerate(cfg.chunk_sizes[1:], start=1):
        variants[f"chunk {c}" if c else "decode only"] = lambda v, ln, ci=ci: (ci, 0)
    variants["offload from any node"] = lambda v, ln: (0, offload_any(v, ln))
    variants["never offload"] = lambda v, ln: (0, 1)
    variants["deadline queue order"] = lambda v, ln: (0, 0, 1)
    variants["chunk 128 + offload from any node"] = lambda v, ln: (2, offload_any(v, ln))
    variants["chunk 128 + offload from any node + deadline order"] = lambda v, ln: (2, offload_any(v, ln), 1)
    print("| adjustment | " + " | ".join(w[0] for w in wins) + " | mean |")
    print("|---|" + "---|" * (len(wins) + 1))
    for name, fn in variants.items():
        xs = [evaluate(c, lambda view, fn=fn: Fixed(view, fn), [seed], held_out="validation", trace=tr,
                       load=ld)[0]["deadline_rps"] for _, c, seed, tr, ld in wins]
        print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in xs) + f" | {np.mean(xs):.3f} |", flush=True)


if __name__ == "__main__":
    main()
