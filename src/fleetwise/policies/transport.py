"""Optimal transport plans (POT) from an origin demand marginal to a supply marginal: the numpy core of the OT
planners (docs/torta.md). POT is imported when a plan is computed."""

from __future__ import annotations

import numpy as np

from fleetwise.errors import InputError


def transport_plan(a: np.ndarray, b: np.ndarray, cost: np.ndarray, reg: float = 0.05, exact: bool = False
                   ) -> np.ndarray:
    """Transport plan from marginal ``a`` (origins) to ``b`` (regions), both summing to 1: POT's ``ot.emd`` or
    ``ot.sinkhorn``, then the rounding of Altschuler et al. (2017, Alg. 2) so both marginals hold to ~1e-12."""
    import ot

    a = np.asarray(a, float)
    b = np.asarray(b, float)
    if a.ndim != 1 or b.ndim != 1 or cost.shape != (len(a), len(b)):
        raise InputError(f"transport_plan: cost must be {len(a)} x {len(b)}, got {cost.shape}")
    if (a < 0).any() or (b < 0).any() or not np.isfinite(cost).all():
        raise InputError("transport_plan: marginals must be >= 0 and costs finite")
    a = a / a.sum()
    b = b / b.sum()
    c = cost / max(float(cost.max()), 1e-12)
    if exact:
        P = ot.emd(a, b, c)
    else:
        import warnings

        with warnings.catch_warnings():  # not converging within the budget is fine: the rounding fixes marginals
            warnings.simplefilter("ignore")
            P = ot.sinkhorn(a, b, c, reg, numItermax=2000, stopThr=1e-9)
    return round_plan(np.asarray(P, float), a, b)


def round_plan(P: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    P = np.maximum(P, 0.0)
    rs = P.sum(1)
    x = np.minimum(1.0, np.divide(a, rs, out=np.ones_like(a), where=rs > 0))
    P = P * x[:, None]
    cs = P.sum(0)
    y = np.minimum(1.0, np.divide(b, cs, out=np.ones_like(b), where=cs > 0))
    P = P * y[None, :]
    ea = np.maximum(a - P.sum(1), 0.0)
    eb = np.maximum(b - P.sum(0), 0.0)
    if ea.sum() > 0:
        P = P + np.outer(ea, eb) / ea.sum()
    return P
