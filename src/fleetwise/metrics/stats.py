"""Statistics over seeds: confidence intervals of a mean and paired comparisons against a baseline.

"Policy X is 12% better" always comes with its interval: the relative change is computed per seed against
the baseline run with the same seed, scenario and grid point (paired: the same arrivals for both), and the
95% interval of its mean is Student's t interval with n - 1 degrees of freedom (SciPy's ``stats.t``).

Not a bootstrap: with the 3-10 seeds or segments a comparison has, the percentile bootstrap's interval is too
narrow (with 3 values it is their range; it held the mean 74.0% of the time at n = 3, 82.8% at n = 5 and 89.7% at
n = 10 in ``benchmarks/ci_coverage.py``, docs/experiments.md), while the t interval holds its 95% for normal
values at every n >= 2.

A learned policy has a run per training seed on each seed (segment, day): those runs are not independent samples,
so their mean is the seed's value (``unit_means``) before the interval.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

CONFIDENCE = 0.95


@dataclass(frozen=True)
class CI:
    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half(self) -> float:
        return (self.hi - self.lo) / 2.0


def _finite(values: Iterable[float]) -> np.ndarray:
    """The values that are numbers (None and NaN of any float type left out)."""
    out = []
    for v in values:
        if v is None:
            continue
        f = float(v)
        if not math.isnan(f):
            out.append(f)
    return np.asarray(out, float)


def mean_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> CI:
    """Mean and Student's t interval of the mean (n - 1 degrees of freedom); NaN bounds for fewer than two
    values. None and NaN values are left out; ``CI.n`` counts the values used."""
    x = _finite(values)
    if len(x) == 0:
        return CI(math.nan, math.nan, math.nan, 0)
    m = float(x.mean())
    if len(x) < 2:
        return CI(m, math.nan, math.nan, 1)
    if np.all(x == x[0]):
        return CI(m, m, m, len(x))
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2.0, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return CI(m, m - half, m + half, len(x))


def paired_change(base: dict, other: dict, **kw) -> CI:
    """Relative change ``other/base - 1`` paired by key (seed), its mean and t interval (``mean_ci``). Keys
    where either value is missing or NaN, or the baseline is 0, are left out (``CI.n`` counts the pairs used)."""
    rel = []
    for k in base:
        if k not in other or base[k] is None or other[k] is None:
            continue
        b, o = float(base[k]), float(other[k])
        if b == 0.0 or math.isnan(b) or math.isnan(o):
            continue
        rel.append(o / b - 1.0)
    return mean_ci(rel, **kw)


def unit_means(rows: Sequence[dict], metric: str) -> dict:
    """{seed (an evaluation unit: a seed, segment or day): the mean of ``metric`` over that seed's rows, None and
    NaN left out (NaN if none)}, in the rows' order."""
    by: dict = defaultdict(list)
    for r in rows:
        by[r["seed"]].append(r.get(metric))
    out = {}
    for seed, vs in by.items():
        x = _finite(vs)
        out[seed] = float(x.mean()) if len(x) else math.nan
    return out


def _seed_means(members: Sequence[dict], metrics: Sequence[str]) -> dict:
    """{seed: {metric: the mean over that seed's runs}} (several runs of a seed: one per training seed)."""
    means = {m: unit_means(members, m) for m in metrics}
    return {seed: {m: means[m][seed] for m in metrics} for seed in means[metrics[0]]} if metrics else {}


def group_key(run: dict) -> tuple:
    return (run["scenario"], json.dumps(run["params"], sort_keys=True), run["batcher_label"], run["router_label"])


def aggregate(runs: Sequence[dict], metrics: Sequence[str], baseline: dict[str, str] | None = None
              ) -> list[dict]:
    """One row per (scenario, grid point, batcher, router): per metric a CI over seeds, and with a baseline
    (e.g. ``{"router": "round_robin"}``) the paired relative change against it."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[group_key(r)].append(r)
    out = []
    for key, members in groups.items():
        row = {"scenario": key[0], "params": members[0]["params"], "batcher": key[2], "router": key[3],
               "seeds": len(members), "ci": {}, "vs_baseline": {}}
        per_seed = _seed_means(members, metrics)  # (a learned policy's training seeds averaged on each seed)
        for m in metrics:
            row["ci"][m] = mean_ci(v[m] for v in per_seed.values())
        if baseline:
            level, name = next(iter(baseline.items()))
            bkey = list(key)
            bkey[3 if level == "router" else 2] = name
            if tuple(bkey) not in groups and "train_seed" in members[0]["params"]:
                # a learned policy's rows of one training seed (a grid parameter of reproduce torta) pair with
                # the rule's rows of the same grid point without it: the rule has no training seed
                bkey[1] = json.dumps({k: v for k, v in members[0]["params"].items() if k != "train_seed"},
                                     sort_keys=True)
            bkey = tuple(bkey)
            if bkey != key and bkey in groups:
                # paired by seed; a learned policy's rows of several training seeds (the training seed a metric
                # column, as reproduce graph-marl stores it) give each seed their mean: rows of one seed are not
                # independent samples
                base = _seed_means(groups[bkey], metrics)
                for m in metrics:
                    row["vs_baseline"][m] = paired_change({k: v[m] for k, v in base.items()},
                                                          {k: v[m] for k, v in per_seed.items()})
        out.append(row)
    return out
