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
from fleetwise.control.registry import make, names, register

__all__ = [
    "Allocator", "Batcher", "BatchPlan", "Controller", "DECODE", "DecisionPoint", "Planner", "Router",
    "Scaler", "WAIT", "make", "names", "register",
]
