"""Scenarios: a YAML file validated once at the edge, then ``build(scenario, seed)`` makes the simulator.

A scenario names the fleet (regions, links, prices), the deployments (model x GPU x TP/PP x replicas per
region), the workload, the router and batcher, and simulator options. Components take plain values, never
the whole scenario.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetwise.errors import InputError

SCENARIO_DIR = Path(__file__).parent / "scenarios"

# Read bandwidth of the storage a replica loads its weights from, GB/s (typical figures):
# local NVMe: a PCIe Gen4 data-centre SSD reads ~6-7 GB/s (e.g. Samsung PM1733 datasheet 7.0 GB/s) -> 5.0
# after file-system overhead; nfs: 10 GbE NFS share ~1.1 GB/s; object_store: S3 at a few parallel ranged
# GETs per instance ~0.5 GB/s (AWS guidance: ~100 MB/s per connection).
STORAGE_GBPS = {"local_nvme": 5.0, "nfs": 1.1, "object_store": 0.5}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    model: str
    gpu: str
    tp: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=64)
    replicas: int = Field(default=1, ge=0)
    region: str | None = None  # default: the fleet's first region
    cloud: str | None = None  # price list to bill from; default: the region's cloud
    pool: Literal["on_demand", "spot"] = "on_demand"
    block_tokens: int = Field(default=16, ge=1)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    cold_start: bool = False  # replicas load their weights at t=0 before serving
    storage: Literal["local_nvme", "nfs", "object_store"] = "local_nvme"
    provision_s: float = Field(default=0.0, ge=0)  # node start-up before the model load, when cold
    # platform (autoscaling, issue 8): this deployment is one scaling group
    zone: str | None = None  # availability zone (e.g. us-east-1a); default: "<region>-a"
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int | None = Field(default=None, ge=0)  # default: max(replicas, 1) * 4
    spot_trace: str | None = None  # spot capacity trace (platform.spot names, or "auto" by zone); spot pools only
    spot_offset_s: float = Field(default=0.0, ge=0)  # where in the trace the simulation starts

    @model_validator(mode="after")
    def _check_limits(self) -> "Deployment":
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) < min_replicas ({self.min_replicas})")
        if self.spot_trace is not None and self.pool != "spot":
            raise ValueError("spot_trace is only for pool: spot")
        return self


class Options(_Model):
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
    """A fault in the schedule. ``target``: gpu -> a replica index or a group (deployment) index, node -> a group
    index, zone -> a zone name, region -> a region name, link -> "regionA,regionB"; empty: chosen at random."""

    at_s: float = Field(ge=0)
    kind: Literal["gpu", "node", "zone", "region", "link"]
    target: str = ""
    duration_s: float | None = Field(default=None, gt=0)  # zone/region outage and link degradation length
    factor: float = Field(default=10.0, ge=1)  # link degradation: round trip x factor, bandwidth / factor


class PlatformSpec(_Model):
    """How the platform layer runs: scaling epochs, health checks, spot notices, faults, tenants, monitoring."""

    epoch_s: float = Field(default=30.0, gt=0)
    monitor_s: float = Field(default=60.0, gt=0)
    health_check_s: float = Field(default=5.0, ge=0)  # a dead replica is routed to until the next failed check
    notice_s: float | None = Field(default=None, ge=0)  # spot interruption notice; default: by cloud (AWS 120 s)
    migrate: bool = True  # spot: running sequences move with their KV cache at the end of the notice
    node_cache: bool = True  # replicas packed on a node share one host copy of the weights (fast reload)
    host_load_gbps: float = Field(default=25.0, gt=0)  # host memory -> GPU weight load bandwidth (node cache hit)
    duration_s: float | None = Field(default=None, gt=0)  # billing window; default: last arrival + drain
    drain_s: float = Field(default=1800.0, ge=0)  # after the last arrival, to let requests finish
    retry_backoff_s: float = Field(default=0.5, gt=0)
    retry_backoff_max_s: float = Field(default=30.0, gt=0)
    tenants: list[TenantSpec] = Field(default_factory=list)
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    faults: list[FaultSpec] = Field(default_factory=list)


class Scenario(_Model):
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    fleet: dict[str, Any] = Field(default_factory=lambda: {"topology": "single"})
    deployments: list[Deployment] = Field(min_length=1)
    workload: dict[str, Any] = Field(default_factory=lambda: {"kind": "default", "rate_rps": 4.0})
    router: PolicyRef = Field(default_factory=lambda: PolicyRef(name="round_robin"))
    batcher: PolicyRef = Field(default_factory=lambda: PolicyRef(name="sarathi"))
    scaler: PolicyRef | None = None  # autoscaling (issue 8): run with the platform layer
    platform: PlatformSpec | None = None
    options: Options = Field(default_factory=Options)

    @model_validator(mode="after")
    def _check_parts(self) -> "Scenario":
        from fleetwise.fleet.spec import parse_fleet_spec
        from fleetwise.workload.spec import parse_workload_spec

        parse_fleet_spec(self.fleet)
        parse_workload_spec(self.workload)
        return self

    def digest(self) -> str:
        """Stable hash of the scenario's content (for results stores)."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def _fmt_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


def format_validation_error(e: ValidationError, where: str) -> str:
    err = e.errors()[0]
    loc = _fmt_loc(err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    got = err.get("input")
    got_s = "" if err["type"] in ("missing", "extra_forbidden") or isinstance(got, (dict, list)) else f" (got {got!r})"
    return f"{where}: {loc or '<top>'}: {msg}{got_s}{more}"


def parse_scenario(data: Any, where: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(e, where)) from None
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def read_yaml(path_or_name: str | Path, builtin_dir: Path, what: str) -> tuple[Path, Any]:
    """Find a YAML file (a path, or a name in ``builtin_dir``) and parse it; one-line errors with the file."""
    p = Path(path_or_name)
    if not p.exists() and (builtin_dir / f"{path_or_name}.yaml").exists():
        p = builtin_dir / f"{path_or_name}.yaml"
    if not p.exists():
        names = ", ".join(sorted(q.stem for q in builtin_dir.glob("*.yaml")))
        raise InputError(f"{path_or_name}: {what} file not found (built-in: {names})")
    try:
        return p, yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{p}:{line} invalid YAML: {getattr(e, 'problem', e)}") from None


def load_scenario(path_or_name: str | Path | None = None) -> Scenario:
    """Load a scenario file, or a built-in one by name (``vidur-parity``); None: the embedded default."""
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
        from fleetwise.control.controller import Controller
        from fleetwise.policies import make

        r = PolicyRef.model_validate(router) if router is not None else self.scenario.router
        b = PolicyRef.model_validate(batcher) if batcher is not None else self.scenario.batcher
        return Controller(router=make("router", r.name, r.params), batcher=make("batcher", b.name, b.params))

    def run(self, router: PolicyRef | str | None = None, batcher: PolicyRef | str | None = None, progress=None):
        """Run the simulator to the end with the scenario's policies (or the ones given); return the records."""
        ctl = self.controller(router, batcher)
        self.chunk_tokens = getattr(ctl.batcher, "chunk_tokens", None)
        return self.sim.run(ctl, progress=progress)

    def summary(self, records) -> dict[str, float]:
        from fleetwise.metrics.summary import summarize

        from fleetwise.workload.adapt import unconfigured_rejections

        s = summarize(records, self.sim.replicas, slo_classes=self.slo_classes,
                      egress_usd_per_gb=np.asarray(self.fleet.egress_usd_per_gb), origin=self.workload.origin,
                      chunk_tokens=self.chunk_tokens)
        # rejections no setting asked for (context, KV, queue, no replica, horizon): > 1% means overloaded
        s["rejected_unconfigured"] = sum(unconfigured_rejections(records.reject_reasons()).values())
        return s


def build(scenario: Scenario, seed: int | None = None, *, workload=None, num_requests: int | None = None,
          options=None) -> Built:
    """Make the fleet, the workload and the replicas of a scenario; all randomness from ``seed``."""
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.fleet.spec import build_fleet
    from fleetwise.perf import PerfModel
    from fleetwise.sim.build import make_replica
    from fleetwise.sim.simulator import SimOptions, Simulator
    from fleetwise.workload.slo import get_slo
    from fleetwise.workload.spec import build_workload_report

    seed = scenario.seed if seed is None else seed
    ss = np.random.SeedSequence(seed)
    fleet_ss, work_ss, sim_ss = ss.spawn(3)
    fleet_rng, work_rng = np.random.default_rng(fleet_ss), np.random.default_rng(work_ss)
    sim_seed = int(sim_ss.generate_state(1)[0])
    fleet = build_fleet(scenario.fleet, fleet_rng)
    if workload is None:
        wspec = dict(scenario.workload)
        if num_requests is not None:
            wspec["num_requests"] = num_requests
            wspec.pop("duration_s", None)
        workload, adaptations = build_workload_report(fit_trace_spec(scenario, wspec), work_rng,
                                                      capacity=trace_capacity(scenario))
    else:
        adaptations = []
        if num_requests is not None:
            workload = workload.head(num_requests)

    # deployments -> replicas; replicas of one deployment share one performance model
    models: list[str] = []
    max_ctx: list[int] = []
    replicas = []
    templates: list[dict] = []  # per deployment: how to make one more replica (the platform's scale-up)
    for di, d in enumerate(scenario.deployments):
        where = f"deployments[{di}]"
        try:
            model = get_model(d.model)
            gpu = get_gpu(d.gpu)
        except InputError as e:
            raise InputError(f"{where}: {e}") from None
        if model.name not in models:
            models.append(model.name)
            max_ctx.append(model.max_context)
        region = fleet.index(d.region) if d.region is not None else 0
        reg = fleet.regions[region]
        cloud = d.cloud or reg.cloud
        price = gpu.prices.get(cloud)
        if price is None and d.cloud is not None and gpu.prices:
            raise InputError(f"{where}: cloud {cloud!r} has no price for {gpu.name}; priced in: {', '.join(sorted(gpu.prices))}")
        if price is None:
            usd = 0.0  # owned hardware (an on-prem "local" region, an edge device): no rental cost
        elif d.pool == "spot":
            if price.spot_usd_per_hour is None:
                raise InputError(f"{where}: {cloud} sells no spot {gpu.name}")
            usd = price.spot_usd_per_hour
        else:
            usd = price.on_demand_usd_per_hour
        perf = PerfModel(gpu, model, tp=d.tp, pp=d.pp)
        if not perf.fits(d.gpu_memory_utilization):
            raise InputError(f"{where}: {model.name} does not fit on {d.tp * d.pp} x {gpu.name} (tp={d.tp}, pp={d.pp}) "
                             f"at gpu_memory_utilization={d.gpu_memory_utilization}")
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

    opts = options or SimOptions(prefix_caching=scenario.options.prefix_caching, max_waiting=scenario.options.max_waiting,
                                 kv_offload=scenario.options.kv_offload)
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


def fit_trace_spec(scenario: Scenario, wspec: dict) -> dict:
    """A trace in the workload with no ``max_total_tokens`` is clipped to the context of the smallest model it is
    served by (what the simulator would otherwise reject as ``exceeds_context``)."""
    from fleetwise.catalog import get_model

    def ctx(spec: dict) -> int | None:
        names = [t.get("model", "default") for t in spec.get("tenants") or []] or [spec.get("model", "default")]
        out = []
        for nm in names:
            try:
                out.append(get_model(_model_name(scenario, nm)).max_context)
            except InputError:
                pass
        return min(out) if out else None

    def fix(spec: dict) -> dict:
        if spec.get("kind") == "trace" and spec.get("max_total_tokens") is None:
            c = ctx(spec)
            if c is not None:
                return {**spec, "max_total_tokens": c}
        return spec

    if wspec.get("kind") == "mix" and wspec.get("max_total_tokens") is None:
        return {**wspec, "parts": [{**p, "workload": fix(dict(p.get("workload", {})))} for p in wspec.get("parts", [])]}
    return fix(wspec)


def simulate(scenario: Scenario, seed: int | None = None, *, router=None, batcher=None, workload=None,
             num_requests: int | None = None, progress=None) -> tuple[Any, dict[str, float]]:
    """Build and run a scenario; return (records, summary)."""
    b = build(scenario, seed, workload=workload, num_requests=num_requests)
    records = b.run(router, batcher, progress=progress)
    return records, b.summary(records)
