"""The fitted constants of the performance model, as one object (``Calibration``).

``default_calibration()`` builds it from ``perf/params.py`` (no data files needed at runtime);
``perf/calibrate.py`` produces a fresh one from the Vidur profiling data. A GPU measured with
``fleetwise perf profile`` gets a ``GpuCalibration`` (``perf/calfile.py`` reads and writes it as JSON; attached with
``Calibration.with_gpu``): its GEMM, small-op and per-backend attention constants replace the transferred ones for
that GPU only.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field, replace

# Ops whose time is bandwidth-bound on activations (per transformer layer, except emb which runs once).
SMALL_OPS: tuple[str, ...] = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add", "emb")
LINEAR_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


# GEMM tile (tokens x output features) whose waves over the streaming multiprocessors set a linear op's compute time.
TILE_M = 128
TILE_N = 128


@dataclass(frozen=True)
class GemmParams:
    """Linear operator y[M,N] = x[M,K] W[N,K]^T on a GPU with S streaming multiprocessors (SMs), 128x128 output tiles:

    compute = 2 (K + k_pad) * S * TILE_M * TILE_N * waves / (peak * eff_compute),
    waves = w + wave_quant * (ceil(w) - w),  w = ceil(M / TILE_M) * ceil(N / TILE_N) / S
    time = max(compute, bytes * (N K + M (N + K)) / (bw * eff_mem)) + t0_s
    """

    eff_compute: float
    eff_mem: float
    wave_quant: float  # 0: tiles spread evenly over SMs; 1: a partly filled last wave costs a full wave
    k_pad: float  # per-tile fixed cost (prologue / epilogue) as extra reduction length, elements
    t0_s: float


@dataclass(frozen=True)
class SmallOpParams:
    """Small op: t0_s + activation bytes / (bw * eff_mem)."""

    t0_s: float
    eff_mem: float


@dataclass(frozen=True)
class AttentionParams:
    """Per layer, per GPU. Prefill: t0 + 4*work*heads*head_dim / (peak*eff); decode: t0 + (B*seq_bytes + KV bytes)/(bw*eff)."""

    prefill_t0_s: float
    prefill_eff_compute: float
    decode_t0_s: float
    decode_seq_bytes: float  # per-sequence fixed cost expressed as bytes of memory traffic
    decode_eff_mem: float


@dataclass(frozen=True)
class CommParams:
    """all_reduce over n GPUs of S bytes = lat(n) + 2(n-1)/n * S / (link * eff(n)); send_recv(S) = lat + S / (link * eff).

    ``all_reduce`` holds (n, lat_s, eff_bw) per measured worker count (empty where the fabric has no all-reduce
    data); an unmeasured n uses the nearest measured n at or above it (else the largest)."""

    all_reduce: tuple[tuple[int, float, float], ...]
    send_recv_lat_s: float
    send_recv_eff_bw: float

    def all_reduce_for(self, n: int) -> tuple[float, float]:
        if not self.all_reduce:
            raise KeyError("no all-reduce measurements for this fabric")
        for m, lat, eff in sorted(self.all_reduce):
            if m >= n:
                return lat, eff
        _, lat, eff = max(self.all_reduce)
        return lat, eff


@dataclass(frozen=True)
class CpuParams:
    """Per-iteration CPU time = base + per_seq*B (+ multi_gpu_base + multi_gpu_per_seq*B when the replica has >1 GPU)."""

    base_s: float
    per_seq_s: float
    multi_gpu_base_s: float
    multi_gpu_per_seq_s: float


ATTN_KINDS: tuple[str, ...] = ("prefill", "chunked", "decode")  # whole prompt, chunk after a context, one-token decode


@dataclass(frozen=True)
class PrefillKernel:
    """Prefill attention of one backend, per layer, per GPU (``h`` query heads of ``hd`` dims on the GPU, one
    sequence of ``q`` new tokens attending to ``kv`` = context + q tokens, lower-right causal mask):

    time = t0 + (thr^p + crit^p)^(1/p),  thr = 4 hd h W / (peak eff),  crit = 4 hd block_q kv S / (peak eff),
    W = q kv - causal_skip q^2 / 2 (the work the causal mask leaves; 1: masked tiles skipped),
    ``crit``: the critical path of the longest query tile (block_q rows over all kv) on one of S SMs.
    """

    t0_s: float
    eff_compute: float
    block_q: float
    pnorm: float
    causal_skip: float = 1.0


@dataclass(frozen=True)
class DecodeKernel:
    """One-token decode attention of one backend, per layer, per GPU, B sequences with K cached tokens in total:

    time = t0 + B seq_bytes / (bw eff) + kv_bytes(K) / (bw eff) * (1 + (parallel / (B kv_heads))^p)^(1/p)

    (``parallel``: the independent (sequence, KV head) pairs the kernel needs to reach full bandwidth; fewer
    leave SMs idle). Affine in K for a fixed B, as ``PerfModel.decode_coeffs`` requires."""

    t0_s: float
    seq_bytes: float
    eff_mem: float
    parallel: float
    pnorm: float

    def kv_factor(self, decode_seqs: int, kv_heads: int) -> float:
        return (1.0 + (self.parallel / (decode_seqs * kv_heads)) ** self.pnorm) ** (1.0 / self.pnorm)


@dataclass(frozen=True)
class AttentionBackend:
    """One attention implementation on one GPU (an SDPA backend): its kernel family and fitted kernels (None
    where the profile had no time for that kind)."""

    family: str  # "flash-attention-2", "cudnn", "mem-efficient", "math", or "other"
    prefill: PrefillKernel | None = None
    chunked: PrefillKernel | None = None
    decode: DecodeKernel | None = None


@dataclass(frozen=True)
class GemmShape:
    """Measured / modelled time of one (N, K) linear op at the profiled token counts; between them the factor
    is interpolated linearly in log M (held at the ends)."""

    log_m: tuple[float, ...]
    log_factor: tuple[float, ...]

    def factor(self, M: float) -> float:
        x = math.log(M) if M >= 1 else 0.0
        xs, ys = self.log_m, self.log_factor
        i = bisect_right(xs, x)
        if i == 0:
            return math.exp(ys[0])
        if i == len(xs):
            return math.exp(ys[-1])
        x0, x1 = xs[i - 1], xs[i]
        return math.exp(ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class GpuCalibration:
    """Constants measured on one GPU (``fleetwise perf calibrate``); collectives and CPU overhead are not
    profiled and stay those of the base calibration."""

    gpu: str  # catalog name
    sms: int
    gemm: GemmParams
    gemm_shapes: dict[tuple[int, int], GemmShape]  # (N, K) -> correction of the profiled shapes
    small: dict[str, SmallOpParams] | None  # None: the transferred small-op constants of the base calibration
    backends: dict[str, AttentionBackend]
    default_backend: dict[str, str]  # kind (ATTN_KINDS) -> backend name: the fastest on the profile
    source: str = ""

    def kernel(self, kind: str, backend: str | None = None):
        """The fitted kernel of ``kind`` for ``backend`` (default: the calibration's default for that kind)."""
        b = self.backends[backend or self.default_backend[kind]]
        k = getattr(b, kind)
        if k is None:
            raise KeyError(f"backend {backend} has no {kind} kernel")
        return k


@dataclass(frozen=True)
class Calibration:
    gemm: dict[str, GemmParams]  # GPU profile ("a100", "a40", "h100") -> params
    small: dict[str, dict[str, SmallOpParams]]  # profile -> op -> params
    attention: AttentionParams  # measured on A100 only; transfers by peak / bandwidth scaling
    comm: dict[str, CommParams]  # fabric -> params (all_reduce fields may be NaN where unmeasured)
    cpu: CpuParams
    gpu_profile: dict[str, str] = field(default_factory=dict)  # catalog GPU name -> profile
    gpu_fabric: dict[str, tuple[str, str]] = field(default_factory=dict)  # GPU name -> (all_reduce fabric, send_recv fabric)
    gpu_sms: dict[str, int] = field(default_factory=dict)  # GPU name -> streaming multiprocessors (datasheet)
    gpus: dict[str, GpuCalibration] = field(default_factory=dict)  # GPU name -> its own measured constants

    def with_gpu(self, g: GpuCalibration) -> Calibration:
        """This calibration with ``g``'s measured constants used for GPU ``g.gpu``."""
        return replace(self, gpus={**self.gpus, g.gpu: g})

    def profile_of(self, gpu_name: str) -> str:
        return self.gpu_profile.get(gpu_name, "a100")

    def sms_of(self, gpu_name: str) -> int:
        return self.gpu_sms.get(gpu_name, 108)

    def fabric_of(self, gpu_name: str) -> tuple[str, str]:
        return self.gpu_fabric.get(gpu_name, ("a100_pairwise_nvlink", "a100_pairwise_nvlink"))


def default_calibration() -> Calibration:
    """The calibration shipped in perf/params.py."""
    from fleetwise.perf import params as p

    return Calibration(
        gemm={k: GemmParams(**v) for k, v in p.GEMM.items()},
        small={k: {op: SmallOpParams(*v) for op, v in ops.items()} for k, ops in p.SMALL.items()},
        attention=AttentionParams(**p.ATTENTION),
        comm={k: CommParams(tuple(tuple(x) for x in v["all_reduce"]), v["send_recv_lat_s"], v["send_recv_eff_bw"]) for k, v in p.COMM.items()},  # type: ignore[misc]
        cpu=CpuParams(**p.CPU),
        gpu_profile=dict(p.GPU_PROFILE),
        gpu_fabric={k: tuple(v) for k, v in p.GPU_FABRIC.items()},  # type: ignore[misc]
        gpu_sms=dict(p.GPU_SMS),
    )
