"""How much the edge action space holds beyond the rule: fixed (state-independent) adjustments of offload_greedy,
and the ceiling (every request of a segment within its deadline). Quoted in docs/batching.md.

By default on the validation segments of `fleetwise reproduce batching --quick` (never the test segments; about
1 minute of CPU). With `--test N`: on the first N held-out test segments of `reproduce batching` (seeds 1000..),
the segments its tables report, to show how far from the ceiling the rule and a fixed adjustment are there (no
choice is made on them).

With `--test N`, also a slack-aware token budget (``SlackBudget``, after Sarathi-Serve's budget from the
time-between-tokens SLO, here from each running sequence's own deadline) and an upper bound on the requests within
deadline from the edge's prefill capacity (``capacity_bound``). With `--validation-full`: the validation segments
of the full budget (7) instead of `--quick`'s.

With `--traces NAMES` (comma-separated): `SlackBudget` and the best fixed adjustment against the rule on those real
traces at load 0.7 (10 seeds each).

Usage: python benchmarks/batching_headroom.py [--test N | --traces NAMES] [--validation-full]
"""

from __future__ import annotations

import bisect
import math

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


class SlackBudget:
    """Each iteration the largest token budget (of ``CHUNKS``) whose iteration time every running sequence that
    can still make its end-to-end deadline affords, (deadline - now) / tokens left; the whole budget
    (``CHUNKS[-1]``) when nothing decodes. Deadline queue order, and offloads by the rule's test at any node (as
    the fixed adjustments above). A hand-written rule, outside the action space."""

    stationary = False
    CHUNKS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)

    def __init__(self, view):
        from fleetwise.policies.batchers import Sarathi

        self.view = view
        self.deadline = view.e2e_deadline.tolist()
        self.sarathi = {c: Sarathi(chunk_tokens=c, max_num_seqs=view.cfg.max_running) for c in self.CHUNKS}

    def plan(self, lane):
        from fleetwise.control.protocols import DECODE

        v = self.view
        if offload_any(v, lane) == 2:
            return v.plan(lane, (0, 2, 0))
        n_run = len(lane.running)
        if not (lane.waiting or lane.prefilling):
            return DECODE if n_run else v.plan(lane, (0, 1, 0))
        sim, now = v.sim, lane.time_s
        perf = sim.replicas[lane.replica].perf
        kv = sum(lane.kv_tokens(r) for r in lane.running)
        step = perf.iteration_time_s(0, 0.0, n_run, kv) if n_run else 0.0
        allow = math.inf
        for r in lane.running:
            left = sim.output[r] - sim.generated(r)
            if left > 0:
                need = (self.deadline[r] - now) / left
                if step <= need < allow:  # (a sequence that cannot make it any more does not constrain)
                    allow = need
        chunk = self.CHUNKS[-1] if not n_run else self.CHUNKS[0]
        if n_run:
            for c in self.CHUNKS:
                if c > n_run and perf.iteration_time_s(c - n_run, (c - n_run) * 1024.0, n_run, kv) <= allow:
                    chunk = c
        s = self.sarathi[chunk]
        return s.plan_queue(lane, v.deadline_order(lane)) if len(lane.waiting) >= 2 else s.plan(lane)


def capacity_bound(view) -> int:
    """An upper bound on a segment's requests within deadline from the edge's prefill capacity. Request r can be
    on time only if its prompt is prefilled within [arrival, deadline - its shortest decode] (``O - 1`` steps of a
    batch of one on the fastest node) and not faster than the fastest node prefills it alone; in any interval
    [t1, t2] the nodes together prefill at most C (t2 - t1) tokens (C: the sum of each node's best prefill rate
    over chunk sizes, nothing else running), so of the requests whose windows lie inside it at most those with
    the smallest prompts that fit are on time; losses over disjoint intervals add (weighted interval scheduling)."""
    sim, w = view.sim, view.sim.workload
    p_tok, out, arr = w.prompt_tokens.astype(np.int64), w.output_tokens.astype(np.int64), w.arrival_s
    perfs = [r.perf for r in sim.replicas]
    cap = sum(max(c / p.iteration_time_s(c, 0.0, 0, 0) for c in SlackBudget.CHUNKS) for p in perfs)
    ctx = p_tok * (out - 1) + (out - 1) * out / 2.0
    dec = np.min([(out - 1) * p.decode_coeffs(1)[0] + p.decode_coeffs(1)[1] * ctx for p in perfs], axis=0)
    pre = np.min([[p.iteration_time_s(int(x), 0.0, 0, 0) for x in p_tok] for p in perfs], axis=0)
    end = view.e2e_deadline - dec
    idx = np.flatnonzero(arr + pre <= end + 1e-9)
    losses = []
    for t1 in np.unique(arr[idx]):
        sel = idx[arr[idx] >= t1]
        o = np.argsort(end[sel])
        e, p = end[sel][o], p_tok[sel][o]
        for t2 in np.unique(e[e > t1]):
            m = int(np.searchsorted(e, t2 + 1e-12, side="right"))
            room = cap * (t2 - t1)
            if p[:m].sum() > room:
                k = int(np.searchsorted(np.cumsum(np.sort(p[:m])), room + 1e-9, side="right"))
                losses.append((t2, t1, m - k))
    losses.sort()
    ends = [x[0] for x in losses]
    best = [0] * (len(losses) + 1)
    for j, (t2, t1, lost) in enumerate(losses, 1):
        best[j] = max(best[j - 1], best[bisect.bisect_right(ends, t1, 0, j - 1)] + lost)
    return len(idx) - best[-1]


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
    from fleetwise.worlds.edge import segment

    slack = evaluate(cfg, SlackBudget, seeds)
    bound = [capacity_bound(segment(cfg, s, True)) for s in seeds]
    print("\n| test segment | requests | slack-aware budget on time | vs rule | capacity bound | bound vs rule |")
    print("|---|---|---|---|---|---|")
    for r, s, b in zip(rule, slack, bound):
        print(f"| {r['seed']} | {r['requests']} | {s['on_time']} | {s['on_time'] / r['on_time'] - 1:+.1%} | {b} | "
              f"{b / r['on_time'] - 1:+.1%} |")
    print(f"| mean | | | {np.mean([s['on_time'] / r['on_time'] - 1 for r, s in zip(rule, slack)]):+.1%} | | "
          f"{np.mean([b / r['on_time'] - 1 for r, b in zip(rule, bound)]):+.1%} |")


def on_traces(names: list[str]) -> None:
    """The slack-aware budget and the best fixed adjustment against the rule on real traces at load 0.7, the 10
    test seeds of ``reproduce batching --eval-trace`` (paired by seed)."""
    from fleetwise.metrics.stats import paired_change
    from fleetwise.workload.spec import load_trace
    from fleetwise.worlds.edge import OffloadGreedy

    cfg, seeds = EdgeConfig(), list(range(1000, 1010))
    print("| trace @0.7 | rule on time | policy | on time | vs rule | TTFT P99 s (rule / policy) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        tr = load_trace(name)
        rule = evaluate(cfg, OffloadGreedy, seeds, trace=tr, load=0.7)
        best = lambda v, ln: (2, offload_any(v, ln), 1)  # noqa: E731
        for label, make in (("SlackBudget", SlackBudget),
                            ("chunk 128 + any node + deadline", lambda view: Fixed(view, best))):
            r = evaluate(cfg, make, seeds, trace=tr, load=0.7)
            ch = paired_change({x["seed"]: x["deadline_rps"] for x in rule}, {x["seed"]: x["deadline_rps"] for x in r})
            print(f"| {name} | {sum(x['on_time'] for x in rule)} of {sum(x['requests'] for x in rule)} | {label} | "
                  f"{sum(x['on_time'] for x in r)} | {ch.mean:+.1%} [{ch.lo:+.1%}, {ch.hi:+.1%}] | "
                  f"{np.mean([x['ttft_p99_s'] for x in rule]):.1f} / {np.mean([x['ttft_p99_s'] for x in r]):.1f} |",
                  flush=True)


def main() -> None:
    import sys

    if "--test" in sys.argv:
        test_segments(int(sys.argv[sys.argv.index("--test") + 1]))
        return
    if "--traces" in sys.argv:
        on_traces(sys.argv[sys.argv.index("--traces") + 1].split(","))
        return
    cfg = EdgeConfig()
    wins = validation_windows(cfg, quick="--validation-full" not in sys.argv)
    variants = {"offload_greedy (zero action)": lambda v, ln: (0, 0)}
    for ci, c in enumerate(cfg.chunk_sizes[1:], start=1):
        variants[f"chunk {c}" if c else "decode only"] = lambda v, ln, ci=ci: (ci, 0)
    variants["offload from any node"] = lambda v, ln: (0, offload_any(v, ln))
    variants["never offload"] = lambda v, ln: (0, 1)
    variants["deadline queue order"] = lambda v, ln: (0, 0, 1)
    variants["chunk 128 + offload from any node"] = lambda v, ln: (2, offload_any(v, ln))
    variants["chunk 128 + offload from any node + deadline order"] = lambda v, ln: (2, offload_any(v, ln), 1)
    variants["slack-aware budget (SlackBudget)"] = None
    print("| adjustment | " + " | ".join(w[0] for w in wins) + " | mean |")
    print("|---|" + "---|" * (len(wins) + 1))
    for name, fn in variants.items():
        make = SlackBudget if fn is None else (lambda view, fn=fn: Fixed(view, fn))
        xs = [evaluate(c, make, [seed], held_out="validation", trace=tr, load=ld)[0]["deadline_rps"]
              for _, c, seed, tr, ld in wins]
        print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in xs) + f" | {np.mean(xs):.3f} |", flush=True)


if __name__ == "__main__":
    main()
