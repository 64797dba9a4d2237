"""Trained Graph-MARL checkpoints bare and behind the run-time monitor (`learn.graph_marl.monitored`: the SLO
fallback and the input guard; docs/graph-marl.md, "The run-time monitor"), evaluated as `fleetwise reproduce
graph-marl` evaluates them (its evaluation jobs, on 2 worker processes): the 10 held-out test segments against
`static` (the best rule there) and arXiv and Mooncake at load 0.7 against `least_loaded` (the rule inside the
actions), paired by (training seed, segment); pooled over the checkpoints given (mean [95% CI]) and per checkpoint.
Nothing is trained.

Usage: PYTHONPATH=src python benchmarks/graph-marl-monitor-eval.py CKPT [CKPT ...]
(e.g. the three Graph-MARL checkpoints `benchmarks/graph-marl-full.sh OUT` leaves in OUT/graph-marl/; a checkpoint's
training seed is read from it). About 2 minutes per checkpoint on 2 cores.
"""

from __future__ import annotations

import sys

import numpy as np

from fleetwise.learn.graph_marl import load_checkpoint
from fleetwise.learn.recipe import run_jobs
from fleetwise.metrics.stats import paired_change
from fleetwise.reproduce.graph_marl import _eval_job, _paired
from fleetwise.worlds.multicloud import GraphMARLConfig

CASES = (("test", None, None, "static"), ("arXiv@0.7", "arxiv-summarization", 0.7, "least_loaded"),
         ("Mooncake@0.7", "mooncake", 0.7, "least_loaded"))


def _ch(ref, rows, k):
    c = paired_change(*_paired(ref, rows, k))
    return f"{c.mean:+.1%} [{c.lo:+.1%}, {c.hi:+.1%}]"


def main() -> None:
    ckpts = sys.argv[1:]
    if not ckpts:
        raise SystemExit(__doc__)
    cfg = GraphMARLConfig()
    seeds = list(range(1000, 1010))
    train_seed = {ck: int(load_checkpoint(ck)["args"]["seed"]) for ck in ckpts}
    for case, trace, load, ref in CASES:
        common = {"cfg": cfg, "seeds": seeds, "eval_trace": trace, "segment_s": None, "load": load}
        jobs = [{**common, "name": ref, "train_seed": None, "ckpt": None, "fallback": False}]
        jobs += [{**common, "name": ck, "train_seed": train_seed[ck], "ckpt": ck, "fallback": fb}
                 for ck in ckpts for fb in (False, True)]
        res = run_jobs(_eval_job, jobs, workers=2)
        base = res[0]
        for fb in (False, True):
            rows = [r for j, rs in zip(jobs[1:], res[1:]) if j["fallback"] == fb for r in rs]
            guarded = sum(r.get("guarded_epochs", 0) for r in rows) / max(1, sum(r.get("epochs", 0) for r in rows))
            tripped = sum(r.get("rule_epochs", 0) > 0 for r in rows)
            print(f"{case} vs {ref}{' +fallback' if fb else ''}: P99 {_ch(base, rows, 'latency_p99_s')}, cost "
                  f"{_ch(base, rows, 'cost_usd')}, attainment {np.mean([r['slo_attainment'] for r in rows]):.3f}"
                  + (f", epochs guarded {guarded:.0%}, SLO fallback tripped in {tripped}/{len(rows)} segments"
                     if fb else ""), flush=True)
            for ck in ckpts:
                mine = [r for r in rows if r["train_seed"] == train_seed[ck]]
                print(f"    seed {train_seed[ck]}: P99 {_ch(base, mine, 'latency_p99_s')}, cost "
                      f"{_ch(base, mine, 'cost_usd')}", flush=True)


if __name__ == "__main__":
    main()
