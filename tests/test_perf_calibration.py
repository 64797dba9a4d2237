"""GPU calibrations from a profile: fit, file, held-out validation, predict, scenarios, and the profiler on a CPU."""

from __future__ import annotations

import json
import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fleetwise
from fleetwise.catalog import GPUS, MODELS, get_gpu, get_model
from fleetwise.errors import InputError
from fleetwise.perf import PerfModel, default_calibration
from fleetwise.perf.calfile import (
    from_gpu_calibration,
    load_calibration,
    parse_calibration,
    write_calibration,
)
from fleetwise.perf.calibrate import gemm_pred
from fleetwise.perf.calibration import DecodeKernel, GemmParams, PrefillKernel
from fleetwise.perf.fit_profile import decode_pred, fit_gpu_calibration, prefill_pred
from fleetwise.perf.model import decode_attention_s, linear_op_s, prefill_attention_s
from fleetwise.perf.profile_data import load_profile, parse_profile, per_gpu_heads

H200 = get_gpu("H200")
P, BW, SMS = H200.tflops_bf16 * 1e12, H200.mem_bw_gbps * 1e9, 132
TRUE_GEMM = GemmParams(eff_compute=0.8, eff_mem=0.85, wave_quant=0.3, k_pad=40.0, t0_s=6e-6)
TRUE = {  # backend -> (whole prompt, chunk, decode) kernels the synthetic profile is drawn from
    "FLASH_ATTENTION": (PrefillKernel(1e-5, 0.4, 96.0, 0.8), PrefillKernel(2e-5, 0.33, 40.0, 1.0, 0.6),
                        DecodeKernel(1.2e-5, 4e4, 0.6, 10.0, 2.0)),
    "CUDNN_ATTENTION": (PrefillKernel(9e-6, 0.75, 70.0, 0.7), PrefillKernel(2.5e-5, 0.28, 90.0, 2.0, 0.2),
                        DecodeKernel(1e-5, 1e5, 0.95, 1.0, 0.6)),
}
SLICES = (("Llama-2-7B", 1), ("Llama-3-8B", 1), ("CodeLlama-34B", 2), ("Llama-2-70B", 4), ("Qwen-72B", 4))


def _x(k):
    return (k.t0_s, k.eff_compute, k.block_q, k.pnorm, k.causal_skip)


def synthetic_profile(noise: float = 0.02, seed: int = 0) -> dict:
    """A profile of an 'H200' whose timings follow known constants, with multiplicative noise."""
    rng = np.random.default_rng(seed)
    jit = lambda: float(np.exp(rng.normal(0.0, noise)))  # noqa: E731
    g = TRUE_GEMM
    gx = (g.eff_compute, g.eff_mem, g.wave_quant, g.k_pad, g.t0_s)
    rows = {"gemm": [], "attn_prefill": [], "attn_decode": []}
    for name, tp in SLICES:
        m = get_model(name)
        h, kvh, hd = per_gpu_heads(m, tp)
        for op, (N, K) in zip(("qkv", "o", "up", "down"), (((h + 2 * kvh) * hd, m.hidden_size), (m.hidden_size, h * hd),
                                                           (2 * m.ffn_size // tp, m.hidden_size), (m.hidden_size, m.ffn_size // tp))):
            for M in (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
                t = float(gemm_pred(gx, M, N, K, P, BW, SMS)) * jit()
                rows["gemm"].append({"model": name, "tp": tp, "op": op, "N": N, "K": K, "M": M, "s": t})
        for q, kv in [(n, n) for n in (128, 256, 512, 1024, 2048, 4096, 8192)] + [(512, 2048), (512, 8192), (2048, 8192)]:
            s = {b: float(prefill_pred(_x(k[0] if q == kv else k[1]), q, kv, h, hd, P, SMS)) * jit() for b, k in TRUE.items()}
            rows["attn_prefill"].append({"model": name, "tp": tp, "q_len": q, "kv_len": kv, "work": q * kv, "s": s})
        for B in (1, 4, 16, 64, 256):
            for C in (256, 1024, 4096):
                s = {b: float(decode_pred((k[2].t0_s, k[2].seq_bytes, k[2].eff_mem, k[2].parallel, k[2].pnorm),
                                          B, C, kvh, hd, BW)) * jit() for b, k in TRUE.items()}
                rows["attn_decode"].append({"model": name, "tp": tp, "B": B, "C": C, "s": s})
    return {"env": {"name": "NVIDIA H200", "device": "cuda", "sms": SMS}, **rows, "errors": []}


@pytest.fixture(scope="module")
def synth():
    return parse_profile(synthetic_profile())


@pytest.fixture(scope="module")
def synth_cal(synth):
    return fit_gpu_calibration(synth)


def test_fit_recovers_the_generating_model(synth, synth_cal):
    gc = synth_cal
    assert gc.gpu == "H200" and gc.sms == SMS
    # the fastest backend per kind: cuDNN for whole prompts and decode, FlashAttention-2 for chunks
    assert gc.default_backend == {"prefill": "CUDNN_ATTENTION", "chunked": "FLASH_ATTENTION", "decode": "CUDNN_ATTENTION"}
    assert gc.backends["FLASH_ATTENTION"].family == "flash-attention-2" and gc.backends["CUDNN_ATTENTION"].family == "cudnn"
    cal = default_calibration().with_gpu(gc)
    g = gc.gemm
    for r in synth.gemm[::7]:
        true = float(gemm_pred((0.8, 0.85, 0.3, 40.0, 6e-6), r.M, r.N, r.K, P, BW, SMS))
        fitted = float(gemm_pred((g.eff_compute, g.eff_mem, g.wave_quant, g.k_pad, g.t0_s), r.M, r.N, r.K, P, BW, SMS))
        assert fitted == pytest.approx(true, rel=0.03)  # the closed form recovers the truth ...
        # ... and the profiled points are kept, up to the noise (made non-decreasing in M)
        assert linear_op_s(cal, H200, r.N, r.K, r.M) == pytest.approx(r.s, rel=0.08)
    for q, kv, h in ((1000, 1000, 32), (300, 5000, 16), (6000, 6000, 16)):
        kind = "prefill" if q == kv else "chunked"
        k_true = TRUE[gc.default_backend[kind]][0 if q == kv else 1]
        pred = prefill_attention_s(gc.kernel(kind), P, SMS, h, 128, q, kv)
        assert pred == pytest.approx(prefill_attention_s(k_true, P, SMS, h, 128, q, kv), rel=0.08)
    k_true = TRUE["CUDNN_ATTENTION"][2]
    for B, K in ((8, 8 * 3000), (100, 100 * 700)):
        assert decode_attention_s(gc.kernel("decode"), BW, 8, 128, B, K) == pytest.approx(
            decode_attention_s(k_true, BW, 8, 128, B, K), rel=0.06)


def test_isotonic():
    from fleetwise.perf.fit_profile import isotonic

    assert isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([3.0, 2.0, 1.0]) == [2.0, 2.0, 2.0]
    y = list(np.random.default_rng(1).normal(size=50))
    z = isotonic(y)
    assert all(b >= a for a, b in zip(z, z[1:])) and sum(z) == pytest.approx(sum(y))


def test_held_out_validation_of_a_clean_profile(synth):
    from fleetwise.perf.validate_profile import render_profile_table, validate_profile

    res = validate_profile(synth)
    held = res["calibrated, held-out rows"]
    assert held["gemm M>=64"]["mape"] < 4 and held["gemm M<64"]["mape"] < 4
    assert held["prefill"]["mape"] < 5 and held["decode"]["mape"] < 5
    assert res["calibrated, unseen model CodeLlama-34B"]["gemm M>=64"]["mape"] < 5
    # the uncalibrated catalog H200 is much further off this GPU (its attention is transferred from an A100)
    assert res["uncalibrated H200, all rows"]["prefill"]["mape"] > 2 * held["prefill"]["mape"]
    from rich.console import Console

    con = Console(width=160, record=True)
    con.print(render_profile_table(res))
    assert "gemm M>=64" in con.export_text()


def test_calibration_changes_only_its_gpu(synth_cal):
    cal = default_calibration().with_gpu(synth_cal)
    for gname in GPUS:
        if gname == "H200":
            continue
        a = PerfModel(GPUS[gname], MODELS["Llama-3-8B"], calibration=cal)
        b = PerfModel(GPUS[gname], MODELS["Llama-3-8B"])
        for args in ((512, 512.0 * 512, 0, 0), (128, 128.0 * 2048, 16, 16000), (0, 0.0, 64, 64 * 900)):
            assert a.iteration_time_s(*args) == b.iteration_time_s(*args)
    pm = PerfModel(H200, MODELS["Llama-3-8B"], calibration=cal)
    assert pm.iteration_time_s(512, 512.0 * 512, 0, 0) != PerfModel(H200, MODELS["Llama-3-8B"]).iteration_time_s(512, 512.0 * 512, 0, 0)


@pytest.mark.parametrize("model,tp", [("Llama-3-8B", 1), ("Llama-2-70B", 4), ("Mixtral-8x7B", 2), ("phi-2", 1)])
def test_calibrated_model_invariants(synth_cal, model, tp):
    cal = default_calibration().with_gpu(synth_cal)
    pm = PerfModel(H200, get_model(model), tp=tp, pp=2, calibration=cal)
    # decode steps are affine in the KV sum (the simulator's fast path relies on it)
    for b in (1, 7, 64):
        c0, c1 = pm.decode_coeffs(b)
        assert c1 > 0
        for K in (0, 1000, 123457):
            assert pm.iteration_time_s(0, 0, b, K) == pytest.approx(c0 + c1 * K, rel=1e-12)
    prev = 0.0
    for n in (1, 16, 256, 1024, 4096):  # longer prompts take longer; a context makes a chunk slower
        t = pm.iteration_time_s(n, float(n) * n, 0, 0)
        assert t > prev
        prev = t
    assert pm.iteration_time_s(512, 512.0 * 4096, 0, 0) > pm.iteration_time_s(512, 512.0 * 512, 0, 0)
    assert pm.stage_time_s(512, 512.0 * 512, 8, 8000) < pm.iteration_time_s(512, 512.0 * 512, 8, 8000)


def test_per_layer_attention_matches_the_kernel_functions(synth_cal):
    cal = default_calibration().with_gpu(synth_cal)
    m = get_model("Llama-2-70B")
    pm = PerfModel(H200, m, tp=4, calibration=cal)
    h, kvh, hd = per_gpu_heads(m, 4)
    assert pm.attention_prefill_s(2048.0**2, 2048) == pytest.approx(
        prefill_attention_s(synth_cal.kernel("prefill"), P, SMS, h, hd, 2048, 2048))
    assert pm.attention_prefill_s(512.0 * 4608, 512) == pytest.approx(
        prefill_attention_s(synth_cal.kernel("chunked"), P, SMS, h, hd, 512, 4608))
    assert pm.attention_decode_s(32, 32 * 1500) == pytest.approx(
        decode_attention_s(synth_cal.kernel("decode"), BW, kvh, hd, 32, 32 * 1500))
    # two whole prompts of 300 tokens (work 2 x 300^2 < 600^2): charged less than one prompt of 600
    assert pm.attention_prefill_s(2 * 300.0**2, 600) < pm.attention_prefill_s(600.0**2, 600)


@pytest.mark.parametrize("tp,pp", [(1, 1), (4, 1), (2, 2)])
def test_iteration_breakdown(synth_cal, tp, pp):
    cal = default_calibration().with_gpu(synth_cal)
    for c in (None, cal):
        pm = PerfModel(H200, get_model("Llama-2-70B"), tp=tp, pp=pp, calibration=c)
        b = pm.iteration_breakdown(512, 1024, 32, 2000)
        assert b["iteration_s"] == pm.iteration_time_s(512, 512.0 * 1536, 32, 64000)
        assert b["gpu_s"] + b["comm_s"] + b["cpu_s"] == pytest.approx(b["iteration_s"], rel=1e-12)
        assert b["cpu_s"] == pm.cpu_overhead_s(33)
        assert (b["comm_s"] > 0) == (tp * pp > 1) and b["gpu_s"] > 0
    with pytest.raises(InputError):
        pm.iteration_breakdown(0, 0, 0, 0)
    with pytest.raises(InputError):
        pm.iteration_breakdown(-1, 0, 4, 10)
    with pytest.raises(InputError, match="prefill_context without prefill_tokens"):
        pm.iteration_breakdown(0, 100, 4, 10)  # a cached context with no prefilling sequence: refused, not ignored
    with pytest.raises(InputError, match="decode_context without decode_seqs"):
        pm.iteration_breakdown(64, 0, 0, 10)
    # bounds (docs/limits.md): one sequence of at most MAX_TOKENS tokens, at most MAX_REQUESTS decoding sequences
    pm.iteration_breakdown(9_999_000, 1_000, 4, 9_999_999)
    for args in ((99_999_999_999, 0, 0, 0), (9_999_000, 1_001, 0, 0), (0, 0, 4, 10_000_000), (0, 0, 10**7 + 1, 1)):
        with pytest.raises(InputError, match="bounds of docs/limits.md"):
            pm.iteration_breakdown(*args)


def test_calibration_file_round_trip(synth_cal, tmp_path):
    f = tmp_path / "cal.json"
    write_calibration(synth_cal, f)
    cal = load_calibration(f)
    g = cal.gpus["H200"]
    assert g.default_backend == synth_cal.default_backend and g.gemm_shapes.keys() == synth_cal.gemm_shapes.keys()
    a = PerfModel(H200, get_model("Llama-3-8B"), calibration=cal)
    b = PerfModel(H200, get_model("Llama-3-8B"), calibration=default_calibration().with_gpu(synth_cal))
    for args in ((700, 700.0 * 700, 0, 0), (256, 256.0 * 3000, 24, 24000), (0, 0.0, 48, 48 * 1000)):
        assert a.iteration_time_s(*args) == pytest.approx(b.iteration_time_s(*args), rel=1e-5)  # 6 digits kept


@pytest.mark.parametrize("change,words", [
    (lambda d: {**d, "gpu": "H900"}, "unknown GPU"),
    (lambda d: {**d, "colour": 1}, "colour: unknown field"),
    (lambda d: {**d, "format": "v0"}, "format"),
    (lambda d: {**d, "gemm": {**d["gemm"], "eff_compute": -1}}, "gemm.eff_compute"),
    (lambda d: {**d, "gemm": {**d["gemm"], "eff_mem": 5e-324}}, "gemm.eff_mem"),  # (was Infinity seconds)
    (lambda d: {**d, "gemm_shapes": [{**d["gemm_shapes"][0], "N": 10**400}]}, "gemm_shapes.0.N"),
    (lambda d: {**d, "attention": {**d["attention"], "default": {**d["attention"]["default"], "decode": "MATH"}}},
     "not in backends"),
    (lambda d: {**d, "gemm_shapes": [{**d["gemm_shapes"][0], "M": d["gemm_shapes"][0]["M"][::-1]}]}, "increasing"),
    (lambda d: [1, 2], "expected a JSON object"),
])
def test_calibration_file_errors_are_one_line(synth_cal, change, words):
    good = from_gpu_calibration(synth_cal)
    with pytest.raises(InputError) as e:
        parse_calibration(change(json.loads(json.dumps(good))), where="cal.json")
    msg = str(e.value)
    assert "\n" not in msg and words in msg and msg.startswith("cal.json")


def test_calibration_file_not_json_or_nan(tmp_path):
    f = tmp_path / "c.json"
    f.write_text("{not json")
    with pytest.raises(InputError, match="line 1: invalid JSON"):
        load_calibration(f)
    with pytest.raises(InputError, match="not found"):
        load_calibration(tmp_path / "missing.json")
    f.write_text('{"format": "fleetwise-perf-calibration/1", "gpu": "H200", "sms": NaN}')
    with pytest.raises(InputError, match="sms"):
        load_calibration(f)


def test_profile_errors_are_one_line(tmp_path):
    good = synthetic_profile()
    for change, words in (
        (lambda d: {**d, "gemm": [{**d["gemm"][0], "s": 0}]}, "gemm.0.s"),
        (lambda d: {**d, "attn_prefill": [{**d["attn_prefill"][0], "kv_len": 1}]}, "kv_len"),
        (lambda d: {**d, "attn_decode": [{**d["attn_decode"][0], "model": "nope"}]}, "'nope'"),
        (lambda d: {**d, "attn_decode": [{**d["attn_decode"][0], "tp": 3}]}, "tp=3"),
        (lambda d: {"env": {}}, "no gemm"),
    ):
        with pytest.raises(InputError) as e:
            parse_profile(change(good), where="p.json")
        assert "\n" not in str(e.value) and words in str(e.value), str(e.value)
    f = tmp_path / "p.json"
    f.write_text("[]")
    with pytest.raises(InputError, match="JSON object"):
        load_profile(f)


def test_scenario_selects_a_calibration(synth_cal, tmp_path):
    from fleetwise.scenario import build, parse_scenario

    f = tmp_path / "h200.json"
    write_calibration(synth_cal, f)
    base = {"name": "h200", "fleet": {"topology": "single"},
            "deployments": [{"model": "llama-3-8b", "gpu": "h200", "replicas": 1, "calibration": str(f)}],
            "workload": {"kind": "default", "rate_rps": 2.0, "num_requests": 20}}
    from fleetwise.run import run_scenario

    r = run_scenario(parse_scenario(base), seed=0)
    assert r.summary["completed"] == 20
    perf = r.built.sim.replicas[0].perf
    assert "H200" in perf.cal.gpus and perf.iteration_time_s(512, 512.0 * 512, 0, 0) == pytest.approx(
        PerfModel(H200, get_model("llama-3-8b"), calibration=load_calibration(f)).iteration_time_s(512, 512.0 * 512, 0, 0))
    bad = json.loads(json.dumps(base))
    bad["deployments"][0]["gpu"] = "a100"
    with pytest.raises(InputError, match=r"deployments\[0\]\.calibration: .* calibrates H200"):
        build(parse_scenario(bad), seed=0)
    bad["deployments"][0].update(gpu="h200", calibration=str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match=r"deployments\[0\]\.calibration: .*not found"):
        build(parse_scenario(bad), seed=0)


# ---------------------------------------------------------------------------------------------- real H200 data
def _h200_file():
    from fleetwise.data import data_dir

    root = data_dir(required=False)
    f = root / "h200-operator-timings" / "h200-ops-2026-11-30.json" if root else None
    return f if f is not None and f.is_file() else None


@pytest.mark.skipif(_h200_file() is None, reason="real data folder (h200-operator-timings) not found")
def test_h200_calibration_meets_the_targets():
    from fleetwise.perf.validate_profile import TARGETS, validate_profile

    res = validate_profile(load_profile(_h200_file()))
    held = res["calibrated, held-out rows"]
    for kind in ("gemm M>=64", "gemm M<64", "prefill", "decode"):
        assert held[kind]["mape"] <= TARGETS[kind], (kind, held[kind])
    unc = res["uncalibrated H200, all rows"]  # the figures for today's model on this data
    assert unc["gemm M>=64"]["mape"] == pytest.approx(10.1, abs=0.05) and unc["prefill"]["median"] > 100


# ---------------------------------------------------------------------------------------------- the profiler (CPU)
class _Run:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run the command line in this process (torch-free commands; no interpreter start-up per call)."""
    from fleetwise import cli as cli_mod

    def run(*args, cwd=None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["fleetwise", *map(str, args)])
        capsys.readouterr()
        try:
            cli_mod.main()
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        o, e = capsys.readouterr()
        return _Run(code, o, e)

    return run


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("profile")
    p = subprocess.run([sys.executable, "-m", "fleetwise", "perf", "profile", "--quick", "--out", str(d / "cpu.json")],
                       capture_output=True, text=True)  # its own process: torch's global state stays out of this one
    assert p.returncode == 0, p.stderr
    assert "cpu.json" in p.stderr and "iterations" in p.stderr
    return d / "cpu.json"


def test_profile_on_cpu_writes_a_valid_profile(cpu_profile):
    prof = load_profile(cpu_profile)
    assert prof.env["device"] == "cpu" and prof.gpu_name() is None and "tiny-llama" in prof.models
    assert {r.op for r in prof.gemm} >= {"attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "lm_head"}
    assert {r.tp for r in prof.gemm} == {1, 2}
    backends = {b for r in prof.attn_prefill for b, v in r.s.items() if v is not None}
    assert {"FLASH_ATTENTION", "MATH"} <= backends  # the CPU runs these two; the GPU-only ones are refused ...
    assert any("CUDNN_ATTENTION" in e for e in prof.errors)  # ... and the refusals are recorded
    assert any(r.q_len < r.kv_len for r in prof.attn_prefill) and prof.attn_decode
    assert {r.op for r in prof.elementwise} == {"input_layernorm", "attn_rope", "mlp_act", "add", "emb"}
    assert prof.iterations and all(r.s > 0 for r in prof.iterations)
    assert {(r.prefill_tokens > 0, r.decode_seqs > 0) for r in prof.iterations} == {(True, False), (False, True), (True, True)}


def test_standalone_profiler_runs_with_torch_alone(tmp_path):
    """``python -m fleetwise.profiler`` runs where only PyTorch and numpy are installed (the GPU machines' image
    has no pydantic, typer or DuckDB): its file is what ``perf profile`` writes, and bad input is one line."""
    pytest.importorskip("torch")
    src = str(Path(fleetwise.__file__).parents[1])
    block = ("import builtins, runpy, sys\n"
             "real = builtins.__import__\n"
             "def imp(name, *a, **k):\n"
             "    if name.split('.')[0] in ('pydantic', 'pydantic_core', 'typer', 'duckdb', 'fastapi', 'ray'):\n"
             "        raise ImportError('not installed: ' + name)\n"
             "    return real(name, *a, **k)\n"
             "builtins.__import__ = imp\n"
             "sys.argv = ['fleetwise.profiler'] + sys.argv[1:]\n"
             "runpy.run_module('fleetwise.profiler', run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": src}

    def run(*args):
        return subprocess.run([sys.executable, "-c", block, *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path)

    p = run("--quick", "--out", "cpu.json")
    assert p.returncode == 0, p.stderr
    assert "cpu.json" in p.stdout and "[1/" in p.stderr  # the summary, and progress lines
    prof = load_profile(tmp_path / "cpu.json")
    assert prof.env["device"] == "cpu" and prof.iterations and prof.gemm and prof.attn_decode
    for args, words in ((("--models", "gpt-9", "--out", "x.json"), "unknown model"),
                        (("--out", "."), "is a folder"), (("--out", "no/such/x.json"), "cannot write")):
        p = run(*args)
        assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["cpu.json"]  # nothing half-written


def test_calibrate_predict_validate_from_a_cpu_profile(cpu_profile, tmp_path, cli):
    cal = tmp_path / "cal.json"
    p = cli("perf", "calibrate", "--profile", str(cpu_profile), "--out", str(cal))
    assert p.returncode == 2 and "--gpu" in p.stderr and not cal.exists()  # a CPU is not a catalog GPU
    p = cli("perf", "calibrate", "--profile", str(cpu_profile), "--gpu", "a100", "--out", str(cal))
    assert p.returncode == 0, p.stderr
    g = load_calibration(cal).gpus["A100-80GB"]
    assert g.small is not None and set(g.backends) >= {"FLASH_ATTENTION", "MATH"}
    args = ("perf", "predict", "--gpu", "a100", "--model", "tiny-llama", "--prefill-tokens", "64", "--json")
    p = cli(*args)
    assert p.returncode == 2 and "unknown model" in p.stderr
    p = cli("perf", "predict", "--gpu", "a100", "--model", "llama-3-8b", "--calibration", str(cal),
            "--prefill-tokens", "64", "--prefill-context", "128", "--decode-seqs", "4", "--decode-context", "64", "--json")
    assert p.returncode == 0, p.stderr
    b = json.loads(p.stdout)
    assert set(b) >= {"iteration_s", "gpu_s", "comm_s"} and b["comm_s"] == 0 and b["gpu_s"] > 0
    # a CPU runs far slower than an A100: the calibration says so
    p0 = json.loads(cli("perf", "predict", "--gpu", "a100", "--model", "llama-3-8b", "--prefill-tokens", "64",
                        "--prefill-context", "128", "--decode-seqs", "4", "--decode-context", "64", "--json").stdout)
    assert b["gpu_s"] > 10 * p0["gpu_s"]
    p = cli("perf", "validate", "--profile", str(cpu_profile), "--gpu", "a100", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    it = res["calibrated, whole iterations (never fitted)"]["iterations"]
    assert it["rows"] == 6 and math.isfinite(it["mape"])


@pytest.mark.parametrize("args,words", [
    (("perf", "predict", "--gpu", "h200", "--model", "llama-3-8b", "--json"), "prefill tokens or decoding"),
    (("perf", "predict", "--gpu", "h200", "--model", "llama-3-8b", "--tp", "3", "--decode-seqs", "1"), "tp=3"),
    (("perf", "calibrate", "--profile", "nope.json", "--out", "x.json"), "nope.json: profile file not found"),
    (("perf", "validate", "--profile", "nope.json"), "not found"),
    (("perf", "profile", "--models", "gpt-9", "--out", "x.json"), "unknown model"),
])
def test_perf_cli_bad_input(args, words, tmp_path, cli):
    p = cli(*args, cwd=tmp_path)
    assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "x.json").exists()


def test_core_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import fleetwise.perf, fleetwise.profiler, "
            "fleetwise.perf.validate_profile, fleetwise.scenario, fleetwise.cli; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_predict_with_the_default_model_matches_perfmodel(cli):
    p = cli("perf", "predict", "--gpu", "a100", "--model", "llama-2-70b", "--tp", "2", "--pp", "2",
            "--prefill-tokens", "512", "--decode-seqs", "20", "--decode-context", "1200", "--json")
    assert p.returncode == 0, p.stderr
    b = json.loads(p.stdout)
    pm = PerfModel(get_gpu("a100"), get_model("llama-2-70b"), tp=2, pp=2)
    assert b["iteration_s"] == pytest.approx(pm.iteration_time_s(512, 512.0 * 512, 20, 24000), rel=1e-12)



def test_profile_without_torch_is_one_line(cli, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    p = cli("perf", "profile", "--out", "x.json", cwd=tmp_path)
    assert p.returncode == 2 and "needs PyTorch" in p.stderr and not (tmp_path / "x.json").exists()


def test_a_row_no_backend_timed_is_left_out_not_a_nan_error():
    """An attention row whose every backend is null (or ``{}``) measures nothing: it made ``perf validate`` print
    NaN errors with exit 0 (found by fuzzing, 2026-12-06). Fits and errors leave it out, and give what they give
    without it."""
    from fleetwise.perf.validate_profile import validate_profile

    base = synthetic_profile()
    extra = copy.deepcopy(base)
    extra["attn_decode"].append({**extra["attn_decode"][0], "s": {b: None for b in extra["attn_decode"][0]["s"]}})
    extra["attn_prefill"].append({**extra["attn_prefill"][0], "s": {}})
    a, b = validate_profile(parse_profile(base)), validate_profile(parse_profile(extra))
    assert a == b
    assert all(math.isfinite(v) for sec in b.values() for row in sec.values() for v in row.values())
