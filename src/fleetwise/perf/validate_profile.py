"""Held-out error of a GPU calibration fitted from a profile (``fleetwise perf validate --profile FILE``).

``validate_profile(profile)`` fits the GPU's calibration on training rows only and reports the MAPE (percent) of
the runtime model on the rows it never saw, next to the uncalibrated model (the catalog GPU with efficiencies
transferred from the Vidur-profiled GPUs) on the same rows:

- GEMM: every third profiled token count M of every shape (not the smallest or largest: the model interpolates
  between profiled counts), split at M = 64; and, fitted without one whole model (``HOLDOUT_MODEL``), that
  model's shapes ("unseen shapes": no per-shape correction, the closed form alone).
- attention: every third row of each model and kind, against the fastest backend measured on the row
  ("prefill" pools whole prompts and chunks, as the issue's figures do) and per backend; and one whole model
  held out.
- layers: a decoder layer's four GEMMs plus its attention, summed from measured operators, against the model's
  sum (whole prompts and decode steps at the profiled sizes; for the held-out model and uncalibrated).
- iterations (a profile from ``fleetwise perf profile``): the whole-iteration check rows, none of which is fitted,
  against ``PerfModel.iteration_breakdown(...)["gpu_s"]`` with the calibration fitted on all operator rows.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fleetwise.catalog.specs import GPUSpec
from fleetwise.perf.calibration import ATTN_KINDS, Calibration, GpuCalibration, default_calibration
from fleetwise.perf.fit_profile import AttnData, GemmData, Masks, attn_data, fit_gpu_calibration, gemm_data, resolve_gpu
from fleetwise.perf.model import PerfModel, decode_attention_s, linear_op_s, prefill_attention_s
from fleetwise.perf.profile_data import Profile

HOLDOUT_MODEL = "CodeLlama-34B"
TARGETS = {"gemm M>=64": 5.0, "gemm M<64": 8.0, "prefill": 10.0, "decode": 10.0, "iterations": 5.0}


def _err(pred, meas) -> np.ndarray:
    return np.asarray(pred, float) / np.asarray(meas, float) - 1.0


def _stats(e: np.ndarray) -> dict[str, float]:
    if len(e) == 0:
        return {}
    return {"mape": float(np.mean(np.abs(e)) * 100), "median": float(np.median(e) * 100),
            "worst": float(e[np.argmax(np.abs(e))] * 100), "rows": int(len(e))}  # fmt: skip


def gemm_test_mask(d: GemmData) -> np.ndarray:
    ms = sorted(set(d.M.tolist()))
    held = set(ms[1:-1][1::3])
    return np.isin(d.M, list(held))


def attn_test_mask(d: AttnData) -> np.ndarray:
    m = np.zeros(len(d), bool)
    seen: dict[str, int] = {}
    for i, name in enumerate(d.model):
        k = seen.get(name, 0)
        m[i] = k % 3 == 1
        seen[name] = k + 1
    return m


def _gemm_pred(cal: Calibration, gpu: GPUSpec, d: GemmData, sel: np.ndarray) -> np.ndarray:
    return np.asarray([linear_op_s(cal, gpu, n, k, m) for n, k, m in zip(d.N[sel], d.K[sel], d.M[sel])])


def _attn_pred(p: Profile, cal: Calibration, gpu: GPUSpec, d: AttnData, kind: str, sel: np.ndarray,
               backend: str | None = None) -> np.ndarray:
    """The model's time for the rows ``sel`` of one attention kind: the GPU calibration's kernel (its default
    backend or ``backend``), or the uncalibrated PerfModel's attention where ``cal`` has no GPU calibration."""
    gc = cal.gpus.get(gpu.name)
    out = []
    P, BW = gpu.tflops_bf16 * 1e12, gpu.mem_bw_gbps * 1e9
    for i in np.nonzero(sel)[0]:
        q, kv, h, kvh, hd = d.q[i], d.kv[i], int(d.heads[i]), int(d.kv_heads[i]), int(d.head_dim[i])
        if gc is not None:
            k = gc.kernel(kind, backend)
            if kind == "decode":
                out.append(decode_attention_s(k, BW, kvh, hd, int(q), q * kv))
            else:
                out.append(prefill_attention_s(k, P, gc.sms, h, hd, q, kv))
        else:
            pm = _perf(p, cal, gpu, d.model[i], int(round(p.model_spec(d.model[i]).num_heads / h)))
            if kind == "decode":
                out.append(pm.attention_decode_s(int(q), q * kv))
            else:
                out.append(pm.attention_prefill_s(q * kv))
    return np.asarray(out)


def _perf(p: Profile, cal: Calibration, gpu: GPUSpec, model: str, tp: int, layers: int | None = None) -> PerfModel:
    spec = p.model_spec(model)
    if layers is not None:
        spec = replace(spec, num_layers=layers)
    return PerfModel(gpu, spec, tp=tp, calibration=cal)


def _section(p: Profile, cal: Calibration, gpu: GPUSpec, gd: GemmData, gsel: np.ndarray,
             ad: dict[str, AttnData], asel: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    e = _err(_gemm_pred(cal, gpu, gd, gsel), gd.t[gsel])
    big = gd.M[gsel] >= 64
    out["gemm M>=64"] = _stats(e[big])
    out["gemm M<64"] = _stats(e[~big])
    pf: list[np.ndarray] = []
    for kind in ATTN_KINDS:
        d, s = ad[kind], asel[kind]
        if not s.any():
            continue
        ek = _err(_attn_pred(p, cal, gpu, d, kind, s), d.fastest()[s])
        out[kind if kind != "prefill" else "prefill whole"] = _stats(ek)
        if kind != "decode":
            pf.append(ek)
    if pf:
        out["prefill"] = _stats(np.concatenate(pf))
    return {k: v for k, v in out.items() if v}


LINEAR = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def _layers(p: Profile, cal: Calibration, gpu: GPUSpec, models: set[str] | None = None) -> dict[str, dict[str, float]]:
    """A decoder layer's GEMMs plus attention, composed from measured operators, against the model's same sum:
    a whole prompt of q tokens (the four GEMMs at M = q, prefill attention q x q) and a decode step of B
    sequences with C cached tokens (GEMMs at M = B, decode attention) -- wherever the profile timed all five
    operators of a model slice at that size (small ops are not in the H200 timings)."""
    gemm: dict[tuple, float] = {(r.model, r.tp, r.op, r.M): r.s for r in p.gemm}
    out: dict[str, tuple[list[float], list[float]]] = {"layer prefill": ([], []), "layer decode": ([], [])}
    rows = [("layer prefill", r.model, r.tp, r.q_len, r) for r in p.attn_prefill if r.q_len == r.kv_len]
    rows += [("layer decode", r.model, r.tp, r.B, r) for r in p.attn_decode]
    for kind, model, tp, M, r in rows:
        if models is not None and model not in models:
            continue
        g = [gemm.get((model, tp, op, M)) for op in LINEAR]
        times = [v for v in r.s.values() if v is not None]
        if None in g or not times:
            continue
        pm = _perf(p, cal, gpu, model, tp)
        ops = pm.layer_op_times_s(M)
        if kind == "layer prefill":
            attn = pm.attention_prefill_s(float(M) * M, M)
        else:
            attn = pm.attention_decode_s(M, M * r.C)
        out[kind][0].append(sum(ops[o] for o in LINEAR) + attn)
        out[kind][1].append(sum(g) + min(times))  # type: ignore[arg-type]
    return {k: _stats(_err(a, b)) for k, (a, b) in out.items() if a}


def _iterations(p: Profile, cal: Calibration, gpu: GPUSpec) -> dict[str, float]:
    pred, meas = [], []
    for r in p.iterations:
        pm = _perf(p, cal, gpu, r.model, r.tp, r.layers)
        b = pm.iteration_breakdown(r.prefill_tokens, r.prefill_context, r.decode_seqs, r.decode_context)
        pred.append(b["gpu_s"])
        meas.append(r.s)
    return _stats(_err(pred, meas))


def validate_profile(p: Profile, gpu: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """{section: {row kind: {mape, median, worst, rows}}} -- errors in percent; see the module docstring."""
    g = resolve_gpu(p, gpu)
    base = default_calibration()
    gd = gemm_data(p)
    ad = {k: attn_data(p, k) for k in ATTN_KINDS}
    gtest = gemm_test_mask(gd)
    atest = {k: attn_test_mask(ad[k]) for k in ATTN_KINDS}
    out: dict[str, dict[str, dict[str, float]]] = {}

    gc = fit_gpu_calibration(p, g.name, Masks(gemm=~gtest, attn={k: ~v for k, v in atest.items()}), base)
    cal = base.with_gpu(gc)
    out["calibrated, held-out rows"] = _section(p, cal, g, gd, gtest, ad, atest)
    for b in sorted(gc.backends):
        res = {}
        for kind in ATTN_KINDS:
            s = atest[kind] & np.isfinite(ad[kind].t.get(b, np.full(len(ad[kind]), np.nan)))
            if getattr(gc.backends[b], kind) is not None and s.any():
                res[kind] = _stats(_err(_attn_pred(p, cal, g, ad[kind], kind, s, b), ad[kind].t[b][s]))
        out[f"calibrated, held-out rows, {b} ({gc.backends[b].family})"] = res

    hold = {k: ad[k].model == HOLDOUT_MODEL for k in ATTN_KINDS}
    ghold = gd.model == HOLDOUT_MODEL
    if ghold.any() and (~ghold).sum() >= 5 and all((~hold[k]).sum() >= 2 for k in ATTN_KINDS):
        gc_u = fit_gpu_calibration(p, g.name, Masks(gemm=~ghold, attn={k: ~v for k, v in hold.items()}), base)
        cal_u = base.with_gpu(gc_u)
        out[f"calibrated, unseen model {HOLDOUT_MODEL}"] = _section(p, cal_u, g, gd, ghold, ad, hold)
        out[f"calibrated, unseen model {HOLDOUT_MODEL}"].update(_layers(p, cal_u, g, {HOLDOUT_MODEL}))

    if p.iterations:
        full = base.with_gpu(fit_gpu_calibration(p, g.name, base=base))
        out["calibrated, whole iterations (never fitted)"] = {"iterations": _iterations(p, full, g)}

    every = {k: np.ones(len(ad[k]), bool) for k in ATTN_KINDS}
    out[f"uncalibrated {g.name}, all rows"] = _section(p, base, g, gd, np.ones(len(gd.t), bool), ad, every)
    out[f"uncalibrated {g.name}, all rows"].update(_layers(p, base, g))
    if p.iterations:
        out[f"uncalibrated {g.name}, all rows"]["iterations"] = _iterations(p, base, g)
    return out


def render_profile_table(res: dict[str, dict[str, dict[str, float]]], title: str = ""):
    """One rich table: a row per (section, kind) with MAPE, median and worst signed error and the row count;
    the calibrated held-out MAPE in red where it misses the issue's target."""
    from rich.table import Table

    t = Table(title=title or "Held-out error of the profile's calibration (percent)")
    for c in ("section", "rows of", "MAPE %", "median %", "worst %", "rows", "target"):
        t.add_column(c, justify="left" if c in ("section", "rows of") else "right")
    for section, kinds in res.items():
        sec = section
        for kind, st in kinds.items():
            checked = section in ("calibrated, held-out rows", "calibrated, whole iterations (never fitted)")
            tgt = TARGETS.get(kind) if checked else None
            m = f"{st['mape']:.1f}"
            if tgt is not None and st["mape"] > tgt:
                m = f"[red]{m}[/red]"
            t.add_row(sec, kind, m, f"{st['median']:+.1f}", f"{st['worst']:+.1f}", str(st["rows"]),
                      f"<= {tgt:g}" if tgt is not None else "")
            sec = ""
    return t


def gpu_calibration_from_profile(p: Profile, gpu: str | None = None, source: str = "") -> GpuCalibration:
    """The calibration ``fleetwise perf calibrate`` writes: fitted on every row of the profile."""
    return fit_gpu_calibration(p, gpu, source=source)
