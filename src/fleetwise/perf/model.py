"""Per-iteration time, memory and power of one replica: a calibrated per-operator roofline.

All per-call work is plain float arithmetic on constants cached in ``__init__`` (the simulator calls
``iteration_time_s`` in its hot loop). Form and calibration: docs/perf-model.md.
"""

from __future__ import annotations

import math

from fleetwise.catalog.specs import GPUSpec, ModelSpec
from fleetwise.errors import InputError
from fleetwise.limits import MAX_REQUESTS, MAX_TOKENS
from fleetwise.perf.calibration import (
    LINEAR_OPS,
    SMALL_OPS,
    TILE_M,
    TILE_N,
    Calibration,
    CommParams,
    DecodeKernel,
    GemmParams,
    GemmShape,
    GpuCalibration,
    PrefillKernel,
    default_calibration,
)

# Activation memory reserved per GPU besides weights and KV cache: a 4096-token batch's largest activations,
# fp32 logits for 256 sampled sequences, plus 0.5 GB of workspace / CUDA graphs (vLLM-style profiling run).
ACTIVATION_TOKENS = 4096
LOGIT_SEQS = 256
WORKSPACE_BYTES = 0.5e9
# Busy power per GPU: idle + (max - idle) * (POWER_FLOOR + (1 - POWER_FLOOR) * x), x = M / (M + ridge tokens).
POWER_FLOOR = 0.45

_DEFAULT_CAL: Calibration | None = None


def _default() -> Calibration:
    global _DEFAULT_CAL
    if _DEFAULT_CAL is None:
        _DEFAULT_CAL = default_calibration()
    return _DEFAULT_CAL


def all_reduce_time_s(c: CommParams, n: int, size_bytes: float, link_gbps: float) -> float:
    if n <= 1:
        return 0.0
    lat, eff = c.all_reduce_for(n)
    return lat + 2.0 * (n - 1) / n * size_bytes / (link_gbps * 1e9 * eff)


def send_recv_time_s(c: CommParams, size_bytes: float, link_gbps: float) -> float:
    return c.send_recv_lat_s + size_bytes / (link_gbps * 1e9 * c.send_recv_eff_bw)


def gemm_coeffs(
    g: GemmParams, N: float, K: float, peak_flops: float, mem_bw: float, sms: int, bpp: float = 2.0
) -> tuple[float, float, float, float, float, float]:
    """Constants of one linear op (y[M,N] = x[M,K] W^T): (wave_s, waves_per_row_tile, wave_quant, b0, b1, t0)."""
    wave_s = 2.0 * (K + g.k_pad) * sms * TILE_M * TILE_N / (peak_flops * g.eff_compute)  # one full wave of tiles
    nw = math.ceil(N / TILE_N) / sms
    b0 = bpp * N * K / (mem_bw * g.eff_mem)
    b1 = bpp * (N + K) / (mem_bw * g.eff_mem)
    return (wave_s, nw, g.wave_quant, b0, b1, g.t0_s)


def gemm_time_s(c: tuple[float, float, float, float, float, float], M: float) -> float:
    """Time of a linear op with constants ``c`` (from gemm_coeffs) for M tokens."""
    a, nw, q, b0, b1, t0 = c
    w = math.ceil(M / TILE_M) * nw
    tc = a * (w + q * (math.ceil(w) - w))
    tm = b0 + b1 * M
    return (tc if tc > tm else tm) + t0


def prefill_attention_s(k: PrefillKernel, peak_flops: float, sms: int, heads: int, head_dim: int, q: float,
                        kv: float) -> float:
    """One prefill attention call of ``k`` (see PrefillKernel): q new tokens attending to kv tokens (kv >= q)."""
    e = peak_flops * k.eff_compute
    thr = 4.0 * head_dim * heads * (q * kv - k.causal_skip * q * q / 2.0) / e
    crit = 4.0 * head_dim * k.block_q * sms * kv / e
    p = k.pnorm
    return k.t0_s + (thr**p + crit**p) ** (1.0 / p)


def decode_attention_s(k: DecodeKernel, mem_bw: float, kv_heads: int, head_dim: int, decode_seqs: int,
                       kv_tokens: float, bytes_per_elem: float = 2.0) -> float:
    """One decode attention call of ``k`` (see DecodeKernel): B sequences, K cached tokens in total."""
    e = mem_bw * k.eff_mem
    kv_bytes = 2.0 * kv_heads * head_dim * bytes_per_elem * kv_tokens
    return k.t0_s + decode_seqs * k.seq_bytes / e + kv_bytes / e * k.kv_factor(decode_seqs, kv_heads)


def linear_op_s(cal: Calibration, gpu: GPUSpec, N: float, K: float, M: float, bpp: float = 2.0) -> float:
    """Time of one linear op y[M,N] = x[M,K] W^T on ``gpu`` as PerfModel charges it (with the measured
    correction of the shape where ``cal`` has the GPU's own profile)."""
    gc = cal.gpus.get(gpu.name)
    g = gc.gemm if gc else cal.gemm[cal.profile_of(gpu.name)]
    sms = gc.sms if gc else cal.sms_of(gpu.name)
    t = gemm_time_s(gemm_coeffs(g, N, K, gpu.tflops_bf16 * 1e12, gpu.mem_bw_gbps * 1e9, sms, bpp), M)
    corr = gc.gemm_shapes.get((int(N), int(K))) if gc else None
    return t * corr.factor(M) if corr is not None else t


def op_geometry(
    hidden: int, heads: int, kv_heads: int, ffn_size: int, gated: bool, tp: int, bytes_per_param: float = 2.0
) -> tuple[list[tuple[float, float]], dict[str, float]]:
    """Per-GPU shapes of one layer: [(N, K)] of the 4 linear ops (LINEAR_OPS order, one expert for MoE) and
    activation bytes moved per token by each small op (read + write). Shared by the model and the calibration."""
    hd = hidden // heads
    q = heads // tp
    kv = max(1, -(-kv_heads // tp))  # kv heads per GPU (replicated when tp > kv heads)
    ffn = ffn_size / tp
    lin = [((q + 2 * kv) * hd, hidden), (hidden, q * hd), (ffn * (2 if gated else 1), hidden), (hidden, ffn)]
    b = bytes_per_param
    small = {
        "input_layernorm": 2 * b * hidden,
        "attn_rope": 2 * b * (q + kv) * hd,
        "post_attention_layernorm": 2 * b * hidden,
        "mlp_act": (3 if gated else 2) * b * ffn,
        "add": 3 * b * hidden,
        "emb": 2 * b * hidden,
    }
    return lin, small


class PerfModel:
    # the simulator's accounting reads ``flops_per_token``, ``attn_flops_coef`` and ``power_by_tokens`` directly
    # (iteration_flops and busy_power_w without a call); another perf model is called
    inline_accounting = True
    __slots__ = (
        "gpu", "model", "tp", "pp", "num_gpus", "cal",
        "_lin", "_lm", "_moe", "_s0", "_s1", "_emb0", "_emb1",
        "_pa0", "_pa1", "_d0", "_d1", "_d2", "_ar0", "_ar1", "_sr0", "_sr1",
        "_cpu0", "_cpu1", "_L", "_Ls", "_kv_tok_gpu", "_w_gpu", "_reserve", "_ridge", "_mlp",
        "_moe_coef", "flops_per_token", "_attn_flops_per_work", "_Lpa1", "_Ld2", "_memo",
        "_gc", "_lin_corr", "_mlp_corr", "_lm_corr", "_kp", "_kc", "_kd", "_heads", "_kv_heads", "_head_dim",
        "_peak", "_bw", "_sms", "_dslope", "attn_flops_coef", "power_by_tokens", "_dcoef", "_lin_memo",
    )  # fmt: skip

    def __init__(
        self, gpu: GPUSpec, model: ModelSpec, tp: int = 1, pp: int = 1, calibration: Calibration | None = None
    ) -> None:
        from fleetwise.catalog import get_gpu, get_model

        # a catalog name works as its spec; anything else is named (a name or None was an AttributeError)
        gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        model = get_model(model) if isinstance(model, str) else model
        if not isinstance(gpu, GPUSpec):
            raise InputError(f"PerfModel gpu {gpu!r:.60}: expected a GPUSpec or a catalog GPU name")
        if not isinstance(model, ModelSpec):
            raise InputError(f"PerfModel model {model!r:.60}: expected a ModelSpec or a catalog model name")
        if calibration is not None and not isinstance(calibration, Calibration):
            raise InputError(f"PerfModel calibration {calibration!r:.60}: expected a Calibration "
                             "(fleetwise.perf.calfile.load_calibration(path)) or None")
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not (x >= 1 and x == int(x) and x <= 4096)
               for x in (tp, pp)):  # (NaN: "cannot convert float NaN to integer" before)
            raise InputError(f"tp and pp must be positive integers, got tp={tp} pp={pp}")
        if pp > model.num_layers:
            raise InputError(f"pp={pp} exceeds the {model.num_layers} layers of {model.name}")
        if model.num_heads % tp != 0:
            raise InputError(f"tp={tp} does not divide the {model.num_heads} attention heads of {model.name}")
        cal = calibration if calibration is not None else _default()
        self.gpu, self.model, self.tp, self.pp, self.cal = gpu, model, int(tp), int(pp), cal
        self.num_gpus = self.tp * self.pp
        prof = cal.profile_of(gpu.name)
        gc: GpuCalibration | None = cal.gpus.get(gpu.name)  # this GPU's own profile (perf calibrate), if any
        self._gc = gc
        g = gc.gemm if gc else cal.gemm[prof]
        P = gpu.tflops_bf16 * 1e12
        BW = gpu.mem_bw_gbps * 1e9
        bpp = model.bytes_per_param
        h, hd, tp = model.hidden_size, model.head_dim, self.tp
        q = model.num_heads // tp
        kv = max(1, -(-model.num_kv_heads // tp))  # kv heads per GPU (replicated when tp > kv heads)
        ffn = model.ffn_size / tp

        sms = gc.sms if gc else cal.sms_of(gpu.name)
        self._peak, self._bw, self._sms = P, BW, sms
        self._heads, self._kv_heads, self._head_dim = q, kv, hd

        def gemm(N: float, K: float) -> tuple[float, float, float, float, float, float]:
            return gemm_coeffs(g, N, K, P, BW, sms, bpp)

        def corr(N: float, K: float) -> GemmShape | None:
            return gc.gemm_shapes.get((int(N), int(K))) if gc else None

        lin, small_bytes = op_geometry(h, model.num_heads, model.num_kv_heads, model.ffn_size, model.gated_mlp, tp, bpp)
        attn_ops = [gemm(*lin[0]), gemm(*lin[1])]
        mlp_ops = [gemm(*lin[2]), gemm(*lin[3])]
        self._moe = model.num_experts > 1
        self._lin = tuple(attn_ops + ([] if self._moe else mlp_ops))
        self._mlp = tuple(mlp_ops)
        self._moe_coef = (model.num_experts, model.experts_per_token)
        self._lm = gemm(model.vocab_size / tp, h)
        lin_corr = [corr(*lin[0]), corr(*lin[1])] + ([] if self._moe else [corr(*lin[2]), corr(*lin[3])])
        self._lin_corr = tuple(lin_corr) if gc else None
        self._mlp_corr = (corr(*lin[2]), corr(*lin[3]))
        self._lm_corr = corr(model.vocab_size / tp, h)
        if self._moe:
            small_bytes["mlp_act"] *= model.experts_per_token
        sp = gc.small if gc and gc.small else cal.small[prof]
        # a decoder layer runs each small op once, except the residual add (twice: after attention and after the
        # MLP); the Vidur-calibrated default counts one add, as its profile does. With a GPU calibration the layer
        # also writes the new tokens' K and V into the cache (an elementwise copy, costed with the add's constants)
        reps = {o: (2 if gc and o == "add" else 1) for o in SMALL_OPS}
        self._s0 = sum(reps[o] * sp[o].t0_s for o in SMALL_OPS if o != "emb")
        self._s1 = sum(reps[o] * small_bytes[o] / (BW * sp[o].eff_mem) for o in SMALL_OPS if o != "emb")
        if gc:
            self._s0 += sp["add"].t0_s
            self._s1 += 2.0 * (2.0 * kv * hd * bpp) / (BW * sp["add"].eff_mem)  # K and V, read and written
        self._emb0 = sp["emb"].t0_s
        self._emb1 = small_bytes["emb"] / (BW * sp["emb"].eff_mem)
        kv_bytes_tok_layer = 2.0 * kv * hd * bpp
        self._attn_flops_per_work = 4.0 * q * hd
        self._dslope = {}
        if gc is None:
            # attention (A100-measured efficiencies applied to this GPU's peak and bandwidth)
            at = cal.attention
            self._kp = self._kc = self._kd = None
            self._pa0 = at.prefill_t0_s
            self._pa1 = self._attn_flops_per_work / (P * at.prefill_eff_compute)
            self._d0 = at.decode_t0_s
            self._d1 = at.decode_seq_bytes / (BW * at.decode_eff_mem)
            self._d2 = kv_bytes_tok_layer / (BW * at.decode_eff_mem)
        else:
            # this GPU's fitted kernels of its default (fastest) backend per kind; prefill attention is added per call
            self._kp, self._kc, self._kd = gc.kernel("prefill"), gc.kernel("chunked"), gc.kernel("decode")
            self._pa0 = self._pa1 = 0.0
            self._d0 = self._kd.t0_s
            self._d1 = self._kd.seq_bytes / (BW * self._kd.eff_mem)
            self._d2 = kv_bytes_tok_layer / (BW * self._kd.eff_mem)
        # communication
        ar_fab, sr_fab = cal.fabric_of(gpu.name)
        link = gpu.interconnect_gbps
        if tp > 1:
            c = cal.comm[ar_fab]
            self._ar0 = 2.0 * all_reduce_time_s(c, tp, 0.0, link)  # two all-reduces per layer
            self._ar1 = 2.0 * (all_reduce_time_s(c, tp, 1e6, link) - all_reduce_time_s(c, tp, 0.0, link)) / 1e6 * bpp * h
        else:
            self._ar0 = self._ar1 = 0.0
        if self.pp > 1:
            c = cal.comm[sr_fab]
            self._sr0 = c.send_recv_lat_s
            self._sr1 = bpp * h / (link * 1e9 * c.send_recv_eff_bw)
        else:
            self._sr0 = self._sr1 = 0.0
        cp = cal.cpu
        self._cpu0 = cp.base_s + (cp.multi_gpu_base_s if self.num_gpus > 1 else 0.0)
        self._cpu1 = cp.per_seq_s + (cp.multi_gpu_per_seq_s if self.num_gpus > 1 else 0.0)
        self._L = model.num_layers
        self._Ls = -(-model.num_layers // self.pp)  # layers on the busiest stage
        self._kv_tok_gpu = kv_bytes_tok_layer * self._Ls
        self._w_gpu = model.weight_bytes / self.num_gpus
        self._reserve = (
            ACTIVATION_TOKENS * bpp * (4 * h + 3 * ffn) + LOGIT_SEQS * 4.0 * model.vocab_size / tp + WORKSPACE_BYTES
        )
        self._ridge = P / BW
        # active parameters per token (MoE: only top-k experts)
        n_mlp = (3 if model.gated_mlp else 2) * h * model.ffn_size
        active = model.num_params - model.num_layers * n_mlp * (model.num_experts - model.experts_per_token)
        self.flops_per_token = 2.0 * active
        self._Lpa1 = self._L * self._pa1
        self._Ld2 = self._L * self._d2
        self._memo: dict = {}  # _base_s per (prefill tokens, decode seqs)
        # for the simulator's accounting, without a call per iteration (the same numbers as iteration_flops and
        # busy_power_w): attention flops per unit of attention work, and busy power per batch token count
        self.attn_flops_coef = self._attn_flops_per_work * self.tp * self._L
        self.power_by_tokens: dict[int, float] = {}
        self._dcoef: dict[int, tuple[float, float]] = {}  # decode_coeffs per decode batch size
        self._lin_memo: dict = {}  # _linear_s per token count (batch shapes differ, their token count often not)

    # ---------------------------------------------------------------- memory

    def weight_bytes_per_gpu(self) -> float:
        return self._w_gpu

    def reserved_bytes_per_gpu(self) -> float:
        """GPU memory held besides weights and KV cache: activations, logits, workspace."""
        return self._reserve

    def kv_bytes_per_token_per_gpu(self) -> float:
        return self._kv_tok_gpu

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        if not 0.0 < gpu_memory_utilization <= 1.0:  # (NaN failed in int())
            raise InputError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        free = gpu_memory_utilization * self.gpu.memory_gb * 1e9 - self._w_gpu - self._reserve
        if free <= 0:
            return 0
        return int(free // self._kv_tok_gpu)

    def fits(self, gpu_memory_utilization: float = 0.9) -> bool:
        return self.kv_capacity_tokens(gpu_memory_utilization) > 0

    # ---------------------------------------------------------------- time
    def _linear_s(self, M: float) -> float:
        if self._lin_corr is not None:
            return self._linear_corr_s(M)
        mt = math.ceil(M / TILE_M)
        ceil = math.ceil
        t = 0.0
        for a, nw, q, b0, b1, t0 in self._lin:
            w = mt * nw
            tc = a * (w + q * (ceil(w) - w))
            tm = b0 + b1 * M
            t += (tc if tc > tm else tm) + t0
        if self._moe:
            E, k = self._moe_coef
            touched = E * (1.0 - (1.0 - k / E) ** M)  # expected distinct experts hit by M tokens
            if touched < 1.0:
                touched = 1.0
            m = M * k / touched
            for c in self._mlp:
                t += touched * gemm_time_s(c, m)
        return t

    def _linear_corr_s(self, M: float) -> float:
        """_linear_s with this GPU's measured per-shape corrections (a GPU calibration)."""
        t = 0.0
        for c, f in zip(self._lin, self._lin_corr):
            t += gemm_time_s(c, M) * (f.factor(M) if f is not None else 1.0)
        if self._moe:
            E, k = self._moe_coef
            touched = max(1.0, E * (1.0 - (1.0 - k / E) ** M))
            m = M * k / touched
            for c, f in zip(self._mlp, self._mlp_corr):
                t += touched * gemm_time_s(c, m) * (f.factor(m) if f is not None else 1.0)
        return t

    def _lm_s(self, seqs: int) -> float:
        t = gemm_time_s(self._lm, seqs)
        f = self._lm_corr if self._gc is not None else None
        return t * f.factor(seqs) if f is not None else t

    def _layer_s(self, prefill_tokens: int, prefill_attn_work: float, decode_seqs: int, decode_kv_tokens: int) -> float:
        M = prefill_tokens + decode_seqs
        lin = self._lin_memo.get(M)
        if lin is None:
            lin = self._linear_s(M)
            if len(self._lin_memo) > 200_000:
                self._lin_memo.clear()
            self._lin_memo[M] = lin
        t = lin + self._s0 + self._s1 * M + self._ar0 + self._ar1 * M
        if prefill_tokens > 0:
            t += self._pa0 + self._pa1 * prefill_attn_work
        if decode_seqs > 0:
            t += self._d0 + self._d1 * decode_seqs + self._d2 * decode_kv_tokens
        return t

    def _extras_s(self, prefill_tokens: int, decode_seqs: int) -> float:
        """Embedding, LM head (sampled tokens only) and CPU overhead: once per iteration."""
        M = prefill_tokens + decode_seqs
        seqs = decode_seqs + (1 if prefill_tokens > 0 else 0)
        lm = gemm_time_s(self._lm, seqs) if self._gc is None else self._lm_s(seqs)
        return (self._emb0 + self._emb1 * M) + lm + self._cpu0 + self._cpu1 * seqs

    def _base_s(self, prefill_tokens: int, decode_seqs: int) -> float:
        """Iteration time without the terms linear in attention work and KV tokens (memoised per batch shape)."""
        key = (prefill_tokens, decode_seqs)
        t = self._memo.get(key)
        if t is None:
            t = self._L * self._layer_s(prefill_tokens, 0.0, decode_seqs, 0) + self._extras_s(prefill_tokens, decode_seqs)
            if self.pp > 1:
                t += (self.pp - 1) * (self._sr0 + self._sr1 * (prefill_tokens + decode_seqs))
            if len(self._memo) > 200_000:
                self._memo.clear()
            self._memo[key] = t
        return t

    def _prefill_attn_s(self, prefill_tokens: int, prefill_attn_work: float) -> float:
        """Per-layer prefill attention with this GPU's fitted kernels (a GPU calibration). ``work`` <= tokens^2
        means prompts without a cached context (one, or several whose sum of squares is the work); more means one
        chunk of ``tokens`` after a context of work/tokens - tokens (several such chunks are treated as one)."""
        q = float(prefill_tokens)
        kv = prefill_attn_work / q
        k = self._kp if kv <= q * (1.0 + 1e-9) else self._kc
        if kv < q:  # several whole prompts: causal work sum(q_i^2)/2, critical path ~ the work-weighted length
            e = self._peak * k.eff_compute
            thr = 4.0 * self._head_dim * self._heads * prefill_attn_work / 2.0 / e
            crit = 4.0 * self._head_dim * k.block_q * self._sms * kv / e
            p = k.pnorm
            return k.t0_s + (thr**p + crit**p) ** (1.0 / p)
        return prefill_attention_s(k, self._peak, self._sms, self._heads, self._head_dim, q, kv)

    def _decode_slope(self, decode_seqs: int) -> float:
        """Iteration time per cached KV token for a batch of ``decode_seqs`` (a GPU calibration; memoised)."""
        s = self._dslope.get(decode_seqs)
        if s is None:
            s = self._Ld2 * self._kd.kv_factor(decode_seqs, self._kv_heads)
            self._dslope[decode_seqs] = s
        return s

    def iteration_time_s(
        self, prefill_tokens: int, prefill_attn_work: float, decode_seqs: int, decode_kv_tokens: int
    ) -> float:
        """The simulator's hot path (called once per iteration): its arguments are not checked. Code that takes
        counts from a user calls :meth:`iteration_breakdown`, which checks them (``perf predict``)."""
        t = self._memo.get((prefill_tokens, decode_seqs))  # (_base_s's memo, read here: a call less per iteration)
        if t is None:
            t = self._base_s(prefill_tokens, decode_seqs)
        if self._gc is None:
            return t + self._Lpa1 * prefill_attn_work + self._Ld2 * decode_kv_tokens
        if prefill_tokens > 0:
            t += self._L * self._prefill_attn_s(prefill_tokens, prefill_attn_work)
        if decode_seqs > 0:
            t += self._decode_slope(decode_seqs) * decode_kv_tokens
        return t

    def stage_time_s(self, prefill_tokens: int, prefill_attn_work: float, decode_seqs: int, decode_kv_tokens: int) -> float:
        if self.pp == 1:
            return self.iteration_time_s(prefill_tokens, prefill_attn_work, decode_seqs, decode_kv_tokens)
        if self._gc is None:
            layer = self._layer_s(prefill_tokens, prefill_attn_work, decode_seqs, decode_kv_tokens)
        else:
            layer = self._layer_s(prefill_tokens, 0.0, decode_seqs, 0)
            if prefill_tokens > 0:
                layer += self._prefill_attn_s(prefill_tokens, prefill_attn_work)
            if decode_seqs > 0:
                layer += self._decode_slope(decode_seqs) / self._L * decode_kv_tokens
        return (
            self._Ls * layer
            + self._extras_s(prefill_tokens, decode_seqs)
            + self._sr0
            + self._sr1 * (prefill_tokens + decode_seqs)
        )

    def decode_coeffs(self, decode_seqs: int) -> tuple[float, float]:
        c = self._dcoef.get(decode_seqs)
        if c is None:
            if decode_seqs <= 0:
                return (0.0, 0.0)
            c = (self._base_s(0, decode_seqs), self._Ld2 if self._gc is None else self._decode_slope(decode_seqs))
            self._dcoef[decode_seqs] = c
        return c

    def iteration_breakdown(self, prefill_tokens: int, prefill_context: int, decode_seqs: int,
                            decode_context: int) -> dict[str, float]:
        """One iteration: a prefill chunk of ``prefill_tokens`` tokens of one sequence that already has
        ``prefill_context`` tokens cached, plus ``decode_seqs`` sequences decoding one token each with
        ``decode_context`` cached tokens. ``iteration_s`` (= iteration_time_s) = ``gpu_s`` (per-GPU compute on
        the critical path: layers, embedding, LM head) + ``comm_s`` (tensor-parallel all-reduces and
        pipeline send/recv) + ``cpu_s`` (the per-iteration CPU overhead)."""
        counts = (prefill_tokens, prefill_context, decode_seqs, decode_context)
        if not all(not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x == int(x)
                   for x in counts):  # (NaN was "cannot convert float NaN to integer", 'a' an int() error)
            raise InputError(f"an iteration's counts are whole numbers; got prefill_tokens={prefill_tokens!r} "
                             f"prefill_context={prefill_context!r} decode_seqs={decode_seqs!r} "
                             f"decode_context={decode_context!r}")
        N, P, B, C = (int(x) for x in counts)
        if min(N, P, B, C) < 0 or N + B == 0:
            raise InputError(f"an iteration needs prefill tokens or decoding sequences, and no negative count; "
                             f"got prefill_tokens={N} prefill_context={P} decode_seqs={B} decode_context={C}")
        if max(N + P, C + 1) > MAX_TOKENS or B > MAX_REQUESTS:  # (docs/limits.md)
            raise InputError(f"an iteration beyond the bounds of docs/limits.md: a sequence of at most "
                             f"{MAX_TOKENS:,} tokens (prefill_context + prefill_tokens = {N + P:,}, decode_context + 1 "
                             f"= {C + 1:,}) and at most {MAX_REQUESTS:,} decoding sequences (decode_seqs = {B:,})")
        if P and not N or C and not B:  # (a context with no sequence to hold it: refused, not ignored)
            raise InputError(f"{'prefill_context' if P and not N else 'decode_context'} without "
                             f"{'prefill_tokens' if P and not N else 'decode_seqs'}: got prefill_tokens={N} "
                             f"prefill_context={P} decode_seqs={B} decode_context={C}")
        M = N + B
        total = self.iteration_time_s(N, float(N) * (P + N), B, B * C)
        comm = self._L * (self._ar0 + self._ar1 * M)
        if self.pp > 1:
            comm += (self.pp - 1) * (self._sr0 + self._sr1 * M)
        cpu = self.cpu_overhead_s(B + (1 if N > 0 else 0))
        return {"iteration_s": total, "gpu_s": total - comm - cpu, "comm_s": comm, "cpu_s": cpu}

    # ---------------------------------------------------------------- power, flops, misc
    def busy_power_w(self, prefill_tokens: int, decode_seqs: int) -> float:
        M = prefill_tokens + decode_seqs
        x = M / (M + self._ridge) if M > 0 else 0.0
        g = self.gpu
        return self.num_gpus * (g.idle_w + (g.max_w - g.idle_w) * (POWER_FLOOR + (1.0 - POWER_FLOOR) * x))

    def idle_power_w(self) -> float:
        return self.num_gpus * self.gpu.idle_w

    def iteration_flops(self, prefill_tokens: int, prefill_attn_work: float, decode_seqs: int, decode_kv_tokens: int) -> float:
        attn = self.attn_flops_coef * (prefill_attn_work + decode_kv_tokens)
        return self.flops_per_token * (prefill_tokens + decode_seqs) + attn

    def peak_flops(self) -> float:
        return self.num_gpus * self.gpu.tflops_bf16 * 1e12

    def load_time_s(self, storage_gbps: float) -> float:
        if not 0 < storage_gbps < math.inf:  # (NaN gave a NaN load time)
            raise InputError(f"storage bandwidth must be > 0 GB/s and finite, got {storage_gbps}")
        bw = min(storage_gbps, self.num_gpus * self.gpu.pcie_gbps) * 1e9
        return self.model.weight_bytes / bw

    def ideal_latency_s(self, prompt_tokens: int, output_tokens: int, chunk_tokens: int | None = None) -> tuple[float, float]:
        P = int(prompt_tokens)
        if not 0 < P <= MAX_TOKENS or not 0 <= int(output_tokens) <= MAX_TOKENS:  # (-5 output tokens was taken)
            raise InputError(f"prompt_tokens must be 1 to {MAX_TOKENS:,} and output_tokens 0 to {MAX_TOKENS:,}, got "
                             f"{prompt_tokens} and {output_tokens}")
        step = P if not chunk_tokens or chunk_tokens <= 0 else int(chunk_tokens)
        ttft = 0.0
        done = 0
        while done < P:
            c = min(step, P - done)
            ttft += self.iteration_time_s(c, float(c) * (done + c), 0, 0)
            done += c
        n = max(0, int(output_tokens) - 1)
        if n == 0:
            return ttft, ttft
        c0, c1 = self.decode_coeffs(1)
        kv_sum = n * P + n * (n + 1) / 2.0  # decode step j attends to P + j tokens
        return ttft, ttft + n * c0 + c1 * kv_sum

    # ---------------------------------------------------------------- per-operator (validation, debugging)
    def layer_op_times_s(self, num_tokens: int) -> dict[str, float]:
        """Per-layer, per-GPU time of each profiled operator for a batch of num_tokens (dense models), and the
        LM head for num_tokens sampled sequences (once per iteration)."""
        M = float(num_tokens)
        out: dict[str, float] = {}
        corr = self._lin_corr[:2] + self._mlp_corr if self._lin_corr is not None else (None,) * 4
        for name, c, f in zip(LINEAR_OPS, self._lin[:2] + self._mlp, corr):
            out[name] = gemm_time_s(c, M) * (f.factor(M) if f is not None else 1.0)
        out["lm_head"] = self._lm_s(num_tokens) if self._gc is not None else gemm_time_s(self._lm, M)
        gc = self._gc
        sp = gc.small if gc and gc.small else self.cal.small[self.cal.profile_of(self.gpu.name)]
        BW = self.gpu.mem_bw_gbps * 1e9
        m = self.model
        _, nb = op_geometry(m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_size, m.gated_mlp, self.tp, m.bytes_per_param)
        for o in SMALL_OPS:
            out[o] = sp[o].t0_s + M * nb[o] / (BW * sp[o].eff_mem)
        return out

    def attention_prefill_s(self, prefill_attn_work: float, prefill_tokens: int | None = None) -> float:
        """Per-layer prefill attention. With a GPU calibration ``prefill_tokens`` (default: a whole prompt,
        sqrt(work)) tells a whole prompt from a chunk after a context (see _prefill_attn_s)."""
        if self._gc is None:
            return self._pa0 + self._pa1 * prefill_attn_work
        q = prefill_tokens if prefill_tokens is not None else math.sqrt(prefill_attn_work)
        return self._prefill_attn_s(q, prefill_attn_work)

    def attention_decode_s(self, decode_seqs: int, decode_kv_tokens: int) -> float:
        if self._gc is None:
            return self._d0 + self._d1 * decode_seqs + self._d2 * decode_kv_tokens
        return self._d0 + self._d1 * decode_seqs + self._decode_slope(decode_seqs) / self._L * decode_kv_tokens

    def cpu_overhead_s(self, batch_seqs: int) -> float:
        return self._cpu0 + self._cpu1 * batch_seqs

    def __repr__(self) -> str:
        return f"PerfModel({self.gpu.name}, {self.model.name}, tp={self.tp}, pp={self.pp})"
