"""Model catalog: transformer shapes from each model's Hugging Face ``config.json``.

Fields map to config.json keys: num_layers = num_hidden_layers, hidden_size, num_heads = num_attention_heads,
num_kv_heads = num_key_value_heads (= num_heads when absent), ffn_size = intermediate_size (per expert for MoE),
vocab_size, max_context = max_position_embeddings (or the trained context). ``num_params`` is the published
parameter count (model card), cross-checked against the shapes in tests/test_catalog.py.

Checked against the Vidur profiling CSVs (columns n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size,
use_gated_mlp): all match except ``vocab_size`` of the Llama-2 / CodeLlama models, which Vidur's model configs pad
from 32000 to 32768; this catalog keeps the real 32000 (the test allows exactly that padding).
"""

from __future__ import annotations

from dataclasses import replace

from fleetwise.catalog.specs import ModelSpec

LLAMA_2_7B = ModelSpec(
    # meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32 heads (MHA), intermediate 11008,
    # vocab 32000, max_position_embeddings 4096; 6.74e9 parameters (model card "7B")
    name="Llama-2-7B",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=32,
    ffn_size=11008,
    vocab_size=32000,
    num_params=6.74e9,
    bytes_per_param=2.0,
    gated_mlp=True,
    max_context=4096,
)

LLAMA_2_70B = ModelSpec(
    # meta-llama/Llama-2-70b-hf config.json: 80 layers, hidden 8192, 64 heads, num_key_value_heads 8 (GQA),
    # intermediate 28672, vocab 32000, max_position_embeddings 4096; 68.98e9 parameters
    name="Llama-2-70B",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    ffn_size=28672,
    vocab_size=32000,
    num_params=68.98e9,
    gated_mlp=True,
    max_context=4096,
)

LLAMA_3_8B = ModelSpec(
    # meta-llama/Meta-Llama-3-8B config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, intermediate 14336,
    # vocab 128256, max_position_embeddings 8192; 8.03e9 parameters
    name="Llama-3-8B",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_size=14336,
    vocab_size=128256,
    num_params=8.03e9,
    gated_mlp=True,
    max_context=8192,
)

LLAMA_3_70B = ModelSpec(
    # meta-llama/Meta-Llama-3-70B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate 28672,
    # vocab 128256, max_position_embeddings 8192; 70.55e9 parameters
    name="Llama-3-70B",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    ffn_size=28672,
    vocab_size=128256,
    num_params=70.55e9,
    gated_mlp=True,
    max_context=8192,
)

CODELLAMA_34B = ModelSpec(
    # codellama/CodeLlama-34b-Instruct-hf config.json: 48 layers, hidden 8192, 64 heads, 8 KV heads,
    # intermediate 22016, vocab 32000, max_position_embeddings 16384; 33.74e9 parameters
    name="CodeLlama-34B",
    num_layers=48,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    ffn_size=22016,
    vocab_size=32000,
    num_params=33.74e9,
    gated_mlp=True,
    max_context=16384,
)

QWEN_72B = ModelSpec(
    # Qwen/Qwen-72B config.json: 80 layers, hidden 8192, 64 heads (MHA, no GQA), vocab 152064, seq_length 32768.
    # config.json's intermediate_size 49152 is the *sum* of the two gated halves (w1, w2 each 24576 wide), so the
    # per-matrix FFN size is 24576 (= Vidur's n_expanded_embd); 72.29e9 parameters (model card "72B")
    name="Qwen-72B",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=64,
    ffn_size=24576,
    vocab_size=152064,
    num_params=72.29e9,
    gated_mlp=True,
    max_context=32768,
)

PHI_2 = ModelSpec(
    # microsoft/phi-2 config.json: 32 layers, hidden 2560, 32 heads (MHA), intermediate 10240 (GELU MLP, not gated),
    # vocab 51200, max_position_embeddings 2048; 2.78e9 parameters (model card "2.7B")
    name="phi-2",
    num_layers=32,
    hidden_size=2560,
    num_heads=32,
    num_kv_heads=32,
    ffn_size=10240,
    vocab_size=51200,
    num_params=2.78e9,
    gated_mlp=False,
    max_context=2048,
)

INTERNLM_20B = ModelSpec(
    # internlm/internlm-20b config.json: 60 layers, hidden 5120, 40 heads (MHA), intermediate 13824, vocab 103168,
    # trained with 4096 context; ~20e9 parameters (model card "20B"; 20.09e9 from the shapes)
    name="internlm-20b",
    num_layers=60,
    hidden_size=5120,
    num_heads=40,
    num_kv_heads=40,
    ffn_size=13824,
    vocab_size=103168,
    num_params=20.09e9,
    gated_mlp=True,
    max_context=4096,
)

MIXTRAL_8X7B = ModelSpec(
    # mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, intermediate 14336 per
    # expert, num_local_experts 8, num_experts_per_tok 2, vocab 32000, max_position_embeddings 32768;
    # 46.7e9 total parameters (12.9e9 active per token)
    name="Mixtral-8x7B",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_size=14336,
    vocab_size=32000,
    num_params=46.7e9,
    gated_mlp=True,
    num_experts=8,
    experts_per_token=2,
    max_context=32768,
)

# Llama-3-8B with 4-bit weights (AWQ/GPTQ-style, group size 128: ~0.53 bytes per parameter with scales), the
# form edge devices serve. Only the bytes read change: the KV cache stays fp16 and the matmuls run at the fp16
# rate after dequantisation (as AWQ's kernels do), which the performance model's GEMM fit covers only roughly.
LLAMA_3_8B_INT4 = replace(LLAMA_3_8B, name="Llama-3-8B-int4", bytes_per_param=0.53)

ALL_MODELS: tuple[ModelSpec, ...] = (
    LLAMA_2_7B,
    LLAMA_2_70B,
    LLAMA_3_8B,
    LLAMA_3_8B_INT4,
    LLAMA_3_70B,
    CODELLAMA_34B,
    QWEN_72B,
    PHI_2,
    INTERNLM_20B,
    MIXTRAL_8X7B,
)

# lower-case alias -> canonical name (Hugging Face repo ids, with and without the org, are added automatically)
MODEL_HF_IDS: dict[str, str] = {
    "Llama-2-7B": "meta-llama/Llama-2-7b-hf",
    "Llama-2-70B": "meta-llama/Llama-2-70b-hf",
    "Llama-3-8B": "meta-llama/Meta-Llama-3-8B",
    "Llama-3-70B": "meta-llama/Meta-Llama-3-70B",
    "CodeLlama-34B": "codellama/CodeLlama-34b-Instruct-hf",
    "Qwen-72B": "Qwen/Qwen-72B",
    "phi-2": "microsoft/phi-2",
    "internlm-20b": "internlm/internlm-20b",
    "Mixtral-8x7B": "mistralai/Mixtral-8x7B-v0.1",
}

MODEL_ALIASES: dict[str, str] = {
    "llama-3-8b-awq": "Llama-3-8B-int4",
    "llama2-7b": "Llama-2-7B",
    "llama-2-7b-chat-hf": "Llama-2-7B",
    "meta-llama/llama-2-7b-chat-hf": "Llama-2-7B",
    "llama2-70b": "Llama-2-70B",
    "llama-2-70b-chat-hf": "Llama-2-70B",
    "meta-llama/llama-2-70b-chat-hf": "Llama-2-70B",
    "llama3-8b": "Llama-3-8B",
    "meta-llama-3-8b": "Llama-3-8B",
    "llama-3.1-8b": "Llama-3-8B",
    "meta-llama/meta-llama-3-8b-instruct": "Llama-3-8B",
    "llama3-70b": "Llama-3-70B",
    "meta-llama-3-70b": "Llama-3-70B",
    "meta-llama/meta-llama-3-70b-instruct": "Llama-3-70B",
    "codellama-34b-hf": "CodeLlama-34B",
    "codellama/codellama-34b-hf": "CodeLlama-34B",
    "codellama-34b-instruct": "CodeLlama-34B",
    "qwen72b": "Qwen-72B",
    "phi2": "phi-2",
    "internlm20b": "internlm-20b",
    "mixtral": "Mixtral-8x7B",
    "mixtral-8x7b-instruct-v0.1": "Mixtral-8x7B",
    "mistralai/mixtral-8x7b-instruct-v0.1": "Mixtral-8x7B",
}
