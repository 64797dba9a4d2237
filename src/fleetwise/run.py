"""The one run path: every way of running a scenario — ``fleetwise simulate``, ``compare``, ``sweep`` (each run of
``fleetwise.experiments.runner``), ``fleetwise.run.run_platform`` and the Python API
``fleetwise.simulate`` — goes through :func:`run_scenario`. A scenario with a scaler (its own, or one
given here) runs with the platform layer; every run ends in the same summary and reject reasons. Inside, the
simulator's one loop ``Simulator.run_until`` answers the decisions (the environments call it directly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetwise.scenario import PolicyRef, Scenario, build, sim_options


@dataclass
class RunResult:
    """One run: the built scenario (simulator, fleet, workload), its records and summary, and the platform layer
    when the scenario has a scaler (None otherwise)."""

    built: Any
    records: Any
    summary: dict[str, Any]
    platform: Any = None


def run_scenario(scenario: Scenario, seed: int | None = None, *, router=None, batcher=None, scaler=None,
                 workload=None, num_requests: int | None = None, sim_overrides: dict | None = None,
                 monitor: bool = False, progress=None, on_built=None) -> RunResult:
    """Build ``scenario`` with ``seed`` (default: its own) and run it to the end.

    ``router`` / ``batcher`` / ``scaler``: a registered name, a ``{name, params}`` mapping or a PolicyRef, in
    place of the scenario's (a scaler may also be a Scaler object); a scaler (the scenario's or this one) runs the platform layer (autoscaling, spot,
    faults, tenants). ``workload`` replaces the scenario's workload; ``num_requests`` keeps its first requests;
    ``sim_overrides`` sets simulator options beyond the scenario's (e.g. ``timeline_bucket_s``); ``monitor``
    records the platform's monitoring series. ``on_built(built)`` is called before the run starts, ``progress(k)``
    as arrivals are processed."""
    seed = scenario.seed if seed is None else seed
    scaler_obj = scaler if scaler is not None and hasattr(scaler, "scale") else None
    if scaler is not None and scaler_obj is None:
        scenario = scenario.model_copy(update={"scaler": PolicyRef.model_validate(scaler)})
    built = build(scenario, seed, workload=workload, num_requests=num_requests,
                  options=sim_options(scenario, **(sim_overrides or {})))
    ctl = built.controller(router, batcher)
    if on_built is not None:
        on_built(built)
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


def simulate(scenario: Scenario, seed: int | None = None, *, router=None, batcher=None, workload=None,
             num_requests: int | None = None, progress=None) -> tuple[Any, dict[str, float]]:
    """Build and run a scenario (:func:`run_scenario`: with the platform layer when it has a scaler); return
    (records, summary)."""
    r = run_scenario(scenario, seed, router=router, batcher=batcher, workload=workload, num_requests=num_requests,
                     progress=progress)
    return r.records, r.summary
