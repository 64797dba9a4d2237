"""One registry per decision level. A new policy is one definition: ``@register_router("power_of_two")``.

This module only keeps the tables; ``fleetwise.policies.make(level, name, params)`` loads the built-in policies
(importing their modules runs the decorators) and builds one. A package of your own registers its policies the
same way when it is imported.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable

from fleetwise.errors import InputError, short_repr
from fleetwise.yamlio import non_finite

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
    return _table(level)


def _table(level: Any) -> dict[str, Callable[..., Any]]:
    if not isinstance(level, str) or level not in _REGISTRY:
        raise InputError(f"unknown decision level {level!r}; expected one of: {', '.join(_REGISTRY)}")
    return _REGISTRY[level]


_ADAPTERS: dict[Any, Any] = {}


def _adapter(annotation: Any):
    """A pydantic TypeAdapter for a parameter's annotation that refuses NaN and infinity (None: not a type
    pydantic can check, e.g. a simulator object)."""
    from pydantic import ConfigDict, TypeAdapter

    try:
        if annotation in _ADAPTERS:
            return _ADAPTERS[annotation]
    except TypeError:  # unhashable: not cached
        pass
    try:
        ta = TypeAdapter(annotation, config=ConfigDict(allow_inf_nan=False))
    except Exception:  # noqa: BLE001 - no schema for this type: only the finiteness check applies
        ta = None
    try:
        _ADAPTERS[annotation] = ta
    except TypeError:
        pass
    return ta


MAX_INT_PARAM = 2**53  # an integer parameter beyond what a float holds exactly is no count of anything here (a 400-digit
# min_zones overflowed math.isfinite)


def _non_finite(v: Any) -> bool:
    """NaN, infinity or an integer beyond 2^53 anywhere in ``v`` (nested lists, tuples and dicts)."""
    return non_finite(v, MAX_INT_PARAM)


def check(level: str, name: str, params: dict[str, Any] | None = None, where: str = "") -> Callable[..., Any]:
    """Check a reference to a registered policy without building it: the name is registered, every parameter
    exists, has the annotated type (validated with pydantic) and holds no NaN or infinity. Returns the factory;
    bad input gives an InputError. ``fleetwise.policies.check`` loads the built-ins first."""
    return _checked(level, name, params, where)[0]


def _checked(level: str, name: str, params: dict[str, Any] | None, where: str) -> tuple[Callable[..., Any], dict]:
    """(factory, parameters): a parameter given as text that its annotation reads as a number (YAML 1.1 reads
    ``1e3`` and ``1.0e308`` as strings) is passed as that number, checked for finiteness like any other; it was
    passed on as text, and the policy compared a string with a number mid-run."""
    table = _table(level)
    if not isinstance(name, str):
        raise InputError(f"{where}{level} name {name!r}: expected a string, one of: {', '.join(sorted(table))}")
    if params is not None and not isinstance(params, dict):
        raise InputError(f"{where}{level} {name!r}: params {params!r}: expected a mapping of parameter names to values")
    if name not in table:
        raise InputError(f"{where}unknown {level} {name!r}; expected one of: {', '.join(sorted(table))}")
    factory = table[name]
    params = dict(params or {})
    sig = inspect.signature(factory)
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    try:
        hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable annotations: check finiteness only
        hints = {}
    # with annotations, an unannotated parameter is for code, not for a spec (a planner's cfg: a world config
    # object; 'ot?cfg=foo' failed mid-plan with "'str' object has no attribute 'w_latency'")
    settable = [k for k in sig.parameters if k != "self" and (not hints or k in hints)]
    if not accepts_kwargs:
        bad = [k for k in params if k not in settable]
        if bad:
            allowed = ", ".join(settable) or "none"
            raise InputError(f"{where}{level} {name!r} has no parameter {bad[0]!r}; allowed: {allowed}")
    required = [k for k, p in sig.parameters.items() if k != "self" and p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and k not in params]
    if required:  # (the factory's own TypeError named an internal function: "load_dqn() missing 1 required ...")
        raise InputError(f"{where}{level} {name!r} needs the parameter {required[0]!r} (e.g. "
                         f"'{name}?{required[0]}=...')")
    from pydantic import ValidationError

    def finite(k: str, v: Any) -> None:
        if _non_finite(v):
            raise InputError(f"{where}{level} {name!r}: {k} must be finite and at most 2^53 in size "
                             f"(got {short_repr(v)})")

    for k, v in params.items():
        finite(k, v)
        ta = _adapter(hints[k]) if k in hints else None
        if ta is not None:
            try:
                got = ta.validate_python(v)
            except ValidationError as e:
                raise InputError(f"{where}{level} {name!r}: {k}: {e.errors()[0]['msg']} (got {short_repr(v)})"
                                 ) from None
            if isinstance(v, bool) and not isinstance(got, bool):  # (pydantic reads true as 1 for a number)
                raise InputError(f"{where}{level} {name!r}: {k}: expected a number, got {str(v).lower()}")
            if isinstance(v, str) and isinstance(got, (int, float)):
                params[k] = got
                finite(k, got)
    return factory, params


def build(level: str, name: str, params: dict[str, Any] | None = None, where: str = "") -> Any:
    """Build the registered policy ``name`` of ``level`` with keyword ``params``; unknown names or parameters, a
    parameter of the wrong type, NaN or infinity (see :func:`check`), or one the constructor refuses give an
    InputError. Only what is registered already is known: ``fleetwise.policies.make`` loads the built-ins."""
    factory, params = _checked(level, name, params, where)
    try:
        return factory(**params)
    except (TypeError, ValueError) as e:
        own = f"{level} {name!r}"  # (a constructor that names itself: not "router 'learned': router 'learned': ...")
        raise InputError(f"{where}{e}" if str(e).startswith(own) else f"{where}{own}: {e}") from None
