"""Per-request records, kept as columns."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

REJECT_REASONS = ("", "no_replica", "exceeds_context", "exceeds_kv_capacity", "queue_full", "rate_limited",
                  "quota_exceeded", "admission_control", "horizon")  # horizon: unfinished at SimOptions.max_time_s
STATUS = ("pending", "completed", "rejected")  # names of the status codes
PENDING, COMPLETED, REJECTED = 0, 1, 2


@dataclass(slots=True)
class Records:
    """One entry per request (index = request id). Times in seconds from the start of the simulation, as the
    client sees them (network round trip to the serving region included). NaN where it never happened."""

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    completion_s: np.ndarray
    queue_delay_s: np.ndarray  # from reaching the replica to first being scheduled
    replica: np.ndarray  # -1: never routed
    region: np.ndarray
    prefix_hit_tokens: np.ndarray
    preemptions: np.ndarray
    status: np.ndarray  # 0 pending, 1 completed, 2 rejected
    reason: np.ndarray  # index into REJECT_REASONS
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    slo_class: np.ndarray
    network_s: np.ndarray  # round trip between the request's origin and its serving region (0: never routed)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def completed(self) -> np.ndarray:
        return self.status == COMPLETED

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.completion_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Time per output token after the first; NaN for single-token outputs."""
        with np.errstate(invalid="ignore", divide="ignore"):
            n = self.output_tokens - 1
            return np.where(n > 0, (self.completion_s - self.first_token_s) / np.maximum(n, 1), np.nan)

    def reject_reasons(self) -> dict[str, int]:
        rej = self.reason[self.status == REJECTED]
        vals, counts = np.unique(rej, return_counts=True)
        return {REJECT_REASONS[v]: int(c) for v, c in zip(vals, counts)}

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def equals(self, other: "Records", rtol: float = 1e-9) -> bool:
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a.dtype.kind == "f":
                if not np.allclose(a, b, rtol=rtol, atol=1e-9, equal_nan=True):
                    return False
            elif not np.array_equal(a, b):
                return False
        return True
