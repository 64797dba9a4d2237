"""Time the operators the catalog models need on this machine's GPU, in pure PyTorch (``fleetwise perf profile``).

What it times (schema of the file: docs/perf-model.md; reader: perf/profile_data.py):

- ``gemm``: ``F.linear(x[M,K], W[N,K])`` for the per-GPU slices of each model's fused QKV, attention output,
  MLP up (gate+up) and down projections and the LM head, tensor-parallel degrees 1, 2, 4, 8, over token counts M;
- ``attn_prefill`` / ``attn_decode``: ``F.scaled_dot_product_attention`` under every SDPA backend
  (``torch.nn.attention.sdpa_kernel``: FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION, MATH): whole prompts
  (causal), prefill chunks after a context (lower-right causal mask) and one-token decode over a cached context;
  GQA native (``enable_gqa``) where a backend takes it, else K/V expanded to the query heads for every backend
  (``kv_expanded``); a refused shape is null with its message in ``errors``;
- ``elementwise``: RMSNorm, rotary embedding, SiLU-and-multiply, residual add, embedding lookup;
- ``iterations`` (the check, never fitted): whole iterations of a small Llama-style decoder (2 layers of a model's
  per-GPU slice, embedding, final norm, LM head on the sampled rows) running prefill, decode and mixed batches
  with the fastest backend of each attention kind; CUDA-graph replay on a GPU.

On a GPU: bf16, CUDA-event timing, median of repeated calls after warm-ups, the L2 cache flushed (a 256 MB write)
before each timed operator call -- the method of the H200 timings in ``<data>/h200-operator-timings``. The jobs
run in priority order within a time budget (110 s; ``--quick`` about 30 s); what the budget cuts is listed in
``errors``. On a CPU (no GPU): a tiny Llama-shaped model and small token counts, wall-clock timing, a few seconds
-- enough to exercise every path in the tests.

torch is imported inside the functions: the rest of fleetwise stays importable without it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetwise.catalog import get_model
from fleetwise.catalog.specs import ModelSpec
from fleetwise.perf.profile_format import FORMAT, per_gpu_heads

BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
TP_DEGREES = (1, 2, 4, 8)
# (model, tp) slices timed first (the H200 reference data's slices, plus internlm-20b and Mixtral's experts)
PRIMARY = (("Llama-2-7B", 1), ("Llama-3-8B", 1), ("CodeLlama-34B", 2), ("Llama-2-70B", 4), ("Llama-3-70B", 8),
           ("Qwen-72B", 4), ("phi-2", 1), ("internlm-20b", 2), ("Mixtral-8x7B", 2))  # fmt: skip
TINY = {"num_layers": 2, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 2, "ffn_size": 704, "vocab_size": 2048,
        "gated_mlp": True}  # fmt: skip


@dataclass
class Plan:
    """Sizes one run times (GPU or CPU, full or quick)."""

    slices: list[tuple[str, int]]  # primary (model, tp) slices
    extra_slices: list[tuple[str, int]]  # other TP degrees, timed while the budget lasts
    gemm_m: tuple[int, ...]
    lm_head_m: tuple[int, ...]
    prefill_q: tuple[int, ...]  # whole prompts
    chunks: tuple[tuple[int, int], ...]  # (q_len, kv_len)
    decode: tuple[tuple[int, int], ...]  # (B, C)
    elementwise_m: tuple[int, ...]
    iterations: tuple[tuple[int, int, int, int], ...]  # (prefill tokens, context, decode seqs, decode context)
    attn_models: list[tuple[str, int]]
    iter_models: list[tuple[str, int]]
    budget_s: float
    warmup: int
    reps: int
    math_max_elems: float  # MATH materialises heads x q x kv scores: skip larger shapes
    max_gemm_flops: float = math.inf  # larger GEMMs are skipped (a CPU asked for real models)
    max_kv_bytes: float = 16e9  # decode shapes whose K and V exceed this are skipped
    models: dict[str, dict] = field(default_factory=dict)  # shapes of non-catalog models


def make_plan(cuda: bool, quick: bool, models: list[str] | None) -> Plan:
    if not cuda:
        names = list(models) if models else ["tiny-llama"]
        slices = [(n, tp) for n in names for tp in (1, 2)]
        return Plan(slices=slices, extra_slices=[], gemm_m=(1, 4, 16, 64, 128, 256), lm_head_m=(1, 16, 64),
                    prefill_q=(32, 64, 128), chunks=((32, 96), (32, 160), (64, 192)),
                    decode=((1, 64), (4, 64), (4, 256), (16, 128)), elementwise_m=(1, 16, 64, 256),
                    iterations=((64, 0, 0, 0), (0, 0, 8, 128), (32, 64, 4, 64)), attn_models=slices[:1],
                    iter_models=slices[:2], budget_s=60.0, warmup=1, reps=3 if quick else 5, math_max_elems=1e9,
                    max_gemm_flops=2e9, max_kv_bytes=2e8, models={} if models else {"tiny-llama": TINY})  # fmt: skip
    if models:
        wanted = [get_model(m).name for m in models]
        primary = [(n, next(tp for tp in TP_DEGREES if _ok(n, tp))) for n in wanted]
    else:
        primary = [s for s in PRIMARY if _ok(*s)]
        wanted = [n for n, _ in primary]
    extra = [(n, tp) for n in wanted for tp in TP_DEGREES if (n, tp) not in primary and _ok(n, tp)]
    attn = [s for s in primary if get_model(s[0]).num_experts == 1][:5]
    if quick:
        return Plan(slices=primary, extra_slices=[], gemm_m=(1, 16, 64, 256, 1024, 4096), lm_head_m=(1, 64, 256),
                    prefill_q=(256, 1024, 4096), chunks=((512, 2048), (2048, 8192)),
                    decode=((1, 1024), (16, 4096), (64, 1024), (256, 1024)), elementwise_m=(16, 256, 4096),
                    iterations=((2048, 0, 0, 0), (0, 0, 64, 1024), (512, 1024, 32, 1024)), attn_models=attn[:3],
                    iter_models=primary[:2], budget_s=30.0, warmup=2, reps=7, math_max_elems=2**28)  # fmt: skip
    return Plan(slices=primary, extra_slices=extra,
                gemm_m=(1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192),
                lm_head_m=(1, 4, 16, 64, 128, 256, 512), prefill_q=(128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                chunks=((512, 1024), (512, 2048), (512, 4096), (512, 8192), (2048, 4096), (2048, 8192)),
                decode=tuple((b, c) for b in (1, 4, 16, 64, 256) for c in (256, 1024, 4096, 16384) if b * c <= 2**22),
                elementwise_m=(1, 16, 64, 256, 1024, 4096, 8192),
                iterations=((512, 0, 0, 0), (2048, 0, 0, 0), (0, 0, 16, 1024), (0, 0, 128, 2048),
                            (512, 1024, 32, 1024), (256, 4096, 64, 2048)),
                attn_models=attn, iter_models=primary[:3] + [s for s in extra if s[1] > 1][:2], budget_s=110.0,
                warmup=3, reps=15, math_max_elems=2**28)  # fmt: skip


def _ok(name: str, tp: int) -> bool:
    m = get_model(name)
    return m.bytes_per_param == 2.0 and m.num_heads % tp == 0


def _spec(plan: Plan, name: str) -> ModelSpec:
    if name in plan.models:
        return ModelSpec(name=name, num_params=0.0, **plan.models[name])
    return get_model(name)


class _Timer:
    """Median seconds of ``fn()`` over repeated calls: CUDA events with an L2 flush before each call on a GPU,
    wall clock on a CPU."""

    def __init__(self, torch, device: str, warmup: int, reps: int) -> None:
        self.torch, self.cuda, self.warmup, self.reps = torch, device == "cuda", warmup, reps
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if self.cuda else None

    def __call__(self, fn: Callable[[], Any], flush: bool = True, reps: int | None = None) -> float:
        torch, n = self.torch, reps or self.reps
        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for a, b in ev:
            if flush:
                self.flush.zero_()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e-3


def _sdpa(torch, backend: str, q, k, v, *, causal: bool = False, mask=None, gqa: bool = False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    with sdpa_kernel(getattr(SDPBackend, backend)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)


def _attention_row(torch, timer: _Timer, plan: Plan, errors: list[str], backends: tuple[str, ...], make, label: str,
                   score_elems: float) -> tuple[dict[str, float | None], bool]:
    """Time one attention shape under each backend: GQA native where any backend takes it, else K/V expanded to
    the query heads for every backend. ``make(expanded)`` gives ((q, k, v), keywords), or None when there is
    nothing to expand (as many KV heads as query heads)."""
    times: dict[str, float | None] = {}
    for expanded in (False, True):
        args = make(expanded)
        if args is None:
            break
        times, errs = {}, []
        for b in backends:
            if b == "MATH" and score_elems > plan.math_max_elems:
                times[b] = None
                errs.append(f"{b} {label}: skipped (MATH materialises {score_elems:.3g} scores)")
                continue
            try:
                times[b] = timer(lambda b=b: _sdpa(torch, b, *args[0], **args[1]))
            except (RuntimeError, ValueError, NotImplementedError) as e:
                times[b] = None
                errs.append(f"{b} {label}{' (K/V expanded)' if expanded else ''}: {str(e).splitlines()[0][:160]}")
        errors.extend(errs)
        if any(v is not None for v in times.values()):
            return times, expanded
    return times, False


def _fastest(rows: list[dict]) -> str | None:
    wins: dict[str, int] = {}
    for r in rows:
        t = {b: v for b, v in r["s"].items() if v is not None}
        if t:
            b = min(t, key=t.__getitem__)
            wins[b] = wins.get(b, 0) + 1
    return max(wins, key=wins.__getitem__) if wins else None


def run_profile(models: list[str] | None = None, quick: bool = False, device: str | None = None,
                on_step: Callable[[int, int, str], None] | None = None) -> dict:
    """Run the profile and return it as a JSON-ready dict (``on_step(done, total, what)`` after each job)."""
    import torch

    start = time.perf_counter()
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev == "cuda"
    torch.manual_seed(0)
    plan = make_plan(cuda, quick, models)
    dt = torch.bfloat16
    F = torch.nn.functional
    timer = _Timer(torch, dev, plan.warmup, plan.reps)
    errors: list[str] = []
    out: dict[str, Any] = {"format": FORMAT, "env": _env(torch, dev, quick), "models": plan.models, "gemm": [],
                           "attn_prefill": [], "attn_decode": [], "elementwise": [], "iterations": [], "errors": errors}
    backends = BACKENDS

    jobs: list[tuple[str, Callable[[], None]]] = []

    def gemm_job(name: str, tp: int) -> None:
        m = _spec(plan, name)
        from fleetwise.perf.model import op_geometry

        lin, _ = op_geometry(m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_size, m.gated_mlp, tp)
        ops = list(zip(("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"), lin))
        ops.append(("lm_head", (-(-m.vocab_size // tp), m.hidden_size)))
        for op, (N, K) in ops:
            N, K = int(N), int(K)
            w = torch.randn(N, K, dtype=dt, device=dev)
            for M in plan.lm_head_m if op == "lm_head" else plan.gemm_m:
                if 2.0 * M * N * K > plan.max_gemm_flops:
                    errors.append(f"gemm {name} tp{tp} {op} M={M}: skipped ({2.0 * M * N * K:.3g} FLOP on a CPU)")
                    continue
                x = torch.randn(M, K, dtype=dt, device=dev)
                s = timer(lambda x=x, w=w: F.linear(x, w))
                out["gemm"].append({"model": name, "tp": tp, "op": op, "N": N, "K": K, "M": M, "s": s})
            del w

    def attn_job(name: str, tp: int) -> None:
        m = _spec(plan, name)
        h, kvh, hd = per_gpu_heads(m, tp)

        def qkv(b: int, nq: int, nkv: int, expanded: bool):
            k_heads = h if expanded else kvh
            if expanded and (kvh == h or 4.0 * b * nkv * h * hd > plan.max_kv_bytes):
                return None  # nothing to expand, or too large expanded
            q = torch.randn(b, h, nq, hd, dtype=dt, device=dev)
            k = torch.randn(b, k_heads, nkv, hd, dtype=dt, device=dev)
            v = torch.randn(b, k_heads, nkv, hd, dtype=dt, device=dev)
            return q, k, v

        from torch.nn.attention.bias import causal_lower_right

        for n in plan.prefill_q:
            def mk(exp, n=n):
                t = qkv(1, n, n, exp)
                return None if t is None else (t, {"causal": True, "gqa": t[1].shape[1] != h})
            s, e = _attention_row(torch, timer, plan, errors, backends, mk, f"{name} tp{tp} prefill {n}", h * n * n)
            out["attn_prefill"].append({"model": name, "tp": tp, "q_len": n, "kv_len": n, "work": n * n, "s": s,
                                        "kv_expanded": e})  # fmt: skip
        for n, kv in plan.chunks:
            def mk(exp, n=n, kv=kv):
                t = qkv(1, n, kv, exp)
                return None if t is None else (t, {"mask": causal_lower_right(n, kv), "gqa": t[1].shape[1] != h})
            s, e = _attention_row(torch, timer, plan, errors, backends, mk, f"{name} tp{tp} chunk {n}/{kv}", h * n * kv)
            out["attn_prefill"].append({"model": name, "tp": tp, "q_len": n, "kv_len": kv, "work": n * kv, "s": s,
                                        "kv_expanded": e})  # fmt: skip
        for B, C in plan.decode:
            if 4.0 * B * C * kvh * hd > plan.max_kv_bytes:  # K and V, bf16
                errors.append(f"{name} tp{tp} decode {B}x{C}: skipped (K/V over {plan.max_kv_bytes / 1e9:g} GB)")
                continue

            def mk(exp, B=B, C=C):
                t = qkv(B, 1, C, exp)
                return None if t is None else (t, {"gqa": t[1].shape[1] != h})
            s, e = _attention_row(torch, timer, plan, errors, backends, mk, f"{name} tp{tp} decode {B}x{C}", h * B * C)
            out["attn_decode"].append({"model": name, "tp": tp, "B": B, "C": C, "s": s, "kv_expanded": e})

    def elementwise_job(name: str, tp: int) -> None:
        m = _spec(plan, name)
        h, kvh, hd = per_gpu_heads(m, tp)
        H, ffn = m.hidden_size, -(-m.ffn_size // tp)
        w = torch.ones(H, dtype=dt, device=dev)
        table = torch.randn(-(-m.vocab_size // tp), H, dtype=dt, device=dev)
        for M in plan.elementwise_m:
            x = torch.randn(M, H, dtype=dt, device=dev)
            qk = torch.randn(M, h + kvh, hd, dtype=dt, device=dev)
            cos, sin = _rope_tables(torch, M, hd, dt, dev)
            gu = torch.randn(M, 2 * ffn if m.gated_mlp else ffn, dtype=dt, device=dev)
            ids = torch.randint(0, table.shape[0], (M,), device=dev)
            cases = [("input_layernorm", lambda: F.rms_norm(x, (H,), w, 1e-5)),
                     ("attn_rope", lambda: _rope(torch, qk, cos, sin)),
                     ("mlp_act", lambda: _act(F, gu, m.gated_mlp)),
                     ("add", lambda: x + x),
                     ("emb", lambda: F.embedding(ids, table))]  # fmt: skip
            for op, fn in cases:
                out["elementwise"].append({"model": name, "tp": tp, "op": op, "M": M, "s": timer(fn)})

    def iteration_job(name: str, tp: int) -> None:
        m = _spec(plan, name)
        kinds = {"prefill": _fastest([r for r in out["attn_prefill"] if r["q_len"] == r["kv_len"]]),
                 "chunked": _fastest([r for r in out["attn_prefill"] if r["q_len"] < r["kv_len"]]),
                 "decode": _fastest(out["attn_decode"])}
        used = ",".join(f"{k}={v}" for k, v in kinds.items() if v)
        for N, P, B, C in plan.iterations:
            fn, graph = _decoder_iteration(torch, m, tp, 2, N, P, B, C, kinds, dev, dt)
            s = timer(fn, flush=False, reps=max(3, plan.reps // 2))
            out["iterations"].append({"model": name, "tp": tp, "layers": 2, "prefill_tokens": N, "prefill_context": P,
                                      "decode_seqs": B, "decode_context": C, "backend": used + (",cuda_graph" if graph else ""),
                                      "s": s})  # fmt: skip

    for n, tp in plan.slices:
        jobs.append((f"GEMMs {n} tp{tp}", lambda n=n, tp=tp: gemm_job(n, tp)))
    for n, tp in plan.attn_models:
        jobs.append((f"attention {n} tp{tp}", lambda n=n, tp=tp: attn_job(n, tp)))
    for n, tp in plan.iter_models:
        jobs.append((f"small ops {n} tp{tp}", lambda n=n, tp=tp: elementwise_job(n, tp)))
    for n, tp in plan.iter_models:
        jobs.append((f"iterations {n} tp{tp}", lambda n=n, tp=tp: iteration_job(n, tp)))
    for n, tp in plan.extra_slices:
        jobs.append((f"GEMMs {n} tp{tp}", lambda n=n, tp=tp: gemm_job(n, tp)))
    for i, (what, job) in enumerate(jobs):
        if time.perf_counter() - start > plan.budget_s:
            errors.extend(f"skipped (time budget {plan.budget_s:g} s): {w}" for w, _ in jobs[i:])
            break
        try:
            job()
        except RuntimeError as e:  # out of memory, a kernel the build lacks: keep what the other jobs measure
            errors.append(f"{what}: failed: {str(e).splitlines()[0][:200]}")
        if cuda:
            torch.cuda.empty_cache()
        if on_step is not None:
            on_step(i + 1, len(jobs), what)
    out["env"]["seconds"] = round(time.perf_counter() - start, 2)
    return out


def _env(torch, dev: str, quick: bool) -> dict:
    import platform

    env: dict[str, Any] = {"torch": torch.__version__, "device": dev, "dtype": "bfloat16", "quick": quick}
    if dev == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(name=torch.cuda.get_device_name(0), sms=int(p.multi_processor_count), mem_gb=p.total_memory / 1e9)
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        t = _Timer(torch, dev, 2, 5)
        env["peak_bf16_tflops_measured"] = 2 * 8192**3 / t(lambda: a @ a, flush=False) / 1e12
        buf = torch.empty(2**30, dtype=torch.int8, device=dev)
        dst = torch.empty_like(buf)
        env["copy_tb_s_measured"] = 2 * 2**30 / t(lambda: dst.copy_(buf), flush=False) / 1e12
        del a, buf, dst
    else:
        env.update(name=platform.processor() or platform.machine() or "cpu", threads=torch.get_num_threads())
    return env


def _rope_tables(torch, M: int, hd: int, dt, dev):
    pos = torch.arange(M, device=dev, dtype=torch.float32)[:, None]
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    ang = torch.cat([pos * inv, pos * inv], dim=-1)
    return ang.cos().to(dt)[:, None, :], ang.sin().to(dt)[:, None, :]


def _rope(torch, x, cos, sin):
    """Rotary embedding of x[M, heads, hd] (rotate-half form, as Hugging Face Llama)."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def _act(F, gu, gated: bool):
    if not gated:
        return F.gelu(gu, approximate="tanh")
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def _decoder_iteration(torch, m: ModelSpec, tp: int, layers: int, N: int, P: int, B: int, C: int,
                       backends: dict[str, str | None], dev: str, dt) -> tuple[Callable[[], Any], bool]:
    """One iteration of a Llama-style decoder with ``layers`` layers of ``m``'s per-GPU slice (no collectives):
    a prefill chunk of N tokens after P cached ones and B decoding sequences with C cached tokens each. Returns a
    function running it (a CUDA graph replay when capture works) and whether it is a graph."""
    from torch.nn.attention.bias import causal_lower_right

    F = torch.nn.functional
    from fleetwise.perf.model import op_geometry

    h, kvh, hd = per_gpu_heads(m, tp)
    H = m.hidden_size
    lin, _ = op_geometry(H, m.num_heads, m.num_kv_heads, m.ffn_size, m.gated_mlp, tp)
    M = N + B

    def r(*shape):
        return torch.randn(*shape, dtype=dt, device=dev) * 0.02

    Ls = [{"wqkv": r(int(lin[0][0]), H), "wo": r(H, int(lin[1][1])), "wup": r(int(lin[2][0]), H),
           "wdown": r(H, int(lin[3][1])), "n1": torch.ones(H, dtype=dt, device=dev),
           "n2": torch.ones(H, dtype=dt, device=dev),
           "kp": r(1, kvh, P + N, hd) if N else None, "vp": r(1, kvh, P + N, hd) if N else None,
           "kd": r(B, kvh, C, hd) if B else None, "vd": r(B, kvh, C, hd) if B else None}
          for _ in range(layers)]  # fmt: skip
    table = r(-(-m.vocab_size // tp), H)
    lm = r(-(-m.vocab_size // tp), H)
    nf = torch.ones(H, dtype=dt, device=dev)
    ids = torch.randint(0, table.shape[0], (M,), device=dev)
    cos, sin = _rope_tables(torch, M, hd, dt, dev)
    sample = torch.tensor(([N - 1] if N else []) + list(range(N, M)), device=dev)
    mask = causal_lower_right(N, P + N) if N and P else None

    def attend(kind: str, q, k, v, causal: bool = False, mask=None):
        b = backends.get(kind)
        gqa = k.shape[1] != q.shape[1]
        if b is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
        return _sdpa(torch, b, q, k, v, causal=causal, mask=mask, gqa=gqa)

    def step():
        x = F.embedding(ids, table)
        for L in Ls:
            y = F.rms_norm(x, (H,), L["n1"], 1e-5)
            qkv = F.linear(y, L["wqkv"])
            q, k, v = qkv.split([h * hd, kvh * hd, kvh * hd], dim=-1)
            q = _rope(torch, q.reshape(M, h, hd), cos, sin)
            k = _rope(torch, k.reshape(M, kvh, hd), cos, sin)
            v = v.reshape(M, kvh, hd)
            outs = []
            if N:  # the chunk's K/V written after its cached context, then attended to
                L["kp"][0, :, P:].copy_(k[:N].transpose(0, 1))
                L["vp"][0, :, P:].copy_(v[:N].transpose(0, 1))
                qp = q[:N].transpose(0, 1)[None]
                if mask is None:
                    o = attend("prefill", qp, L["kp"], L["vp"], causal=True)
                else:
                    o = attend("chunked", qp, L["kp"], L["vp"], mask=mask)
                outs.append(o[0].transpose(0, 1).reshape(N, h * hd))
            if B:  # each sequence's new K/V written into its last cache slot
                L["kd"][:, :, C - 1].copy_(k[N:])
                L["vd"][:, :, C - 1].copy_(v[N:])
                o = attend("decode", q[N:][:, :, None], L["kd"], L["vd"])
                outs.append(o.reshape(B, h * hd))
            a = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = x + F.linear(a, L["wo"])
            y = F.rms_norm(x, (H,), L["n2"], 1e-5)
            x = x + F.linear(_act(F, F.linear(y, L["wup"]), m.gated_mlp), L["wdown"])
        return F.linear(F.rms_norm(x[sample], (H,), nf, 1e-5), lm)

    if dev != "cuda":
        return step, False
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        return g.replay, True
    except RuntimeError:
        torch.cuda.synchronize()
        return step, False


def round_profile(p: dict) -> dict:
    """Times to 4 significant digits (the file stays small and readable)."""

    def r(x):
        return float(f"{x:.4g}") if isinstance(x, float) and math.isfinite(x) else x

    for key in ("gemm", "elementwise", "iterations"):
        for row in p[key]:
            row["s"] = r(row["s"])
    for key in ("attn_prefill", "attn_decode"):
        for row in p[key]:
            row["s"] = {b: r(v) for b, v in row["s"].items()}
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetwise.profiler --out FILE [--quick] [--models a,b]``: ``fleetwise perf profile`` for a GPU
    machine that has PyTorch and numpy but not the rest of fleetwise's dependencies (pydantic, typer, ...): run
    from a checkout with ``PYTHONPATH=src``, copy the file back, then ``fleetwise perf calibrate`` / ``validate``
    it where fleetwise is installed (docs/perf-model.md). The file is written whole or not at all."""
    import argparse
    import json
    import os
    import sys
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m fleetwise.profiler", description=main.__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="profile file to write (JSON)")
    ap.add_argument("--models", default=None, help="comma-separated catalog models")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (about 30 s on a GPU)")
    a = ap.parse_args(argv)
    out = os.path.abspath(a.out)
    names = [m.strip() for m in a.models.split(",") if m.strip()] if a.models is not None else None
    try:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ValueError("the profiler needs PyTorch (pip install 'fleetwise[profile]')") from None
        if names is not None and not names:
            raise ValueError(f"--models {a.models!r}: expected comma-separated catalog model names")
        for n in names or []:
            get_model(n)  # an unknown name fails before any timing
        if os.path.isdir(out):
            raise ValueError(f"{a.out}: is a folder; name the file to write")
        # the file is made (empty, hidden, beside the target) before any timing: an unwritable place fails now
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=os.path.dirname(out))
        except OSError as e:
            raise ValueError(f"{a.out}: cannot write ({e.strerror})") from None
    except Exception as e:  # one line, exit 2, as the CLI's bad input
        print(f"error: {e}", file=sys.stderr)
        return 2
    last = [-1.0]

    def step(i: int, n: int, what: str) -> None:
        if i == n or time.perf_counter() - last[0] >= 5.0:  # a progress line every 5 s
            last[0] = time.perf_counter()
            print(f"[{i}/{n}] {what}", file=sys.stderr, flush=True)

    try:
        res = round_profile(run_profile(names, quick=a.quick, on_step=step))
        with os.fdopen(fd, "w") as f:
            umask = os.umask(0o022)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # (mkstemp makes 0600)
            f.write(json.dumps(res, indent=1) + "\n")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    env = res["env"]
    print(f"{a.out}: {len(res['gemm'])} GEMMs, {len(res['attn_prefill'])} prefill and {len(res['attn_decode'])} "
          f"decode attention shapes, {len(res['iterations'])} iterations on {env.get('name')} ({env['device']}) in "
          f"{env['seconds']:.0f} s; {len(res['errors'])} refused or skipped (listed under errors)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
