"""The five decision levels, as small protocols, and the plain actions they return.

A policy sees a read-only view (``fleetwise.control.views``, ``ScaleObs`` below) and returns a plain action
(``BatchPlan``, a replica index, targets); it never reaches into the simulator. Heuristic and learned policies
go through the same code path (``Simulator.run_until``). The plain actions and ``DecisionPoint`` are defined
beside the simulator that consumes them (``fleetwise.sim.actions``) and re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fleetwise.control.views import LaneView, PlanView, RouteView
from fleetwise.sim.actions import DECODE, WAIT, BatchPlan, DecisionPoint

__all__ = ["Allocator", "BatchPlan", "Batcher", "DECODE", "DecisionPoint", "GroupState", "LaneView", "PlanView",
           "Planner", "RouteView", "Router", "ScaleObs", "Scaler", "WAIT"]


@runtime_checkable
class Router(Protocol):
    """Picks the replica (one of ``view.candidates()``) that serves one request."""

    def route(self, view: RouteView) -> int: ...


@runtime_checkable
class Batcher(Protocol):
    """Picks what a free engine lane runs next.

    ``stationary``: the policy's choice for a lane whose waiting queue and running set have not changed is
    the same decode step again. The simulator then advances such decode runs in one event (cost grows with
    requests, not tokens). Learned batchers set it False and are asked at every iteration.
    """

    stationary: bool

    def plan(self, view: LaneView) -> BatchPlan: ...


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
    groups: Sequence[GroupState]  # a list, or (the service's columnar body) a sequence that makes each when read
    # optional: the same groups' fields as columns (field name -> one value per group, in the order of ``groups``;
    # a field left out is read from the groups), when the producer has them (the decision service's columnar
    # body): scalers read models with many groups from them instead of every group's attributes
    columns: dict[str, Any] | None = None


@runtime_checkable
class Scaler(Protocol):
    """Sets the target number of replicas of every scaling group at the start of each scaling epoch
    (issue 8): ``scale(obs) -> {group key: target replicas}``; groups left out keep their target."""

    def scale(self, obs: ScaleObs) -> dict[str, int]: ...
