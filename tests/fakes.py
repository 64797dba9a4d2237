"""A tiny deterministic performance model with the PerfModel API, for engine tests that need exact control."""

from __future__ import annotations

from types import SimpleNamespace


class LinearPerf:
    """iteration time = base + per_prefill * prefill_tokens + per_seq * decode_seqs + per_kv * decode_kv_tokens."""

    def __init__(self, base=0.01, per_prefill=1e-4, per_seq=1e-4, per_kv=1e-6, kv_tokens=20000, pp=1, tp=1):
        self.base, self.per_prefill, self.per_seq, self.per_kv = base, per_prefill, per_seq, per_kv
        self._kv = kv_tokens
        self.tp, self.pp = tp, pp
        self.num_gpus = tp * pp
        self.model = SimpleNamespace(name="fake-model", max_context=1 << 30,
                                     kv_bytes_per_token=lambda: 131072.0)  # Llama-3-8B: 128 KiB per token
        self.gpu = SimpleNamespace(name="fake-gpu", pcie_gbps=32.0)

    def kv_capacity_tokens(self, gpu_memory_utilization=0.9):
        return self._kv

    def iteration_time_s(self, prefill_tokens, prefill_attn_work, decode_seqs, decode_kv_tokens):
        return self.base + self.per_prefill * prefill_tokens + self.per_seq * decode_seqs + self.per_kv * decode_kv_tokens

    def stage_time_s(self, *a):
        return self.iteration_time_s(*a) / self.pp

    def decode_coeffs(self, decode_seqs):
        return self.base + self.per_seq * decode_seqs, self.per_kv

    def busy_power_w(self, prefill_tokens, decode_seqs):
        return 300.0 * self.num_gpus

    def idle_power_w(self):
        return 60.0 * self.num_gpus

    def iteration_flops(self, prefill_tokens, prefill_attn_work, decode_seqs, decode_kv_tokens):
        return 1e9 * (prefill_tokens + decode_seqs) + 1e3 * decode_kv_tokens

    def peak_flops(self):
        return 1e14 * self.num_gpus

    def load_time_s(self, storage_gbps):
        return 10.0

    def ideal_latency_s(self, prompt_tokens, output_tokens, chunk_tokens=None):
        ttft = self.iteration_time_s(prompt_tokens, 0, 0, 0)
        e2e = ttft
        for j in range(output_tokens - 1):
            e2e += self.iteration_time_s(0, 0, 1, prompt_tokens + 1 + j)
        return ttft, e2e
