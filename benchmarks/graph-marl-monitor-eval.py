"""Trained Graph-MARL checkpoints bare and behind the run-time monitor (`learn.graph_marl.monitored`: the SLO
fallback and the input guard; docs/graph-marl.md, "The run-time monitor"), evaluated as `fleetwise reproduce
graph-marl` evaluates them (its evaluation jobs, on 2 worker processes), paired by (training seed, segment); pooled
over the checkpoints given (mean [95% CI]) and per checkpoint. Nothing is trained. Cases:
  validation    10 segments of the validation split (seeds 500-509, the test segments' length; the split
                checkpoints are chosen on) against `static`: where the monitor's options are chosen
  test          the 10 held-out test segments against `static` (the best rule there)
  stress        the same validation segments with every prompt 3x as long at half the classes' rates (drawn
                from the training traces, unlike their mix: most epochs above the input guard's threshold)
                against `least_loaded`
  arXiv, Mooncake   the real traces at load 0.7 against `least_loaded` (the rule inside the actions)

Usage: PYTHONPATH=src python benchmarks/graph-marl-monitor-eval.py [--handover rule,placement,rule:known-guard]
       [--cases validation,stress,test,arXiv,Mooncake] CKPT [CKPT ...]
(e.g. the three Graph-MARL checkpoints `benchmarks/graph-marl-full.sh OUT` leaves in OUT/graph-marl/; a checkpoint's
training seed is read from it, one checkpoint per training seed). `--handover`: what the SLO fallback hands
over, one monitored row each (default: `TrainedPolicy`'s); `:no-guard`: the SLO fallback without the input guard;
`:known-guard`: the guard decides only on a known share of long requests (not the first epoch of a segment, before
any traffic). About 2 minutes per checkpoint and 3 cases with two variants on 2 cores; measured in
docs/graph-marl.md ("The handover").
"""

from __future__ import annotations

import argparse

import numpy as np

from fleetwise.learn.graph_marl import HANDOVER, HANDOVERS, load_checkpoint
from fleetwise.learn.recipe import run_jobs
from fleetwise.metrics.stats import paired_change
from fleetwise.reproduce.graph_marl import _eval_job, _paired
from fleetwise.worlds.multicloud import GraphMARLConfig

STRESS = {"validation_varies": True, "train_prompt_range": (3.0, 3.0), "train_rate_range": (0.5, 0.5)}
CASES = {"validation": ("validation", None, None, "static", range(500, 510), {}),
         "stress": ("validation", None, None, "least_loaded", range(500, 510), STRESS),
         "test": ("test", None, None, "static", range(1000, 1010), {}),
         "arXiv": (None, "arxiv-summarization", 0.7, "least_loaded", range(1000, 1010), {}),
         "Mooncake": (None, "mooncake", 0.7, "least_loaded", range(1000, 1010), {})}


def _opts(variant):
    """A variant ``HANDOVER[:no-guard|:known-guard]`` as job keys, or None if unknown."""
    h, *opts = (variant or "rule").split(":")
    if h not in HANDOVERS or len(opts) > 1 or set(opts) - {"no-guard", "known-guard"}:
        return None
    return {"handover": h, "guard": False if "no-guard" in opts else "known" if "known-guard" in opts else True}


def _ch(ref, rows, k):
    c = paired_change(*_paired(ref, rows, k))
    return f"{c.mean:+.1%} [{c.lo:+.1%}, {c.hi:+.1%}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--handover", default=HANDOVER, help=f"comma-separated, of {', '.join(HANDOVERS)}")
    ap.add_argument("--cases", default="test,arXiv,Mooncake", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("ckpts", nargs="+")
    a = ap.parse_args()
    handovers, cases = a.handover.split(","), a.cases.split(",")
    bad = [h for h in handovers if _opts(h) is None]
    bad += [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"unknown handover or case {bad[0]!r} (handovers: {', '.join(HANDOVERS)}; cases: "
                         f"{', '.join(CASES)})")
    cfg = GraphMARLConfig()
    train_seed = {ck: int(load_checkpoint(ck)["args"]["seed"]) for ck in a.ckpts}
    if len(set(train_seed.values())) < len(train_seed):  # (rows are paired and pooled by training seed)
        raise SystemExit("two checkpoints of the same training seed: give one variant's checkpoints at a time")
    for case in cases:
        split, trace, load, ref, seeds, changes = CASES[case]
        common = {"cfg": cfg, "seeds": list(seeds), "eval_trace": trace, "segment_s": None, "load": load,
                  "split": split, "cfg_changes": changes}
        variants = [(False, None)] + [(True, h) for h in handovers]
        jobs = [{**common, "name": ref, "train_seed": None, "ckpt": None, "fallback": False}]
        jobs += [{**common, "name": ck, "train_seed": train_seed[ck], "ckpt": ck, "fallback": fb,
                  **(_opts(h) if fb else {}), "variant": h} for ck in a.ckpts for fb, h in variants]
        res = run_jobs(_eval_job, jobs, workers=2)
        base = res[0]
        for fb, h in variants:
            rows = [r for j, rs in zip(jobs[1:], res[1:]) if (j["fallback"], j["variant"]) == (fb, h) for r in rs]
            guarded = sum(r.get("guarded_epochs", 0) for r in rows) / max(1, sum(r.get("epochs", 0) for r in rows))
            tripped = sum(r.get("rule_epochs", 0) > 0 for r in rows)
            label = f" +fallback (handover {h})" if fb else " bare"
            print(f"{case} vs {ref}{label}: P99 {_ch(base, rows, 'latency_p99_s')}, cost "
                  f"{_ch(base, rows, 'cost_usd')}, attainment {np.mean([r['slo_attainment'] for r in rows]):.3f}, "
                  f"P99 {np.mean([r['latency_p99_s'] for r in rows]):.2f} s"
                  + (f", epochs guarded {guarded:.0%}, SLO fallback tripped in {tripped}/{len(rows)} segments"
                     if fb else ""), flush=True)
            for ck in a.ckpts:
                mine = [r for r in rows if r["train_seed"] == train_seed[ck]]
                print(f"    seed {train_seed[ck]}: P99 {_ch(base, mine, 'latency_p99_s')}, cost "
                      f"{_ch(base, mine, 'cost_usd')}, attainment {np.mean([r['slo_attainment'] for r in mine]):.3f}"
                      + (f", tripped {sum(r.get('rule_epochs', 0) > 0 for r in mine)}" if fb else ""), flush=True)
        print(f"  {ref}: P99 {np.mean([r['latency_p99_s'] for r in base]):.2f} s, attainment "
              f"{np.mean([r['slo_attainment'] for r in base]):.3f}", flush=True)


if __name__ == "__main__":
    main()
