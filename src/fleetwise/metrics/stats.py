"""Statistics over seeds: bootstrap confidence intervals and paired comparisons against a baseline.

"Policy X is 12% better" always comes with its interval: the relative change is computed per seed against
the baseline run with the same seed, scenario and grid point (paired: the same arrivals for both), and the
95% interval of its mean comes from a bootstrap over seeds (SciPy's ``stats.bootstrap``, percentile method).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 2000


@dataclass(frozen=True)
class CI:
    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half(self) -> float:
        return (self.hi - self.lo) / 2.0


def bootstrap_ci(values: Iterable[float], confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                 seed: int = 0) -> CI:
    """Mean and bootstrap percentile interval of the mean (NaN bounds for fewer than two values)."""
    x = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], float)
    if len(x) == 0:
        return CI(math.nan, math.nan, math.nan, 0)
    m = float(x.mean())
    if len(x) < 2:
        return CI(m, math.nan, math.nan, 1)
    if np.all(x == x[0]):
        return CI(m, m, m, len(x))
    from scipy import stats

    r = stats.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                        random_state=np.random.default_rng(seed))
    return CI(m, float(r.confidence_interval.low), float(r.confidence_interval.high), len(x))


def paired_change(base: dict, other: dict, **kw) -> CI:
    """Relative change ``other/base - 1`` paired by key (seed), its mean and bootstrap CI."""
    keys = [k for k in base if k in other and base[k] not in (None, 0) and other[k] is not None]
    rel = [other[k] / base[k] - 1.0 for k in keys
           if not (math.isnan(base[k]) or math.isnan(other[k]))]
    return bootstrap_ci(rel, **kw)


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
        for m in metrics:
            row["ci"][m] = bootstrap_ci([r.get(m) for r in members])
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
                base = {r["seed"]: r for r in groups[bkey]}
                # paired by seed; a learned policy's rows of several training seeds each pair with the rule's row
                # of their seed (the training seed a metric column, as reproduce graph-marl stores it)
                mine = {(r["seed"], r.get("train_seed")): r for r in members if r["seed"] in base}
                for m in metrics:
                    row["vs_baseline"][m] = paired_change({k: base[k[0]].get(m) for k in mine},
                                                          {k: r.get(m) for k, r in mine.items()})
        out.append(row)
    return out
