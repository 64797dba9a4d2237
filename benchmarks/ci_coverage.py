"""How often a 95% interval of a mean covers the true mean, by sample size: the percentile bootstrap (SciPy's
``stats.bootstrap``, what fleetwise used until 2026-12-07) against Student's t (``fleetwise.metrics.stats.mean_ci``).

    python benchmarks/ci_coverage.py [--trials 2000] [--sizes 2,3,4,5,10,20]

Normal samples with mean 0; each trial draws n values and asks whether the interval holds 0. Prints a table
(docs/experiments.md, "Statistics")."""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats

from fleetwise.metrics.stats import mean_ci


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--sizes", default="2,3,4,5,10,20")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| n | percentile bootstrap | Student's t |")
    print("|---:|---:|---:|")
    for n in (int(x) for x in a.sizes.split(",")):
        boot = t = 0
        for _ in range(a.trials):
            x = rng.normal(0.0, 1.0, n)
            r = stats.bootstrap((x,), np.mean, confidence_level=0.95, n_resamples=2000, method="percentile",
                                random_state=np.random.default_rng(0)).confidence_interval
            boot += r.low <= 0.0 <= r.high
            ci = mean_ci(x)
            t += ci.lo <= 0.0 <= ci.hi
        print(f"| {n} | {boot / a.trials:.1%} | {t / a.trials:.1%} |", flush=True)


if __name__ == "__main__":
    main()
