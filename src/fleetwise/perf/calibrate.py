"""Fit the performance model's constants to the Vidur profiling data (real measured operator timings).

    python -m fleetwise.perf.calibrate            # fit on all rows, print a new perf/params.py to stdout
    python -m fleetwise.perf.calibrate --write    # ... and overwrite src/fleetwise/perf/params.py

Data: ``<data>/vidur-profiling`` (see its PROVENANCE.md). Each part is a small scipy least-squares fit of
log(predicted / measured) (relative error) with a soft-L1 loss; all parts together take a few seconds.
"""

from __future__ import annotations

import csv
import gzip
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from fleetwise.catalog import get_gpu
from fleetwise.perf.calibration import (
    LINEAR_OPS,
    SMALL_OPS,
    TILE_M,
    TILE_N,
    AttentionParams,
    Calibration,
    CommParams,
    CpuParams,
    GemmParams,
    SmallOpParams,
)
from fleetwise.perf.model import op_geometry

PROFILES = {"a100": "A100-80GB", "a40": "A40", "h100": "H100-80GB"}  # data folder -> catalog GPU measured
# GPUs without measurements take the closest measured GPU's efficiencies (same generation / memory type):
GPU_PROFILE = {
    "A100-80GB": "a100",
    "A40": "a40",
    "H100-80GB": "h100",
    "H200": "h100",  # same Hopper SXM silicon as H100, HBM3e
    "L4": "a40",  # Ada/Ampere PCIe cards with GDDR6: closest is the A40
    "L40S": "a40",
    "T4": "a40",
    "Jetson-AGX-Orin-64GB": "a40",  # Ampere GPU; no closer measured part
}
# Streaming multiprocessors per catalog GPU (NVIDIA datasheets / whitepapers): sets the GEMM wave quantisation.
GPU_SMS = {
    "A100-80GB": 108,  # A100 SXM4
    "A40": 84,
    "H100-80GB": 132,  # H100 SXM5
    "H200": 132,  # same GH100 configuration as H100 SXM5
    "L4": 58,
    "L40S": 142,
    "T4": 40,
    "Jetson-AGX-Orin-64GB": 16,  # 2048 CUDA cores / 128 per Ampere SM
}
FABRIC_GPU = {  # fabric -> catalog GPU whose interconnect_gbps is the link bandwidth the efficiency refers to
    "a100_dgx": "A100-80GB",
    "a100_pairwise_nvlink": "A100-80GB",
    "h100_dgx": "H100-80GB",
    "h100_pairwise_nvlink": "H100-80GB",
    "a40_pairwise_nvlink": "A40",
}
# (all_reduce fabric, send_recv fabric) used for each GPU. The A40 (pairwise NVLink bridges) takes the A100 pairwise
# fabric's all-reduce; PCIe cards take the A100 DGX fabric's latency and bandwidth efficiency applied to their own
# (PCIe) interconnect bandwidth (an assumption: no PCIe-only collective data).
GPU_FABRIC = {
    "A100-80GB": ("a100_dgx", "a100_dgx"),
    "A40": ("a100_pairwise_nvlink", "a40_pairwise_nvlink"),
    "H100-80GB": ("h100_dgx", "h100_dgx"),
    "H200": ("h100_dgx", "h100_dgx"),
    "L4": ("a100_dgx", "a100_dgx"),
    "L40S": ("a100_dgx", "a100_dgx"),
    "T4": ("a100_dgx", "a100_dgx"),
    "Jetson-AGX-Orin-64GB": ("a100_dgx", "a100_dgx"),
}
ATTN_FILE = "legacy-a100-llama-2-70b-tp2-attention.csv.gz"
CPU_FILE = "legacy-a100-llama-2-70b-tp2-cpu_overheads.csv.gz"
CPU_BASE_COLS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median", "process_model_outputs_median")


def profiling_dir(data_dir: str | Path | None = None) -> Path:
    if data_dir is not None:
        p = Path(data_dir)
        return p / "vidur-profiling" if (p / "vidur-profiling").is_dir() else p
    from fleetwise.data import data_path

    return data_path("vidur-profiling")


def _read(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------ compute (mlp.csv)
@dataclass
class ComputeRows:
    """All mlp.csv rows of one GPU, one entry per (row, op), as numpy arrays."""

    model: np.ndarray  # model folder name, e.g. "Llama-2-70b-hf"
    op: np.ndarray  # op name
    tokens: np.ndarray
    tp: np.ndarray
    work: np.ndarray  # linear ops: 2*N*K (FLOPs per token); small ops: bytes per token
    wbytes: np.ndarray  # linear ops: N*K (weight elements); small ops: 0
    actb: np.ndarray  # linear ops: N+K (activation elements per token); small ops: 0
    n: np.ndarray  # linear ops: output features N per GPU; small ops: 0
    k: np.ndarray  # linear ops: reduction dimension K per GPU; small ops: 0
    t: np.ndarray  # measured median, seconds


def load_compute(data_dir: str | Path | None = None) -> dict[str, ComputeRows]:
    root = profiling_dir(data_dir) / "compute"
    out: dict[str, ComputeRows] = {}
    for gdir in sorted(root.iterdir()):
        cols: dict[str, list] = {k: [] for k in ("model", "op", "tokens", "tp", "work", "wbytes", "actb", "n", "k", "t")}
        for f in sorted(gdir.glob("*/*/mlp.csv.gz")):
            mname = f.parent.name
            geo_cache: dict[tuple, tuple] = {}
            for r in _read(f):
                key = (r["n_head"], r["n_kv_head"], r["n_embd"], r["n_expanded_embd"], r["use_gated_mlp"], r["num_tensor_parallel_workers"])
                if key not in geo_cache:
                    nh, nkv, h, ffn, gated, tp = int(key[0]), int(key[1]), int(key[2]), int(key[3]), key[4] == "True", int(key[5])
                    geo_cache[key] = op_geometry(h, nh, nkv, ffn, gated, tp)
                lin, small = geo_cache[key]
                M, tp = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
                for op, (N, K) in zip(LINEAR_OPS, lin):
                    v = r.get(f"time_stats.{op}.median")
                    if v:
                        cols["model"].append(mname); cols["op"].append(op); cols["tokens"].append(M); cols["tp"].append(tp)  # noqa: E702
                        cols["work"].append(2.0 * N * K); cols["wbytes"].append(N * K); cols["actb"].append(N + K)  # noqa: E702
                        cols["n"].append(N); cols["k"].append(K)  # noqa: E702
                        cols["t"].append(float(v) * 1e-3)
                for op in SMALL_OPS:
                    v = r.get(f"time_stats.{op}.median")
                    if v:
                        cols["model"].append(mname); cols["op"].append(op); cols["tokens"].append(M); cols["tp"].append(tp)  # noqa: E702
                        cols["work"].append(small[op]); cols["wbytes"].append(0.0); cols["actb"].append(0.0)  # noqa: E702
                        cols["n"].append(0.0); cols["k"].append(0.0)  # noqa: E702
                        cols["t"].append(float(v) * 1e-3)
        out[gdir.name] = ComputeRows(**{k: np.asarray(v, dtype=object if k in ("model", "op") else float) for k, v in cols.items()})
    return out


def gemm_pred(x: np.ndarray, M, N, K, P: float, BW: float, sms: int, bpp: float = 2.0):
    """Vectorised twin of perf.model.gemm_time_s (see GemmParams for the form). x = (eff_c, eff_m, wave_quant, k_pad, t0)."""
    ec, em, q, kp, t0 = x
    w = np.ceil(M / TILE_M) * np.ceil(N / TILE_N) / sms
    tc = 2.0 * (K + kp) * sms * TILE_M * TILE_N * (w + q * (np.ceil(w) - w)) / (P * ec)
    tm = bpp * (N * K + (N + K) * M) / (BW * em)
    return np.maximum(tc, tm) + t0


def fit_gemm(rows: ComputeRows, gpu_name: str, mask: np.ndarray | None = None) -> GemmParams:
    g = get_gpu(gpu_name)
    P, BW, sms = g.tflops_bf16 * 1e12, g.mem_bw_gbps * 1e9, GPU_SMS[gpu_name]
    sel = np.isin(rows.op, LINEAR_OPS)
    if mask is not None:
        sel &= mask
    M, N, K, t = rows.tokens[sel], rows.n[sel], rows.k[sel], rows.t[sel]
    logt = np.log(t)

    def res(z):
        return np.log(gemm_pred(np.exp(z), M, N, K, P, BW, sms)) - logt

    z0 = np.log([0.8, 0.8, 0.5, 100.0, 3e-6])
    lo, hi = [0.05, 0.05, 1e-4, 1e-3, 1e-8], [1.0, 1.0, 1.0, 5000.0, 1e-3]
    r = least_squares(res, z0, loss="soft_l1", f_scale=0.05, bounds=(np.log(lo), np.log(hi)))
    ec, em, q, kp, t0 = np.exp(r.x)
    return GemmParams(eff_compute=float(ec), eff_mem=float(em), wave_quant=float(q), k_pad=float(kp), t0_s=float(t0))


def fit_small(rows: ComputeRows, gpu_name: str, mask: np.ndarray | None = None) -> dict[str, SmallOpParams]:
    BW = get_gpu(gpu_name).mem_bw_gbps * 1e9
    out = {}
    for op in SMALL_OPS:
        sel = rows.op == op
        if mask is not None:
            sel &= mask
        M, b, t = rows.tokens[sel], rows.work[sel], rows.t[sel]
        logt = np.log(t)

        def res(z, M=M, b=b, logt=logt):
            t0, e = np.exp(z)
            return np.log(t0 + M * b / (BW * e)) - logt

        r = least_squares(res, np.log([5e-6, 0.5]), loss="soft_l1", f_scale=0.05, bounds=(np.log([1e-8, 1e-3]), np.log([1e-3, 1.5])))
        t0, e = np.exp(r.x)
        out[op] = SmallOpParams(t0_s=float(t0), eff_mem=float(e))
    return out


# ------------------------------------------------------------------------------------------ attention
@dataclass
class AttnRows:
    prefill_chunk: np.ndarray
    prefill_kv: np.ndarray
    prefill_t: np.ndarray
    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_t: np.ndarray
    n_q_head: int
    n_kv_head: int
    head_dim: int


def load_attention(data_dir: str | Path | None = None) -> AttnRows:
    rows = _read(profiling_dir(data_dir) / ATTN_FILE)
    pc, pk, pt, db, dk, dt = [], [], [], [], [], []
    r0 = rows[0]
    tp = int(r0["num_tensor_parallel_workers"])
    nq, nkv, h = int(r0["n_q_head"]), int(r0["n_kv_head"]), int(r0["n_embd"])
    for r in rows:
        if r["is_prefill"] == "True":
            v = r["time_stats.attn_prefill.median"]
            if v:
                pc.append(int(r["prefill_chunk_size"])); pk.append(int(r["kv_cache_size"])); pt.append(float(v) * 1e-3)  # noqa: E702
        else:
            v = r["time_stats.attn_decode.median"]
            if v:
                db.append(int(r["batch_size"])); dk.append(int(r["kv_cache_size"])); dt.append(float(v) * 1e-3)  # noqa: E702
    a = np.asarray
    return AttnRows(a(pc, float), a(pk, float), a(pt), a(db, float), a(dk, float), a(dt),
                    nq // tp, max(1, nkv // tp), h // nq)  # fmt: skip


def attn_prefill_pred(x, work, n_q_head, head_dim, P):
    t0, e = x
    return t0 + 4.0 * work * n_q_head * head_dim / (P * e)


def attn_decode_pred(x, batch, kv_total, n_kv_head, head_dim, BW, bpp=2.0):
    t0, seqb, e = x
    return t0 + (batch * seqb + kv_total * 2.0 * n_kv_head * head_dim * bpp) / (BW * e)


def fit_attention(a: AttnRows, pmask=None, dmask=None) -> AttentionParams:
    g = get_gpu("A100-80GB")
    P, BW = g.tflops_bf16 * 1e12, g.mem_bw_gbps * 1e9
    pm = np.ones_like(a.prefill_t, bool) if pmask is None else pmask
    dm = np.ones_like(a.decode_t, bool) if dmask is None else dmask
    work = (a.prefill_chunk * (a.prefill_kv + a.prefill_chunk))[pm]
    lp = np.log(a.prefill_t[pm])
    rp = least_squares(lambda z: np.log(attn_prefill_pred(np.exp(z), work, a.n_q_head, a.head_dim, P)) - lp,
                       np.log([1e-5, 0.4]), loss="soft_l1", f_scale=0.05)  # fmt: skip
    B, K = a.decode_batch[dm], (a.decode_batch * a.decode_kv)[dm]
    ld = np.log(a.decode_t[dm])
    rd = least_squares(lambda z: np.log(attn_decode_pred(np.exp(z), B, K, a.n_kv_head, a.head_dim, BW)) - ld,
                       np.log([1e-5, 1e4, 0.5]), loss="soft_l1", f_scale=0.05)  # fmt: skip
    pt0, pe = np.exp(rp.x)
    dt0, dsb, de = np.exp(rd.x)
    return AttentionParams(prefill_t0_s=float(pt0), prefill_eff_compute=float(pe), decode_t0_s=float(dt0),
                           decode_seq_bytes=float(dsb), decode_eff_mem=float(de))  # fmt: skip


# ------------------------------------------------------------------------------------------ collectives
@dataclass
class CommRows:
    kind: np.ndarray  # "all_reduce" / "send_recv"
    n: np.ndarray
    size: np.ndarray
    t: np.ndarray


def load_comm(data_dir: str | Path | None = None) -> dict[str, CommRows]:
    root = profiling_dir(data_dir) / "network"
    out = {}
    for fdir in sorted(root.iterdir()):
        kind, n, size, t = [], [], [], []
        for coll in ("all_reduce", "send_recv"):
            f = fdir / f"{coll}.csv.gz"
            if not f.exists():
                continue
            for r in _read(f):
                # intra-node only: all workers on one node (send_recv: both peers on one node)
                if int(r["devices_per_node"]) != int(r["num_workers"]):
                    continue
                v = r[f"time_stats.{coll}.median"]
                if v:
                    kind.append(coll); n.append(int(r["num_workers"])); size.append(float(r["size"])); t.append(float(v) * 1e-3)  # noqa: E702
        out[fdir.name] = CommRows(np.asarray(kind, dtype=object), np.asarray(n, float), np.asarray(size), np.asarray(t))
    return out


def ar_pred(x, n, size, link):
    lat, e = x
    return lat + 2.0 * (n - 1) / n * size / (link * 1e9 * e)


def sr_pred(x, size, link):
    lat, e = x
    return lat + size / (link * 1e9 * e)


def _fit_lat_bw(pred, size, t, *args) -> tuple[float, float]:
    lt = np.log(t)
    r = least_squares(lambda z: np.log(pred(np.exp(z), *args)) - lt, np.log([2e-5, 0.5]), loss="linear",
                      bounds=(np.log([1e-7, 1e-3]), np.log([1e-2, 5.0])))  # fmt: skip
    lat, e = np.exp(r.x)
    return float(lat), float(e)


def fit_comm(rows: CommRows, fabric: str, mask=None) -> CommParams:
    link = get_gpu(FABRIC_GPU[fabric]).interconnect_gbps
    m = np.ones_like(rows.t, bool) if mask is None else mask
    ar = []
    for n in sorted(set(rows.n[(rows.kind == "all_reduce") & m].tolist())):
        s = (rows.kind == "all_reduce") & (rows.n == n) & m
        lat, e = _fit_lat_bw(ar_pred, rows.size[s], rows.t[s], n, rows.size[s], link)
        ar.append((int(n), lat, e))
    s = (rows.kind == "send_recv") & m
    lat, e = _fit_lat_bw(sr_pred, rows.size[s], rows.t[s], rows.size[s], link)
    return CommParams(all_reduce=tuple(ar), send_recv_lat_s=lat, send_recv_eff_bw=e)


# ------------------------------------------------------------------------------------------ CPU overhead
@dataclass
class CpuRows:
    batch: np.ndarray
    base_t: np.ndarray  # schedule + sampler + prepare inputs + process outputs, seconds
    multi_t: np.ndarray  # ray_comm_time (driver <-> workers; only when a replica has more than one GPU)


def load_cpu(data_dir: str | Path | None = None) -> CpuRows:
    rows = _read(profiling_dir(data_dir) / CPU_FILE)
    b = np.asarray([float(r["batch_size"]) for r in rows])
    base = np.asarray([sum(float(r[c]) for c in CPU_BASE_COLS) * 1e-3 for r in rows])
    multi = np.asarray([float(r["ray_comm_time_mean"]) * 1e-3 for r in rows])
    return CpuRows(b, base, multi)


def _affine_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    def res(z):
        return np.log(z[0] + z[1] * x) - np.log(y)

    r = least_squares(res, [y.min(), (y.max() - y.min()) / max(1.0, x.max() - x.min())], bounds=([0, 0], [np.inf, np.inf]))
    return float(r.x[0]), float(r.x[1])


def fit_cpu(c: CpuRows, mask=None) -> CpuParams:
    m = np.ones_like(c.batch, bool) if mask is None else mask
    b0, b1 = _affine_fit(c.batch[m], c.base_t[m])
    r0, r1 = _affine_fit(c.batch[m], c.multi_t[m])
    return CpuParams(base_s=b0, per_seq_s=b1, multi_gpu_base_s=r0, multi_gpu_per_seq_s=r1)


# ------------------------------------------------------------------------------------------ everything
@dataclass
class Masks:
    """Training-row selectors (True = use for fitting); None = all rows."""

    compute: Callable[[ComputeRows], np.ndarray] | None = None
    attn_prefill: Callable[[AttnRows], np.ndarray] | None = None
    attn_decode: Callable[[AttnRows], np.ndarray] | None = None
    comm: Callable[[CommRows], np.ndarray] | None = None
    cpu: Callable[[CpuRows], np.ndarray] | None = None


@dataclass
class ProfilingData:
    compute: dict[str, ComputeRows]
    attention: AttnRows
    comm: dict[str, CommRows]
    cpu: CpuRows


def load_all(data_dir: str | Path | None = None) -> ProfilingData:
    return ProfilingData(load_compute(data_dir), load_attention(data_dir), load_comm(data_dir), load_cpu(data_dir))


def fit_all(data: ProfilingData, masks: Masks | None = None) -> Calibration:
    mk = masks or Masks()
    gemm, small = {}, {}
    for prof, rows in data.compute.items():
        cm = mk.compute(rows) if mk.compute else None
        gemm[prof] = fit_gemm(rows, PROFILES[prof], cm)
        small[prof] = fit_small(rows, PROFILES[prof], cm)
    a = data.attention
    attn = fit_attention(a, mk.attn_prefill(a) if mk.attn_prefill else None, mk.attn_decode(a) if mk.attn_decode else None)
    comm = {fab: fit_comm(rows, fab, mk.comm(rows) if mk.comm else None) for fab, rows in data.comm.items()}
    cpu = fit_cpu(data.cpu, mk.cpu(data.cpu) if mk.cpu else None)
    return Calibration(gemm=gemm, small=small, attention=attn, comm=comm, cpu=cpu, gpu_profile=dict(GPU_PROFILE), gpu_fabric=dict(GPU_FABRIC),
                       gpu_sms=dict(GPU_SMS))  # fmt: skip


def fit_default(data_dir: str | Path | None = None) -> Calibration:
    """Fit on all rows of the profiling data (what perf/params.py holds)."""
    return fit_all(load_all(data_dir))


def _f(v: float) -> str:
    return "float('nan')" if math.isnan(v) else f"{v:.6g}"


def render_params(cal: Calibration) -> str:
    L = [
        '"""Fitted constants of the performance model (generated; do not edit by hand).',
        "",
        "Source: Vidur profiling data (microsoft/vidur @ 7d47513, see <data>/vidur-profiling/PROVENANCE.md):",
        "compute/{a100,a40,h100}/*/*/mlp.csv.gz, network/*/{all_reduce,send_recv}.csv.gz,",
        f"{ATTN_FILE}, {CPU_FILE}.",
        "Regenerate: python -m fleetwise.perf.calibrate --write",
        "Units: seconds, bytes, dimensionless efficiencies relative to the catalog's peak FLOP/s, memory and link bandwidth.",
        '"""',
        "",
        f"# profile -> linear-op constants; {TILE_M}x{TILE_N} output tiles, waves over the GPU's SMs (GPU_SMS below)",
        "GEMM = {",
    ]
    for k, g in cal.gemm.items():
        L.append(
            f'    "{k}": {{"eff_compute": {_f(g.eff_compute)}, "eff_mem": {_f(g.eff_mem)}, "wave_quant": {_f(g.wave_quant)}, '
            f'"k_pad": {_f(g.k_pad)}, "t0_s": {_f(g.t0_s)}}},'
        )
    L += ["}", "", "# op -> (t0_s, eff_mem)", "SMALL = {"]
    for k, ops in cal.small.items():
        L.append(f'    "{k}": {{')
        for op, s in ops.items():
            L.append(f'        "{op}": ({_f(s.t0_s)}, {_f(s.eff_mem)}),')
        L.append("    },")
    a = cal.attention
    L += ["}", "", "# measured on A100 with the Llama-2-70B TP2 shape; transfers to other GPUs via peak / bandwidth", "ATTENTION = {"]
    for fld in ("prefill_t0_s", "prefill_eff_compute", "decode_t0_s", "decode_seq_bytes", "decode_eff_mem"):
        L.append(f'    "{fld}": {_f(getattr(a, fld))},')
    L += ["}", "", "# fabric -> all_reduce: ((workers, latency_s, bandwidth efficiency), ...), intra-node rows only", "COMM = {"]
    for k, c in cal.comm.items():
        L.append(f'    "{k}": {{')
        L.append('        "all_reduce": (' + "".join(f"({n}, {_f(lat)}, {_f(e)}), " for n, lat, e in c.all_reduce) + "),")
        L.append(f'        "send_recv_lat_s": {_f(c.send_recv_lat_s)},')
        L.append(f'        "send_recv_eff_bw": {_f(c.send_recv_eff_bw)},')
        L.append("    },")
    c = cal.cpu
    L += ["}", "", "# measured with CodeLlama-34B TP2 on A100 (the only rows in the data)", "CPU = {"]
    for fld in ("base_s", "per_seq_s", "multi_gpu_base_s", "multi_gpu_per_seq_s"):
        L.append(f'    "{fld}": {_f(getattr(c, fld))},')
    L += ["}", "", "# catalog GPU -> measured GPU whose efficiencies it takes (see perf/calibrate.py)", "GPU_PROFILE = {"]
    L += [f'    "{k}": "{v}",' for k, v in cal.gpu_profile.items()]
    L += ["}", "", "# catalog GPU -> (all_reduce fabric, send_recv fabric)", "GPU_FABRIC = {"]
    L += [f'    "{k}": ("{v[0]}", "{v[1]}"),' for k, v in cal.gpu_fabric.items()]
    L += ["}", "", "# catalog GPU -> streaming multiprocessors (datasheets; GEMM wave quantisation)", "GPU_SMS = {"]
    L += [f'    "{k}": {v},' for k, v in cal.gpu_sms.items()]
    L += ["}", ""]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render_params(fit_default())
    if "--write" in argv:
        (Path(__file__).parent / "params.py").write_text(text)
        print(f"wrote {Path(__file__).parent / 'params.py'}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
