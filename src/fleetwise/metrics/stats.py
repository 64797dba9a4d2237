"""Spread across seeds: mean with a 95% confidence interval (Student's t, as the number of seeds is small)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of the confidence interval). Half-width is NaN for fewer than two values."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan
    m = float(x.mean())
    if len(x) < 2:
        return m, math.nan
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2.0, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, half
