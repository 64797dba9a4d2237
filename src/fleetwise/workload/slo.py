"""Service-level objective (SLO) classes.

Default classes (TTFT = time to first token, TPOT = time per output token after the first):

=============  ======  =======  ========  ================================================================
name           TTFT    TPOT     priority  rationale
=============  ======  =======  ========  ================================================================
interactive    0.5 s   0.05 s   2         chat UI: first token within half a second; 50 ms/token = 20
                                          tokens/s, faster than people read (~4-8 tokens/s). Same order as
                                          the tight SLOs used in DistServe/Splitwise-style evaluations.
standard       2.0 s   0.10 s   1         API traffic: 2 s to first token, 10 tokens/s streaming.
batch          60 s    0.50 s   0         offline / bulk jobs: only throughput matters; loose bounds so
                                          that "met" still means "not starved".
=============  ======  =======  ========  ================================================================

Priority: larger = more important (matches ``Request.priority``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetwise.errors import InputError

__all__ = ["SLOClass", "DEFAULT_SLO_CLASSES", "get_slo", "slo_names"]


@dataclass(frozen=True, slots=True)
class SLOClass:
    name: str
    ttft_s: float  # time-to-first-token target, seconds
    tpot_s: float  # time-per-output-token target (decode), seconds per token
    priority: int = 0  # larger = more important

    def __post_init__(self) -> None:
        if not self.name:
            raise InputError("SLO class: name must not be empty")
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise InputError(f"SLO class {self.name}: ttft_s and tpot_s must be > 0")

    def e2e_deadline_s(self, output_tokens: int) -> float:
        """End-to-end latency bound implied by the two targets for a request with ``output_tokens`` outputs."""
        return self.ttft_s + max(0, int(output_tokens) - 1) * self.tpot_s


DEFAULT_SLO_CLASSES: dict[str, SLOClass] = {
    c.name: c
    for c in (
        SLOClass("interactive", ttft_s=0.5, tpot_s=0.05, priority=2),
        SLOClass("standard", ttft_s=2.0, tpot_s=0.10, priority=1),
        SLOClass("batch", ttft_s=60.0, tpot_s=0.50, priority=0),
    )
}


def slo_names() -> list[str]:
    return list(DEFAULT_SLO_CLASSES)


def get_slo(name: str) -> SLOClass:
    """The default SLO class called ``name``; InputError listing the known names otherwise."""
    try:
        return DEFAULT_SLO_CLASSES[name]
    except KeyError:
        raise InputError(f"slo_class {name!r}: unknown (expected one of {', '.join(DEFAULT_SLO_CLASSES)})") from None
