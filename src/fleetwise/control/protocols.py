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
    preempt: tuple[int, ...] = ()  # admitted requests of this lane to evict first (recompute), e.g. low priority
    offload: tuple[tuple[int, int], ...] = ()  # (request id, replica index): move a waiting request elsewhere
    wait_s: float = 0.0  # with nothing to run: idle this long (or until the queue changes), then decide again

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


WAIT = BatchPlan()
DECODE = BatchPlan(decode=True)


@dataclass(slots=True)
class DecisionPoint:
    """Something a policy must decide. ``kind`` is "route" (which replica serves request ``request``),
    "batch" (what lane ``lane`` runs next) or one a platform layer adds with ``Simulator.at`` (e.g. "scale",
    with the observation as ``payload``). ``sim`` is the read-only view the policy may inspect."""

    kind: str
    time_s: float
    sim: "Simulator"
    request: int = -1
    lane: "Lane | None" = None
    payload: Any = None  # other kinds (e.g. "scale"): the observation; ``handler(action)`` applies the answer
    handler: Any = None


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


@dataclass(slots=True)
class GroupState:
    """What a scaler sees of one scaling group (a deployment: one model on one GPU type, in one region and
    zone, from one pool) at the start of a scaling epoch. Rates and percentiles cover the last epoch."""

    key: str  # unique group name, e.g. "llama-8b/A100-80GB/us-east-1a/spot"
    model: str
    gpu: str
    region: str
    zone: str
    pool: str  # "on_demand" | "spot"
    ready: int  # replicas serving
    starting: int  # replicas provisioning / loading weights
    draining: int  # replicas finishing their requests before they stop
    min_replicas: int
    max_replicas: int
    waiting: int  # requests queued at the group's replicas, plus requests held for a replica (cold start)
    running: int  # requests admitted to the group's engines
    kv_used: float  # mean KV-cache fraction in use over ready replicas (0 with none)
    busy: float  # mean GPU-busy fraction of ready replicas over the last epoch
    arrivals_rps: float  # requests for this group's model per second over the last epoch (model demand)
    history_rps: tuple[float, ...] = ()  # arrivals_rps of earlier epochs, oldest first
    ttft_p90_s: float = float("nan")  # of requests that got their first token in the last epoch
    tpot_p90_s: float = float("nan")  # time per output token of requests completed in the last epoch
    slo_ttft_s: float = float("nan")
    slo_tpot_s: float = float("nan")
    capacity_rps: float = 0.0  # requests/s one replica sustains within the SLO (performance model estimate)
    price_usd_per_hour: float = 0.0  # per replica, from the pool's price list
    cold_start_s: float = 0.0  # expected node provisioning + model load of one new replica
    available: int | None = None  # replicas the pool can give now (spot capacity); None: unlimited


@dataclass(slots=True)
class ScaleObs:
    time_s: float
    epoch_s: float
    groups: list[GroupState]


@runtime_checkable
class Scaler(Protocol):
    """Sets the target number of replicas of every scaling group at the start of each scaling epoch
    (issue 8): ``scale(obs) -> {group key: target replicas}``; groups left out keep their target."""

    def scale(self, obs: ScaleObs) -> dict[str, int]: ...
