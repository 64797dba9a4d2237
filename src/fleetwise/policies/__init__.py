"""Hand-written policies for every decision level, and the one place that builds a policy by name.

``make("router", "power_of_two")`` imports the built-in policy modules (their ``@register_*`` decorators fill
the tables of ``fleetwise.control.registry``) and builds the policy; ``names(level)`` lists them;
``make_controller(router, batcher)`` bundles a router and a batcher.
"""

from __future__ import annotations

from typing import Any

from fleetwise.control.controller import Controller
from fleetwise.control.registry import LEVELS, build, registered
from fleetwise.control.registry import check as _check_registered

__all__ = ["LEVELS", "check", "make", "make_controller", "names"]


def _load_builtins() -> None:
    # Importing the modules runs their @register decorators; none needs an optional extra.
    import fleetwise.policies.allocators  # noqa: F401
    import fleetwise.policies.batchers  # noqa: F401
    import fleetwise.policies.planners  # noqa: F401
    import fleetwise.policies.routers  # noqa: F401
    import fleetwise.policies.routers_learned  # noqa: F401  (the learned router; its checkpoint ships in the package)
    import fleetwise.policies.scalers  # noqa: F401
    import fleetwise.policies.scalers_rl  # noqa: F401  (the trained scaler "rl"; loads its checkpoint lazily)


def names(level: str) -> list[str]:
    """Registered policy names of ``level`` (one of LEVELS)."""
    _load_builtins()
    return sorted(registered(level))


def make(level: str, name: str, params: dict[str, Any] | None = None, where: str = "") -> Any:
    """Build the policy ``name`` of ``level`` with keyword ``params``; unknown names/params give an InputError."""
    _load_builtins()
    return build(level, name, params, where)


def check(level: str, name: str, params: dict[str, Any] | None = None, where: str = "") -> None:
    """Check a policy reference (name, parameter names and types, no NaN/infinity) without building it."""
    _load_builtins()
    _check_registered(level, name, params, where)


def make_controller(router: str = "round_robin", batcher: str = "sarathi", router_params: dict | None = None,
                    batcher_params: dict | None = None) -> Controller:
    """A Controller with the router and batcher of these names."""
    return Controller(router=make("router", router, router_params), batcher=make("batcher", batcher, batcher_params))
