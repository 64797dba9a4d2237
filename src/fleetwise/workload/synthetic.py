"""Synthetic arrival processes and request-length samplers.

All randomness comes from a caller-supplied ``numpy.random.Generator``: the same seed gives identical arrays.
Arrival generators return a float64 array of arrival times in seconds, sorted, starting after 0 (the first
arrival is one inter-arrival gap after t = 0). Give either ``num_requests`` (exactly that many arrivals) or
``duration_s`` (all arrivals in ``[0, duration_s)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetwise.errors import InputError
from fleetwise.workload.request import Workload

MIN_PERIOD_H = 1.0 / 60.0  # a diurnal period of at least a minute

__all__ = [
    "poisson_arrivals",
    "gamma_arrivals",
    "mmpp_arrivals",
    "diurnal_arrivals",
    "diurnal_rate",
    "replay",
    "EmpiricalLengths",
    "LognormalLengths",
    "clip_total_tokens",
    "make_workload",
    "as_generator",
]


def _number(name: str, v) -> float:
    """``v`` as a finite float, or one InputError line naming it (a string, None or NaN failed deep inside; a NaN
    hour made diurnal thinning keep nothing, and its loop never ended)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        raise InputError(f"{name}={v!r}: expected a finite number")
    return float(v)


def _positive(name: str, v: float) -> float:
    if _number(name, v) <= 0:
        raise InputError(f"{name}={v!r}: expected a number > 0")
    return float(v)


def as_generator(rng) -> np.random.Generator:
    """The caller's generator; an integer seed makes one (``np.random.default_rng(seed)``)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise InputError(f"rng {rng!r}: expected a numpy.random.Generator (np.random.default_rng(seed)) or a seed >= 0")


def _check_n_or_duration(num_requests: int | None, duration_s: float | None, mean_rate: float = 0.0) -> None:
    """Exactly one of the two, within the limits (docs/limits.md): at most ``MAX_REQUESTS`` requests, and a span
    that at ``mean_rate`` draws no more (1e12 s at 5 req/s asked numpy for 40 TiB)."""
    from fleetwise.limits import MAX_REQUESTS, MAX_SPAN_S

    if (num_requests is None) == (duration_s is None):
        raise InputError("arrivals: give exactly one of num_requests or duration_s")
    if num_requests is not None and (isinstance(num_requests, bool) or not isinstance(num_requests, (int, np.integer))
                                     or not 0 <= num_requests <= MAX_REQUESTS):
        raise InputError(f"num_requests={num_requests!r}: expected an integer from 0 to {MAX_REQUESTS:,}")
    if duration_s is not None:
        if _positive("duration_s", duration_s) > MAX_SPAN_S:
            raise InputError(f"duration_s={duration_s!r}: expected at most {MAX_SPAN_S:,.0f} s (366 days)")
        if mean_rate * duration_s > MAX_REQUESTS:
            raise InputError(f"duration_s={duration_s!r} at {mean_rate:g} req/s: about "
                             f"{mean_rate * duration_s:,.0f} requests, more than {MAX_REQUESTS:,}")


def _renewal(rng: np.random.Generator, draw, mean_gap: float, num_requests: int | None, duration_s: float | None) -> np.ndarray:
    """Cumulative sum of gaps from ``draw(n)`` until ``num_requests`` arrivals or ``duration_s`` is covered."""
    if num_requests is not None:
        return np.cumsum(draw(int(num_requests)))
    chunks = []
    t0 = 0.0
    n = int(duration_s / mean_gap * 1.1) + 32
    while True:
        t = t0 + np.cumsum(draw(n))
        chunks.append(t)
        if t[-1] >= duration_s:
            break
        t0 = float(t[-1])
    t = np.concatenate(chunks)
    return t[t < duration_s]


def poisson_arrivals(
    rng: np.random.Generator, rate_rps: float, num_requests: int | None = None, duration_s: float | None = None
) -> np.ndarray:
    """Homogeneous Poisson process: exponential gaps with mean ``1/rate_rps``."""
    rng = as_generator(rng)
    rate = _positive("rate_rps", rate_rps)
    _check_n_or_duration(num_requests, duration_s, rate)
    return _renewal(rng, lambda n: rng.exponential(1.0 / rate, n), 1.0 / rate, num_requests, duration_s)


def gamma_arrivals(
    rng: np.random.Generator, rate_rps: float, cv: float, num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Renewal process with Gamma gaps: mean ``1/rate_rps``, coefficient of variation ``cv``
    (shape = 1/cv², scale = cv²/rate). cv = 1 is Poisson; cv > 1 is bursty, cv < 1 more regular."""
    rng = as_generator(rng)
    rate = _positive("rate_rps", rate_rps)
    cv = _positive("cv", cv)
    _check_n_or_duration(num_requests, duration_s, rate)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    return _renewal(rng, lambda n: rng.gamma(shape, scale, n), 1.0 / rate, num_requests, duration_s)


def mmpp_arrivals(
    rng: np.random.Generator,
    base_rate_rps: float,
    burst_rate_rps: float,
    mean_base_s: float,
    mean_burst_s: float,
    num_requests: int | None = None,
    duration_s: float | None = None,
    start_in_burst: bool = False,
) -> np.ndarray:
    """Two-state Markov-modulated Poisson process.

    The process alternates between a *base* state (Poisson at ``base_rate_rps``) and a *burst* state (Poisson at
    ``burst_rate_rps``); sojourn times are exponential with means ``mean_base_s`` and ``mean_burst_s``. The
    long-run mean rate is ``(base*mean_base + burst*mean_burst) / (mean_base + mean_burst)``. Starts in the base
    state unless ``start_in_burst``.
    """
    rng = as_generator(rng)
    rb = _positive("base_rate_rps", base_rate_rps)
    rh = _positive("burst_rate_rps", burst_rate_rps)
    db = _positive("mean_base_s", mean_base_s)
    dh = _positive("mean_burst_s", mean_burst_s)
    _check_n_or_duration(num_requests, duration_s, (rb * db + rh * dh) / (db + dh))
    out: list[np.ndarray] = []
    count = 0
    t = 0.0
    burst = bool(start_in_burst)
    target = num_requests
    horizon = duration_s
    while True:
        if target is not None and count >= target:
            break
        if horizon is not None and t >= horizon:
            break
        stay = rng.exponential(dh if burst else db)
        rate = rh if burst else rb
        end = t + stay
        # Poisson points in [t, end): count ~ Poisson(rate*stay), positions uniform (order statistics)
        k = rng.poisson(rate * stay)
        if k:
            pts = np.sort(rng.uniform(t, end, k))
            out.append(pts)
            count += k
        t = end
        burst = not burst
    arr = np.concatenate(out) if out else np.zeros(0)
    if target is not None:
        return arr[: int(target)]
    return arr[arr < horizon]


def diurnal_rate(
    t_s: np.ndarray | float,
    mean_rate_rps: float,
    peak_to_trough: float,
    period_h: float = 24.0,
    peak_hour_local: float = 14.0,
    utc_offset_h: float = 0.0,
    start_hour_utc: float = 0.0,
) -> np.ndarray:
    """Sinusoidal rate at simulation time ``t_s``.

    Simulation time 0 is ``start_hour_utc`` (UTC). A region at ``utc_offset_h`` (e.g. -5 for US East, +8 for
    Singapore) peaks at ``peak_hour_local`` on its own clock, i.e. at UTC hour ``peak_hour_local - utc_offset_h``.
    ``rate(t) = mean * (1 + a*cos(2π (h_utc(t) - h_peak_utc) / period))`` with ``a = (r-1)/(r+1)`` so that
    peak/trough = r = ``peak_to_trough``; the mean over a period is ``mean_rate_rps``.
    """
    r = float(peak_to_trough)
    a = (r - 1.0) / (r + 1.0)
    h_utc = start_hour_utc + np.asarray(t_s, dtype=np.float64) / 3600.0
    h_peak_utc = peak_hour_local - utc_offset_h
    return mean_rate_rps * (1.0 + a * np.cos(2.0 * np.pi * (h_utc - h_peak_utc) / period_h))


def diurnal_arrivals(
    rng: np.random.Generator,
    mean_rate_rps: float,
    peak_to_trough: float = 3.0,
    period_h: float = 24.0,
    peak_hour_local: float = 14.0,
    utc_offset_h: float = 0.0,
    start_hour_utc: float = 0.0,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Non-homogeneous Poisson process with the :func:`diurnal_rate` intensity, by thinning (Lewis-Shedler):
    candidates from a Poisson process at the peak rate are kept with probability rate(t)/peak."""
    rng = as_generator(rng)
    mean = _positive("mean_rate_rps", mean_rate_rps)
    r = _positive("peak_to_trough", peak_to_trough)
    if r < 1:
        raise InputError(f"peak_to_trough={peak_to_trough}: expected >= 1 (peak rate / trough rate)")
    if not _positive("period_h", period_h) >= MIN_PERIOD_H:
        raise InputError(f"period_h={period_h}: expected at least {MIN_PERIOD_H:.4g} hours (one minute)")
    for name, v in (("peak_hour_local", peak_hour_local), ("utc_offset_h", utc_offset_h),
                    ("start_hour_utc", start_hour_utc)):
        _number(name, v)
    a = (r - 1.0) / (r + 1.0)
    _check_n_or_duration(num_requests, duration_s, mean)
    lam_max = mean * (1.0 + a)
    kw = dict(mean_rate_rps=mean, peak_to_trough=r, period_h=period_h, peak_hour_local=peak_hour_local,
              utc_offset_h=utc_offset_h, start_hour_utc=start_hour_utc)
    if duration_s is not None:
        cand = _renewal(rng, lambda n: rng.exponential(1.0 / lam_max, n), 1.0 / lam_max, None, duration_s)
        keep = rng.uniform(0.0, lam_max, len(cand)) < diurnal_rate(cand, **kw)
        return cand[keep]
    out: list[np.ndarray] = []
    got = 0
    t0 = 0.0
    n_chunk = max(1024, int(num_requests * (1.0 + a) * 1.2) + 64)
    while got < num_requests:
        cand = t0 + np.cumsum(rng.exponential(1.0 / lam_max, n_chunk))
        keep = rng.uniform(0.0, lam_max, n_chunk) < diurnal_rate(cand, **kw)
        out.append(cand[keep])
        got += int(keep.sum())
        t0 = float(cand[-1])
    return np.concatenate(out)[: int(num_requests)] if out else np.zeros(0)


def replay(workload: Workload, speedup: float | None = None, target_rate_rps: float | None = None) -> Workload:
    """Trace replay with time scaling: arrival times divided by ``speedup`` (2.0 = twice as fast), or scaled so
    that the mean rate ``(n-1)/span`` equals ``target_rate_rps``. Lengths and other columns are unchanged."""
    if not isinstance(workload, Workload):
        raise InputError(f"replay: {type(workload).__name__} is not a fleetwise.workload.Workload")
    if speedup is not None and target_rate_rps is not None:
        raise InputError("replay: give speedup or target_rate_rps, not both")
    w = workload.take(slice(None))
    if speedup is not None:
        w.arrival_s = w.arrival_s / _positive("speedup", speedup)
    elif target_rate_rps is not None:
        tr = _positive("target_rate_rps", target_rate_rps)
        span = float(w.arrival_s[-1] - w.arrival_s[0]) if len(w) > 1 else 0.0
        if span <= 0:
            raise InputError(f"replay {workload.name}: all arrivals at one instant, cannot scale to a target rate")
        cur = (len(w) - 1) / span
        w.arrival_s = (w.arrival_s - w.arrival_s[0]) * (cur / tr)
    return w


# ----------------------------------------------------------------------------------------------------------------
# lengths


def clip_total_tokens(
    prompt: np.ndarray, output: np.ndarray, max_total_tokens: int, mode: str = "prompt"
) -> tuple[np.ndarray, np.ndarray]:
    """Make ``prompt + output <= max_total_tokens`` (both stay >= 1).

    ``mode="prompt"`` (default) follows Vidur's trace-replay generator: the overflow is removed from the prompt
    (``prompt -= max(0, prompt + output - max_total)``); if the output alone does not fit, it is first cut to
    ``max_total - 1`` so one prompt token remains. ``mode="proportional"`` follows Vidur's trace length
    generator: the overflow is removed from both in proportion to their share (``ceil`` each), then clipped to >= 1.
    """
    if _number("max_total_tokens", max_total_tokens) < 2:
        raise InputError(f"max_total_tokens={max_total_tokens}: expected >= 2")
    m = int(max_total_tokens)
    p = np.maximum(np.asarray(prompt, dtype=np.int64), 1)
    o = np.maximum(np.asarray(output, dtype=np.int64), 1)
    if p.shape != o.shape:
        raise InputError(f"clip_total_tokens: {p.shape[0] if p.ndim else 1} prompts and "
                         f"{o.shape[0] if o.ndim else 1} outputs (one of each per request)")
    if mode == "prompt":
        o = np.minimum(o, m - 1)
        p = np.minimum(p, m - o)
    elif mode == "proportional":
        tot = p + o
        diff = np.maximum(tot - m, 0)
        p = p - np.ceil(diff * (p / tot)).astype(np.int64)
        o = o - np.ceil(diff * (o / tot)).astype(np.int64)
        p, o = np.maximum(p, 1), np.maximum(o, 1)
        # the >= 1 floor can leave an overshoot in degenerate cases: take it from the prompt first
        over = np.maximum(p + o - m, 0)
        dp = np.minimum(over, p - 1)
        p, o = p - dp, o - (over - dp)
    else:
        raise InputError(f"clip mode {mode!r}: expected 'prompt' or 'proportional'")
    return p, o


@dataclass
class EmpiricalLengths:
    """Resample (prompt, output) pairs jointly from a workload (keeps their correlation)."""

    prompt: np.ndarray
    output: np.ndarray

    @classmethod
    def from_workload(cls, w: Workload) -> "EmpiricalLengths":
        if not isinstance(w, Workload):
            raise InputError(f"empirical lengths: {type(w).__name__} is not a fleetwise.workload.Workload")
        if len(w) == 0:
            raise InputError(f"empirical lengths: workload {w.name} is empty")
        return cls(prompt=np.asarray(w.prompt_tokens, np.int64), output=np.asarray(w.output_tokens, np.int64))

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, len(self.prompt), int(n))
        return self.prompt[idx].copy(), self.output[idx].copy()


@dataclass
class LognormalLengths:
    """Lognormal prompt and output lengths (natural-log parameters), optionally correlated in log space
    (``rho``), rounded to integers and clipped to ``[min, max]`` per column."""

    prompt_mu: float
    prompt_sigma: float
    output_mu: float
    output_sigma: float
    rho: float = 0.0
    prompt_min: int = 1
    prompt_max: int = 1_000_000
    output_min: int = 1
    output_max: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("prompt_mu", "prompt_sigma", "output_mu", "output_sigma", "rho"):
            _number(f"lognormal lengths: {name}", getattr(self, name))  # (a NaN mu drew prompts of -2^63)
        if self.prompt_min < 1 or self.output_min < 1:
            raise InputError("lognormal lengths: prompt_min and output_min must be >= 1 (no empty prompt or output)")
        if self.prompt_sigma < 0 or self.output_sigma < 0:
            raise InputError("lognormal lengths: sigma must be >= 0")
        if not -1.0 <= self.rho <= 1.0:
            raise InputError(f"lognormal lengths: rho={self.rho} must be in [-1, 1]")
        if self.prompt_min > self.prompt_max or self.output_min > self.output_max:
            raise InputError("lognormal lengths: min must be <= max")

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = as_generator(rng)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InputError(f"lognormal lengths: n={n!r}: expected a count >= 0")
        z = rng.standard_normal((2, int(n)))
        z1 = z[0]
        z2 = self.rho * z[0] + math.sqrt(max(0.0, 1.0 - self.rho**2)) * z[1]
        p = np.exp(self.prompt_mu + self.prompt_sigma * z1)
        o = np.exp(self.output_mu + self.output_sigma * z2)
        p = np.clip(np.rint(p), self.prompt_min, self.prompt_max).astype(np.int64)
        o = np.clip(np.rint(o), self.output_min, self.output_max).astype(np.int64)
        return p, o


def make_workload(
    arrival_s: np.ndarray,
    lengths,
    rng: np.random.Generator,
    max_total_tokens: int | None = None,
    name: str = "synthetic",
) -> Workload:
    """Combine arrival times with lengths drawn from ``lengths.sample(rng, n)``; optional total-token clipping."""
    t = np.asarray(arrival_s, dtype=np.float64)
    p, o = lengths.sample(rng, len(t))
    if max_total_tokens is not None:
        p, o = clip_total_tokens(p, o, max_total_tokens)
    return Workload(arrival_s=t, prompt_tokens=p, output_tokens=o, name=name).sorted()
