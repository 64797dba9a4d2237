"""Experiment specs: scenarios x policies x parameter grid x seeds, expanded into runs.

```yaml
name: routers-vs-load
scenarios: [default, scenarios/my.yaml]        # built-in names or files
policies:
  router: [round_robin, least_outstanding_tokens, {name: prefix_aware, hit_weight: 2.0}]
  batcher: [sarathi]                           # optional: each scenario's own when left out
grid:                                          # dotted paths into the scenario; every combination runs
  workload.rate_rps: [10, 20, 30]
  deployments.0.replicas: [2, 4]
seeds: 5                                       # or a list: [0, 1, 2]
requests: 2000                                 # optional: requests per run
baseline: {router: round_robin}                # paired comparisons are against this
trace: mooncake                                # optional: a trace in place of each scenario's arrivals and lengths
load: 0.7                                      # with trace: a fraction of the fleet's capacity, or real
records: false                                 # also write per-request records as Parquet
timeline_bucket_s: 10                          # per-replica utilisation over time, bucket width
```
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, StrictInt, field_validator

from fleetwise.strict import StrictModel
from fleetwise.errors import InputError
from fleetwise.limits import (
    MAX_REQUESTS,
    MAX_RUNS,
    MAX_SEED,
    MAX_SEEDS,
    MAX_SPAN_S,
    MAX_TIMELINE_BUCKETS,
    MIN_TIMELINE_BUCKET_S,
)
from fleetwise.scenario import (
    PolicyRef,
    check_deployments,
    format_validation_error,
    load_scenario,
    parse_scenario,
    read_yaml,
)

EXPERIMENT_DIR = resources.files("fleetwise") / "experiments" / "specs"  # package data (importlib.resources)
LEVELS = ("router", "batcher")


class ExperimentSpec(StrictModel):  # no unknown fields, NaN, infinity or true for a number
    """An experiment file (``fleetwise sweep FILE``): scenarios x policies x a grid of parameters x seeds, each
    combination one run stored in the results store (docs/experiments.md)."""

    name: str = Field(default="experiment", min_length=1, max_length=256)  # (it names the runs in the store)
    description: str = ""
    scenarios: list[str] = Field(min_length=1)
    policies: dict[str, list[PolicyRef]] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    # strict: `requests: true` ran 1 request, `seeds: [true, false]` seeds 1 and 0, `requests: '50'` was taken
    seeds: StrictInt | list[StrictInt] = 3
    requests: StrictInt | None = Field(default=None, gt=0, le=MAX_REQUESTS)
    baseline: dict[str, str] = Field(default_factory=dict)
    records: bool = False
    timeline_bucket_s: float | None = Field(default=None, ge=MIN_TIMELINE_BUCKET_S, le=MAX_SPAN_S)  # (the run's bound)
    # a user's trace in place of every scenario's arrivals and lengths (docs/workloads.md#bring-your-own-trace)
    trace: str | None = Field(default=None, min_length=1)
    load: float | str | None = None  # a fraction of the fleet's capacity, or "real" (default with a trace)

    @field_validator("policies")
    @classmethod
    def _levels(cls, v: dict) -> dict:
        for level, refs in v.items():
            if level not in LEVELS:
                raise ValueError(f"unknown decision level {level!r}; expected one of: {', '.join(LEVELS)}")
            if not refs:
                raise ValueError(f"policies.{level}: give at least one policy")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        if isinstance(v, int) and not 1 <= v <= MAX_SEEDS:
            raise ValueError(f"{v:,} seeds: expected 1 to {MAX_SEEDS:,} (docs/limits.md)")
        if isinstance(v, list) and (not v or len(set(v)) != len(v)):
            raise ValueError("seeds must be a non-empty list of distinct integers")
        if isinstance(v, list) and len(v) > MAX_SEEDS:
            raise ValueError(f"{len(v):,} seeds, above the limit of {MAX_SEEDS:,} (docs/limits.md)")
        if isinstance(v, list) and any(not 0 <= x <= MAX_SEED for x in v):
            bad = next(x for x in v if not 0 <= x <= MAX_SEED)
            raise ValueError(f"seed {bad}: expected an integer from 0 to 2^63 - 1")
        return v

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict) -> dict:
        for k, vals in v.items():
            if not vals:
                raise ValueError(f"grid.{k}: give at least one value")
            for i, x in enumerate(vals):  # ([5, 5.0] ran twice as two points: the same run, labelled twice)
                if any(x == y and type(x) is not bool and type(y) is not bool for y in vals[:i]):
                    raise ValueError(f"grid.{k}: the value {x!r} is listed twice")
        return v

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


@dataclass(frozen=True)
class Run:
    """One simulation: a scenario (as a validated dict, grid values applied), policies and a seed."""

    run_id: str
    experiment: str
    scenario_name: str
    scenario: dict
    scenario_hash: str
    params: dict  # grid values of this run, e.g. {"workload.rate_rps": 20}
    router: str
    router_params: dict
    batcher: str
    batcher_params: dict
    seed: int
    requests: int | None = None
    records_dir: str | None = None
    timeline_bucket_s: float | None = None
    policy: dict = field(default_factory=dict)  # {"router": label, "batcher": label}
    level: str = "router"  # the level(s) the experiment compares: router, batcher or router+batcher

    @property
    def policy_label(self) -> str:
        """The compared policy's label: at each compared level, joined by ``+``."""
        return "+".join(str(self.policy.get(lv)) for lv in self.level.split("+"))


def _label(ref: PolicyRef) -> str:
    if not ref.params:
        return ref.name
    return ref.name + "(" + ",".join(f"{k}={v}" for k, v in sorted(ref.params.items())) + ")"


def set_path(d: dict, path: str, value: Any, where: str) -> None:
    """Set ``a.b.0.c`` inside nested dicts and lists."""
    parts = path.split(".")
    cur: Any = d
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(cur, list):
            if not (p.isascii() and p.isdigit()) or int(p) >= len(cur):  # (isdigit alone takes '²')
                raise InputError(f"{where}: grid key {path!r}: {'.'.join(parts[:i])} has no item {p}")
            if last:
                cur[int(p)] = value
            else:
                cur = cur[int(p)]
        elif isinstance(cur, dict):
            if last:
                cur[p] = value
            else:
                if p not in cur:
                    cur[p] = {}
                cur = cur[p]
        else:
            raise InputError(f"{where}: grid key {path!r}: {'.'.join(parts[:i])} is not a mapping or list")


def load_experiment(path_or_name: str | Path) -> ExperimentSpec:
    """Load an experiment file, or a built-in one by name (``default``)."""
    p, data = read_yaml(path_or_name, EXPERIMENT_DIR, "experiment")
    return parse_experiment(data, where=str(p))


def parse_experiment(data: Any, where: str = "experiment") -> ExperimentSpec:
    """An :class:`ExperimentSpec` from a mapping (a parsed YAML file); bad input is one ``InputError`` line naming
    ``where`` and the field."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping at the top level")
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(e, where)) from None
    from fleetwise.policies import make

    for level, refs in spec.policies.items():
        for i, ref in enumerate(refs):
            make(level, ref.name, ref.params, where=f"{where}: policies.{level}[{i}]: ")
    if spec.baseline:
        for level, name in spec.baseline.items():
            labels = [_label(r) for r in spec.policies.get(level, [])]
            if level not in LEVELS or (labels and name not in labels):
                raise InputError(f"{where}: baseline.{level}: {name!r} is not one of the experiment's policies "
                                 f"({', '.join(labels) or 'none'})")
    return spec


def _check_run_size(workload: dict, spec: ExperimentSpec, where: str, traces: dict) -> None:
    """What a run will ask for, checked before any run starts: the workload with the spec's ``requests``, its
    trace files (read once per expansion), and the utilisation timeline's bucket count where the arrivals' span
    is known (generated workloads)."""
    from pydantic import ValidationError

    from fleetwise.scenario import format_validation_error, with_requests
    from fleetwise.workload.spec import expected_span_s, parse_workload_spec

    w = with_requests(workload, spec.requests) if spec.requests is not None else workload
    try:
        parsed = parse_workload_spec(w)
    except ValidationError as e:
        raise InputError(format_validation_error(e, f"{where}: with requests: {spec.requests}: workload")) from None
    from fleetwise.workload.spec import MixSpec, TraceSpec, load_trace

    for part in parsed.parts if isinstance(parsed, MixSpec) else [parsed]:
        part = getattr(part, "workload", part)
        key = (part.path, part.format, part.num_requests) if isinstance(part, TraceSpec) else None
        if key is not None and key not in traces:
            try:
                traces[key] = load_trace(part.path, part.format, limit=part.num_requests) is not None
            except InputError as e:
                raise InputError(f"{where}: workload: {e}") from None
    span = expected_span_s(parsed)
    if spec.timeline_bucket_s and span is not None and span / spec.timeline_bucket_s > MAX_TIMELINE_BUCKETS:
        raise InputError(f"{where}: timeline_bucket_s {spec.timeline_bucket_s:g} over ~{span:.3g} s of arrivals is "
                         f"{span / spec.timeline_bucket_s:.3g} buckets per replica, above the limit of "
                         f"{MAX_TIMELINE_BUCKETS:,} (docs/limits.md)")


def _trace_workload(base, spec: ExperimentSpec, where: str) -> dict:
    """The scenario's workload with the experiment's trace and load (fleetwise.workload.spec.trace_in_place_of)."""
    from fleetwise.workload.spec import parse_load, resolve_trace, trace_in_place_of

    try:
        load = parse_load(spec.load)
        if spec.trace is not None:
            resolve_trace(spec.trace)
            return trace_in_place_of(base.workload, spec.trace, load)[0]
    except InputError as e:
        raise InputError(f"{where}: {str(e).replace('--load', 'load')}") from None
    if base.workload.get("kind") != "trace":
        raise InputError(f"{where}: load needs a trace (scenario {base.name}'s workload is "
                         f"{base.workload.get('kind')}; name one in trace:)")
    if load == "real":  # the trace's own rate, as the scenario replays it: its time scale kept (it was dropped,
        # so prefix-cache ran at twice its rate), as trace_in_place_of keeps it for simulate --load real
        return {k: v for k, v in base.workload.items() if k != "load"} | {"load": load}
    w = {k: v for k, v in base.workload.items() if k not in ("time_scale", "target_rate_rps")}
    return w | {"load": load}


def _run_id(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def expand(spec: ExperimentSpec, where: str = "experiment", records_dir: str | None = None) -> list[Run]:
    """Every combination of scenario x grid point x router x batcher x seed, validated up front. A run's id
    hashes the experiment name, its scenario (grid applied), policies, seed and request count."""
    runs: list[Run] = []
    keys = list(spec.grid)
    n_points = math.prod(len(spec.grid[k]) for k in keys)
    n_pol = math.prod(len(spec.policies.get(level) or [None]) for level in LEVELS)
    n_runs = len(spec.scenarios) * n_points * n_pol * len(spec.seed_list)
    if n_runs > MAX_RUNS:  # counted before anything is expanded
        raise InputError(f"{where}: the spec expands to {n_runs:,} runs, above the limit of {MAX_RUNS:,} "
                         "(docs/limits.md)")
    for k in keys:  # a grid key that another setting overrides ran every point alike, labelled with its value
        root = k.split(".")[0]
        other = ("seeds" if k == "seed" else f"policies.{root}" if root in LEVELS and spec.policies.get(root)
                 else "requests" if spec.requests is not None and k in ("workload.num_requests", "workload.duration_s")
                 else None)
        if other is not None:
            hint = "drop requests: to let the grid set the size" if other == "requests" else f"list them in {other}"
            raise InputError(f"{where}: grid key {k!r}: every run takes it from {other}, so its values would "
                             f"change nothing ({hint})")
    points = list(itertools.product(*(spec.grid[k] for k in keys))) or [()]
    traces: dict = {}  # trace files read once while checking
    varied = [lv for lv in ("router", "batcher") if len(spec.policies.get(lv) or []) > 1]
    level = "+".join(varied) or ("batcher" if spec.policies.get("batcher") and not spec.policies.get("router")
                                 else "router")
    for sname in spec.scenarios:
        try:
            base = load_scenario(sname)
        except InputError as e:
            raise InputError(f"{where}: scenarios: {e}") from None
        base_dict = base.model_dump(mode="json")
        if spec.trace is not None or spec.load is not None:
            base_dict["workload"] = _trace_workload(base, spec, where)
        for point in points:
            sc = copy.deepcopy(base_dict)
            params = dict(zip(keys, point))
            for k, v in params.items():
                set_path(sc, k, v, where)
            tag = ",".join(f"{k}={v}" for k, v in params.items())
            label = f"{where}: scenario {base.name}" + (f" with {tag}" if tag else "")
            scenario = parse_scenario(sc, where=label)
            try:  # what building it would refuse (an unknown model, GPU, region or cloud; a model too large)
                check_deployments(scenario)
            except InputError as e:
                raise InputError(f"{label}: {e}") from None
            if scenario.platform is not None:  # runs with the platform layer: what it checks, checked now
                from fleetwise.platform.faults import check_scenario_faults

                if scenario.scaler is None:
                    raise InputError(f"{label}: platform: runs only with a scaler (add scaler: static for a "
                                     "fixed fleet)")
                try:
                    check_scenario_faults(scenario)
                except InputError as e:
                    raise InputError(f"{label}: {e}") from None
            sc = scenario.model_dump(mode="json")
            _check_run_size(sc["workload"], spec, label, traces)
            routers = spec.policies.get("router") or [scenario.router]
            batchers = spec.policies.get("batcher") or [scenario.batcher]
            for r in routers:
                for b in batchers:
                    for seed in spec.seed_list:
                        payload = {"experiment": spec.name, "scenario": sc, "router": r.model_dump(), "batcher": b.model_dump(),
                                   "seed": seed, "requests": spec.requests, "timeline": spec.timeline_bucket_s}
                        runs.append(Run(
                            run_id=_run_id(payload), experiment=spec.name, scenario_name=base.name, scenario=sc,
                            scenario_hash=scenario.digest(), params=params, router=r.name, router_params=r.params,
                            batcher=b.name, batcher_params=b.params, seed=seed, requests=spec.requests,
                            records_dir=records_dir if spec.records else None,
                            timeline_bucket_s=spec.timeline_bucket_s,
                            policy={"router": _label(r), "batcher": _label(b)}, level=level))
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise InputError(f"{where}: the spec expands to duplicate runs (a scenario or policy listed twice?)")
    for lv, name in (spec.baseline or {}).items():  # (with no policies listed at that level, a baseline naming
        # none of the scenarios' own was taken, and every change printed as "-")
        labels = sorted({r.policy.get(lv) for r in runs if r.policy.get(lv) is not None})
        if runs and name not in labels:
            raise InputError(f"{where}: baseline.{lv}: {name!r} is not a policy any run uses ({', '.join(labels)})")
    return runs
