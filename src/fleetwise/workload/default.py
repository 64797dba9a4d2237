"""The embedded default workload: needs no data file.

Lengths are lognormal, with parameters fitted (maximum likelihood: mean and standard deviation of the natural
log, plus the Pearson correlation of the two logs) to the Azure LLM inference trace 2023, conversation service
(``azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv``, 19,366 requests) by
:func:`fit_lognormal_lengths`. Reproduce with::

    from fleetwise.data import data_path
    from fleetwise.workload import read_azure, fit_lognormal_lengths
    fit_lognormal_lengths(read_azure(data_path("azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv")))

Samples are clipped to the trace's observed range (prompt 1..14,050, output 1..1,000; the conv trace's output
never exceeds 1,000, which looks like a service cap). Arrivals are Poisson at ``rate_rps``.
"""

from __future__ import annotations

import numpy as np

from fleetwise.errors import InputError
from fleetwise.workload.request import Workload
from fleetwise.workload.synthetic import LognormalLengths, as_generator, make_workload, poisson_arrivals

__all__ = ["AZURE_CONV_LOGNORMAL", "fit_lognormal_lengths", "default_lengths", "default_workload"]

# Fitted on AzureLLMInferenceTrace_conv.csv by fit_lognormal_lengths (natural-log parameters).
AZURE_CONV_LOGNORMAL = {
    "prompt_mu": 6.633313,  # exp(mu) = 760 tokens (geometric mean); arithmetic mean in trace 1154.7
    "prompt_sigma": 0.985154,
    "output_mu": 5.018997,  # exp(mu) = 151 tokens; arithmetic mean in trace 211.1
    "output_sigma": 0.859009,
    "rho": 0.087489,  # correlation of log(prompt) and log(output)
}
AZURE_CONV_PROMPT_RANGE = (1, 14050)
AZURE_CONV_OUTPUT_RANGE = (1, 1000)


def fit_lognormal_lengths(workload: Workload) -> dict[str, float]:
    """Maximum-likelihood lognormal fit of prompt and output lengths (rows with a 0 length are ignored)."""
    p = np.asarray(workload.prompt_tokens, dtype=np.float64)
    o = np.asarray(workload.output_tokens, dtype=np.float64)
    ok = (p > 0) & (o > 0)
    if ok.sum() < 2:
        raise InputError(f"fit_lognormal_lengths: workload {workload.name} has fewer than 2 rows with positive lengths")
    lp, lo = np.log(p[ok]), np.log(o[ok])
    return {
        "prompt_mu": float(lp.mean()),
        "prompt_sigma": float(lp.std()),
        "output_mu": float(lo.mean()),
        "output_sigma": float(lo.std()),
        "rho": float(np.corrcoef(lp, lo)[0, 1]) if lp.std() > 0 and lo.std() > 0 else 0.0,
    }


def default_lengths() -> LognormalLengths:
    """The fitted Azure-conversation lognormal length sampler."""
    return LognormalLengths(
        **AZURE_CONV_LOGNORMAL,
        prompt_min=AZURE_CONV_PROMPT_RANGE[0], prompt_max=AZURE_CONV_PROMPT_RANGE[1],
        output_min=AZURE_CONV_OUTPUT_RANGE[0], output_max=AZURE_CONV_OUTPUT_RANGE[1],
    )


def default_workload(
    num_requests: int, rate_rps: float, rng: np.random.Generator, max_total_tokens: int | None = None
) -> Workload:
    """``num_requests`` Poisson arrivals at ``rate_rps`` with Azure-conversation-like lognormal lengths."""
    rng = as_generator(rng)
    t = poisson_arrivals(rng, rate_rps, num_requests=num_requests)
    return make_workload(t, default_lengths(), rng, max_total_tokens=max_total_tokens, name="default")
