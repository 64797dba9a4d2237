"""Fit one GPU's calibration (``GpuCalibration``) from its profile (``fleetwise perf calibrate``).

Each part is a small scipy least-squares fit of log(predicted / measured) with a soft-L1 loss, as in
perf/calibrate.py (which fits the shipped constants to the Vidur profiling data):

- GEMM: the five constants of the tile/wave roofline (GemmParams) over all linear-op rows, then, per profiled
  (N, K) shape, the measured / modelled time at each profiled token count (``GemmShape``; interpolated in log M
  at run time): cuBLAS picks its kernel per shape, which no closed form follows to a few percent.
- attention: per SDPA backend (its kernel family) and kind -- whole prompts, chunks after a context, decode --
  the PrefillKernel / DecodeKernel forms; the default backend of each kind is the one fastest on most of the
  profile's rows, as a serving engine picks the fastest kernel it has.
- small ops (norms, RoPE, activation, residual add, embedding): t0 + bytes / (bw eff) per op, when the profile
  timed them; otherwise the transferred constants of the base calibration stay.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from fleetwise.catalog import get_gpu
from fleetwise.catalog.specs import GPUSpec
from fleetwise.errors import InputError
from fleetwise.perf.calibrate import gemm_pred
from fleetwise.perf.calibration import (
    ATTN_KINDS,
    AttentionBackend,
    Calibration,
    DecodeKernel,
    GemmParams,
    GemmShape,
    GpuCalibration,
    PrefillKernel,
    SmallOpParams,
    default_calibration,
)
from fleetwise.perf.model import op_geometry
from fleetwise.perf.profile_data import Profile, per_gpu_heads

FAMILIES = {"FLASH_ATTENTION": "flash-attention-2", "CUDNN_ATTENTION": "cudnn", "EFFICIENT_ATTENTION": "mem-efficient",
            "MATH": "math"}


# ------------------------------------------------------------------------------------------ rows as arrays
@dataclass
class GemmData:
    model: np.ndarray
    op: np.ndarray
    N: np.ndarray
    K: np.ndarray
    M: np.ndarray
    t: np.ndarray


@dataclass
class AttnData:
    """Attention rows of one kind; ``t`` maps backend -> seconds (NaN where refused)."""

    model: np.ndarray
    q: np.ndarray  # prefill: new tokens; decode: sequences B
    kv: np.ndarray  # prefill: tokens attended to (context + q); decode: cached tokens per sequence C
    heads: np.ndarray
    kv_heads: np.ndarray  # decode: KV heads read (query heads where K/V were expanded)
    head_dim: np.ndarray
    t: dict[str, np.ndarray]

    def fastest(self) -> np.ndarray:
        return np.nanmin(np.vstack(list(self.t.values())), axis=0)

    def __len__(self) -> int:
        return len(self.q)


def gemm_data(p: Profile) -> GemmData:
    rows = p.gemm
    a = np.asarray
    return GemmData(a([r.model for r in rows], dtype=object), a([r.op for r in rows], dtype=object),
                    a([r.N for r in rows], float), a([r.K for r in rows], float), a([r.M for r in rows], float),
                    a([r.s for r in rows], float))  # fmt: skip


def attn_data(p: Profile, kind: str) -> AttnData:
    """Rows of ``kind`` ("prefill": q == kv, "chunked": q < kv, "decode") that some backend timed: a row that every
    backend refused (all null, or ``{}``) measures nothing (it made ``perf validate`` print NaN errors, exit 0)."""
    if kind == "decode":
        rows = [r for r in p.attn_decode if any(v is not None for v in r.s.values())]
        qs = [r.B for r in rows]
        kvs = [r.C for r in rows]
    else:
        rows = [r for r in p.attn_prefill if (r.q_len < r.kv_len) == (kind == "chunked")
                and any(v is not None for v in r.s.values())]
        qs = [r.q_len for r in rows]
        kvs = [r.kv_len for r in rows]
    heads, kvh, hd = [], [], []
    for r in rows:
        h, k, d = per_gpu_heads(p.model_spec(r.model), r.tp)
        heads.append(h)
        kvh.append(h if r.kv_expanded else k)
        hd.append(d)
    backends = sorted({b for r in rows for b, v in r.s.items() if v is not None})
    t = {b: np.asarray([r.s.get(b) if r.s.get(b) is not None else np.nan for r in rows], float) for b in backends}
    a = np.asarray
    return AttnData(a([r.model for r in rows], dtype=object), a(qs, float), a(kvs, float), a(heads, float),
                    a(kvh, float), a(hd, float), t)  # fmt: skip


# ------------------------------------------------------------------------------------------ forms (vectorised)
def prefill_pred(x, q, kv, heads, hd, P, sms):
    """Vectorised twin of perf.model.prefill_attention_s. x = (t0, eff, block_q, pnorm, causal_skip)."""
    t0, eff, bq, p, skip = x
    e = P * eff
    thr = 4.0 * hd * heads * (q * kv - skip * q * q / 2.0) / e
    crit = 4.0 * hd * bq * sms * kv / e
    return t0 + (thr**p + crit**p) ** (1.0 / p)


def decode_pred(x, B, C, kvh, hd, BW, bpe=2.0):
    """Vectorised twin of perf.model.decode_attention_s. x = (t0, seq_bytes, eff, parallel, pnorm)."""
    t0, sb, eff, par, p = x
    e = BW * eff
    kvb = 2.0 * kvh * hd * bpe * B * C
    return t0 + B * sb / e + kvb / e * (1.0 + (par / (B * kvh)) ** p) ** (1.0 / p)


def _lsq(res, z0, lo, hi):
    r = least_squares(res, z0, loss="soft_l1", f_scale=0.05, bounds=(lo, hi))
    return r.x


# ------------------------------------------------------------------------------------------ fits
def fit_gemm(d: GemmData, gpu: GPUSpec, sms: int, sel: np.ndarray) -> GemmParams:
    P, BW = gpu.tflops_bf16 * 1e12, gpu.mem_bw_gbps * 1e9
    M, N, K, logt = d.M[sel], d.N[sel], d.K[sel], np.log(d.t[sel])

    def res(z):
        return np.log(gemm_pred(np.exp(z), M, N, K, P, BW, sms)) - logt

    lo, hi = np.log([1e-6, 1e-6, 1e-4, 1e-3, 1e-9]), np.log([2.0, 2.0, 1.0, 1e5, 1.0])
    z = _lsq(res, np.clip(np.log([0.8, 0.8, 0.5, 100.0, 5e-6]), lo + 1e-9, hi - 1e-9), lo, hi)
    ec, em, q, kp, t0 = np.exp(z)
    return GemmParams(eff_compute=float(ec), eff_mem=float(em), wave_quant=float(q), k_pad=float(kp), t0_s=float(t0))


def isotonic(y: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``y`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, n), (b, m) = blocks.pop(), blocks.pop()
            blocks.append([(a * n + b * m) / (n + m), n + m])
    return [v for v, n in blocks for _ in range(int(n))]


def gemm_shapes(d: GemmData, g: GemmParams, gpu: GPUSpec, sms: int, sel: np.ndarray) -> dict[tuple[int, int], GemmShape]:
    """Per (N, K): measured / modelled time at each profiled M. The measured times of a shape (median over
    repeated rows) are first made non-decreasing in M (isotonic fit of log time: more rows never run faster;
    what is left is timing noise)."""
    P, BW = gpu.tflops_bf16 * 1e12, gpu.mem_bw_gbps * 1e9
    x = (g.eff_compute, g.eff_mem, g.wave_quant, g.k_pad, g.t0_s)
    groups: dict[tuple[int, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i in np.nonzero(sel)[0]:
        groups[(int(d.N[i]), int(d.K[i]))][int(d.M[i])].append(float(d.t[i]))
    out = {}
    for (N, K), by_m in groups.items():
        ms = sorted(by_m)
        logt = isotonic([float(np.log(np.median(by_m[m]))) for m in ms])
        model = np.log(gemm_pred(x, np.asarray(ms, float), float(N), float(K), P, BW, sms))
        out[(N, K)] = GemmShape(tuple(float(np.log(m)) for m in ms), tuple(float(a - b) for a, b in zip(logt, model)))
    return out


def fit_prefill(d: AttnData, backend: str, sel: np.ndarray, P: float, sms: int, chunked: bool) -> PrefillKernel | None:
    t = d.t.get(backend)
    if t is None:
        return None
    s = sel & np.isfinite(t)
    n = int(s.sum())
    if n < 2:
        return None
    q, kv, h, hd, logt = d.q[s], d.kv[s], d.heads[s], d.head_dim[s], np.log(t[s])
    # (log t0, log eff, log block_q, log pnorm[, causal_skip]); few rows: t0 and eff only
    full = n >= 8
    fit_skip = chunked and full

    def unpack(z):
        t0, eff = np.exp(z[0]), np.exp(z[1])
        bq, p = (np.exp(z[2]), np.exp(z[3])) if full else (1.0, 1.0)
        skip = z[4] if fit_skip else 1.0
        return t0, eff, bq, p, skip

    def res(z):
        return np.log(prefill_pred(unpack(z), q, kv, h, hd, P, sms)) - logt

    z0 = [np.log(max(np.min(t[s]) * 0.5, 1e-8)), np.log(0.3)]
    lo, hi = [np.log(1e-9), np.log(1e-7)], [np.log(1.0), np.log(2.0)]
    if full:
        z0 += [np.log(64.0), np.log(1.0)]
        lo += [np.log(1.0), np.log(0.3)]
        hi += [np.log(1e5), np.log(10.0)]
    if fit_skip:
        z0 += [0.8]
        lo += [0.0]
        hi += [1.0]
    z = _lsq(res, np.clip(z0, np.add(lo, 1e-9), np.subtract(hi, 1e-9)), lo, hi)
    t0, eff, bq, p, skip = unpack(z)
    return PrefillKernel(t0_s=float(t0), eff_compute=float(eff), block_q=float(bq), pnorm=float(p), causal_skip=float(skip))


def fit_decode(d: AttnData, backend: str, sel: np.ndarray, BW: float) -> DecodeKernel | None:
    t = d.t.get(backend)
    if t is None:
        return None
    s = sel & np.isfinite(t)
    n = int(s.sum())
    if n < 2:
        return None
    B, C, kvh, hd, logt = d.q[s], d.kv[s], d.kv_heads[s], d.head_dim[s], np.log(t[s])
    full = n >= 8

    def unpack(z):
        t0, eff = np.exp(z[0]), np.exp(z[1])
        sb, par, p = (np.exp(z[2]), np.exp(z[3]), np.exp(z[4])) if full else (0.0, 1e-9, 1.0)
        return t0, sb, eff, par, p

    def res(z):
        return np.log(decode_pred(unpack(z), B, C, kvh, hd, BW)) - logt

    z0 = [np.log(max(np.min(t[s]) * 0.5, 1e-8)), np.log(0.5)]
    lo, hi = [np.log(1e-9), np.log(1e-7)], [np.log(1.0), np.log(10.0)]
    if full:
        z0 += [np.log(1e4), np.log(32.0), np.log(1.0)]
        lo += [np.log(1e-3), np.log(1e-3), np.log(0.3)]
        hi += [np.log(1e9), np.log(1e6), np.log(10.0)]
    z = _lsq(res, np.clip(z0, np.add(lo, 1e-9), np.subtract(hi, 1e-9)), lo, hi)
    t0, sb, eff, par, p = unpack(z)
    return DecodeKernel(t0_s=float(t0), seq_bytes=float(sb), eff_mem=float(eff), parallel=float(par), pnorm=float(p))


def fit_small_ops(p: Profile, gpu: GPUSpec, sel: np.ndarray | None, base: dict[str, SmallOpParams]) -> dict[str, SmallOpParams] | None:
    """t0 + M bytes_per_token / (bw eff) per small op from the profile's elementwise rows; ops it did not time
    keep the base constants (post_attention_layernorm takes input_layernorm's: the same kernel)."""
    rows = [r for i, r in enumerate(p.elementwise) if sel is None or sel[i]]
    if not rows:
        return None
    BW = gpu.mem_bw_gbps * 1e9
    by_op: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in rows:
        m = p.model_spec(r.model)
        _, nb = op_geometry(m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_size, m.gated_mlp, r.tp)
        by_op[r.op].append((float(r.M), nb[r.op], r.s))
    out = dict(base)
    for op, vals in by_op.items():
        M, b, t = (np.asarray(v, float) for v in zip(*vals))
        logt = np.log(t)

        def res(z, M=M, b=b, logt=logt):
            t0, e = np.exp(z)
            return np.log(t0 + M * b / (BW * e)) - logt

        lo, hi = np.log([1e-9, 1e-6]), np.log([1.0, 10.0])
        z = _lsq(res, np.clip(np.log([max(t.min() * 0.5, 1e-8), 0.5]), lo + 1e-9, hi - 1e-9), lo, hi)
        t0, e = np.exp(z)
        out[op] = SmallOpParams(t0_s=float(t0), eff_mem=float(e))
    if "post_attention_layernorm" not in by_op and "input_layernorm" in by_op:
        out["post_attention_layernorm"] = out["input_layernorm"]
    return out


def default_backends(data: dict[str, AttnData], backends: dict[str, AttentionBackend]) -> dict[str, str]:
    """Per kind, the backend measured fastest on most rows (among those with a fitted kernel of that kind)."""
    out = {}
    for kind in ATTN_KINDS:
        d = data[kind]
        cands = [b for b in sorted(backends) if getattr(backends[b], kind) is not None]
        if not cands:
            raise InputError(f"the profile has no {kind} attention rows with a time (needs at least 2)")
        wins: Counter = Counter()
        for i in range(len(d)):
            times = {b: d.t[b][i] for b in cands if b in d.t and np.isfinite(d.t[b][i])}
            if times:
                wins[min(times, key=times.__getitem__)] += 1
        out[kind] = max(cands, key=lambda b: (wins[b], -cands.index(b)))
    return out


@dataclass
class Masks:
    """Training rows (True = fit on it) per section of a profile; None = all rows."""

    gemm: np.ndarray | None = None
    attn: dict[str, np.ndarray] | None = None  # kind -> mask over attn_data(profile, kind)
    elementwise: np.ndarray | None = None


def resolve_gpu(p: Profile, gpu: str | None) -> GPUSpec:
    if gpu is not None:
        return get_gpu(gpu)
    name = p.gpu_name()
    if name is None:
        raise InputError(f"the profile was measured on {p.env.get('name', 'an unnamed device')!r}, which is not a catalog "
                         f"GPU; pass --gpu NAME to fit it as one")
    return get_gpu(name)


def fit_gpu_calibration(p: Profile, gpu: str | None = None, masks: Masks | None = None,
                        base: Calibration | None = None, source: str = "") -> GpuCalibration:
    """The calibration of the profile's GPU (or ``gpu``), fitted on the rows ``masks`` selects."""
    g = resolve_gpu(p, gpu)
    base = base or default_calibration()
    mk = masks or Masks()
    sms = p.env.get("sms") if p.gpu_name() == g.name and isinstance(p.env.get("sms"), int) else base.sms_of(g.name)
    P, BW = g.tflops_bf16 * 1e12, g.mem_bw_gbps * 1e9
    gd = gemm_data(p)
    if len(gd.t) < 5:
        raise InputError("the profile needs at least 5 gemm rows")
    gsel = np.ones(len(gd.t), bool) if mk.gemm is None else mk.gemm
    gp = fit_gemm(gd, g, sms, gsel)
    shapes = gemm_shapes(gd, gp, g, sms, gsel)
    data = {k: attn_data(p, k) for k in ATTN_KINDS}
    sel = {k: (np.ones(len(data[k]), bool) if mk.attn is None else mk.attn[k]) for k in ATTN_KINDS}
    names = sorted({b for d in data.values() for b in d.t})
    backends = {}
    for b in names:
        ab = AttentionBackend(family=FAMILIES.get(b, "other"),
                              prefill=fit_prefill(data["prefill"], b, sel["prefill"], P, sms, chunked=False),
                              chunked=fit_prefill(data["chunked"], b, sel["chunked"], P, sms, chunked=True),
                              decode=fit_decode(data["decode"], b, sel["decode"], BW))  # fmt: skip
        if ab.prefill or ab.chunked or ab.decode:
            backends[b] = ab
    small = fit_small_ops(p, g, mk.elementwise, base.small[base.profile_of(g.name)])
    return GpuCalibration(gpu=g.name, sms=int(sms), gemm=gp, gemm_shapes=shapes, small=small, backends=backends,
                          default_backend=default_backends(data, backends), source=source)
