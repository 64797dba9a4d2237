"""One registry per decision level. A new policy is one definition: ``@register_router("power_of_two")``.

This module only keeps the tables; ``fleetwise.policies.make(level, name, params)`` loads the built-in policies
(importing their modules runs the decorators) and builds one. A package of your own registers its policies the
same way when it is imported.
"""

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


def registered(level: str) -> dict[str, Callable[..., Any]]:
    """The policies registered for ``level`` so far (name -> factory). ``fleetwise.policies.make`` and ``names``
    load the built-in policies first; use those."""
    return _REGISTRY[level]


def build(level: str, name: str, params: dict[str, Any] | None = None, where: str = "") -> Any:
    """Build the registered policy ``name`` of ``level`` with keyword ``params``; unknown names/params give an
    InputError. Only what is registered already is known: ``fleetwise.policies.make`` loads the built-ins."""
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
