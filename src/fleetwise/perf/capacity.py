"""Requests per second one replica sustains within a latency SLO, from the performance model.

Used to fill ``GroupState.capacity_rps`` for the autoscalers (docs/autoscaling.md). The estimate is analytic
(no simulation): a replica running continuous batching with prefill-first scheduling (vLLM) holds on average
``B`` decoding sequences; it is a closed-form steady state of that batch, checked against the simulator in
tests/test_scalers.py.
"""

from __future__ import annotations

import math

from fleetwise.errors import InputError


def _limit(x: float | None) -> float:
    """An SLO value, or +inf when it is unset (None, NaN, <= 0)."""
    if x is None:
        return math.inf
    x = float(x)
    return x if x > 0 and not math.isnan(x) else math.inf


def capacity_rps(perf, prompt_tokens: float, output_tokens: float, slo_ttft_s: float | None = None,
                 slo_tpot_s: float | None = None, *, max_num_seqs: int = 256,
                 gpu_memory_utilization: float = 0.9, kv_capacity_tokens: int | None = None) -> float:
    """Requests/s one replica (``perf``: a PerfModel or anything with its API) sustains for requests of
    ``prompt_tokens`` prompt and ``output_tokens`` output tokens (typical or mean values) while the mean time
    per output token stays within ``slo_tpot_s`` and the mean time to first token within ``slo_ttft_s``
    (None / NaN: no limit). 0.0 when no batch meets the SLO or a request does not fit the KV cache.

    Model, per engine lane (a replica has ``perf.pp`` lanes, each with 1/pp of the KV cache), with P prompt
    and O output tokens, n = O - 1 decode steps per request:

    - prefill of one request: ``t_pf = iteration_time_s(P, P*P, 0, 0)`` (a prefill-only iteration);
    - decode step of B sequences: ``s(B) = c0(B) + c1 * B * (P + O/2)`` from ``decode_coeffs(B)`` (the mean
      context of a decoding sequence is P + O/2);
    - Little's law with the GPU time shared between prefills and decode steps:
      ``rps(B) = B / (n * s(B) + B * t_pf)``; the fraction of time spent prefilling is ``f = rps * t_pf``;
    - time per output token: ``tpot(B) = s(B) / (1 - f) = s(B) + B * t_pf / n`` (prefills of other requests
      interleave with a sequence's decode steps);
    - time to first token: ``t_pf + s(B)`` (the iteration in flight) plus the M/D/1 wait of prefills,
      ``f * t_pf / (2 (1 - f))``;
    - B ranges over 1 .. min(max_num_seqs, KV tokens of the lane // (P + O)) (no preemption).

    The capacity is ``pp * max rps(B)`` over the batches whose tpot and ttft meet the SLO. It is the
    saturation rate at that batch: scalers add their own headroom.
    """
    P = float(prompt_tokens)
    O = float(output_tokens)
    if not (P >= 1 and O >= 1) or math.isinf(P) or math.isinf(O):
        raise InputError(f"capacity_rps: prompt_tokens and output_tokens must be >= 1, got {prompt_tokens}, "
                         f"{output_tokens}")
    if max_num_seqs < 1:
        raise InputError(f"capacity_rps: max_num_seqs must be >= 1, got {max_num_seqs}")
    tpot_max, ttft_max = _limit(slo_tpot_s), _limit(slo_ttft_s)
    lanes = max(1, int(getattr(perf, "pp", 1)))
    kv = perf.kv_capacity_tokens(gpu_memory_utilization) if kv_capacity_tokens is None else kv_capacity_tokens
    b_max = min(int(max_num_seqs), int(kv // lanes // (P + O)))
    if b_max < 1:
        return 0.0
    Pi = round(P)
    t_pf = float(perf.iteration_time_s(Pi, float(Pi) * Pi, 0, 0))
    n = O - 1.0
    ctx = P + O / 2.0
    if n <= 0:  # one output token: prefill only
        return lanes / t_pf if t_pf * 1.0 <= ttft_max else 0.0
    best = 0.0
    for B in range(1, b_max + 1):
        c0, c1 = perf.decode_coeffs(B)
        s = c0 + c1 * B * ctx
        rps = B / (n * s + B * t_pf)
        f = rps * t_pf
        tpot = s + B * t_pf / n
        ttft = t_pf + s + f * t_pf / (2.0 * (1.0 - f))
        if tpot > tpot_max or ttft > ttft_max:
            if tpot > tpot_max:  # tpot grows with B: no larger batch meets the SLO
                break
            continue
        best = max(best, rps)
    return lanes * best
