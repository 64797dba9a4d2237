"""Scenarios: a YAML file validated once at the edge, then ``build(scenario, seed)`` makes the simulator.

A scenario names the fleet (regions, links, prices), the deployments (model x GPU x TP/PP x replicas per
region), the workload, the router and batcher, and simulator options. Components take plain values, never
the whole scenario.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from fleetwise.strict import StrictModel
from fleetwise.errors import InputError, format_validation_error, not_a_file
from fleetwise.limits import MAX_BLOCK_TOKENS, MAX_REPLICAS, MAX_REQUESTS, MAX_SEED, MAX_SPAN_S, MIN_PERIOD_S

# The built-in scenarios ship inside the package (package data; the repository's scenarios/ links here) and are
# found through importlib.resources, so an installed wheel finds them wherever it is installed.
SCENARIO_DIR = resources.files("fleetwise") / "scenarios"

# Read bandwidth of the storage a replica loads its weights from, GB/s (typical figures):
# local NVMe: a PCIe Gen4 data-centre SSD reads ~6-7 GB/s (e.g. Samsung PM1733 datasheet 7.0 GB/s) -> 5.0
# after file-system overhead; nfs: 10 GbE NFS share ~1.1 GB/s; object_store: S3 at a few parallel ranged
# GETs per instance ~0.5 GB/s (AWS guidance: ~100 MB/s per connection).
STORAGE_GBPS = {"local_nvme": 5.0, "nfs": 1.1, "object_store": 0.5}


class _Model(StrictModel):  # no unknown fields, NaN, infinity or true for a number
    pass


class PolicyRef(_Model):
    """A policy by registered name, with keyword parameters: ``round_robin`` or ``{name: sarathi, chunk_tokens: 512}``."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_short(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"name": v}
        if isinstance(v, dict) and "params" not in v and "name" in v:
            return {"name": v["name"], "params": {k: x for k, x in v.items() if k != "name"}}
        return v


class Deployment(_Model):
    """``replicas`` copies of ``model`` on ``gpu`` (catalog names: ``fleetwise perf predict --help``), each on
    ``tp`` x ``pp`` GPUs, in ``region`` (default: the fleet's first), billed from ``pool`` (``on_demand`` or
    ``spot``); a ``calibration`` file selects a fitted performance model (docs/perf-model.md)."""

    model: str
    gpu: str
    tp: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=64)
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    region: str | None = None  # default: the fleet's first region
    cloud: str | None = None  # price list to bill from; default: the region's cloud
    pool: Literal["on_demand", "spot"] = "on_demand"
    block_tokens: int = Field(default=16, ge=1, le=MAX_BLOCK_TOKENS)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    cold_start: bool = False  # replicas load their weights at t=0 before serving
    storage: Literal["local_nvme", "nfs", "object_store"] = "local_nvme"
    provision_s: float = Field(default=0.0, ge=0, le=MAX_SPAN_S)  # node start-up before the model load, when cold
    # platform (autoscaling, issue 8): this deployment is one scaling group
    zone: str | None = None  # availability zone (e.g. us-east-1a); default: "<region>-a"
    min_replicas: int = Field(default=0, ge=0, le=MAX_REPLICAS)
    max_replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)  # default: max(replicas, 1) * 4
    spot_trace: str | None = None  # spot capacity trace (platform.spot names, or "auto" by zone); spot pools only
    spot_offset_s: float = Field(default=0.0, ge=0, le=MAX_SPAN_S)  # where in the trace the simulation starts
    calibration: str | None = None  # a GPU calibration file (fleetwise perf calibrate) for this deployment's GPU

    @field_validator("model", "gpu")
    @classmethod
    def _in_catalog(cls, v: str, info) -> str:  # (an unknown name was found only when the scenario was built)
        from fleetwise.catalog import get_gpu, get_model

        (get_model if info.field_name == "model" else get_gpu)(v)
        return v

    @model_validator(mode="after")
    def _check_limits(self) -> "Deployment":
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) < min_replicas ({self.min_replicas})")
        if self.max_replicas is not None and self.replicas > self.max_replicas:  # (5 ran and were billed)
            raise ValueError(f"replicas ({self.replicas}) > max_replicas ({self.max_replicas})")
        if self.spot_trace is not None and self.pool != "spot":
            raise ValueError("spot_trace is only for pool: spot")
        if self.spot_offset_s and self.pool != "spot":  # (was taken and ignored)
            raise ValueError("spot_offset_s is only for pool: spot")
        return self


class Options(_Model):
    """Engine options of every replica: prefix caching, a bound on the waiting queue (``max_waiting``; a request
    beyond it is rejected as ``queue_full``), and swapping a preempted sequence's KV cache to host memory."""

    prefix_caching: bool = True
    max_waiting: int | None = Field(default=None, ge=0)
    kv_offload: bool = False  # preempted sequences swap their KV to host memory (PCIe) instead of recomputing


class TenantSpec(_Model):
    """Per-tenant admission: a token-bucket rate limit and a quota of requests in flight."""

    name: str = Field(min_length=1)
    rate_limit_rps: float | None = Field(default=None, gt=0)
    burst: int = Field(default=20, ge=1)
    max_outstanding: int | None = Field(default=None, ge=1)


class AdmissionSpec(_Model):
    """Overload admission control: with more than ``max_queue_per_replica`` requests waiting per ready replica
    of the model, requests below ``protect_priority`` are rejected ("admission_control")."""

    max_queue_per_replica: float | None = Field(default=None, gt=0)
    protect_priority: int = 1


class FaultSpec(_Model):
    """A fault in the schedule. ``target``: gpu -> a replica (``r3``) or a group (deployment, ``g1``), node -> a
    group, zone -> a zone of the deployments, region -> a region of the fleet, link -> "regionA,regionB"; gpu and
    node faults with an empty target hit one at random. A target naming nothing is an error (checked when the
    platform layer starts, before it runs)."""

    at_s: float = Field(ge=0, le=MAX_SPAN_S)
    kind: Literal["gpu", "node", "zone", "region", "link"]
    target: str = ""
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SPAN_S)  # zone/region outage, link degradation
    # link degradation: round trip x factor, bandwidth / factor. At most 1,000: at 1e6 a request sent during the
    # fault took longer in transit than the drain and was lost (transit is fixed when it is sent)
    factor: float = Field(default=10.0, ge=1, le=1000)

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> "FaultSpec":  # (a gpu fault's duration_s and factor were taken and ignored)
        if self.kind in ("gpu", "node") and self.duration_s is not None:
            raise ValueError(f"duration_s: a {self.kind} fault is permanent (the platform replaces the replica); "
                             "duration_s is for zone, region and link faults")
        if self.kind != "link" and self.factor != 10.0:
            raise ValueError("factor is for link faults")
        return self


class PlatformSpec(_Model):
    """How the platform layer runs: scaling epochs, health checks, spot notices, faults, tenants, monitoring."""

    epoch_s: float = Field(default=30.0, ge=MIN_PERIOD_S, le=MAX_SPAN_S)
    monitor_s: float = Field(default=60.0, ge=MIN_PERIOD_S, le=MAX_SPAN_S)
    health_check_s: float = Field(default=5.0, ge=0, le=MAX_SPAN_S)  # dead replicas get requests until a check
    notice_s: float | None = Field(default=None, ge=0, le=MAX_SPAN_S)  # spot notice; default: by cloud (AWS 120 s)
    migrate: bool = True  # spot: running sequences move with their KV cache at the end of the notice
    node_cache: bool = True  # replicas packed on a node share one host copy of the weights (fast reload)
    host_load_gbps: float = Field(default=25.0, gt=0)  # host memory -> GPU weight load bandwidth (node cache hit)
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SPAN_S)  # billing window; default: last arrival + drain
    drain_s: float = Field(default=1800.0, ge=0, le=MAX_SPAN_S)  # after the last arrival, to let requests finish
    # a failed attempt's retry waits retry_backoff_s, doubling up to retry_backoff_max_s: a cap under a second (as
    # the scaling epochs' floor) let 1 ms retries hit a dead replica a million times before its health check
    retry_backoff_s: float = Field(default=0.5, ge=1e-3, le=MAX_SPAN_S)
    retry_backoff_max_s: float = Field(default=30.0, ge=MIN_PERIOD_S, le=MAX_SPAN_S)
    tenants: list[TenantSpec] = Field(default_factory=list)
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    faults: list[FaultSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "PlatformSpec":
        names = [t.name for t in self.tenants]  # (a second entry of one name silently replaced the first)
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"tenants: {dup!r} is listed twice")
        if self.retry_backoff_s > self.retry_backoff_max_s:  # (the cap won: the first backoff was ignored)
            raise ValueError(f"retry_backoff_s ({self.retry_backoff_s:g}) > retry_backoff_max_s "
                             f"({self.retry_backoff_max_s:g})")
        return self


def _check_models(d: Any, where: str) -> None:
    """Every ``model:`` a scenario's workload names (its own, a mix part's, a trace tenant's) is ``default`` or a
    catalog model: a typo sent every request to no replica, with exit status 0. (Model names a trace file carries,
    e.g. BurstGPT's ``ChatGPT``, are the trace's and are not checked here.)"""
    from fleetwise.workload.spec import known_model

    if isinstance(d, dict):
        for k, v in d.items():
            if k == "model" and isinstance(v, str):
                try:
                    known_model(v)
                except ValueError as e:
                    raise ValueError(f"{where}.model: {e}") from None
            else:
                _check_models(v, f"{where}.{k}")
    elif isinstance(d, list):
        for i, v in enumerate(d):
            _check_models(v, f"{where}[{i}]")


def _named_models(d: Any) -> set[str]:
    """The models a workload names other than ``default`` (its own, a mix part's, a trace tenant's)."""
    out: set[str] = set()
    if isinstance(d, dict):
        for k, v in d.items():
            if k == "model" and isinstance(v, str):
                if v != "default":
                    out.add(v)
            else:
                out |= _named_models(v)
    elif isinstance(d, list):
        for v in d:
            out |= _named_models(v)
    return out


class Scenario(_Model):
    """A scenario file, validated (unknown fields, NaN, infinity and ``true`` for a number are refused): a fleet of
    regions, ``deployments`` (model x GPU x TP/PP x replicas), a ``workload`` (synthetic or a real trace), the
    ``router`` and ``batcher`` (and optionally a ``scaler`` with its ``platform``) as registered policy names with
    parameters, and engine ``options``. ``fleetwise.load_scenario`` reads one; ``fleetwise.simulate`` runs it.
    docs/tutorial.md and the built-in ``scenarios/*.yaml`` show every field."""

    name: str = "scenario"
    description: str = ""
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    fleet: dict[str, Any] = Field(default_factory=lambda: {"topology": "single"})
    deployments: list[Deployment] = Field(min_length=1)
    workload: dict[str, Any] = Field(default_factory=lambda: {"kind": "default", "rate_rps": 4.0})
    router: PolicyRef = Field(default_factory=lambda: PolicyRef(name="round_robin"))
    batcher: PolicyRef = Field(default_factory=lambda: PolicyRef(name="sarathi"))
    scaler: PolicyRef | None = None  # autoscaling (issue 8): run with the platform layer
    platform: PlatformSpec | None = None
    options: Options = Field(default_factory=Options)
    # the typed fleet and workload specs (tagged unions), parsed once when the scenario is validated; the dicts
    # above stay what the scenario says (what it dumps, hashes and a sweep's grid edits)
    _parsed: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check_parts(self) -> "Scenario":
        from fleetwise.fleet.spec import parse_fleet_spec
        from fleetwise.workload.spec import parse_workload_spec

        fleet = parse_fleet_spec(self.fleet)
        try:
            workload = parse_workload_spec(self.workload)
        except ValidationError as e:
            raise ValueError(format_validation_error(e, "workload")) from None
        self._parsed = {"fleet": (self.fleet, fleet), "workload": (self.workload, workload)}
        _check_models(self.workload, "workload")
        named = _named_models(self.workload)
        if named:  # a catalog model that no deployment serves reached no replica either (exit 0, a warning)
            from fleetwise.catalog import get_model

            served = {get_model(d.model).name for d in self.deployments}
            missing = sorted({get_model(m).name for m in named} - served)
            if missing:
                raise ValueError(f"workload: model {missing[0]} is served by no deployment (deployed: "
                                 f"{', '.join(sorted(served))})")
        total = sum(d.replicas for d in self.deployments)
        if self.scaler is not None:  # the platform may scale every group up to its max_replicas
            total = max(total, sum(d.max_replicas if d.max_replicas is not None else max(d.replicas, 1) * 4
                                   for d in self.deployments))
        if total > MAX_REPLICAS:
            raise ValueError(f"deployments: {total:,} replicas in all{' (max_replicas)' if self.scaler else ''}, "
                             f"above the limit of {MAX_REPLICAS:,} (docs/limits.md)")
        return self

    def _typed(self, part: str):
        src, spec = self._parsed.get(part, (None, None))
        if src is getattr(self, part):
            return spec
        self._check_parts()  # a model_copy(update=...) replaced the dict: parse the new one once
        return self._parsed[part][1]

    @property
    def workload_spec(self):
        """The workload as its typed spec (``fleetwise.workload.spec``: PoissonSpec, TraceSpec, MixSpec, ...)."""
        return self._typed("workload")

    @property
    def fleet_spec(self):
        """The fleet as its typed spec (``fleetwise.fleet.spec``: SingleSpec, BackboneSpec, ...)."""
        return self._typed("fleet")

    def digest(self) -> str:
        """Stable hash of the scenario's content (for results stores)."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def parse_scenario(data: Any, where: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(e, where)) from None
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    from fleetwise.policies import check, make

    # policy parameters are checked here too (types, no NaN/infinity, the constructor's own checks); the scaler
    # is only checked, not built (a learned one loads its checkpoint)
    make("router", sc.router.name, sc.router.params, where=f"{where}: router: ")
    make("batcher", sc.batcher.name, sc.batcher.params, where=f"{where}: batcher: ")
    if sc.scaler is not None:
        check("scaler", sc.scaler.name, sc.scaler.params, where=f"{where}: scaler: ")
    return sc


def builtin_files(builtin_dir) -> dict[str, Any]:
    """The ``NAME.yaml`` files of a package-data folder (an importlib.resources Traversable), by NAME."""
    return {q.name[:-5]: q for q in builtin_dir.iterdir() if q.name.endswith(".yaml") and q.is_file()}


def scenario_names() -> list[str]:
    return sorted(builtin_files(SCENARIO_DIR))


def read_yaml(path_or_name: str | Path, builtin_dir, what: str) -> tuple[Path, Any]:
    """Find a YAML file (a path, or a name in the package-data folder ``builtin_dir``) and parse it; one-line
    errors with the file (not found, a folder, not UTF-8, invalid YAML, a key given twice)."""
    from fleetwise.yamlio import load_file

    p = Path(path_or_name)
    builtin = builtin_files(builtin_dir)
    if not p.is_file() and str(path_or_name) in builtin:  # (a folder of that name in the working directory, e.g.
        p = builtin[str(path_or_name)]  # reproduce platform's checkpoints, is not a scenario and hides nothing)
    if not p.is_file():
        problem = not_a_file(p, what)
        raise InputError(f"{path_or_name}: {problem} (built-in: {', '.join(sorted(builtin))})")
    return p, load_file(p, what)


def load_scenario(path_or_name: str | Path | None = None) -> Scenario:
    """Load a scenario file, or a built-in one by name (``vidur-parity``); None: the embedded default."""
    if path_or_name is not None and not isinstance(path_or_name, (str, os.PathLike)):
        raise InputError(f"scenario {path_or_name!r}: expected a built-in scenario's name or a file's path")
    if path_or_name is not None and not os.fspath(path_or_name).strip():  # ("" read as the current folder)
        raise InputError(f"scenario {path_or_name!r}: empty; expected a built-in scenario's name or a file's path")
    p, data = read_yaml("default" if path_or_name is None else path_or_name, SCENARIO_DIR, "scenario")
    return parse_scenario(data, where=str(p))


@dataclass
class Built:
    """What ``build`` returns: the simulator, ready to run, and the pieces a summary needs."""

    scenario: Scenario
    sim: Any
    fleet: Any
    workload: Any
    slo_classes: list
    chunk_tokens: int | None = None
    templates: list | None = None  # per deployment: make_replica keyword arguments (platform scale-up)
    models: list | None = None  # model names by model index
    adaptations: list = field(default_factory=list)  # AdaptReport per trace fitted to the fleet (print .lines())

    def controller(self, router: PolicyRef | str | None = None, batcher: PolicyRef | str | None = None):
        """A Controller with the scenario's router and batcher (or the ones given: a name, a mapping, a
        PolicyRef, or a policy object itself, e.g. one being trained). Run it with ``fleetwise.run.run_scenario``
        (the one run path) or ``self.sim.run``."""
        from fleetwise.control.controller import Controller
        from fleetwise.policies import make

        def policy(level: str, ref, default: PolicyRef):
            if ref is not None and hasattr(ref, "route" if level == "router" else "plan"):
                return ref
            try:
                r = PolicyRef.model_validate(ref) if ref is not None else default
            except ValidationError as e:  # (router=5 was pydantic's multi-line error)
                raise InputError(format_validation_error(e, f"{level} {ref!r:.60}")) from None
            return make(level, r.name, r.params)

        ctl = Controller(router=policy("router", router, self.scenario.router),
                         batcher=policy("batcher", batcher, self.scenario.batcher))
        self.chunk_tokens = getattr(ctl.batcher, "chunk_tokens", None)  # the summary's prefill-chunk figures
        return ctl

    def summary(self, records) -> dict[str, float]:
        from fleetwise.metrics.summary import summarize

        from fleetwise.workload.adapt import unconfigured_rejections

        s = summarize(records, self.sim.replicas, slo_classes=self.slo_classes,
                      egress_usd_per_gb=np.asarray(self.fleet.egress_usd_per_gb), origin=self.workload.origin,
                      chunk_tokens=self.chunk_tokens)
        # rejections no setting asked for (context, KV, queue, no replica, horizon): > 1% means overloaded
        s["rejected_unconfigured"] = sum(unconfigured_rejections(records.reject_reasons()).values())
        return s


def check_seed(seed: Any, where: str = "seed") -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"{where} {seed!r}: expected an integer from 0 to 2^63 - 1")


def with_requests(workload, n: int):
    """The workload spec (a typed spec or a dict) asking for ``n`` requests (``--requests``): a generated kind
    draws ``n`` instead of its ``duration_s``, a trace reads its first ``n`` rows; a ``mix`` is unchanged
    (``build`` keeps the first ``n`` of its merged arrivals). A typed spec comes back typed and checked."""
    if isinstance(workload, BaseModel):
        from fleetwise.workload.spec import MixSpec

        if isinstance(workload, MixSpec):
            return workload
        d = {k: v for k, v in workload.model_dump(exclude_unset=True).items() if k != "duration_s"}
        return type(workload).model_validate(d | {"num_requests": n})
    w = dict(workload)
    if w.get("kind") == "mix":
        return w
    w["num_requests"] = n
    w.pop("duration_s", None)
    return w


def _deployment(fleet, di: int, d, fit: bool = True) -> tuple:
    """(model, gpu, region index, region, USD per GPU-hour, PerfModel) of deployment ``di``, with every check
    that needs the catalog, the fleet or a calibration file (one-line InputErrors naming the deployment), and with
    ``fit`` whether the model fits in the GPUs' memory."""
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel

    where = f"deployments[{di}]"
    try:
        model = get_model(d.model)
        gpu = get_gpu(d.gpu)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    try:
        region = fleet.index(d.region) if d.region is not None else 0
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    reg = fleet.regions[region]
    cloud = d.cloud or reg.cloud
    price = gpu.prices.get(cloud)
    if price is None and d.cloud is not None and gpu.prices:
        raise InputError(f"{where}: cloud {cloud!r} has no price for {gpu.name}; priced in: "
                         f"{', '.join(sorted(gpu.prices))}")
    if price is None:
        usd = 0.0  # owned hardware (an on-prem "local" region, an edge device): no rental cost
    elif d.pool == "spot":
        if price.spot_usd_per_hour is None:
            raise InputError(f"{where}: {cloud} sells no spot {gpu.name}")
        usd = price.spot_usd_per_hour
    else:
        usd = price.on_demand_usd_per_hour
    cal = None
    if d.calibration is not None:
        from fleetwise.perf.calfile import load_calibration

        try:
            cal = load_calibration(d.calibration)
        except InputError as e:
            raise InputError(f"{where}.calibration: {e}") from None
        if gpu.name not in cal.gpus:
            raise InputError(f"{where}.calibration: {d.calibration} calibrates {next(iter(cal.gpus))}, "
                             f"the deployment's GPU is {gpu.name}")
    perf = PerfModel(gpu, model, tp=d.tp, pp=d.pp, calibration=cal)
    if fit and not perf.fits(d.gpu_memory_utilization):
        raise InputError(f"{where}: {model.name} does not fit on {d.tp * d.pp} x {gpu.name} (tp={d.tp}, pp={d.pp}) "
                         f"at gpu_memory_utilization={d.gpu_memory_utilization}")
    return model, gpu, region, reg, usd, perf


def check_deployments(scenario: Scenario) -> None:
    """What ``build`` checks of the deployments (catalog names, regions, prices, calibration files) without a
    workload or a simulator: a sweep checks every grid point's scenario this way before any run. Whether a model
    fits in memory is left to the run: a grid over ``gpu_memory_utilization`` may hold points that do not fit,
    stored as failed runs beside the others."""
    from fleetwise.fleet.spec import build_fleet

    fleet = build_fleet(scenario.fleet_spec, np.random.default_rng(0))
    for di, d in enumerate(scenario.deployments):
        _deployment(fleet, di, d, fit=False)
    if scenario.scaler is None and not any(d.replicas for d in scenario.deployments):  # (as build refuses it)
        raise InputError("deployments: no replicas (every deployment has replicas: 0)")


def build(scenario: Scenario, seed: int | None = None, *, workload=None, num_requests: int | None = None,
          options=None) -> Built:
    """Make the fleet, the workload and the replicas of a scenario; all randomness from ``seed``."""
    from fleetwise.catalog import get_model
    from fleetwise.fleet.spec import build_fleet
    from fleetwise.sim.build import make_replica
    from fleetwise.sim.simulator import Simulator
    from fleetwise.workload.slo import get_slo
    from fleetwise.workload.spec import build_workload_report

    seed = scenario.seed if seed is None else seed
    check_seed(seed)
    if num_requests is not None and not 1 <= num_requests <= MAX_REQUESTS:
        raise InputError(f"requests {num_requests}: expected 1 to {MAX_REQUESTS:,} (docs/limits.md)")
    ss = np.random.SeedSequence(seed)
    fleet_ss, work_ss, sim_ss = ss.spawn(3)
    fleet_rng, work_rng = np.random.default_rng(fleet_ss), np.random.default_rng(work_ss)
    sim_seed = int(sim_ss.generate_state(1)[0])
    fleet = build_fleet(scenario.fleet_spec, fleet_rng)
    if workload is None:
        try:
            wspec = scenario.workload_spec if num_requests is None else with_requests(scenario.workload_spec,
                                                                                      num_requests)
            workload, adaptations = build_workload_report(fit_trace_spec(scenario, wspec), work_rng,
                                                          capacity=trace_capacity(scenario))
        except ValidationError as e:
            raise InputError(format_validation_error(e, "workload")) from None
    else:
        adaptations = []
    if num_requests is not None and len(workload) > num_requests:
        workload = workload.head(num_requests)  # a given workload, or a mix of tenants: its first requests

    # deployments -> replicas; replicas of one deployment share one performance model
    models: list[str] = []
    max_ctx: list[int] = []
    replicas = []
    templates: list[dict] = []  # per deployment: how to make one more replica (the platform's scale-up)
    for di, d in enumerate(scenario.deployments):
        model, gpu, region, reg, usd, perf = _deployment(fleet, di, d)
        if model.name not in models:
            models.append(model.name)
            max_ctx.append(model.max_context)
        ready = (d.provision_s + perf.load_time_s(STORAGE_GBPS[d.storage])) if d.cold_start else 0.0
        tmpl = dict(perf=perf, region=region, model_index=models.index(model.name), block_tokens=d.block_tokens,
                    gpu_memory_utilization=d.gpu_memory_utilization, price_usd_per_gpu_hour=usd,
                    electricity_usd_per_kwh=float(reg.electricity_usd_per_kwh),
                    prefix_block_tokens=workload.block_tokens, prefix_caching=scenario.options.prefix_caching)
        templates.append(tmpl)
        for _ in range(d.replicas):
            replicas.append(make_replica(len(replicas), name=f"{model.name}@{gpu.name}#{len(replicas)}",
                                         ready_s=ready, **tmpl))
            replicas[-1].group = di
            replicas[-1].pool = d.pool
            replicas[-1].zone = d.zone or f"{reg.name}-a"
    if not replicas and scenario.scaler is None:
        raise InputError("deployments: no replicas (every deployment has replicas: 0)")

    # workload names -> indices: models ("default" = first deployment's model), origins ("default" = region 0)
    code = []
    for name in workload.models:
        if name == "default":
            code.append(0)
        else:
            try:
                m = get_model(name).name
            except InputError:
                m = name
            code.append(models.index(m) if m in models else len(models))  # no replica -> rejected "no_replica"
    model_index = np.asarray(code, dtype=np.int64)[workload.model] if len(workload) else np.zeros(0, np.int64)
    ocode = [0 if o == "default" else fleet.index(o) for o in workload.origins]
    workload.origin = np.asarray(ocode, dtype=np.int16)[workload.origin] if len(workload) else workload.origin
    workload.origins = [fleet.regions[i].name for i in ocode]

    opts = options or sim_options(scenario)
    sim = Simulator(replicas, workload, rtt_s=np.asarray(fleet.rtt_s, dtype=float), model_index=model_index,
                    max_context=max_ctx, seed=int(sim_seed), options=opts,
                    bandwidth_gbps=np.asarray(fleet.bandwidth_gbps, dtype=float) if hasattr(fleet, "bandwidth_gbps") else None)
    slo = [get_slo(n) for n in workload.slo_classes]
    return Built(scenario=scenario, sim=sim, fleet=fleet, workload=workload, slo_classes=slo, templates=templates,
                 models=models, adaptations=adaptations)


def _deployed_models(scenario: Scenario) -> dict[str, list[tuple[Any, float, int]]]:
    """Model name -> [(PerfModel, gpu_memory_utilization, replicas at the start)] of its deployments."""
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel

    out: dict[str, list] = {}
    for di, d in enumerate(scenario.deployments):
        try:
            model, gpu = get_model(d.model), get_gpu(d.gpu)
        except InputError as e:
            raise InputError(f"deployments[{di}]: {e}") from None
        n = max(d.replicas, d.min_replicas)
        out.setdefault(model.name, []).append((PerfModel(gpu, model, tp=d.tp, pp=d.pp), d.gpu_memory_utilization, n))
    if scenario.scaler is not None:  # a model a scaler may start from zero counts with one replica of each group
        for name, deps in out.items():
            if sum(n for *_, n in deps) == 0:
                out[name] = [(p, u, 1) for p, u, _ in deps]
    return out


def _model_name(scenario: Scenario, name: str) -> str:
    from fleetwise.catalog import get_model

    if name == "default":
        name = scenario.deployments[0].model
    try:
        return get_model(name).name
    except InputError:
        return name


def trace_capacity(scenario: Scenario):
    """The fleet's capacity for a trace fitted with ``load: x`` (``fleetwise.workload.adapt``): per model,
    ``capacity_rps`` (perf/capacity.py, the estimate the autoscalers use) summed over the replicas the scenario
    starts with, at the SLO of the model's largest class of requests; the fleet's capacity is the total rate at
    which the busiest model (capacity / its share of the requests) reaches load 1. When no batch meets that SLO
    for the mean request, the capacity without an SLO (saturation) is used and said."""
    def capacity(prompt: float, output: float, parts: list[tuple[str, str, float]]) -> tuple[float, str]:
        from fleetwise.perf.capacity import capacity_rps
        from fleetwise.workload.slo import get_slo

        deployed = _deployed_models(scenario)
        share: dict[str, float] = {}
        cls: dict[str, dict[str, float]] = {}
        for model, slo_class, sh in parts:
            m = _model_name(scenario, model)
            share[m] = share.get(m, 0.0) + sh
            cls.setdefault(m, {})[slo_class] = cls.get(m, {}).get(slo_class, 0.0) + sh
        total = sum(share.values())
        rate = math.inf
        notes = []
        for m, sh in share.items():
            if m not in deployed:
                notes.append(f"no deployment serves {m}")
                continue
            slo = get_slo(max(cls[m], key=cls[m].get))
            cap = sum(n * capacity_rps(p, prompt, output, slo.ttft_s, slo.tpot_s, gpu_memory_utilization=u)
                      for p, u, n in deployed[m])
            if cap <= 0:
                cap = sum(n * capacity_rps(p, prompt, output, gpu_memory_utilization=u) for p, u, n in deployed[m])
                notes.append(f"{m}: no batch meets the {slo.name} SLO for the mean request, capacity is saturation")
            rate = min(rate, cap / (sh / total))
        return (0.0 if math.isinf(rate) else rate), "; ".join(notes)

    return capacity


def fit_trace_spec(scenario: Scenario, wspec):
    """A trace in the (typed) workload with no ``max_total_tokens`` is clipped to the context of the smallest model
    it is served by (what the simulator would otherwise reject as ``exceeds_context``)."""
    from fleetwise.catalog import get_model
    from fleetwise.workload.spec import MixSpec, TraceSpec

    def ctx(spec) -> int | None:
        names = [t.model for t in spec.tenants or []] or [spec.model]
        out = []
        for nm in names:
            try:
                out.append(get_model(_model_name(scenario, nm)).max_context)
            except InputError:
                pass
        return min(out) if out else None

    def fix(spec):
        if isinstance(spec, TraceSpec) and spec.max_total_tokens is None:
            c = ctx(spec)
            if c is not None:
                return spec.model_copy(update={"max_total_tokens": c})
        return spec

    if isinstance(wspec, MixSpec) and wspec.max_total_tokens is None:
        return wspec.model_copy(update={"parts": [p.model_copy(update={"workload": fix(p.workload)})
                                                  for p in wspec.parts]})
    return fix(wspec)


def sim_options(scenario: Scenario, **overrides):
    """The simulator options a scenario asks for (``options:``), with ``overrides`` (e.g. ``timeline_bucket_s``)."""
    from fleetwise.sim.simulator import SimOptions

    o = scenario.options
    return SimOptions(**({"prefix_caching": o.prefix_caching, "max_waiting": o.max_waiting,
                          "kv_offload": o.kv_offload} | overrides))
