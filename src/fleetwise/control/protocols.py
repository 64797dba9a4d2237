"""The five decision levels, as small protocols, and the plain actions they return.

A policy sees a read-only view and returns a plain action; it never reaches into the simulator.
Heuristic and learned policies go through the same code path (`Simulator.advance` / `Simulator.apply`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.sim.engine import Lane
    from fleetwise.sim.simulator import Simulator


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
    offload: tuple[tuple[int, int], ...] = ()  # (request id, replica index): move a waiting request elsewhere
    wait_s: float = 0.0  # with nothing to run: idle this long (or until the queue changes), then decide again

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


WAIT = BatchPlan()
DECODE = BatchPlan(decode=True)


@dataclass(slots=True)
class DecisionPoint:
    """Something a policy must decide. ``kind`` is "route" (which replica serves request ``request``) or
    "batch" (what lane ``lane`` runs next). ``sim`` is the read-only view the policy may inspect."""

    kind: str
    time_s: float
    sim: "Simulator"
    request: int = -1
    lane: "Lane | None" = None


@runtime_checkable
class Router(Protocol):
    """Picks the replica (index into ``sim.replicas``) that serves one request."""

    def route(self, dp: DecisionPoint) -> int: ...


@runtime_checkable
class Batcher(Protocol):
    """Picks what a free engine lane runs next.

    ``stationary``: the policy's choice for a lane whose waiting queue and running set have not changed is
    the same decode step again. The simulator then advances such decode runs in one event (cost grows with
    requests, not tokens). Learned batchers set it False and are asked at every iteration.
    """

    stationary: bool

    def plan(self, lane: "Lane", sim: "Simulator") -> BatchPlan: ...


@runtime_checkable
class Allocator(Protocol):
    """Chooses GPU count and parallelism of a deployment (issue 4 fills this level)."""

    def allocate(self, obs: Any) -> Any: ...


@runtime_checkable
class Planner(Protocol):
    """Spreads demand across regions / clouds every planning epoch (issues 6, 7)."""

    def plan(self, obs: Any) -> Any: ...


@runtime_checkable
class Scaler(Protocol):
    """Sets replicas per model, GPU type and pool every scaling epoch (issue 8)."""

    def scale(self, obs: Any) -> Any: ...
