"""Building replicas from plain values (components never see the whole scenario)."""

from __future__ import annotations

from collections import OrderedDict

from fleetwise.errors import InputError
from fleetwise.sim.engine import Replica, make_lanes


def make_replica(index: int, perf, *, region: int = 0, name: str | None = None, model_index: int = 0,
                 block_tokens: int = 16, gpu_memory_utilization: float = 0.9, start_s: float = 0.0,
                 ready_s: float = 0.0, price_usd_per_gpu_hour: float = 0.0, electricity_usd_per_kwh: float = 0.0,
                 prefix_block_tokens: int = 512, prefix_caching: bool = True, kv_capacity_tokens: int | None = None
                 ) -> Replica:
    cap = perf.kv_capacity_tokens(gpu_memory_utilization) if kv_capacity_tokens is None else kv_capacity_tokens
    if cap < block_tokens * perf.pp:
        raise InputError(f"replica {name or index}: {perf.model.name} does not fit on {perf.num_gpus} x "
                         f"{perf.gpu.name} (tp={perf.tp}, pp={perf.pp}) with gpu_memory_utilization="
                         f"{gpu_memory_utilization}: no room left for the KV cache")
    rep = Replica(index=index, name=name or f"r{index}", model_name=perf.model.name, gpu_name=perf.gpu.name,
                  region=region, perf=perf, lanes=[], block_tokens=block_tokens, num_gpus=perf.num_gpus,
                  price_usd_per_gpu_hour=price_usd_per_gpu_hour, electricity_usd_per_kwh=electricity_usd_per_kwh,
                  start_s=start_s, ready_s=ready_s, model_index=model_index)
    rep.lanes = make_lanes(rep, cap, perf.pp, block_tokens)
    if prefix_caching:
        rep.prefix_cache = OrderedDict()
        rep.prefix_cap_blocks = max(1, cap // prefix_block_tokens)
    return rep
