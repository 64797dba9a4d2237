"""A Controller bundles one policy per decision level and answers the simulator's decision points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetwise.control.protocols import Batcher, BatchPlan, DecisionPoint, Router


@dataclass(slots=True)
class Controller:
    router: Router
    batcher: Batcher
    scaler: Any = None
    planner: Any = None
    allocator: Any = None

    @classmethod
    def from_names(cls, router: str = "round_robin", batcher: str = "sarathi", router_params: dict | None = None,
                   batcher_params: dict | None = None) -> "Controller":
        from fleetwise.control.registry import make

        return cls(router=make("router", router, router_params), batcher=make("batcher", batcher, batcher_params))

    def decide(self, dp: DecisionPoint) -> int | BatchPlan:
        if dp.kind == "route":
            return self.router.route(dp)
        if dp.kind == "batch":
            return self.batcher.plan(dp.lane, dp.sim)
        if dp.kind == "scale" and self.scaler is not None:
            return self.scaler.scale(dp.payload)
        raise ValueError(f"unknown decision kind {dp.kind!r}")
