"""Every checkpoint of a `benchmarks/graph-marl-full.sh` folder on the validation split at fixed multiples of the
classes' rates (5 validation segments of 300 s, seeds 500-504), paired against `least_loaded` (docs/graph-marl.md,
"What else was tried"): would a stress check on validation data have flagged the checkpoints that break on arXiv?

Usage: python benchmarks/graph-marl-stress-probe.py FACTORS [CHECKPOINT_DIR]   (e.g. 1.5,2.0 /tmp/gfull7/graph-marl)
About a minute per factor on 2 processes.
"""

from __future__ import annotations

import glob
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

from fleetwise.envs.graph_marl import evaluate
from fleetwise.learn.graph_marl import load_trained
from fleetwise.metrics.stats import paired_change
from fleetwise.worlds.multicloud import GraphMARLConfig

SEEDS = list(range(500, 505))


def job(a: tuple[float, str | None]) -> list[dict]:
    f, ck = a
    cfg = replace(GraphMARLConfig(), validation_varies=True, train_rate_range=(f, f))  # every class at f x its rate
    pol = "least_loaded" if ck is None else load_trained(ck, GraphMARLConfig())
    return evaluate(cfg, pol, SEEDS, split="validation", duration_s=300.0)


def main() -> None:
    folder = sys.argv[2] if len(sys.argv) > 2 else "/tmp/gfull7/graph-marl"
    cks = sorted(glob.glob(f"{folder}/*.pt"))
    factors = [float(x) for x in sys.argv[1].split(",")]
    jobs = [(f, ck) for f in factors for ck in [None] + cks]
    with ProcessPoolExecutor(2) as ex:
        res = dict(zip(jobs, ex.map(job, jobs)))
    for f in factors:
        base = {r["seed"]: r for r in res[(f, None)]}
        print(f"factor {f}: least_loaded P99 {np.mean([r['latency_p99_s'] for r in base.values()]):.3f} s, "
              f"attainment {np.mean([r['slo_attainment'] for r in base.values()]):.3f}")
        for ck in cks:
            rows = {r["seed"]: r for r in res[(f, ck)]}
            p = paired_change({s: base[s]["latency_p99_s"] for s in base}, {s: rows[s]["latency_p99_s"] for s in rows})
            c = paired_change({s: base[s]["cost_usd"] for s in base}, {s: rows[s]["cost_usd"] for s in rows})
            att = np.mean([r["slo_attainment"] for r in rows.values()])
            print(f"  {ck.split('/')[-1]:40s} P99 {p.mean:+.1%} [{p.lo:+.1%}, {p.hi:+.1%}] cost {c.mean:+.1%} "
                  f"attainment {att:.3f}", flush=True)


if __name__ == "__main__":
    main()
