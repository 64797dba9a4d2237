"""A Controller bundles one policy per decision level and answers the simulator's decision points
(``fleetwise.policies.make_controller`` builds one by policy names)."""

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

    def decide(self, dp: DecisionPoint) -> int | BatchPlan:
        if dp.kind == "route":
            return self.router.route(dp.view)
        if dp.kind == "batch":
            return self.batcher.plan(dp.view)
        if dp.kind == "scale" and self.scaler is not None:
            return self.scaler.scale(dp.payload)
        raise ValueError(f"unknown decision kind {dp.kind!r}")
