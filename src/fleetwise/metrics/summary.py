"""Summary metrics of one simulation run (see docs/metrics.md for each definition)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from fleetwise.sim.records import Records

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.sim.engine import Replica
    from fleetwise.workload.slo import SLOClass

BYTES_PER_TOKEN = 4.0  # request/response text on the wire (UTF-8 averages ~4 bytes per token for English)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else math.nan


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else math.nan


def balance(x: Sequence[float]) -> dict[str, float]:
    """Load balance of per-replica values: coefficient of variation, Jain's fairness index, std."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0 or x.sum() == 0:
        return {"cv": 0.0, "jain": 1.0, "std": 0.0}
    m = x.mean()
    return {"cv": float(x.std() / m), "jain": float(x.sum() ** 2 / (len(x) * (x ** 2).sum())), "std": float(x.std())}


def ideal_latency(records: Records, replicas: Sequence["Replica"], chunk_tokens: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per request: TTFT and end-to-end latency alone on an empty replica of the kind that served it
    (NaN if never served). The physical floor every policy is measured against."""
    n = len(records)
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    groups: dict[int, list[int]] = {}
    for r in replicas:
        groups.setdefault(id(r.perf), []).append(r.index)
    for members in groups.values():
        perf = replicas[members[0]].perf
        mask = np.isin(records.replica, members)
        if not mask.any():
            continue
        prompt = records.prompt_tokens[mask]
        out = records.output_tokens[mask]
        uniq, inv = np.unique(prompt, return_inverse=True)
        t_first = np.array([perf.ideal_latency_s(int(p), 1, chunk_tokens)[0] for p in uniq])[inv]
        c0, c1 = perf.decode_coeffs(1)
        steps = np.maximum(out - 1, 0).astype(float)
        # decode step j (0-based) attends prompt + 1 + j tokens
        t_dec = steps * (c0 + c1 * (prompt + 1)) + c1 * steps * (steps - 1) / 2.0
        ttft[mask] = t_first
        e2e[mask] = t_first + t_dec
    return ttft, e2e


def summarize(records: Records, replicas: Sequence["Replica"], *, slo_classes: Sequence["SLOClass"] | None = None,
              egress_usd_per_gb: np.ndarray | None = None, origin: np.ndarray | None = None,
              chunk_tokens: int | None = None, with_ideal: bool = True) -> dict[str, float]:
    """One flat dict of summary metrics (units in the key names)."""
    done = records.completed
    n = len(records)
    ttft = records.ttft_s[done]
    e2e = records.e2e_s[done]
    tpot_all = records.tpot_s[done]
    tpot = tpot_all[~np.isnan(tpot_all)]
    qd = records.queue_delay_s[done]
    end_s = float(np.nanmax(records.completion_s)) if done.any() else 0.0
    start_s = float(records.arrival_s.min()) if n else 0.0
    duration = max(end_s - start_s, 1e-9)
    out_tokens = int(records.output_tokens[done].sum())
    in_tokens = int(records.prompt_tokens[done].sum())

    s: dict[str, float] = {
        "requests": n,
        "completed": int(done.sum()),
        "rejected": int((records.status == 2).sum()),
        "duration_s": duration,
    }
    for name, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        s[f"{name}_mean_s"] = _mean(x)
        for q in (50, 90, 99):
            s[f"{name}_p{q}_s"] = _pct(x, q)
    s["queue_delay_mean_s"] = _mean(qd)
    s["queue_delay_p99_s"] = _pct(qd, 99)

    # goodput: completed requests meeting their SLO class's TTFT and TPOT targets, per second
    if slo_classes:
        ttft_t = np.array([c.ttft_s for c in slo_classes])[records.slo_class]
        tpot_t = np.array([c.tpot_s for c in slo_classes])[records.slo_class]
        with np.errstate(invalid="ignore"):
            tp = np.nan_to_num(records.tpot_s, nan=0.0)
            met = done & (records.ttft_s <= ttft_t) & (tp <= tpot_t)
        s["slo_attainment"] = float(met.sum() / max(n, 1))
        s["goodput_rps"] = float(met.sum() / duration)
    s["throughput_rps"] = float(done.sum() / duration)
    s["tokens_per_s"] = out_tokens / duration
    s["total_tokens_per_s"] = (out_tokens + in_tokens) / duration
    s["preemptions"] = int(records.preemptions.sum())
    s["prefix_hit_rate"] = float(records.prefix_hit_tokens.sum() / max(1, records.prompt_tokens[records.replica >= 0].sum()))

    # replicas: utilisation, MFU, KV, balance, energy, cost
    util, mfu, kv, energy_j, gpu_usd, energy_usd = [], [], [], 0.0, 0.0, 0.0
    for r in replicas:
        active = max(end_s - r.start_s, 1e-9) if r.stop_s is None else max(r.stop_s - r.start_s, 1e-9)
        util.append(r.busy_s / active)
        mfu.append(r.flops / (r.perf.peak_flops() * active))
        cap = r.kv_capacity_tokens()
        kv.append(r.kv_token_s / (cap * active) if cap else 0.0)
        e = r.energy_j(active)
        energy_j += e
        energy_usd += e / 3.6e6 * r.electricity_usd_per_kwh
        gpu_usd += r.gpu_cost_usd(active)
    s["gpu_util"] = float(np.mean(util)) if util else 0.0
    s["mfu"] = float(np.mean(mfu)) if mfu else 0.0
    s["kv_util"] = float(np.mean(kv)) if kv else 0.0
    b = balance(util)
    s["load_cv"], s["load_jain"], s["load_util_std"] = b["cv"], b["jain"], b["std"]
    served = balance([r.served for r in replicas])
    s["served_cv"] = served["cv"]
    s["energy_kwh"] = energy_j / 3.6e6
    egress_usd = 0.0
    if egress_usd_per_gb is not None and origin is not None:
        routed = records.replica >= 0
        reg = records.region[routed].astype(int)
        org = np.asarray(origin)[routed].astype(int)
        gb = (records.prompt_tokens[routed] + records.output_tokens[routed]) * BYTES_PER_TOKEN / 1e9
        egress_usd = float((gb * egress_usd_per_gb[org, reg]).sum())
    s["cost_gpu_usd"] = gpu_usd
    s["cost_energy_usd"] = energy_usd
    s["cost_egress_usd"] = egress_usd
    s["cost_usd"] = gpu_usd + energy_usd + egress_usd
    # no token served: no cost per token (NaN, null in JSON); max(tokens, 1) made it the cost x 1e6
    s["cost_per_mtok_usd"] = s["cost_usd"] / (out_tokens + in_tokens) * 1e6 if out_tokens + in_tokens else math.nan

    if with_ideal and done.any():
        i_ttft, i_e2e = ideal_latency(records, replicas, chunk_tokens)
        with np.errstate(invalid="ignore", divide="ignore"):
            slow = records.e2e_s[done] / i_e2e[done]
        slow = slow[np.isfinite(slow)]
        s["ideal_e2e_mean_s"] = _mean(i_e2e[done])
        s["slowdown_mean"] = _mean(slow)
        s["slowdown_p50"] = _pct(slow, 50)
        s["slowdown_p99"] = _pct(slow, 99)
    return s


def per_tenant(records: Records, tenants: Sequence[str], tenant_codes: np.ndarray) -> Mapping[str, dict[str, float]]:
    out = {}
    for i, t in enumerate(tenants):
        m = (tenant_codes == i) & records.completed
        out[t] = {"completed": int(m.sum()), "ttft_p99_s": _pct(records.ttft_s[m], 99), "e2e_p99_s": _pct(records.e2e_s[m], 99)}
    return out
