"""The five decision levels (protocols), the controller that bundles them, and the policy registry."""

from fleetwise.control.controller import Controller
from fleetwise.control.protocols import (
    DECODE,
    WAIT,
    Allocator,
    Batcher,
    BatchPlan,
    DecisionPoint,
    Planner,
    Router,
    Scaler,
)
from fleetwise.control.registry import register
from fleetwise.control.views import LaneView, PlanView, RouteView

__all__ = [
    "Allocator", "Batcher", "BatchPlan", "Controller", "DECODE", "DecisionPoint", "LaneView", "PlanView", "Planner",
    "RouteView", "Router", "Scaler", "WAIT", "register",
]
