"""What a platform run reports (docs/platform.md): the summary plus losses, retries, scaling, spot, cold starts,
faults and recovery, and the cost broken down by model, region, pool and tenant."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fleetwise.sim.records import COMPLETED, REJECT_REASONS, REJECTED

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.platform.runner import Platform


def platform_results(p: "Platform", records) -> dict[str, Any]:
    """The summary (fleetwise.metrics.summarize) plus the platform's own figures."""
    sim = p.sim
    s = p.built.summary(records)

    reason = records.reason
    horizon = REJECT_REASONS.index("horizon")
    lost = int((records.status == 0).sum() + ((records.status == REJECTED) & (reason == horizon)).sum())
    s["lost_requests"] = lost
    s["retried_requests"] = int((np.frombuffer(sim.retries, dtype=np.int32) > 0).sum())
    s["oscillations"] = p.flaps
    s["scale_events"] = sum(g.scale_events for g in p.groups)
    s["spot_preemptions"] = p.spot_preemptions
    s["cold_starts"] = sum(g.cold_starts for g in p.groups)
    s["cache_starts"] = sum(g.cache_starts for g in p.groups)
    s["migrated_gb"] = sim.migrated_bytes / 1e9
    s["replica_hours"] = sum(r.active_s(sim.now) for r in sim.replicas) / 3600.0
    for reason_name in ("rate_limited", "quota_exceeded", "admission_control"):
        s[f"rejected_{reason_name}"] = int((reason == REJECT_REASONS.index(reason_name)).sum())
    rec = [f.recovered_s for f in p.faults if f.replicas and f.recovered_s is not None]
    s["faults"] = len(p.faults)
    s["recovery_s_max"] = max(rec) if rec else 0.0
    s["fault_requests_affected"] = sum(f.requests for f in p.faults)
    return s

def cost_breakdown(p: "Platform") -> dict[str, dict[str, float]]:
    """GPU + energy cost (USD) by model, region, pool and tenant (tenants pay in proportion to the tokens
    they were served on each replica)."""
    sim = p.sim
    w = sim.workload
    out: dict[str, dict[str, float]] = {"model": {}, "region": {}, "pool": {}, "tenant": {}}
    rep_cost = []
    for r in sim.replicas:
        c = r.cost_usd(r.active_s(sim.now))
        rep_cost.append(c)
        for k, v in (("model", r.model_name), ("region", p.built.fleet.regions[r.region].name), ("pool", r.pool)):
            out[k][v] = out[k].get(v, 0.0) + c
    rep = np.frombuffer(sim.replica_of, dtype=np.int32)
    done = np.frombuffer(sim.status, dtype=np.int8) == COMPLETED
    tok = (w.prompt_tokens + w.output_tokens).astype(float) * done
    nrep = len(sim.replicas)
    per_rep = np.bincount(rep[done], weights=tok[done], minlength=nrep)
    for ti, tname in enumerate(w.tenants):
        m = done & (w.tenant == ti)
        share = np.bincount(rep[m], weights=tok[m], minlength=nrep)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(per_rep > 0, share / per_rep, 0.0)
        out["tenant"][tname] = float((frac * np.asarray(rep_cost)).sum())
    return out
