"""The one run path: every way of running a scenario — ``fleetwise simulate``, ``compare``, ``sweep`` (each run of
``fleetwise.experiments.runner``), ``fleetwise.run.run_platform`` and the Python API
``fleetwise.simulate`` — goes through :func:`run_scenario`. A scenario with a scaler (its own, or one
given here) runs with the platform layer; every run ends in the same summary and reject reasons. Inside, the
simulator's one loop ``Simulator.run_until`` answers the decisions (the environments call it directly).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from fleetwise.errors import InputError
from fleetwise.scenario import PolicyRef, Scenario, build, sim_options


@dataclass
class RunResult:
    """One run: the built scenario (simulator, fleet, workload), its records and summary, and the platform layer
    when the scenario has a scaler (None otherwise)."""

    built: Any
    records: Any
    summary: dict[str, Any]
    platform: Any = None


def _policy_arg(level: str, ref):
    """``ref`` (router=, batcher=, scaler=) as ``run_scenario`` takes it, or one InputError line: a name, a
    ``{name, params}`` mapping, a PolicyRef, or a policy object (a router, a batcher or a scaler itself)."""
    from collections.abc import Mapping

    from pydantic import ValidationError

    method = {"router": "route", "batcher": "plan", "scaler": "scale"}[level]
    if ref is None or isinstance(ref, PolicyRef) or hasattr(ref, method):
        return ref
    if isinstance(ref, str):
        return PolicyRef(name=ref)
    if isinstance(ref, Mapping):
        try:
            return PolicyRef.model_validate(dict(ref))
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise InputError(f"{level}={dict(ref)!r}: {loc + ': ' if loc else ''}{err['msg']}") from None
    raise InputError(f"{level}={ref!r}: expected a {level} name, a {{'name': ..., 'params': {{...}}}} mapping, a "
                     f"PolicyRef or a {level} object, not {type(ref).__name__}")


def _check_args(scenario, num_requests, workload, sim_overrides, progress, on_built) -> Scenario:
    """The Python API's arguments, each wrong one named in one InputError line (a wrong type was an
    AttributeError or TypeError deep in the build); a scenario may also be given by name or path."""
    import os

    if isinstance(scenario, (str, os.PathLike)):
        from fleetwise.scenario import load_scenario

        scenario = load_scenario(os.fspath(scenario))
    if not isinstance(scenario, Scenario):
        raise InputError(f"scenario {type(scenario).__name__}: expected a Scenario (fleetwise.load_scenario(...)) "
                         "or a built-in scenario's name or a scenario file's path")
    import numpy as np

    if num_requests is not None and (isinstance(num_requests, bool)
                                     or not isinstance(num_requests, (int, np.integer))):
        raise InputError(f"num_requests {num_requests!r}: expected an integer")
    from fleetwise.limits import MAX_REQUESTS

    if num_requests is not None and not 1 <= num_requests <= MAX_REQUESTS:  # (named the CLI's "requests")
        raise InputError(f"num_requests {num_requests}: expected 1 to {MAX_REQUESTS:,} (docs/limits.md)")
    if workload is not None:
        from fleetwise.workload.request import Workload

        if not isinstance(workload, Workload):
            raise InputError(f"workload {type(workload).__name__}: expected a fleetwise.workload.Workload (a "
                             "scenario's workload spec goes in the scenario: scenario.model_copy(update=...))")
        if len(workload) == 0:
            raise InputError(f"workload {workload.name!r}: no request (a run of it measures nothing)")
        workload.check(f"workload {workload.name!r}")
    if sim_overrides is not None:
        import dataclasses

        from fleetwise.sim.simulator import SimOptions

        allowed = {f.name for f in dataclasses.fields(SimOptions)}
        bad = sorted(set(sim_overrides) - allowed) if hasattr(sim_overrides, "keys") else None
        if bad is None or bad:
            raise InputError(f"sim_overrides {bad if bad else sim_overrides!r}: expected a mapping of simulator "
                             f"options ({', '.join(sorted(allowed))})")
    for name, f in (("progress", progress), ("on_built", on_built)):
        if f is not None and not callable(f):
            raise InputError(f"{name} {f!r}: expected a callable")
        if f is not None:  # (a callback of another signature failed inside the run, after the build)
            try:
                inspect.signature(f).bind(0)
            except TypeError:
                arg = "the requests processed since the last call" if name == "progress" else "the built scenario"
                raise InputError(f"{name} {getattr(f, '__name__', f)!r}: expected a callable of one argument "
                                 f"({arg})") from None
            except ValueError:  # no signature to read (some builtins): called as given
                pass
    return scenario


def run_scenario(scenario: Scenario | str, seed: int | None = None, *, router=None, batcher=None, scaler=None,
                 workload=None, num_requests: int | None = None, sim_overrides: dict | None = None,
                 monitor: bool = False, progress=None, on_built=None) -> RunResult:
    """Build ``scenario`` (a Scenario, or a built-in name or file path) with ``seed`` (default: its own) and run it
    to the end.

    ``router`` / ``batcher`` / ``scaler``: a registered name, a ``{name, params}`` mapping or a PolicyRef, in
    place of the scenario's (a scaler may also be a Scaler object); a scaler (the scenario's or this one) runs the platform layer (autoscaling, spot,
    faults, tenants). ``workload`` replaces the scenario's workload; ``num_requests`` keeps its first requests;
    ``sim_overrides`` sets simulator options beyond the scenario's (e.g. ``timeline_bucket_s``); ``monitor``
    records the platform's monitoring series. ``on_built(built)`` is called before the run starts, ``progress(k)``
    as arrivals are processed."""
    scenario = _check_args(scenario, num_requests, workload, sim_overrides, progress, on_built)
    router, batcher, scaler = (_policy_arg(k, v) for k, v in (("router", router), ("batcher", batcher),
                                                               ("scaler", scaler)))
    seed = scenario.seed if seed is None else seed
    scaler_obj = scaler if scaler is not None and hasattr(scaler, "scale") else None
    if scaler is not None and scaler_obj is None:
        scenario = scenario.model_copy(update={"scaler": PolicyRef.model_validate(scaler)})
    if scenario.platform is not None and scenario.scaler is None and scaler_obj is None:
        raise InputError("platform: runs only with a scaler (add scaler: static for a fixed fleet)")
    try:
        options = sim_options(scenario, **(sim_overrides or {}))
    except ValueError as e:
        raise InputError(f"sim_overrides: {e}") from None
    built = build(scenario, seed, workload=workload, num_requests=num_requests, options=options)
    ctl = built.controller(router, batcher)
    if on_built is not None:
        on_built(built)
    if len(built.workload) == 0:  # (compare and sweep printed a summary of nothing, exit 0)
        raise InputError(f"{scenario.name}: the workload drew no request (a rate or a window too small for any "
                         "arrival); nothing to simulate")
    if scenario.scaler is None and scaler_obj is None:
        records = built.sim.run(ctl, progress=progress)
        summary = built.summary(records)
        plat = None
    else:
        from fleetwise.platform.runner import Platform
        from fleetwise.policies import make

        if scaler_obj is None:
            ref = scenario.scaler
            scaler_obj = make("scaler", ref.name, ref.params, where="scaler: ")
        plat = Platform(built, scaler_obj, seed=seed, monitor=monitor)
        records = plat.run(ctl, progress=progress)
        summary = plat.results(records)
    summary["reject_reasons"] = records.reject_reasons()
    return RunResult(built=built, records=records, summary=summary, platform=plat)


def run_platform(scenario, seed: int | None = None, *, scaler=None, workload=None, progress=None, monitor=True):
    """Run ``scenario`` (a Scenario) with the platform layer through the one run path
    (``fleetwise.run.run_scenario``); returns the Platform, with ``records`` and ``summary`` — ``scaler`` is a
    registered name, a PolicyRef-like dict, or a Scaler object; default: the scenario's ``scaler`` (``hpa`` if
    it has none)."""
    if scaler is None and scenario.scaler is None:
        scaler = "hpa"
    r = run_scenario(scenario, seed, scaler=scaler, workload=workload, progress=progress, monitor=monitor)
    p = r.platform
    p.records, p.summary = r.records, r.summary
    return p


def simulate(scenario: Scenario | str, seed: int | None = None, *, router=None, batcher=None, workload=None,
             num_requests: int | None = None, progress=None) -> tuple[Any, dict[str, Any]]:
    """Build and run a scenario (:func:`run_scenario`: with the platform layer when it has a scaler); return
    (records, summary)."""
    r = run_scenario(scenario, seed, router=router, batcher=batcher, workload=workload, num_requests=num_requests,
                     progress=progress)
    return r.records, r.summary
