"""The workload part of a scenario YAML: pydantic v2 models and :func:`build_workload`.

Examples (YAML under ``workload:``)::

    {kind: default, rate_rps: 4.0, num_requests: 2000}
    {kind: poisson, rate_rps: 8, lengths: {kind: trace, trace: azure-conv}, max_total_tokens: 4096}
    {kind: gamma, rate_rps: 8, cv: 3, lengths: {kind: lognormal, prompt_mu: 6.6, prompt_sigma: 1.0,
                                                output_mu: 5.0, output_sigma: 0.9}}
    {kind: mmpp, base_rate_rps: 2, burst_rate_rps: 20, mean_base_s: 60, mean_burst_s: 10}
    {kind: diurnal, mean_rate_rps: 5, peak_to_trough: 3, duration_s: 172800,
     origin: [{region: us-east, weight: 2, utc_offset_h: -5}, {region: eu-west, weight: 1, utc_offset_h: 1}]}
    {kind: trace, format: azure, path: azure-conv, time_scale: 0.5}
    {kind: trace, path: mooncake, load: 0.7, max_total_tokens: 8192}   # fitted: docs/workloads.md#bring-your-own-trace
    {kind: servegen, servegen_model: deepseek-r1, start_s: 0, end_s: 3600}
    {kind: mix, parts: [{tenant: chat, workload: {kind: poisson, rate_rps: 4, slo_class: interactive}},
                        {tenant: batch, workload: {kind: poisson, rate_rps: 1, slo_class: batch}}]}

Every model forbids unknown fields. Generated kinds take either ``num_requests`` (exact count) or
``duration_s`` (all arrivals in ``[0, duration_s)``), not both; with neither, 1,000 requests.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated, Callable, Literal, Union

import numpy as np
from pydantic import BaseModel, Field, TypeAdapter, field_validator, model_validator

from fleetwise.data import data_path
from fleetwise.strict import StrictModel
from fleetwise.errors import InputError
from fleetwise.limits import MAX_CV, MAX_MMPP_SWITCHES, MAX_REQUESTS, MAX_SPAN_S, MAX_TOKENS
from fleetwise.workload import readers
from fleetwise.workload.adapt import AdaptReport, TraceFit, adapt_trace, clip_to_context
from fleetwise.workload.default import default_lengths
from fleetwise.workload.request import Workload
from fleetwise.workload.slo import DEFAULT_SLO_CLASSES, get_slo
from fleetwise.workload.synthetic import (
    MIN_PERIOD_H,
    EmpiricalLengths,
    LognormalLengths,
    as_generator,
    clip_total_tokens,
    diurnal_arrivals,
    gamma_arrivals,
    mmpp_arrivals,
    poisson_arrivals,
)

__all__ = [
    "TRACE_ALIASES",
    "resolve_trace",
    "load_trace",
    "OriginWeight",
    "TraceLengths",
    "LognormalLengthsSpec",
    "DefaultLengths",
    "DefaultWorkloadSpec",
    "PoissonSpec",
    "GammaSpec",
    "MMPPSpec",
    "DiurnalSpec",
    "TraceSpec",
    "TraceTenant",
    "ServeGenSpec",
    "MixSpec",
    "WorkloadSpec",
    "parse_workload_spec",
    "build_workload",
    "build_workload_report",
    "CapacityFn",
    "parse_load",
    "trace_in_place_of",
]

Format = Literal["azure", "mooncake", "vidur", "burstgpt", "plain"]

# alias -> (path parts inside the data folder, format)
TRACE_ALIASES: dict[str, tuple[tuple[str, ...], str]] = {
    "azure-conv": (("azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv"), "azure"),
    "azure-code": (("azure-llm-inference-2023", "AzureLLMInferenceTrace_code.csv"), "azure"),
    "mooncake": (("mooncake-fast25-traces", "synthetic_trace.jsonl"), "mooncake"),
    "mooncake-synthetic": (("mooncake-fast25-traces", "synthetic_trace.jsonl"), "mooncake"),
    "arxiv-summarization": (
        ("vidur-arxiv-summarization-lengths", "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"),
        "vidur",
    ),
}

_READERS = {
    "azure": readers.read_azure,
    "mooncake": readers.read_mooncake,
    "vidur": readers.read_vidur_lengths,
    "burstgpt": readers.read_burstgpt,
    "plain": readers.read_plain,
}


def resolve_trace(path_or_alias: str | Path) -> tuple[Path, str | None]:
    """(file path, format or None). Aliases are looked up in the data folder; anything else is a file path."""
    key = str(path_or_alias)
    if key in TRACE_ALIASES:
        parts, fmt = TRACE_ALIASES[key]
        return data_path(*parts), fmt
    p = Path(key).expanduser()
    if not p.exists():
        raise InputError(
            f"trace {key!r}: file not found and not a known alias ({', '.join(TRACE_ALIASES)})"
        )
    if p.is_dir():
        raise InputError(f"trace {key!r}: a directory, not a trace file")
    if not p.is_file():  # (a device or a pipe: /dev/zero has no end, and sniffing its header read it all)
        raise InputError(f"trace {key!r}: not a regular file (a device, a pipe or a socket)")
    return p, None


def _sniff_format(p: Path) -> str:
    name = p.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json")):
        return "mooncake"
    if "burstgpt" in name:
        return "burstgpt"
    if name.endswith(".parquet"):  # (it said "not UTF-8 text (byte 0xc0)")
        raise InputError(f"trace {p}: a Parquet file; traces are .csv or .jsonl (gzipped or not): the records that "
                         "`fleetwise simulate --records FILE.csv` writes replay as a trace")
    try:
        with readers.open_text(p) as f:
            header = next(csv.reader(readers.bounded_lines(f, p)), [])
    except readers.READ_ERRORS as e:
        raise readers.read_error(p, e) from None
    h = {x.strip() for x in header}
    if "TIMESTAMP" in h and "ContextTokens" in h:
        return "azure"
    if "num_prefill_tokens" in h:
        return "vidur"
    if "Request tokens" in h and "Response tokens" in h:
        return "burstgpt"
    if set(readers.PLAIN_COLUMNS) <= h:
        return "plain"
    raise InputError(
        f"{p.name}: cannot tell the trace format from the name or header {sorted(h)}; "
        f"pass format= {' | '.join(_READERS)} (plain: a CSV with columns {', '.join(readers.PLAIN_COLUMNS)})"
    )


def load_trace(path_or_alias: str | Path, format: str | None = None, limit: int | None = None) -> Workload:
    """Read a trace by alias (``azure-conv``, ``azure-code``, ``mooncake``, ``arxiv-summarization``) or path.

    With ``format=None`` the reader is chosen from the alias, else the file name (``.jsonl`` -> mooncake,
    ``burstgpt`` in the name -> burstgpt), else the CSV header.
    """
    p, fmt = resolve_trace(path_or_alias)
    if format is not None:
        if format not in _READERS:
            raise InputError(f"trace format {format!r}: expected one of {', '.join(_READERS)}")
        fmt = format
    if fmt is None:
        fmt = _sniff_format(p)
    if limit is None:  # one more than allowed: a longer file is an error, not a silent cut
        w = _READERS[fmt](p, limit=MAX_REQUESTS + 1)
        if len(w) > MAX_REQUESTS:
            raise InputError(f"trace {p.name}: more than {MAX_REQUESTS:,} requests, the limit per run "
                             "(docs/limits.md); use num_requests or --requests for its first ones")
    else:
        w = _READERS[fmt](p, limit=min(limit, MAX_REQUESTS) if isinstance(limit, int) else limit)
    if len(w) == 0:
        raise InputError(f"trace {p.name}: no requests")
    check_span(w, f"trace {p.name}")
    if str(path_or_alias) in TRACE_ALIASES:
        w.name = str(path_or_alias)
    return w


def check_span(w: Workload, where: str) -> None:
    """Arrivals must cover at most ``MAX_SPAN_S`` of simulated time."""
    if len(w) and float(w.arrival_s[-1] - w.arrival_s[0]) > MAX_SPAN_S:
        raise InputError(f"{where}: arrivals span {float(w.arrival_s[-1] - w.arrival_s[0]):.3g} s, above the "
                         f"limit of {MAX_SPAN_S:.0f} s (docs/limits.md)")


# ----------------------------------------------------------------------------------------------------------------
# pydantic models


def known_slo_class(v: str) -> str:
    """An SLO class name the workload knows (``slo_class`` of a workload and of a trace's tenant)."""
    if v not in DEFAULT_SLO_CLASSES:
        raise ValueError(f"unknown slo_class {v!r}; expected one of {', '.join(DEFAULT_SLO_CLASSES)}")
    return v


def known_model(v: str) -> str:
    """``default`` (the first deployment's model) or a catalog model: a name the catalog does not know reached no
    replica, and every request was rejected with exit status 0."""
    if v != "default":
        from fleetwise.catalog import get_model

        try:
            get_model(v)
        except InputError as e:
            raise ValueError(str(e)) from None
    return v


MIN_LOAD = 1e-6  # the smallest fraction of a fleet's capacity a trace may be fitted to


class _Model(StrictModel):  # no unknown fields, NaN, infinity or true for a number
    pass


class OriginWeight(_Model):
    region: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0, le=1e9)  # relative; bounded so that their sum is finite
    utc_offset_h: float | None = Field(default=None, ge=-12, le=14)  # used by kind=diurnal


class TraceLengths(_Model):
    """Resample (prompt, output) pairs jointly from a trace."""

    kind: Literal["trace"]
    trace: str = Field(min_length=1)  # alias or path
    format: Format | None = None


class LognormalLengthsSpec(_Model):
    kind: Literal["lognormal"]
    prompt_mu: float = Field(ge=-20, le=20)  # natural log of tokens: e^20 is far above any context
    prompt_sigma: float = Field(ge=0, le=10)
    output_mu: float = Field(ge=-20, le=20)
    output_sigma: float = Field(ge=0, le=10)
    rho: float = Field(default=0.0, ge=-1, le=1)
    prompt_min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    prompt_max: int = Field(default=1_000_000, ge=1, le=MAX_TOKENS)
    output_min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    output_max: int = Field(default=1_000_000, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ranges(self):
        if self.prompt_min > self.prompt_max or self.output_min > self.output_max:
            raise ValueError("min must be <= max for prompt and output")
        return self


class DefaultLengths(_Model):
    """The embedded Azure-conversation lognormal fit (see ``fleetwise.workload.default``)."""

    kind: Literal["default"]


LengthsSpec = Annotated[Union[TraceLengths, LognormalLengthsSpec, DefaultLengths], Field(discriminator="kind")]


class _Common(_Model):
    num_requests: int | None = Field(default=None, gt=0, le=MAX_REQUESTS)
    max_total_tokens: int | None = Field(default=None, ge=2, le=2 * MAX_TOKENS)
    clip_mode: Literal["prompt", "proportional"] = "prompt"
    slo_class: str = "standard"
    origin: list[OriginWeight] | None = Field(default=None, min_length=1)
    model: str = Field(default="default", min_length=1)

    _known_slo = field_validator("slo_class")(staticmethod(known_slo_class))

    @field_validator("origin")
    @classmethod
    def _unique_regions(cls, v):
        if v is not None:
            names = [o.region for o in v]
            if len(set(names)) != len(names):
                raise ValueError("origin regions must be unique")
        return v


class _Generated(_Common):
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SPAN_S)
    lengths: LengthsSpec = Field(default_factory=lambda: DefaultLengths(kind="default"))

    @model_validator(mode="after")
    def _n_or_duration(self):
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError("give num_requests or duration_s, not both")
        rate = self.arrival_rate_rps()
        if self.duration_s is not None:
            if rate * self.duration_s > MAX_REQUESTS:
                raise ValueError(f"rate x duration_s = {rate * self.duration_s:.3g} expected requests, above the "
                                 f"limit of {MAX_REQUESTS:,} per run (docs/limits.md)")
        elif self.expected_span_s() > MAX_SPAN_S:
            raise ValueError(f"{self.count_kwargs()['num_requests']} requests at {rate:.3g} requests/s span "
                             f"{self.expected_span_s():.3g} s, above the limit of {MAX_SPAN_S:.0f} s (docs/limits.md)")
        return self

    def arrival_rate_rps(self) -> float:
        """Long-run mean arrival rate."""
        return self.rate_rps  # type: ignore[attr-defined]

    def expected_span_s(self) -> float:
        """Simulated seconds the arrivals cover (on average)."""
        if self.duration_s is not None:
            return self.duration_s
        return self.count_kwargs()["num_requests"] / self.arrival_rate_rps()

    def expected_requests(self) -> float:
        if self.duration_s is not None:
            return self.arrival_rate_rps() * self.duration_s
        return self.count_kwargs()["num_requests"]

    def count_kwargs(self) -> dict:
        if self.duration_s is not None:
            return {"duration_s": self.duration_s}
        return {"num_requests": self.num_requests if self.num_requests is not None else 1000}


class DefaultWorkloadSpec(_Generated):
    kind: Literal["default"]
    rate_rps: float = Field(gt=0)

    @model_validator(mode="after")
    def _default_lengths(self):  # (its lengths are the Azure-fitted default: a lengths: given was ignored)
        if self.lengths.kind != "default":
            raise ValueError("kind: default draws the default lengths; for other lengths use kind: poisson")
        return self


class PoissonSpec(_Generated):
    kind: Literal["poisson"]
    rate_rps: float = Field(gt=0)


class GammaSpec(_Generated):
    kind: Literal["gamma"]
    rate_rps: float = Field(gt=0)
    cv: float = Field(ge=1 / MAX_CV, le=MAX_CV)


class MMPPSpec(_Generated):
    kind: Literal["mmpp"]
    base_rate_rps: float = Field(gt=0)
    burst_rate_rps: float = Field(gt=0)
    mean_base_s: float = Field(gt=0)
    mean_burst_s: float = Field(gt=0)

    def arrival_rate_rps(self) -> float:
        return (self.base_rate_rps * self.mean_base_s + self.burst_rate_rps * self.mean_burst_s) / (
            self.mean_base_s + self.mean_burst_s)

    @model_validator(mode="after")
    def _switches(self):
        for state, rate, mean_s in (("base", self.base_rate_rps, self.mean_base_s),
                                    ("burst", self.burst_rate_rps, self.mean_burst_s)):
            if rate * mean_s > MAX_REQUESTS / 10:  # a sojourn's arrivals are drawn at once
                raise ValueError(f"{state}_rate_rps x mean_{state}_s = {rate * mean_s:.3g} arrivals per sojourn, above "
                                 f"the limit of {MAX_REQUESTS // 10:,} (docs/limits.md)")
        cycle = self.mean_base_s + self.mean_burst_s
        n = 2 * self.expected_span_s() / cycle
        if n > MAX_MMPP_SWITCHES:
            raise ValueError(f"{n:.3g} expected state switches over {self.expected_span_s():.3g} s of arrivals, above "
                             f"the limit of {MAX_MMPP_SWITCHES:,} (longer mean_base_s / mean_burst_s; docs/limits.md)")
        return self


class DiurnalSpec(_Generated):
    kind: Literal["diurnal"]
    mean_rate_rps: float = Field(gt=0)  # total over all origins
    peak_to_trough: float = Field(default=3.0, ge=1)
    period_h: float = Field(default=24.0, ge=MIN_PERIOD_H)  # (1e-310 overflowed the phase: NaN rates, a hang)
    peak_hour_local: float = Field(default=14.0, ge=0, lt=24)
    utc_offset_h: float = Field(default=0.0, ge=-12, le=14)  # for origins without their own offset
    start_hour_utc: float = Field(default=0.0, ge=0, lt=24)

    def arrival_rate_rps(self) -> float:
        return self.mean_rate_rps


class TraceTenant(_Model):
    """A class of a trace's requests (docs/workloads.md#bring-your-own-trace): each request is drawn one of the
    tenants with probability ``share``; it then has the tenant's SLO class (and priority), model and origins."""

    tenant: str = Field(min_length=1)
    share: float = Field(gt=0, le=1e9)
    slo_class: str = "standard"
    model: str = Field(default="default", min_length=1)
    origin: list[OriginWeight] | None = Field(default=None, min_length=1)

    _known_slo = field_validator("slo_class")(staticmethod(known_slo_class))


class TraceSpec(_Common):
    kind: Literal["trace"]
    path: str = Field(min_length=1)  # alias (azure-conv, azure-code, mooncake, arxiv-summarization) or file
    format: Format | None = None
    time_scale: float = Field(default=1.0, gt=0)  # multiplies arrival times (Vidur's time_scale_factor): 2 = half rate
    target_rate_rps: float | None = Field(default=None, gt=0)  # alternative to time_scale
    # fitting the trace to the fleet (fleetwise.workload.adapt): a fraction of the fleet's capacity, or "real"
    load: Union[Annotated[float, Field(ge=MIN_LOAD, le=100)], Literal["real"]] = "real"
    window_s: float | None = Field(default=None, gt=0)  # trace seconds each seed replays (with resample: window)
    duration_s: float | None = Field(default=None, gt=0)  # or: simulated seconds of arrivals (bootstrap repeats)
    resample: Literal["auto", "window", "bootstrap", "none"] = "auto"
    block_s: float | None = Field(default=None, gt=0)  # bootstrap block length, trace seconds
    spread_ties: bool = False  # timestamps of a coarse resolution: spread each arrival over its tick (adapt.py)
    tenants: list[TraceTenant] | None = Field(default=None, min_length=1)  # class mapping; default: slo_class

    @model_validator(mode="after")
    def _one_scaling(self):
        if self.target_rate_rps is not None and self.time_scale != 1.0:
            raise ValueError("give time_scale or target_rate_rps, not both")
        if self.load != "real" and (self.target_rate_rps is not None or self.time_scale != 1.0):
            raise ValueError("give load, time_scale or target_rate_rps, not several (load sets the rate)")
        if sum(x is not None for x in (self.num_requests, self.window_s, self.duration_s)) > 1:
            raise ValueError("give at most one of num_requests, window_s and duration_s")
        if self.tenants is not None and len({t.tenant for t in self.tenants}) != len(self.tenants):
            raise ValueError("tenant names must be unique")
        # fields another setting makes moot were taken and ignored (found by fuzzing, 2026-12-06)
        if self.block_s is not None and self.resample in ("window", "none"):
            raise ValueError(f"block_s applies to resample: bootstrap (or auto), not {self.resample}")
        given = [k for k, v in (("slo_class", self.slo_class != "standard"), ("model", self.model != "default"),
                                ("origin", self.origin is not None)) if v]
        if self.tenants is not None and given:
            raise ValueError(f"give {given[0]} per tenant (tenants set each request's SLO class, model and origins)")
        if not 1e-6 <= self.time_scale <= 1e6:  # (1e-320 printed a rate of inf with exit 0)
            raise ValueError(f"time_scale {self.time_scale:g}: expected 1e-6 to 1e6")
        return self

    def fit(self) -> TraceFit:
        return TraceFit(load=None if self.load == "real" else float(self.load), time_scale=self.time_scale,
                        target_rate_rps=self.target_rate_rps, max_total_tokens=self.max_total_tokens,
                        clip_mode=self.clip_mode, num_requests=self.num_requests, window_s=self.window_s,
                        duration_s=self.duration_s, resample=self.resample, block_s=self.block_s,
                        spread_ties=self.spread_ties)

    def parts(self) -> list[tuple[str, str, float]]:
        """(model, SLO class, share) of the requests, for the capacity estimate."""
        if self.tenants:
            tot = sum(t.share for t in self.tenants)
            return [(t.model, t.slo_class, t.share / tot) for t in self.tenants]
        return [(self.model, self.slo_class, 1.0)]


class ServeGenSpec(_Common):
    kind: Literal["servegen"]
    servegen_model: str = Field(min_length=1, description="ServeGen model: m-large, m-mid, m-small, deepseek-r1, mm-image")
    path: str | None = None  # folder; default: servegen-alibaba-modelstudio in the data folder
    start_s: float = Field(default=0.0, ge=0, le=MAX_SPAN_S)
    end_s: float | None = Field(default=None, gt=0, le=MAX_SPAN_S)
    rate_scale: float = Field(default=1.0, gt=0)
    lengths: LengthsSpec = Field(default_factory=lambda: DefaultLengths(kind="default"))

    @model_validator(mode="after")
    def _window(self):
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError("end_s must be > start_s")
        return self


_PartSpec = Annotated[
    Union[DefaultWorkloadSpec, PoissonSpec, GammaSpec, MMPPSpec, DiurnalSpec, TraceSpec, ServeGenSpec],
    Field(discriminator="kind"),
]


class MixPart(_Model):
    tenant: str = Field(default="default", min_length=1)
    workload: _PartSpec


class MixSpec(_Model):
    """Several tenants' workloads merged by arrival time; each part keeps its own model, SLO class (and so
    priority) and origins, and all its requests carry the part's tenant name."""

    kind: Literal["mix"]
    parts: list[MixPart] = Field(min_length=1)
    max_total_tokens: int | None = Field(default=None, ge=2, le=2 * MAX_TOKENS)

    @field_validator("parts")
    @classmethod
    def _unique_tenants(cls, v):
        names = [p.tenant for p in v]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique across parts")
        n = sum(p.workload.expected_requests() for p in v if isinstance(p.workload, _Generated))
        if n > MAX_REQUESTS:
            raise ValueError(f"the parts expect {n:.3g} requests in all, above the limit of {MAX_REQUESTS:,} per run "
                             "(docs/limits.md)")
        return v


WorkloadSpec = Annotated[
    Union[DefaultWorkloadSpec, PoissonSpec, GammaSpec, MMPPSpec, DiurnalSpec, TraceSpec, ServeGenSpec, MixSpec],
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter = TypeAdapter(WorkloadSpec)


def parse_workload_spec(data: dict) -> "WorkloadSpec":
    """Validate a dict (e.g. the ``workload:`` part of a scenario YAML). Raises ``pydantic.ValidationError``."""
    return _ADAPTER.validate_python(data)


def expected_span_s(spec) -> float | None:
    """Simulated seconds a validated spec's arrivals cover on average; None where only the data tell (traces,
    ServeGen)."""
    if isinstance(spec, MixSpec):
        spans = [expected_span_s(p.workload) for p in spec.parts]
        return None if any(x is None for x in spans) else max(spans)
    return spec.expected_span_s() if isinstance(spec, _Generated) else None


# ----------------------------------------------------------------------------------------------------------------
# build


def _lengths_sampler(spec) -> object:
    ls = spec
    if isinstance(ls, TraceLengths):
        return EmpiricalLengths.from_workload(load_trace(ls.trace, ls.format))
    if isinstance(ls, LognormalLengthsSpec):
        return LognormalLengths(**ls.model_dump(exclude={"kind"}))
    return default_lengths()


def _origins(spec) -> tuple[list[str], np.ndarray]:
    if not spec.origin:
        return ["default"], np.ones(1)
    w = np.array([o.weight for o in spec.origin], dtype=np.float64)
    return [o.region for o in spec.origin], w / w.sum()


# capacity(mean prompt tokens, mean output tokens, [(model, SLO class, share)]) -> (requests/s, note): the fleet's
# capacity for a trace's mean request, which a scenario provides (fleetwise.scenario) for ``load: x``
CapacityFn = Callable[[float, float, list], tuple[float, str]]


def build_workload(spec, rng: np.random.Generator, capacity: CapacityFn | None = None) -> Workload:
    """Build the workload a spec describes. Deterministic for a given ``rng`` state.

    ``spec`` is one of the spec models or a plain dict (validated first). ``capacity``: the fleet's capacity, for
    a trace with a numeric ``load``."""
    return build_workload_report(spec, rng, capacity)[0]


def _assign_tenants(w: Workload, tenants: list[TraceTenant], rng: np.random.Generator) -> dict[str, float]:
    """Each request drawn one tenant by share; it takes the tenant's SLO class, priority, model and origins."""
    n = len(w)
    sh = np.array([t.share for t in tenants], float)
    code = rng.choice(len(tenants), size=n, p=sh / sh.sum()) if len(tenants) > 1 else np.zeros(n, np.int64)
    slos = [get_slo(t.slo_class) for t in tenants]
    cls_names = list(dict.fromkeys(s.name for s in slos))
    models = list(dict.fromkeys(t.model for t in tenants))
    origins: list[str] = []
    origin = np.zeros(n, np.int16)
    for k, t in enumerate(tenants):
        names, weights = _origins(t)
        for nm in names:
            if nm not in origins:
                origins.append(nm)
        m = np.flatnonzero(code == k)
        pick = rng.choice(len(names), size=len(m), p=weights) if len(names) > 1 else np.zeros(len(m), np.int64)
        origin[m] = np.asarray([origins.index(nm) for nm in names], np.int16)[pick]
    w.tenant, w.tenants = code.astype(np.int16), [t.tenant for t in tenants]
    w.slo_class = np.asarray([cls_names.index(s.name) for s in slos], np.int16)[code]
    w.slo_classes = cls_names
    w.priority = np.asarray([s.priority for s in slos], np.int16)[code]
    w.model, w.models = np.asarray([models.index(t.model) for t in tenants], np.int16)[code], models
    w.origin, w.origins = origin, origins
    counts = np.bincount(code, minlength=len(tenants))
    return {f"{t.tenant} ({t.slo_class}, {t.model})": float(c / max(n, 1)) for t, c in zip(tenants, counts)}


def build_workload_report(spec, rng: np.random.Generator, capacity: CapacityFn | None = None
                          ) -> tuple[Workload, list[AdaptReport]]:
    """:func:`build_workload`, and for every trace in it the :class:`~fleetwise.workload.adapt.AdaptReport` of
    what was done to fit it (window, context clipping, rate)."""
    if isinstance(spec, dict):  # (from the Python API: one line, as a scenario's workload section gets)
        from pydantic import ValidationError

        from fleetwise.errors import format_validation_error

        try:
            spec = parse_workload_spec(spec)
        except ValidationError as e:
            raise InputError(format_validation_error(e, "workload")) from None
    elif not isinstance(spec, BaseModel):
        raise InputError(f"workload spec {spec!r:.60}: expected a mapping (the workload: section of a scenario) or "
                         "a spec model")
    rng = as_generator(rng)
    reports: list[AdaptReport] = []
    if isinstance(spec, MixSpec):
        parts = []
        for part in spec.parts:
            w, reps = build_workload_report(part.workload, rng, capacity)
            reports += reps
            if not (isinstance(part.workload, TraceSpec) and part.workload.tenants):
                w.tenant, w.tenants = np.zeros(len(w), np.int16), [part.tenant]
            parts.append(w)
        w = Workload.concat(parts, name="mix")
        if spec.max_total_tokens is not None:
            w = clip_to_context(w, spec.max_total_tokens)[0]
        return w, reports
    origins, weights = _origins(spec)
    origin_codes: np.ndarray | None = None

    if isinstance(spec, TraceSpec):
        raw = load_trace(spec.path, spec.format,
                         limit=spec.num_requests if spec.resample == "none" else None)
        parts = spec.parts()
        cap = None if capacity is None else (lambda p, o: capacity(p, o, parts))
        w, rep = adapt_trace(raw, rng, spec.fit(), capacity=cap)
        reports.append(rep)
        if spec.tenants:
            rep.classes = _assign_tenants(w, spec.tenants, rng)
            rep.class_rule = "each request drawn a tenant by share, seeded"
            return w, reports
        rep.classes = {spec.slo_class: 1.0}
        rep.class_rule = "every request in the scenario's class"
    elif isinstance(spec, ServeGenSpec):
        folder = Path(spec.path).expanduser() if spec.path else data_path("servegen-alibaba-modelstudio")
        try:
            rates = readers.read_servegen(folder, model=spec.servegen_model)
        except readers.READ_ERRORS as e:  # a chunk file that is not UTF-8 text, a truncated .gz
            raise InputError(f"servegen folder {folder}: {readers.read_error(Path(spec.servegen_model), e)}") from None
        span = float(rates.window_start_s[-1] + rates.window_s) if len(rates.window_start_s) else 0.0
        if spec.start_s >= span:  # (an empty workload ran and printed a summary of nothing)
            raise InputError(f"servegen {spec.servegen_model}: start_s {spec.start_s:g} is past the end of its "
                             f"recorded rates ({span:g} s)")
        w = readers.servegen_workload(
            rates, rng, lengths=_lengths_sampler(spec.lengths), start_s=spec.start_s, end_s=spec.end_s,
            rate_scale=spec.rate_scale,
        )
        if spec.num_requests is not None:
            w = w.head(spec.num_requests)
    else:
        count = spec.count_kwargs()
        if isinstance(spec, (DefaultWorkloadSpec, PoissonSpec)):
            t = poisson_arrivals(rng, spec.rate_rps, **count)
        elif isinstance(spec, GammaSpec):
            t = gamma_arrivals(rng, spec.rate_rps, spec.cv, **count)
        elif isinstance(spec, MMPPSpec):
            t = mmpp_arrivals(rng, spec.base_rate_rps, spec.burst_rate_rps, spec.mean_base_s, spec.mean_burst_s, **count)
        elif isinstance(spec, DiurnalSpec):
            kw = dict(peak_to_trough=spec.peak_to_trough, period_h=spec.period_h,
                      peak_hour_local=spec.peak_hour_local, start_hour_utc=spec.start_hour_utc)
            if spec.origin and any(o.utc_offset_h is not None for o in spec.origin):
                # each origin follows its own local clock; its share of the mean rate is its weight
                parts_t, parts_c = [], []
                shares = None
                if "num_requests" in count:  # exactly num_requests in all: largest remainders (rounding each
                    # origin's share ran 4 requests for 3, and none for 1)
                    want = np.asarray(weights, float) * count["num_requests"]
                    shares = np.floor(want).astype(np.int64)
                    extra = int(count["num_requests"] - shares.sum())
                    shares[np.argsort(-(want - shares), kind="stable")[:extra]] += 1
                for k, o in enumerate(spec.origin):
                    off = spec.utc_offset_h if o.utc_offset_h is None else o.utc_offset_h
                    sub = dict(count)
                    if shares is not None:
                        if shares[k] == 0:
                            continue
                        sub["num_requests"] = int(shares[k])
                    tk = diurnal_arrivals(rng, spec.mean_rate_rps * weights[k], utc_offset_h=off, **kw, **sub)
                    parts_t.append(tk)
                    parts_c.append(np.full(len(tk), k, dtype=np.int16))
                t = np.concatenate(parts_t)
                origin_codes = np.concatenate(parts_c)
                order = np.argsort(t, kind="stable")
                t, origin_codes = t[order], origin_codes[order]
            else:
                t = diurnal_arrivals(rng, spec.mean_rate_rps, utc_offset_h=spec.utc_offset_h, **kw, **count)
        else:  # pragma: no cover
            raise InputError(f"workload kind {spec.kind!r}: not supported")
        lengths = default_lengths() if isinstance(spec, DefaultWorkloadSpec) else _lengths_sampler(spec.lengths)
        p, o = lengths.sample(rng, len(t))
        w = Workload(arrival_s=t, prompt_tokens=p, output_tokens=o, name=spec.kind)

    n = len(w)
    if isinstance(spec, (TraceSpec, ServeGenSpec)):  # time_scale / target_rate_rps may stretch a trace
        check_span(w, f"workload {spec.kind}")
    if spec.max_total_tokens is not None and not isinstance(spec, TraceSpec):  # a trace was clipped by adapt_trace
        w.prompt_tokens, w.output_tokens = clip_total_tokens(
            w.prompt_tokens, w.output_tokens, spec.max_total_tokens, mode=spec.clip_mode
        )
    if origin_codes is None:
        origin_codes = (
            rng.choice(len(origins), size=n, p=weights).astype(np.int16) if len(origins) > 1 else np.zeros(n, np.int16)
        )
    w.origin, w.origins = origin_codes, origins
    if spec.model != "default" or w.models == ["default"]:
        w.model, w.models = np.zeros(n, np.int16), [spec.model]
    slo = get_slo(spec.slo_class)
    w.slo_class, w.slo_classes = np.zeros(n, np.int16), [slo.name]
    w.priority = np.full(n, slo.priority, dtype=np.int16)
    return w, reports


# ----------------------------------------------------------------------------------------------------------------
# a user's trace in place of a scenario's workload


def parse_load(value: str | float | None) -> float | str:
    """``--load``: a fraction of the fleet's capacity (``0.7``) or ``real`` (the trace's own rate)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "real"):
        return "real"
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(f"--load {value!r}: expected a fraction of the fleet's capacity (e.g. 0.7) or 'real'") from None
    if not (MIN_LOAD <= x <= 100):  # (1e-320, a denormal, spilled numpy's overflow warnings)
        raise InputError(f"--load {value!r}: expected a number from {MIN_LOAD:g} to 100 (a fraction of the fleet's "
                         "capacity) or 'real'")
    return x


def trace_in_place_of(workload: dict, trace: str, load: float | str = "real", *, format: str | None = None,
                      window_s: float | None = None, resample: str | None = None,
                      shares_seed: int = 0) -> tuple[dict, list[str]]:
    """A ``kind: trace`` workload for ``trace`` that keeps what the scenario's ``workload`` says beyond its
    arrivals and lengths: its context limit (``max_total_tokens``, ``clip_mode``), SLO class, model, origins and
    tenants, and, at ``load="real"``, its trace time scale. A mix becomes one tenant per part, each request drawn a
    tenant with the part's share of the scenario's own requests (counted on its workload built with seed
    ``shares_seed``). Returns (the spec dict, one line per override for the caller to print)."""
    base = parse_workload_spec(workload)
    load = parse_load(load) if not isinstance(load, float) else load
    spec: dict = {"kind": "trace", "path": str(trace), "load": load}
    if format is not None:
        spec["format"] = format
    if window_s is not None:
        spec["window_s"] = float(window_s)
    if resample is not None:
        spec["resample"] = resample
    lines = [f"--trace {trace}: replaces the arrivals and lengths of the scenario's workload ({base.kind})"]
    kept = []
    if isinstance(base, MixSpec):
        w = build_workload(base, np.random.default_rng(shares_seed))
        counts = np.bincount(w.tenant, minlength=len(w.tenants)) if len(w) else np.ones(len(w.tenants))
        by_name = dict(zip(w.tenants, counts.tolist()))
        tenants = []
        for part in base.parts:
            p = part.workload
            t = {"tenant": part.tenant, "share": max(float(by_name.get(part.tenant, 0)), 1e-9) / max(1, len(w)),
                 "slo_class": p.slo_class, "model": p.model}
            if p.origin:
                t["origin"] = [o.model_dump(exclude_none=True) for o in p.origin]
            tenants.append(t)
        spec["tenants"] = tenants
        ctx = [x for x in [base.max_total_tokens] + [pt.workload.max_total_tokens for pt in base.parts] if x]
        if ctx:
            spec["max_total_tokens"] = min(ctx)
        kept.append("tenants " + ", ".join(f"{t['tenant']} {t['share']:.1%} ({t['slo_class']}, {t['model']})"
                                           for t in tenants) + f" (shares of the scenario's own requests, seed {shares_seed})")
    else:
        for k in ("max_total_tokens", "clip_mode", "slo_class", "model"):
            v = getattr(base, k)
            if v is not None:
                spec[k] = v
        if base.origin:
            spec["origin"] = [o.model_dump(exclude_none=True) for o in base.origin]
            kept.append("origins " + ", ".join(o.region for o in base.origin))
        kept.append(f"SLO class {base.slo_class}")
        if base.model != "default":
            kept.append(f"model {base.model}")
        if isinstance(base, TraceSpec):
            if load == "real":
                if base.time_scale != 1.0:
                    spec["time_scale"] = base.time_scale
                    kept.append(f"time_scale {base.time_scale:g}")
                if base.target_rate_rps is not None:
                    spec["target_rate_rps"] = base.target_rate_rps
                    kept.append(f"target_rate_rps {base.target_rate_rps:g}")
            elif base.time_scale != 1.0 or base.target_rate_rps is not None:
                lines.append(f"the scenario's trace rate (time_scale {base.time_scale:g}"
                             + (f", target_rate_rps {base.target_rate_rps:g}" if base.target_rate_rps else "")
                             + f") is replaced by load {load:g}")
            for k in ("window_s", "block_s"):
                if spec.get(k) is None and getattr(base, k) is not None:
                    spec[k] = getattr(base, k)
            if resample is None and base.resample != "auto":
                spec["resample"] = base.resample
            if base.spread_ties:
                spec["spread_ties"] = True
                kept.append("spread_ties")
        else:
            rate = {k: getattr(base, k) for k in ("rate_rps", "mean_rate_rps", "base_rate_rps") if hasattr(base, k)}
            if rate:
                lines.append("the scenario's " + ", ".join(f"{k} {v:g}" for k, v in rate.items()) + " is replaced by "
                             + ("the trace's real rate" if load == "real" else f"load {load:g}"))
    if spec.get("max_total_tokens") is not None:
        kept.insert(0, f"context limit {spec['max_total_tokens']} tokens")
    if kept:
        lines.append("kept from the scenario: " + "; ".join(kept))
    lines.append("rate: " + ("the trace's real rate" if load == "real" else f"load {load:g} of the fleet's capacity"))
    parse_workload_spec(spec)
    return spec, lines
