"""Workloads: request records, trace readers, synthetic generators, the default workload, SLO classes and the
scenario-YAML workload spec. See docs/workloads.md."""

from fleetwise.workload.request import Request, Workload
from fleetwise.workload.readers import (
    ServeGenRates,
    read_azure,
    read_burstgpt,
    read_plain,
    read_mooncake,
    read_servegen,
    read_vidur_lengths,
    servegen_arrivals,
    servegen_workload,
)
from fleetwise.workload.synthetic import (
    EmpiricalLengths,
    LognormalLengths,
    clip_total_tokens,
    diurnal_arrivals,
    diurnal_rate,
    gamma_arrivals,
    make_workload,
    mmpp_arrivals,
    poisson_arrivals,
    replay,
)
from fleetwise.workload.default import AZURE_CONV_LOGNORMAL, default_lengths, default_workload, fit_lognormal_lengths
from fleetwise.workload.slo import DEFAULT_SLO_CLASSES, SLOClass, get_slo
from fleetwise.workload.spec import (
    TRACE_ALIASES,
    WorkloadSpec,
    build_workload,
    load_trace,
    parse_workload_spec,
    resolve_trace,
)

__all__ = [
    "Request", "Workload",
    "read_azure", "read_mooncake", "read_vidur_lengths", "read_burstgpt", "read_plain", "read_servegen", "ServeGenRates",
    "servegen_arrivals", "servegen_workload",
    "poisson_arrivals", "gamma_arrivals", "mmpp_arrivals", "diurnal_arrivals", "diurnal_rate", "replay",
    "EmpiricalLengths", "LognormalLengths", "clip_total_tokens", "make_workload",
    "AZURE_CONV_LOGNORMAL", "fit_lognormal_lengths", "default_lengths", "default_workload",
    "SLOClass", "DEFAULT_SLO_CLASSES", "get_slo",
    "WorkloadSpec", "parse_workload_spec", "build_workload", "load_trace", "resolve_trace", "TRACE_ALIASES",
]
