"""Frozen spec types for the catalogs. Entries with their sources live in gpus.py and models.py."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Price:
    """USD per GPU-hour in one cloud. ``spot_usd_per_hour`` is None where the cloud sells no spot capacity."""

    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None = None


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    tflops_bf16: float  # dense (no sparsity) bf16/fp16 tensor-core peak, TFLOP/s
    memory_gb: float  # HBM/DRAM usable by the model, GB (1e9 bytes)
    mem_bw_gbps: float  # memory bandwidth, GB/s
    interconnect_gbps: float  # intra-node GPU-to-GPU bandwidth per GPU per direction, GB/s (NVLink or PCIe)
    idle_w: float
    max_w: float  # TDP / max board power
    prices: dict[str, Price] = field(default_factory=dict)  # cloud -> price per GPU-hour
    pcie_gbps: float = 32.0  # host<->device bandwidth, GB/s (KV offload, model load from host)
    gpus_per_node: int = 8


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int  # intermediate size of one MLP / one expert
    vocab_size: int
    num_params: float  # total parameters
    bytes_per_param: float = 2.0
    gated_mlp: bool = True  # SwiGLU (3 matrices) vs GELU MLP (2 matrices)
    num_experts: int = 1  # mixture of experts: experts per layer
    experts_per_token: int = 1  # top-k
    max_context: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    def kv_bytes_per_token(self, kv_bytes_per_elem: float = 2.0) -> float:
        """Bytes of K and V cache that one token occupies across all layers (whole model, before TP/PP split)."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes_per_elem
