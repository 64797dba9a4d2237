"""The plain actions a policy returns to the simulator, and the decision points it answers.

Defined here, beside the simulator that consumes them, so that ``fleetwise.sim`` imports nothing from the layers
above it; ``fleetwise.control`` re-exports them for policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What one engine lane runs next.

    ``decode``: include one decode token for every running (decoding) sequence of the lane.
    ``prefill``: (request id, chunk tokens) pairs; a request still waiting is admitted (KV allocated for its prompt).
    ``offload``: waiting requests sent to another replica's queue (over the network between their regions);
    each request may be offloaded once. After an offload-only plan the lane is asked again at once.
    An empty plan (no decode, no prefill) means: wait until something changes (an arrival or a completion), or
    for ``wait_s`` seconds when that is > 0.
    """

    decode: bool = False
    prefill: tuple[tuple[int, int], ...] = ()
    preempt: tuple[int, ...] = ()  # admitted requests of this lane to evict first (recompute), e.g. low priority
    offload: tuple[tuple[int, int], ...] = ()  # (request id, replica index): move a waiting request elsewhere
    wait_s: float = 0.0  # with nothing to run: idle this long (or until the queue changes), then decide again
    queue: tuple[int, ...] | None = None  # reorder the replica's waiting queue first (see above)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


WAIT = BatchPlan()
DECODE = BatchPlan(decode=True)


@dataclass(slots=True)
class DecisionPoint:
    """Something a policy must decide. ``kind`` is "route" (which replica serves request ``request``; ``view``
    is its ``RouteView``), "batch" (what engine lane ``lane`` runs next; ``view`` is its ``LaneView``) or one a
    platform layer adds with ``Simulator.at`` (e.g. "scale", with the observation as ``payload``).

    Policies read ``view`` (or ``payload``) only. ``lane`` is the simulator's own lane object, for the
    environments that drive the simulator through its public API."""

    kind: str
    time_s: float
    request: int = -1
    lane: Any = None
    view: Any = None  # RouteView | LaneView
    payload: Any = None  # other kinds (e.g. "scale"): the observation; ``handler(action)`` applies the answer
    handler: Any = None
