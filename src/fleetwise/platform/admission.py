"""Tenants' admission on the platform layer (docs/platform.md): token-bucket rate limits and in-flight quotas per
tenant, and overload admission control by priority."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetwise.errors import InputError
from fleetwise.scenario import PlatformSpec

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.platform.runner import Platform


class Admission:
    """Per-tenant token-bucket rate limits and in-flight quotas, and overload admission control by priority.
    Called by the simulator for every arriving request; returns "" (admit) or the rejection reason."""

    def __init__(self, platform: "Platform", spec: PlatformSpec):
        sim = platform.sim
        w = sim.workload
        self.platform = platform
        self.sim = sim
        self.tenant = w.tenant.tolist()
        self.prio = w.priority.tolist()
        by_name = {t.name: t for t in spec.tenants}
        unknown = [t for t in by_name if t not in w.tenants]
        if unknown:
            raise InputError(f"platform.tenants: tenant {unknown[0]!r} is not in the workload (tenants: "
                             f"{', '.join(w.tenants)})")
        self.rate = [by_name[t].rate_limit_rps if t in by_name else None for t in w.tenants]
        self.burst = [float(by_name[t].burst) if t in by_name else 0.0 for t in w.tenants]
        self.quota = [by_name[t].max_outstanding if t in by_name else None for t in w.tenants]
        self.tokens = list(self.burst)
        self.t_last = [0.0] * len(w.tenants)
        self.inflight = [0] * len(w.tenants)
        self.admitted = bytearray(sim.n)
        self._seen = 0
        self.max_q = spec.admission.max_queue_per_replica
        self.protect = spec.admission.protect_priority
        self.active = any(r is not None for r in self.rate) or any(q is not None for q in self.quota) or \
            self.max_q is not None

    def _sync(self) -> None:
        log = self.sim.completions
        for rid in log[self._seen:]:
            if self.admitted[rid]:
                self.admitted[rid] = 0
                self.inflight[self.tenant[rid]] -= 1
        self._seen = len(log)

    def __call__(self, rid: int) -> str:
        t = self.tenant[rid]
        now = self.sim.now
        r = self.rate[t]
        if r is not None:
            tok = min(self.burst[t], self.tokens[t] + (now - self.t_last[t]) * r)
            self.t_last[t] = now
            if tok < 1.0:
                self.tokens[t] = tok
                return "rate_limited"
            self.tokens[t] = tok - 1.0
        q = self.quota[t]
        if q is not None:
            self._sync()
            if self.inflight[t] >= q:
                return "quota_exceeded"
        if self.max_q is not None and self.prio[rid] < self.protect:
            m = self.sim.model_of[rid]
            ready, waiting = self.platform.model_queue(m)
            if waiting > self.max_q * max(ready, 1):
                return "admission_control"
        if q is not None:
            self.admitted[rid] = 1
            self.inflight[t] += 1
        return ""
