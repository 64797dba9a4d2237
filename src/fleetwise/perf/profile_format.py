"""What the profiler and the profile reader share, without pydantic: the profiler runs as
``python -m fleetwise.profiler`` on a GPU machine that has PyTorch and numpy but not fleetwise's other
dependencies (docs/perf-model.md), and the reader (perf/profile_data.py) validates what it wrote."""

from __future__ import annotations

from fleetwise.catalog.specs import ModelSpec

FORMAT = "fleetwise-gpu-profile/1"


def per_gpu_heads(spec: ModelSpec, tp: int) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) on one GPU of a tensor-parallel slice (KV heads replicated when
    tp exceeds them), as PerfModel counts them."""
    return spec.num_heads // tp, max(1, -(-spec.num_kv_heads // tp)), spec.hidden_size // spec.num_heads
