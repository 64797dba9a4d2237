"""Fit a real trace to a scenario: context, load, window, classes — and say what was done.

A trace brings arrivals and lengths; the scenario keeps everything else (its context limit, time scale, SLO
classes, tenants, models, origins). :func:`adapt_trace` turns a trace into the workload a run replays:

1. **Context**: ``prompt + output <= max_total_tokens`` (:func:`clip_to_context`, Vidur's rule: the overflow
   comes off the prompt); a clipped prompt keeps only the prefix-cache blocks it still covers.
2. **Rate**: ``load = x`` sets the replayed mean rate to ``x`` times the fleet's capacity for the mean request of
   the whole clipped trace (``capacity(mean prompt, mean output)``, which the scenario computes from the
   performance model: :func:`fleetwise.perf.capacity.capacity_rps` summed over the replicas, the estimate the
   autoscalers use), the same for every seed; ``load = "real"`` keeps the trace's own rate, times
   ``1 / time_scale`` or scaled to ``target_rate_rps``. ``duration_s`` asks for as many requests as that many
   simulated seconds hold at the rate.
3. **Window** (what each seed replays), ``resample``:

   * ``window``: a contiguous window of the trace — ``num_requests`` requests, or ``window_s`` seconds of the
     trace's own clock — starting at a point drawn uniformly by the seed (as long as the trace or longer: a
     circular window, wrapping around the trace's end);
   * ``bootstrap``: a circular block bootstrap in time (Politis & Romano's circular blocks): blocks of
     ``block_s`` trace seconds (default: a twentieth of the trace's span, at least ten mean gaps), each starting
     at a uniform point of the trace (wrapping around its end), laid end to end until the run is as long as the
     trace (or ``window_s``, or ``num_requests`` requests). Bursts shorter than a block keep their shape;
   * ``none``: the trace as it is (the first ``num_requests``), identical for every seed (so confidence
     intervals over seeds only show the simulator's own randomness);
   * ``auto`` (default): ``window`` when ``num_requests`` or ``window_s`` selects less than the whole trace,
     ``bootstrap`` otherwise — except for a trace with prefix-cache block ids, which gets a ``window`` (a whole
     trace is then a circular window: from a random point, wrapping around the end), so that no request appears
     twice in a lap (a repeat would hit the cache its first copy filled). A request replayed again (a bootstrap,
     several laps) gets fresh prefix-block ids.

   The window's clock is then compressed or stretched so that its own mean rate is the rate of step 2 (its
   bursts keep their shape). A trace without arrival times (all at 0 s, e.g. a lengths-only file) gets Poisson
   arrivals at the target rate (it needs a numeric ``load`` or ``target_rate_rps``), its lengths drawn with
   replacement.

   Timestamps of a coarse resolution (whole seconds, minutes, hours or tenths of a second, relative to the first
   request) replay the requests of one tick at one instant; the report says how many share an instant.
   ``spread_ties`` spreads each replayed request uniformly over its tick (drawn by the seed, before step 2's
   clock change), as if the trace had recorded finer times.

Every step is recorded in an :class:`AdaptReport` whose ``lines()`` callers print.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from fleetwise.errors import InputError
from fleetwise.limits import MAX_REQUESTS
from fleetwise.workload.request import Workload
from fleetwise.workload.synthetic import clip_total_tokens

__all__ = ["TraceFit", "AdaptReport", "adapt_trace", "clip_to_context", "select_window", "UNCONFIGURED",
           "unconfigured_rejections", "overload_warning", "RESAMPLE", "timestamp_resolution"]

RESAMPLE = ("auto", "window", "bootstrap", "none")
# coarse timestamp resolutions a trace may have been recorded at, coarsest first: (seconds, unit, plural)
RESOLUTIONS = ((3600.0, "hour", "hours"), (60.0, "minute", "minutes"), (1.0, "second", "seconds"),
               (0.1, "tenth of a second", "tenths of a second"))
# Rejection reasons no scenario setting asked for: the fleet could not hold the request (context, KV, no replica
# of its model), or it was still queued when the run ended, or a max_waiting queue overflowed. Rate limits,
# quotas and admission control are policies the scenario configures.
UNCONFIGURED = ("no_replica", "exceeds_context", "exceeds_kv_capacity", "queue_full", "horizon")
WARN_SHARE = 0.01


@dataclass(frozen=True)
class TraceFit:
    """How to fit a trace (see the module docstring). ``load``: a fraction of the fleet's capacity, or None for
    the trace's real rate (then ``time_scale`` multiplies arrival times, or ``target_rate_rps`` sets the mean)."""

    load: float | None = None
    time_scale: float = 1.0
    target_rate_rps: float | None = None
    max_total_tokens: int | None = None
    clip_mode: str = "prompt"
    num_requests: int | None = None
    window_s: float | None = None
    duration_s: float | None = None  # simulated seconds of arrivals (after the rate is set)
    resample: str = "auto"
    block_s: float | None = None
    spread_ties: bool = False  # spread arrivals recorded at a coarse resolution over their tick

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.num_requests, self.window_s, self.duration_s)) > 1:
            raise InputError("give at most one of num_requests, window_s and duration_s (the size of a replay)")
        if self.resample not in RESAMPLE:
            raise InputError(f"resample={self.resample!r}: expected one of {', '.join(RESAMPLE)}")
        if self.load is not None and not (self.load > 0 and math.isfinite(self.load)):
            raise InputError(f"load={self.load!r}: expected a fraction of the fleet's capacity > 0, or 'real'")
        if self.load is not None and (self.time_scale != 1.0 or self.target_rate_rps is not None):
            raise InputError("give load, time_scale or target_rate_rps, not several (load sets the rate)")


@dataclass
class AdaptReport:
    """What :func:`adapt_trace` did to one trace, for one seed."""

    trace: str
    trace_requests: int
    trace_span_s: float
    trace_rate_rps: float
    resample: str  # window | bootstrap | none | poisson
    window_s: tuple[float, float] | None = None  # trace seconds (window) or None
    blocks: int = 0  # bootstrap blocks
    block_s: float = 0.0
    requests: int = 0
    clipped: int = 0
    raised_outputs: int = 0  # outputs of 0 tokens in the trace, replayed as 1 (the whole trace)
    clipped_share: float = 0.0
    prefix_blocks_dropped: int = 0
    max_total_tokens: int | None = None
    mean_prompt_tokens: float = 0.0  # of the replayed requests
    mean_output_tokens: float = 0.0
    capacity_prompt_tokens: float = 0.0  # the mean request the capacity is for (the whole clipped trace)
    capacity_output_tokens: float = 0.0
    load: float | None = None
    capacity_rps: float | None = None
    capacity_note: str = ""
    window_rate_rps: float = 0.0  # the replayed requests' own rate before scaling
    rate_rps: float = 0.0  # the rate the run replays
    rate_factor: float = 1.0  # rate_rps / window_rate_rps (2 = twice as fast as the trace)
    duration_s: float = 0.0  # simulated seconds of arrivals
    classes: dict[str, float] = field(default_factory=dict)  # class (or tenant) -> share of requests
    class_rule: str = ""
    time_resolution_s: float | None = None  # the trace's timestamps are whole multiples of this (None: finer)
    tied_requests: int = 0  # requests of the trace at the same instant as the one before
    spread_ties: bool = False
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """Human-readable lines, one fact each."""
        out = [f"trace {self.trace}: {self.trace_requests} requests over {self.trace_span_s:.0f} s "
               f"({self.trace_rate_rps:.3g} req/s)" if self.trace_span_s > 0 else
               f"trace {self.trace}: {self.trace_requests} request{'s' if self.trace_requests != 1 else ''}, all at one "
               "instant (no arrival times to replay)"]
        if self.resample == "window" and self.window_s is not None:
            out.append(f"window: trace seconds {self.window_s[0]:.0f}-{self.window_s[1]:.0f} "
                       f"({self.requests} requests; each seed draws its own window)")
        elif self.resample == "bootstrap":
            out.append(f"block bootstrap: {self.blocks} blocks of {self.block_s:.0f} trace seconds "
                       f"({self.requests} requests; each seed draws its own blocks)")
        elif self.resample == "poisson":
            out.append(f"no arrival times to replay: Poisson arrivals, lengths drawn with replacement "
                       f"({self.requests} requests)")
        else:
            out.append(f"replayed as is: {self.requests} requests (the same for every seed)")
        if self.max_total_tokens is not None:
            out.append(f"context: prompt + output <= {self.max_total_tokens} tokens; clipped "
                       f"{self.clipped} requests ({self.clipped_share:.1%})"
                       + (f", {self.prefix_blocks_dropped} prefix blocks dropped" if self.prefix_blocks_dropped
                          else ""))
        if self.raised_outputs:
            out.append(f"outputs of 0 tokens replayed as 1 (an engine emits at least one): {self.raised_outputs} of "
                       f"the trace's {self.trace_requests} requests")
        if self.load is not None:
            out.append(f"load {self.load:g}: {self.rate_rps:.3g} req/s = {self.load:g} x fleet capacity "
                       f"{self.capacity_rps:.3g} req/s for the trace's mean request ({self.capacity_prompt_tokens:.0f} "
                       f"prompt, {self.capacity_output_tokens:.0f} output tokens)"
                       f"{'; ' + self.capacity_note if self.capacity_note else ''}")
        else:
            out.append(f"real rate: {self.rate_rps:.3g} req/s")
        if math.isfinite(self.rate_factor):
            out.append(f"rate factor {self.rate_factor:.3g} (the trace's clock runs {self.rate_factor:.3g}x as fast); "
                       f"{self.duration_s:.0f} s of arrivals; replayed requests' mean {self.mean_prompt_tokens:.0f} "
                       f"prompt, {self.mean_output_tokens:.0f} output tokens")
        else:
            out.append(f"{self.duration_s:.0f} s of arrivals; replayed requests' mean {self.mean_prompt_tokens:.0f} "
                       f"prompt, {self.mean_output_tokens:.0f} output tokens")
        if self.classes:
            out.append("classes: " + ", ".join(f"{k} {v:.0%}" for k, v in self.classes.items())
                       + (f" ({self.class_rule})" if self.class_rule else ""))
        out += self.notes
        return out


def timestamp_resolution(t0: np.ndarray) -> tuple[float, str, str] | None:
    """The coarsest of :data:`RESOLUTIONS` (seconds, unit, plural) that every arrival time, counted from the first,
    is a whole multiple of; None for finer times or a trace without arrival times."""
    if len(t0) < 2 or not t0[-1] > 0:
        return None
    for res in RESOLUTIONS:
        x = t0 / res[0]
        if np.all(np.abs(x - np.rint(x)) <= 1e-6):
            return res
    return None


def _spread(sel: Workload, rng: np.random.Generator, tick_s: float) -> Workload:
    """Each arrival moved uniformly within ``[t, t + tick_s)``, re-sorted, the first at 0."""
    t = sel.arrival_s + rng.uniform(0.0, tick_s, len(sel))
    order = np.argsort(t, kind="stable")
    out = sel.take(order)
    out.arrival_s = t[order] - t[order[0]]
    return out


def clip_to_context(w: Workload, max_total_tokens: int, mode: str = "prompt") -> tuple[Workload, int, int]:
    """``prompt + output <= max_total_tokens`` (:func:`~fleetwise.workload.synthetic.clip_total_tokens`); a
    clipped prompt keeps its first ``ceil(prompt / block_tokens)`` prefix-cache blocks (the ones that still hold
    its tokens). Returns (workload, requests clipped, prefix blocks dropped); the input is not modified."""
    p, o = clip_total_tokens(w.prompt_tokens, w.output_tokens, max_total_tokens, mode=mode)
    clipped = int(((p != w.prompt_tokens) | (o != w.output_tokens)).sum())
    out = w.take(slice(None))
    out.prompt_tokens, out.output_tokens = p, o
    dropped = 0
    if w.prefix_offsets is not None:
        lens = np.diff(w.prefix_offsets)
        keep = np.minimum(lens, -(-p // max(1, w.block_tokens)))
        dropped = int((lens - keep).sum())
        if dropped:
            starts = w.prefix_offsets[:-1]
            mask = np.zeros(len(w.prefix_blocks), bool)
            idx = np.repeat(starts, keep) + (np.arange(keep.sum()) - np.repeat(np.cumsum(keep) - keep, keep))
            mask[idx] = True
            out.prefix_blocks = w.prefix_blocks[mask]
            po = np.zeros(len(w) + 1, np.int64)
            np.cumsum(keep, out=po[1:])
            out.prefix_offsets = po
    return out, clipped, dropped


def _rate(t: np.ndarray) -> float:
    span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    return (len(t) - 1) / span if span > 0 else math.inf


class _Sparse(ValueError):
    """The block bootstrap cannot replay this trace: too many blocks, or none drew a request."""


def _window(w: Workload, t: np.ndarray, span: float, rng: np.random.Generator, fit: TraceFit):
    """(selection, indices, info) of a window: ``num_requests`` consecutive requests, ``window_s`` seconds, or the
    whole trace and more as a circular window from a random point."""
    n = len(w)
    if fit.num_requests is not None and fit.num_requests < n:
        k = int(fit.num_requests)
        s = int(rng.integers(0, n - k + 1))
        idx = np.arange(s, s + k)
        return w.take(idx), idx, {"resample": "window", "window_s": (float(t[idx[0]]), float(t[idx[-1]]))}
    if fit.window_s is not None and fit.window_s < span:
        s0 = float(rng.uniform(0.0, span - fit.window_s))
        idx = np.flatnonzero((t >= s0) & (t < s0 + fit.window_s))
        if len(idx) == 0:
            raise InputError(f"trace {w.name}: the {fit.window_s:g} s window from {s0:.0f} s holds no request (the "
                             "trace is sparser than that: a longer window_s in a scenario's trace workload, or "
                             "more requests, -n / num_requests)")
        return w.take(idx), idx, {"resample": "window", "window_s": (float(t[idx[0]]), float(t[idx[-1]]))}
    # the whole trace or more: a circular window from a random point, wrapping around the end
    gap = span / max(n - 1, 1)
    circ = span + gap
    s0 = float(rng.uniform(0.0, circ))
    rel = (t - s0) % circ
    order = np.argsort(rel, kind="stable")
    target_s = float(fit.window_s) if fit.window_s is not None else circ
    laps = max(1, math.ceil((fit.num_requests or 0) / n), math.ceil(target_s / circ - 1e-9))
    idx = np.tile(order, laps)
    tt = (np.arange(laps)[:, None] * circ + rel[order][None, :]).ravel()
    if fit.num_requests is not None:
        idx, tt = idx[: fit.num_requests], tt[: fit.num_requests]
    else:
        keep = tt < target_s
        idx, tt = idx[keep], tt[keep]
    sel = w.take(idx)
    sel.arrival_s = tt
    return sel, idx, {"resample": "window", "window_s": (s0, s0 + float(tt[-1])),
                      "note": f"the window covers the whole trace: from trace second {s0:.0f}, wrapping around its "
                              f"end ({laps} lap{'s' if laps > 1 else ''}); each seed its own start"}


def _bootstrap(w: Workload, t: np.ndarray, span: float, rng: np.random.Generator, fit: TraceFit):
    """(selection, indices, info) of a circular block bootstrap; ``_Sparse`` when it cannot replay the trace."""
    n = len(w)
    gap = span / max(n - 1, 1)
    b = float(fit.block_s) if fit.block_s is not None else max(span / 20.0, 10.0 * gap)
    circ = span + gap  # the circle: the end wraps to the start one mean gap later
    target_s = float(fit.window_s) if fit.window_s is not None else span + gap
    # the blocks the bootstrap will draw, known before it draws (a block_s of 1e-300 scanned the trace 100,000
    # times, minutes, before it was refused): by duration, or by requests at the trace's requests per block
    per_block = n * min(b, circ) / circ
    blocks = (fit.num_requests / per_block if per_block > 0 else math.inf) if fit.num_requests is not None \
        else target_s / b
    if not blocks <= 100_000:
        raise _Sparse(f"block_s {b:g} s would take about {blocks:.3g} blocks (at most 100,000)")
    idxs, times = [], []
    total, k = 0, 0
    while True:
        s = float(rng.uniform(0.0, circ))
        rel = (t - s) % circ
        sel_b = np.flatnonzero(rel < b)
        sel_b = sel_b[np.argsort(rel[sel_b], kind="stable")]
        idxs.append(sel_b)
        times.append(k * b + rel[sel_b])
        total += len(sel_b)
        k += 1
        if fit.num_requests is not None:
            if total >= fit.num_requests:
                break
        elif k * b >= target_s:
            break
        if k > 100_000:
            raise _Sparse("the block bootstrap did not reach the requested size")
    idx = np.concatenate(idxs)
    tt = np.concatenate(times)
    if fit.num_requests is not None:
        idx, tt = idx[: fit.num_requests], tt[: fit.num_requests]
    else:
        keep = tt < target_s
        idx, tt = idx[keep], tt[keep]
    if len(idx) == 0:
        raise _Sparse(f"the block bootstrap drew no request ({k} blocks of {b:g} s of a trace idle for most of its "
                      "span)")
    sel = w.take(idx)
    sel.arrival_s = tt
    return sel, idx, {"resample": "bootstrap", "blocks": k, "block_s": b}


def select_window(w: Workload, rng: np.random.Generator, fit: TraceFit) -> tuple[Workload, dict]:
    """The requests one seed replays (step 3 of the module docstring), arrivals starting at 0; and what was
    done (``resample``, ``window_s``, ``blocks``, ``block_s``)."""
    n = len(w)
    if n == 0:
        raise InputError(f"trace {w.name}: no requests")
    t = w.arrival_s - w.arrival_s[0]
    span = float(t[-1])
    mode = fit.resample
    sized = fit.num_requests is not None or fit.window_s is not None
    if span <= 0:  # no arrival times: lengths only
        k = fit.num_requests or n
        idx = rng.integers(0, n, k) if mode != "none" else np.arange(min(k, n))
        return w.take(idx), {"resample": "poisson", "idx": idx}
    whole = (fit.num_requests is None or fit.num_requests >= n) and (fit.window_s is None or fit.window_s >= span)
    auto = mode == "auto"
    if auto:  # a trace with prefix-cache ids keeps each request once per lap: a (circular) window
        mode = "window" if (sized and not whole) or w.has_prefix else "bootstrap"
    if mode == "none":
        idx = np.arange(min(n, fit.num_requests or n))
        if fit.window_s is not None:
            idx = idx[t[idx] < fit.window_s]
        sel = w.take(idx)  # a copy: the caller's trace is never modified
        info = {"resample": "none"}
    elif mode == "window":
        sel, idx, info = _window(w, t, span, rng, fit)
    else:
        try:
            sel, idx, info = _bootstrap(w, t, span, rng, fit)
        except _Sparse as e:  # chosen here, not asked for: the circular window replays such a trace
            if not auto:
                raise InputError(f"trace {w.name}: {e} (set a longer block_s, or resample: window, in a scenario's "
                                 "trace workload)") from None
            sel, idx, info = _window(w, t, span, rng, fit)
            info["note"] = f"{e}: replayed in a circular window instead" + \
                (f" ({info['note'].split(': ', 1)[1]})" if "note" in info else "")
    sel.arrival_s = sel.arrival_s - sel.arrival_s[0]
    info["idx"] = idx
    _fresh_prefix_ids(sel, idx)
    return sel, info


def _fresh_prefix_ids(sel: Workload, idx: np.ndarray) -> None:
    """A request replayed a second time (bootstrap, a window of several laps) gets fresh prefix-cache block ids,
    so that a repeat never hits the cache its first copy filled (the k-th repeat: ids + k x (largest id + 1))."""
    if sel.prefix_offsets is None or len(idx) == 0 or len(sel.prefix_blocks) == 0:
        return
    order = np.argsort(idx, kind="stable")
    first = np.r_[True, idx[order][1:] != idx[order][:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(idx)), 0))
    occ = np.empty(len(idx), np.int64)
    occ[order] = np.arange(len(idx)) - run_start
    if occ.max() == 0:
        return
    step = int(sel.prefix_blocks.max()) + 1
    sel.prefix_blocks = sel.prefix_blocks + np.repeat(occ * step, np.diff(sel.prefix_offsets))


def adapt_trace(w: Workload, rng: np.random.Generator, fit: TraceFit,
                capacity: Callable[[float, float], tuple[float, str]] | None = None) -> tuple[Workload, AdaptReport]:
    """Fit trace ``w`` (arrivals sorted) by ``fit``; all randomness from ``rng``. ``capacity(mean_prompt,
    mean_output) -> (requests/s, note)`` is the fleet's capacity, needed for a numeric ``load``; it is asked once,
    for the mean request of the whole (clipped) trace, so every seed replays the same rate."""
    n0 = len(w)
    if n0 == 0:
        raise InputError(f"trace {w.name}: no requests")
    t0 = w.arrival_s - w.arrival_s[0]
    span = float(t0[-1])
    rep = AdaptReport(trace=w.name, trace_requests=n0, trace_span_s=span,
                      trace_rate_rps=_rate(t0) if span > 0 else 0.0, resample="none",
                      max_total_tokens=fit.max_total_tokens, load=fit.load)
    res = timestamp_resolution(t0)
    if res is not None:
        rep.time_resolution_s, rep.tied_requests = res[0], int(np.count_nonzero(np.diff(t0) == 0))
    rep.spread_ties = bool(fit.spread_ties and res is not None)
    if rep.spread_ties:
        rep.notes.append(f"timestamps in whole {res[2]}: each replayed request's arrival is spread uniformly over its "
                         f"{res[1]} (spread_ties)")
    elif fit.spread_ties:
        rep.notes.append("spread_ties: the timestamps are finer than a tenth of a second; nothing spread")
    elif rep.tied_requests:
        rep.notes.append(f"timestamps in whole {res[2]}: {rep.tied_requests:,} of the {n0:,} requests arrive at the "
                         f"instant of the one before and are replayed together (spread_ties: true in a scenario's "
                         f"trace workload spreads each over its {res[1]})")
    clipped = np.zeros(n0, bool)
    dropped = np.zeros(n0, np.int64)
    if fit.max_total_tokens is not None:
        c, _, _ = clip_to_context(w, fit.max_total_tokens, fit.clip_mode)
        # an output of 0 raised to 1 (every engine emits at least one token) is counted on its own line, not as a clip
        raised = (w.output_tokens < 1) & (c.output_tokens == 1) & (c.prompt_tokens == w.prompt_tokens)
        clipped = ((c.prompt_tokens != w.prompt_tokens) | (c.output_tokens != w.output_tokens)) & ~raised
        rep.raised_outputs = int(raised.sum())
        if w.prefix_offsets is not None:
            dropped = np.diff(w.prefix_offsets) - np.diff(c.prefix_offsets)
        w = c
    target: float | None = None
    if fit.load is not None:
        if capacity is None:
            raise InputError(f"trace {w.name}: load={fit.load:g} needs the fleet's capacity (build the workload "
                             f"through a scenario, or give load: real)")
        p_mean, o_mean = float(w.prompt_tokens.mean()), float(w.output_tokens.mean())
        cap, note = capacity(max(1.0, p_mean), max(1.0, o_mean))
        rep.capacity_prompt_tokens, rep.capacity_output_tokens = p_mean, o_mean
        if not cap > 0:
            raise InputError(f"trace {w.name}: the fleet has no capacity for its mean request "
                             f"({p_mean:.0f} prompt + {o_mean:.0f} output tokens){': ' + note if note else ''}")
        rep.capacity_rps, rep.capacity_note = float(cap), note
        target = fit.load * cap
    elif fit.target_rate_rps is not None:
        target = float(fit.target_rate_rps)
    limit = f"above the limit of {MAX_REQUESTS:,} requests of one run (docs/limits.md)"
    if fit.duration_s is not None and span > 0:  # as many requests as duration_s holds at the replayed rate
        rate = target if target is not None else rep.trace_rate_rps / fit.time_scale
        if not rate * fit.duration_s <= MAX_REQUESTS:  # (before drawing: 121 M requests ran out of memory)
            raise InputError(f"trace {w.name}: {rate:.4g} requests/s x duration_s {fit.duration_s:g} is {limit}")
        fit = dataclasses.replace(fit, duration_s=None, num_requests=max(2, int(rate * fit.duration_s) + 1))
    elif fit.duration_s is not None and target is not None and not target * fit.duration_s <= MAX_REQUESTS:
        raise InputError(f"trace {w.name}: {target:.4g} requests/s x duration_s {fit.duration_s:g} is {limit}")
    if fit.num_requests is None and fit.window_s is not None and span > 0 \
            and not len(w) * fit.window_s / span <= MAX_REQUESTS:  # (a 1e300 s window overflowed np.tile)
        raise InputError(f"trace {w.name}: a window_s of {fit.window_s:g} s holds about "
                         f"{len(w) * fit.window_s / span:.3g} of its requests, {limit}")
    sel, info = select_window(w, rng, fit)
    rep.resample = info["resample"]
    rep.window_s = info.get("window_s")
    rep.blocks, rep.block_s = info.get("blocks", 0), info.get("block_s", 0.0)
    if "note" in info:
        rep.notes.append(info["note"])
    idx = info["idx"]
    if rep.spread_ties and rep.resample != "poisson":
        sel = _spread(sel, rng, rep.time_resolution_s)
    n = len(sel)
    rep.requests = n
    rep.clipped = int(clipped[idx].sum())
    rep.clipped_share = rep.clipped / n
    rep.prefix_blocks_dropped = int(dropped[idx].sum())
    rep.mean_prompt_tokens = float(sel.prompt_tokens.mean())
    rep.mean_output_tokens = float(sel.output_tokens.mean())
    if rep.resample == "poisson":
        if target is None:
            raise InputError(f"trace {w.name}: all its requests arrive at one instant (no arrival times to "
                             f"replay); give a load or target_rate_rps so that arrivals can be drawn")
        if fit.duration_s is not None:
            k = max(1, int(rng.poisson(target * fit.duration_s)))
            sel = sel.take(rng.integers(0, n, k)) if k != n else sel
            n = rep.requests = len(sel)
        sel.arrival_s = np.cumsum(rng.exponential(1.0 / target, n))
        rep.window_rate_rps = math.inf
        rep.rate_rps = target
        rep.rate_factor = math.inf
    else:
        own = _rate(sel.arrival_s)
        if not math.isfinite(own):
            raise InputError(f"trace {w.name}: the replayed requests all arrive at one instant, so no rate can be "
                             f"set (the trace's timestamps are coarser than what one seed replays: more requests, "
                             f"-n / num_requests, or a longer window_s)")
        rep.window_rate_rps = own
        factor = target / own if target is not None else 1.0 / fit.time_scale
        sel.arrival_s = sel.arrival_s / factor
        rep.rate_factor = factor
        rep.rate_rps = own * factor
    rep.duration_s = float(sel.arrival_s[-1]) if n else 0.0
    return sel, rep


# ------------------------------------------------------------------------------------------------ honesty
def unconfigured_rejections(reasons: dict[str, int]) -> dict[str, int]:
    """The rejections (reason -> count) that no scenario setting asked for (:data:`UNCONFIGURED`)."""
    return {k: int(v) for k, v in reasons.items() if k in UNCONFIGURED and v}


def overload_warning(reasons: dict[str, int], requests: int, where: str = "") -> str | None:
    """A warning line when more than 1% of ``requests`` were rejected for an unconfigured reason, else None."""
    bad = unconfigured_rejections(reasons)
    k = sum(bad.values())
    if requests <= 0 or k <= WARN_SHARE * requests:
        return None
    parts = ", ".join(f"{r} {c}" for r, c in sorted(bad.items(), key=lambda x: -x[1]))
    return (f"warning: {where + ': ' if where else ''}{k} of {requests} requests ({k / requests:.1%}) were rejected "
            f"for reasons no setting asked for ({parts}): the fleet is overloaded or the trace does not fit it; "
            f"these numbers do not compare with a run that serves them (try --load 0.7)")
