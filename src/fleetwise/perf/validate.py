"""Held-out validation of the performance model against the Vidur profiling data.

``run_validation()`` fits a fresh calibration on the *training* rows only and reports the MAPE (percent) of the
runtime ``PerfModel`` on the held-out rows:

- compute (mlp.csv): one whole model (CodeLlama-34B, all its rows on every GPU) and, for all other models, the
  token-count ranges in ``HOLDOUT_TOKENS``. Keys "<gpu>/<model>"; operators "<op>@64+" (held-out rows with
  >= 64 tokens, the target range: MAPE <= 10% for linear ops), "linear@64+" (the 4 linear ops pooled), "linear@<64" (the 4 linear ops below 64 tokens),
  small ops over all held-out rows, "layer@64+" (sum of all per-layer ops, >= 64 tokens).
- attention ("a100/attention"): prefill chunk sizes and decode batch sizes in the held-out ranges below.
- collectives ("<fabric>/collective"): message sizes in ``HOLDOUT_SIZES`` (intra-node rows).
- CPU overhead ("a100/cpu_overhead"): batch sizes in ``HOLDOUT_CPU_BATCH``.

    fleetwise perf validate [--json]      (or: python -m fleetwise.perf.validate [--json])
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from fleetwise.catalog import get_gpu, get_model
from fleetwise.catalog.specs import ModelSpec
from fleetwise.perf.calibrate import (
    FABRIC_GPU,
    PROFILES,
    AttnRows,
    ComputeRows,
    CommRows,
    CpuRows,
    Masks,
    fit_all,
    load_all,
)
from fleetwise.perf.calibration import LINEAR_OPS, SMALL_OPS
from fleetwise.perf.model import PerfModel, all_reduce_time_s, send_recv_time_s

HOLDOUT_MODEL = "CodeLlama-34b-Instruct-hf"
HOLDOUT_TOKENS = ((24, 40), (320, 512), (2048, 2560), (16384, 10**9))  # inclusive ranges of num_tokens
HOLDOUT_PREFILL_CHUNK = ((1024, 1536), (3584, 4096))
HOLDOUT_DECODE_BATCH = ((41, 56), (113, 128))
HOLDOUT_SIZES = ((2**18, 2**21), (2**25 + 1, 2**40))
HOLDOUT_CPU_BATCH = ((48, 80),)
TARGET_LINEAR_MAPE = 10.0
TARGET_ATTN_COMM_MAPE = 20.0

# data folder name -> catalog model (shapes are taken from the CSV itself; the name is only the report key)
DATA_MODEL_NAMES = {
    "Llama-2-7b-hf": "Llama-2-7B",
    "Llama-2-70b-hf": "Llama-2-70B",
    "Meta-Llama-3-8B": "Llama-3-8B",
    "Meta-Llama-3-70B": "Llama-3-70B",
    "CodeLlama-34b-Instruct-hf": "CodeLlama-34B",
    "Qwen-72B": "Qwen-72B",
    "phi-2": "phi-2",
    "internlm-20b": "internlm-20b",
}


def _in(x: np.ndarray, ranges) -> np.ndarray:
    m = np.zeros(x.shape, bool)
    for lo, hi in ranges:
        m |= (x >= lo) & (x <= hi)
    return m


def compute_test_mask(r: ComputeRows) -> np.ndarray:
    return (r.model == HOLDOUT_MODEL) | _in(r.tokens, HOLDOUT_TOKENS)


MASKS = Masks(
    compute=lambda r: ~compute_test_mask(r),
    attn_prefill=lambda a: ~_in(a.prefill_chunk, HOLDOUT_PREFILL_CHUNK),
    attn_decode=lambda a: ~_in(a.decode_batch, HOLDOUT_DECODE_BATCH),
    comm=lambda c: ~_in(c.size, HOLDOUT_SIZES),
    cpu=lambda c: ~_in(c.batch, HOLDOUT_CPU_BATCH),
)


def _mape(pred, meas) -> float:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(pred - meas) / meas) * 100.0) if len(meas) else float("nan")


def _shape_model(prof_rows_model: str) -> ModelSpec:
    return get_model(DATA_MODEL_NAMES.get(prof_rows_model, prof_rows_model))


def run_validation(data_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    data = load_all(data_dir)
    cal = fit_all(data, MASKS)
    out: dict[str, dict[str, float]] = {}
    # ---- compute
    for prof, rows in data.compute.items():
        gpu = get_gpu(PROFILES[prof])
        test = compute_test_mask(rows)
        for mname in sorted(set(rows.model.tolist())):
            model = _shape_model(mname)
            sel = test & (rows.model == mname)
            # per (tp, tokens) prediction through the runtime model
            preds = np.empty(int(sel.sum()))
            idx = np.nonzero(sel)[0]
            cache: dict[tuple[int, int], dict[str, float]] = {}
            models: dict[int, PerfModel] = {}
            for j, i in enumerate(idx):
                tp, M = int(rows.tp[i]), int(rows.tokens[i])
                if (tp, M) not in cache:
                    if tp not in models:
                        models[tp] = PerfModel(gpu, model, tp=tp, calibration=cal)
                    cache[(tp, M)] = models[tp].layer_op_times_s(M)
                preds[j] = cache[(tp, M)][rows.op[i]]
            meas, ops, toks = rows.t[idx], rows.op[idx], rows.tokens[idx]
            res: dict[str, float] = {}
            big = toks >= 64
            for op in LINEAR_OPS:
                s = (ops == op) & big
                res[f"{op}@64+"] = _mape(preds[s], meas[s])
            s = np.isin(ops, LINEAR_OPS) & big
            res["linear@64+"] = _mape(preds[s], meas[s])
            s = np.isin(ops, LINEAR_OPS) & ~big
            res["linear@<64"] = _mape(preds[s], meas[s])
            for op in SMALL_OPS:
                s = ops == op
                res[op] = _mape(preds[s], meas[s])
            # whole layer (sum of per-layer ops, emb excluded) per (tp, tokens) row, >= 64 tokens
            lay_p: dict[tuple, float] = {}
            lay_m: dict[tuple, float] = {}
            for p, m_, op, tp, M in zip(preds, meas, ops, rows.tp[idx], toks):
                if op == "emb" or M < 64:
                    continue
                k = (tp, M)
                lay_p[k] = lay_p.get(k, 0.0) + p
                lay_m[k] = lay_m.get(k, 0.0) + m_
            keys = list(lay_p)
            res["layer@64+"] = _mape([lay_p[k] for k in keys], [lay_m[k] for k in keys])
            out[f"{prof}/{model.name}"] = {k: v for k, v in res.items() if v == v}  # drop ops absent from the data
    # ---- attention (A100, Llama-2-70B TP2 shape)
    a: AttnRows = data.attention
    pm = PerfModel(get_gpu("A100-80GB"), get_model("Llama-2-70B"), tp=2, calibration=cal)
    sp = _in(a.prefill_chunk, HOLDOUT_PREFILL_CHUNK)
    work = a.prefill_chunk * (a.prefill_kv + a.prefill_chunk)
    sd = _in(a.decode_batch, HOLDOUT_DECODE_BATCH)
    out["a100/attention"] = {
        "prefill": _mape([pm.attention_prefill_s(w) for w in work[sp]], a.prefill_t[sp]),
        "decode": _mape([pm.attention_decode_s(int(b), b * k) for b, k in zip(a.decode_batch[sd], a.decode_kv[sd])], a.decode_t[sd]),
    }
    # ---- collectives
    for fab, c in data.comm.items():
        c: CommRows
        link = get_gpu(FABRIC_GPU[fab]).interconnect_gbps
        cp = cal.comm[fab]
        s = _in(c.size, HOLDOUT_SIZES)
        res = {}
        ar = s & (c.kind == "all_reduce")
        if ar.any():
            res["all_reduce"] = _mape([all_reduce_time_s(cp, int(n), z, link) for n, z in zip(c.n[ar], c.size[ar])], c.t[ar])
        sr = s & (c.kind == "send_recv")
        res["send_recv"] = _mape([send_recv_time_s(cp, z, link) for z in c.size[sr]], c.t[sr])
        out[f"{fab}/collective"] = res
    # ---- CPU overhead (CodeLlama-34B TP2 on A100)
    cpu: CpuRows = data.cpu
    s = _in(cpu.batch, HOLDOUT_CPU_BATCH)
    pm = PerfModel(get_gpu("A100-80GB"), get_model("CodeLlama-34B"), tp=2, calibration=cal)
    out["a100/cpu_overhead"] = {"total": _mape([pm.cpu_overhead_s(int(b)) for b in cpu.batch[s]], (cpu.base_t + cpu.multi_t)[s])}
    return out


def to_json(result: dict[str, dict[str, float]]) -> str:
    return json.dumps({k: {op: round(v, 3) for op, v in d.items()} for k, d in result.items()}, indent=2)


def _cell(d: dict[str, float], op: str, target: float | None = None) -> str:
    v = d.get(op)
    if v is None or v != v:
        return ""
    txt = f"{v:.1f}"
    return f"[red]{txt}[/red]" if target is not None and v > target else txt


def render_table(result: dict[str, dict[str, float]]):
    """Three rich tables (a Group): linear ops and whole layer per "<gpu>/<model>", small ops per "<gpu>/<model>",
    and attention / collectives / CPU overhead. Values over their target are red."""
    from rich.console import Group
    from rich.table import Table

    compute = {k: d for k, d in result.items() if "linear@64+" in d}
    other = {k: d for k, d in result.items() if k not in compute}
    T = TARGET_LINEAR_MAPE

    lin = Table(
        title=f"Held-out MAPE % — linear ops and layer, >= 64 tokens (target <= {T:g}%)",
        caption="qkv/o/up/down = attn_pre_proj/attn_post_proj/mlp_up_proj/mlp_down_proj; linear = the four pooled; "
        "layer = sum of all per-layer ops. linear<64 (< 64 tokens) has no target.",
    )
    lin.add_column("GPU/model", no_wrap=True)
    lin_cols = [("qkv", "attn_pre_proj@64+"), ("o", "attn_post_proj@64+"), ("up", "mlp_up_proj@64+"),
                ("down", "mlp_down_proj@64+"), ("linear@64+", "linear@64+"), ("layer@64+", "layer@64+")]  # fmt: skip
    for name, _ in lin_cols:
        lin.add_column(name, justify="right")
    lin.add_column("linear<64", justify="right", style="dim")
    for k, d in compute.items():
        lin.add_row(k, *(_cell(d, op, T) for _, op in lin_cols), _cell(d, "linear@<64"))

    small = Table(title="Held-out MAPE % — small activation-bound ops, all held-out rows (no target)")
    small.add_column("GPU/model", no_wrap=True)
    for op in SMALL_OPS:
        small.add_column(op.replace("post_attention_layernorm", "post_attn_norm").replace("input_layernorm", "input_norm"), justify="right")
    for k, d in compute.items():
        small.add_row(k, *(_cell(d, op) for op in SMALL_OPS))

    A = TARGET_ATTN_COMM_MAPE
    rest = Table(title=f"Held-out MAPE % — attention, collectives, CPU (target <= {A:g}%)")
    rest.add_column("rows", no_wrap=True)
    rest_cols: list[str] = []
    for d in other.values():
        rest_cols += [op for op in d if op not in rest_cols]
    for op in rest_cols:
        rest.add_column(op, justify="right")
    for k, d in other.items():
        rest.add_row(k, *(_cell(d, op, A) for op in rest_cols))
    return Group(lin, small, rest)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    res = run_validation()
    if "--json" in argv:
        print(to_json(res))
    else:
        from rich.console import Console

        Console(markup=False).print(render_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
