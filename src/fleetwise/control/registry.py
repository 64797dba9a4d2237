"""One registry per decision level. A new policy is one definition: ``@register_router("power_of_two")``."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from fleetwise.errors import InputError

LEVELS = ("allocator", "planner", "scaler", "router", "batcher")
_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {level: {} for level in LEVELS}


def register(level: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(factory: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY[level]:
            raise ValueError(f"{level} policy {name!r} registered twice")
        _REGISTRY[level][name] = factory
        return factory

    return deco


def register_router(name: str):
    return register("router", name)


def register_batcher(name: str):
    return register("batcher", name)


def register_scaler(name: str):
    return register("scaler", name)


def register_planner(name: str):
    return register("planner", name)


def register_allocator(name: str):
    return register("allocator", name)


def _load_builtins() -> None:
    # Importing the modules runs their @register decorators.
    import fleetwise.policies.batchers  # noqa: F401
    import fleetwise.policies.planners  # noqa: F401
    import fleetwise.policies.routers  # noqa: F401
    import fleetwise.policies.scalers  # noqa: F401

    try:  # allocators need gymnasium (the ``rl`` extra)
        import fleetwise.policies.allocators  # noqa: F401
        import fleetwise.policies.scalers_rl  # noqa: F401  (the trained scaler "rl")
    except ImportError:
        pass


def names(level: str) -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY[level])


def make(level: str, name: str, params: dict[str, Any] | None = None, where: str = "") -> Any:
    """Build the policy ``name`` of ``level`` with keyword ``params``; unknown names/params give an InputError."""
    _load_builtins()
    table = _REGISTRY[level]
    if name not in table:
        raise InputError(f"{where}unknown {level} {name!r}; expected one of: {', '.join(sorted(table))}")
    factory = table[name]
    params = dict(params or {})
    sig = inspect.signature(factory)
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    if not accepts_kwargs:
        bad = [k for k in params if k not in sig.parameters]
        if bad:
            allowed = ", ".join(k for k in sig.parameters if k != "self") or "none"
            raise InputError(f"{where}{level} {name!r} has no parameter {bad[0]!r}; allowed: {allowed}")
    try:
        return factory(**params)
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}{level} {name!r}: {e}") from None
