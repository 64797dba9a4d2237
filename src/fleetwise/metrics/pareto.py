"""The Pareto front of a set of (cost, loss) points: the one implementation the report and the platform use."""

from __future__ import annotations

import numpy as np


def pareto_front(x, y) -> np.ndarray:
    """Indices of the points that no other point dominates when both ``x`` and ``y`` are to be minimised (a point
    dominates another when it is no worse in both and better in one), sorted by ``x`` then ``y``. Points with a
    NaN or infinite coordinate are left out; identical points are all kept. To maximise a coordinate, negate it."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if len(ok) == 0:
        return np.zeros(0, dtype=int)
    c, a = x[ok], y[ok]
    dom = ((c[None, :] <= c[:, None]) & (a[None, :] <= a[:, None])
           & ((c[None, :] < c[:, None]) | (a[None, :] < a[:, None]))).any(axis=1)
    keep = ok[~dom]
    return keep[np.lexsort((y[keep], x[keep]))]
