import csv
import gzip

import pytest

from fleetwise.catalog import GPUS, MODELS, GPUSpec, ModelSpec, Price, get_gpu, get_model
from fleetwise.errors import InputError

# Vidur's model configs pad the Llama-2 / CodeLlama vocabulary 32000 -> 32768; the catalog keeps the real value.
VIDUR_VOCAB_PAD = {32000: 32768}

PROFILED = {
    "meta-llama/Llama-2-7b-hf": "Llama-2-7B",
    "meta-llama/Llama-2-70b-hf": "Llama-2-70B",
    "meta-llama/Meta-Llama-3-8B": "Llama-3-8B",
    "meta-llama/Meta-Llama-3-70B": "Llama-3-70B",
    "codellama/CodeLlama-34b-Instruct-hf": "CodeLlama-34B",
    "Qwen/Qwen-72B": "Qwen-72B",
    "microsoft/phi-2": "phi-2",
    "internlm/internlm-20b": "internlm-20b",
}


def _prof_dir():
    from fleetwise.data import data_dir

    root = data_dir(required=False)
    if root is None or not (root / "vidur-profiling").is_dir():
        pytest.skip("real data folder (vidur-profiling) not found")
    return root / "vidur-profiling"


def test_required_entries_present():
    for g in ["A100-80GB", "A40", "H100-80GB", "H200", "L4", "L40S", "T4", "Jetson-AGX-Orin-64GB"]:
        assert isinstance(GPUS[g], GPUSpec)
    for m in ["Llama-2-7B", "Llama-2-70B", "Llama-3-8B", "Llama-3-70B", "CodeLlama-34B", "Qwen-72B", "phi-2",
              "internlm-20b", "Mixtral-8x7B"]:  # fmt: skip
        assert isinstance(MODELS[m], ModelSpec)


def test_gpu_values_sane():
    for g in GPUS.values():
        assert g.tflops_bf16 > 10 and g.memory_gb >= 16 and g.mem_bw_gbps > 100
        assert 0 < g.idle_w < g.max_w
        for cloud, p in g.prices.items():
            assert cloud in {"aws", "gcp", "azure"}
            assert isinstance(p, Price) and p.on_demand_usd_per_hour > 0
            assert p.spot_usd_per_hour is None or 0 < p.spot_usd_per_hour < p.on_demand_usd_per_hour
    assert GPUS["Jetson-AGX-Orin-64GB"].prices == {}
    assert GPUS["H100-80GB"].tflops_bf16 > GPUS["A100-80GB"].tflops_bf16 > GPUS["A40"].tflops_bf16
    assert GPUS["H200"].mem_bw_gbps > GPUS["H100-80GB"].mem_bw_gbps


def test_param_counts_match_shapes():
    for m in MODELS.values():
        h, kv = m.hidden_size, m.num_kv_heads * m.head_dim
        mlp = (3 if m.gated_mlp else 2) * h * m.ffn_size * m.num_experts
        p = m.num_layers * (h * (h + 2 * kv) + h * h + mlp) + 2 * m.vocab_size * h
        assert p == pytest.approx(m.num_params, rel=0.02), m.name


def test_mixtral_moe():
    m = get_model("Mixtral-8x7B")
    assert m.num_experts == 8 and m.experts_per_token == 2


def test_shapes_match_profiling_csvs():
    root = _prof_dir()
    seen = 0
    for hf, name in PROFILED.items():
        files = sorted(root.glob(f"compute/*/{hf}/mlp.csv.gz"))
        assert files, hf
        m = MODELS[name]
        for f in files:
            with gzip.open(f, "rt") as fh:
                r = next(csv.DictReader(fh))
            assert int(r["n_head"]) == m.num_heads, (f, name)
            assert int(r["n_kv_head"]) == m.num_kv_heads, (f, name)
            assert int(r["n_embd"]) == m.hidden_size, (f, name)
            assert int(r["n_expanded_embd"]) == m.ffn_size, (f, name)
            assert (r["use_gated_mlp"] == "True") == m.gated_mlp, (f, name)
            v = int(r["vocab_size"])
            assert v == m.vocab_size or v == VIDUR_VOCAB_PAD.get(m.vocab_size), (f, name, v)
            seen += 1
    assert seen >= 20


@pytest.mark.parametrize(
    "alias,canon",
    [("a100", "A100-80GB"), ("A100", "A100-80GB"), ("h100", "H100-80GB"), ("H200", "H200"), ("l40s", "L40S"),
     ("t4", "T4"), ("orin", "Jetson-AGX-Orin-64GB"), ("a40", "A40"), ("L4", "L4")],
)  # fmt: skip
def test_gpu_aliases(alias, canon):
    assert get_gpu(alias).name == canon


@pytest.mark.parametrize(
    "alias,canon",
    [("llama-2-70b", "Llama-2-70B"), ("meta-llama/Llama-2-70b-hf", "Llama-2-70B"), ("Llama-2-70b-hf", "Llama-2-70B"),
     ("LLAMA-2-7B", "Llama-2-7B"), ("meta-llama/Meta-Llama-3-8B", "Llama-3-8B"), ("codellama/CodeLlama-34b-Instruct-hf", "CodeLlama-34B"),
     ("Qwen/Qwen-72B", "Qwen-72B"), ("microsoft/phi-2", "phi-2"), ("internlm/internlm-20b", "internlm-20b"),
     ("mistralai/Mixtral-8x7B-v0.1", "Mixtral-8x7B"), ("mixtral", "Mixtral-8x7B")],
)  # fmt: skip
def test_model_aliases(alias, canon):
    assert get_model(alias).name == canon


def test_unknown_names():
    with pytest.raises(InputError, match=r"unknown GPU 'x'; expected one of: A100-80GB"):
        get_gpu("x")
    with pytest.raises(InputError, match=r"unknown model 'gpt-9'"):
        get_model("gpt-9")
