"""A GPU calibration file: the constants ``fleetwise perf calibrate`` fits from one GPU's profile, as JSON.

It is data, never code: ``load_calibration`` validates every field (pydantic, unknown fields refused, finite
positive numbers) and reports the first problem as one line naming the file and the field. Schema and meaning:
docs/perf-model.md ("The calibration file"). A scenario selects one per deployment
(``deployments[].calibration: FILE``); ``fleetwise perf predict --calibration FILE`` uses it for one iteration.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from fleetwise.strict import StrictModel
from fleetwise.errors import InputError, check_replaceable
from fleetwise.perf.calibration import (
    ATTN_KINDS,
    SMALL_OPS,
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
from fleetwise.perf.profile_data import format_validation_error, read_json

FORMAT = "fleetwise-perf-calibration/1"

Dim = Field(ge=1, le=2**31)  # a GEMM shape's features or tokens
# efficiencies: fractions of the GPU's peak; a CPU profile fitted as a GPU reaches ~7e-5, and a value far below
# that (a denormal 5e-324 was accepted) turned every iteration into Infinity seconds
EFF_MIN = 1e-8  # (below the fit's own lower bounds, 1e-7 and 1e-6: whatever perf calibrate writes loads)


class _Strict(StrictModel):  # no unknown fields, NaN, infinity or true for a number
    pass


class GemmJ(_Strict):
    eff_compute: float = Field(ge=EFF_MIN, le=2)
    eff_mem: float = Field(ge=EFF_MIN, le=2)
    wave_quant: float = Field(ge=0, le=1)
    k_pad: float = Field(ge=0, le=1e5)
    t0_s: float = Field(ge=0, le=1)


class GemmShapeJ(_Strict):
    N: int = Dim
    K: int = Dim
    M: list[int] = Field(min_length=1, max_length=4096)
    factor: list[float] = Field(min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _check(self) -> GemmShapeJ:
        if len(self.M) != len(self.factor):
            raise ValueError(f"M has {len(self.M)} entries but factor has {len(self.factor)}")
        if any(not 0 < m <= 2**31 for m in self.M) or any(b <= a for a, b in zip(self.M, self.M[1:])):
            raise ValueError("M must be positive (at most 2^31) and strictly increasing")
        if any(not (0.01 < f < 100) for f in self.factor):
            raise ValueError("factor values must lie in (0.01, 100)")
        return self


class SmallJ(_Strict):
    t0_s: float = Field(ge=0, le=1)
    eff_mem: float = Field(ge=EFF_MIN, le=10)


class PrefillJ(_Strict):
    t0_s: float = Field(ge=0, le=1)
    eff_compute: float = Field(ge=EFF_MIN, le=2)
    block_q: float = Field(ge=1, le=1e5)
    pnorm: float = Field(ge=0.2, le=20)
    causal_skip: float = Field(default=1.0, ge=0, le=1)


class DecodeJ(_Strict):
    t0_s: float = Field(ge=0, le=1)
    seq_bytes: float = Field(ge=0, le=1e12)
    eff_mem: float = Field(ge=EFF_MIN, le=10)
    parallel: float = Field(gt=0, le=1e7)
    pnorm: float = Field(ge=0.2, le=20)


class BackendJ(_Strict):
    family: Literal["flash-attention-2", "cudnn", "mem-efficient", "math", "other"]
    prefill: PrefillJ | None = None
    chunked: PrefillJ | None = None
    decode: DecodeJ | None = None


class AttentionJ(_Strict):
    default: dict[Literal["prefill", "chunked", "decode"], str]
    backends: dict[str, BackendJ] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> AttentionJ:
        for kind in ATTN_KINDS:
            b = self.default.get(kind)  # type: ignore[call-overload]
            if b is None:
                raise ValueError(f"default has no backend for {kind}")
            if b not in self.backends:
                raise ValueError(f"default {kind} backend {b!r} is not in backends ({', '.join(self.backends)})")
            if getattr(self.backends[b], kind) is None:
                raise ValueError(f"default {kind} backend {b!r} has no {kind} kernel")
        return self


class CalibrationJ(_Strict):
    format: Literal["fleetwise-perf-calibration/1"]
    gpu: str = Field(min_length=1)
    source: str = ""
    sms: int = Field(ge=1, le=100_000)
    gemm: GemmJ
    gemm_shapes: list[GemmShapeJ] = Field(default_factory=list, max_length=10_000)
    small_ops: dict[Literal[SMALL_OPS], SmallJ] | None = None  # type: ignore[valid-type]
    attention: AttentionJ

    @model_validator(mode="after")
    def _check(self) -> CalibrationJ:
        if self.small_ops is not None and set(self.small_ops) != set(SMALL_OPS):
            missing = sorted(set(SMALL_OPS) - set(self.small_ops))
            raise ValueError(f"small_ops misses {', '.join(missing)}")
        seen = set()
        for s in self.gemm_shapes:
            if (s.N, s.K) in seen:
                raise ValueError(f"gemm_shapes lists N={s.N} K={s.K} twice")
            seen.add((s.N, s.K))
        return self


def to_gpu_calibration(c: CalibrationJ) -> GpuCalibration:
    from fleetwise.catalog import get_gpu

    def pk(x: PrefillJ | None) -> PrefillKernel | None:
        return PrefillKernel(**x.model_dump()) if x is not None else None

    return GpuCalibration(
        gpu=get_gpu(c.gpu).name,
        sms=c.sms,
        gemm=GemmParams(**c.gemm.model_dump()),
        gemm_shapes={(s.N, s.K): GemmShape(tuple(math.log(m) for m in s.M), tuple(math.log(f) for f in s.factor))
                     for s in c.gemm_shapes},
        small={k: SmallOpParams(**v.model_dump()) for k, v in c.small_ops.items()} if c.small_ops else None,
        backends={name: AttentionBackend(family=b.family, prefill=pk(b.prefill), chunked=pk(b.chunked),
                                         decode=DecodeKernel(**b.decode.model_dump()) if b.decode else None)
                  for name, b in c.attention.backends.items()},
        default_backend=dict(c.attention.default),
        source=c.source,
    )


def from_gpu_calibration(g: GpuCalibration) -> dict:
    """The JSON object of a GpuCalibration (rounded to 6 significant digits)."""

    def r(x: float) -> float:
        return float(f"{x:.6g}")

    def d(obj) -> dict | None:
        return None if obj is None else {k: r(v) for k, v in vars(obj).items()}

    out = {
        "format": FORMAT,
        "gpu": g.gpu,
        "source": g.source,
        "sms": g.sms,
        "gemm": d(g.gemm),
        "gemm_shapes": [{"N": N, "K": K, "M": [round(math.exp(x)) for x in s.log_m],
                         "factor": [r(math.exp(y)) for y in s.log_factor]}
                        for (N, K), s in sorted(g.gemm_shapes.items())],
        "small_ops": {k: d(v) for k, v in g.small.items()} if g.small else None,
        "attention": {
            "default": dict(g.default_backend),
            "backends": {name: {"family": b.family, "prefill": d(b.prefill), "chunked": d(b.chunked),
                                "decode": d(b.decode)} for name, b in g.backends.items()},
        },
    }
    return out


def parse_calibration(data, where: str = "calibration") -> GpuCalibration:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object at the top level, got {type(data).__name__}")
    try:
        c = CalibrationJ.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(e, where)) from None
    try:
        return to_gpu_calibration(c)
    except InputError as e:
        raise InputError(f"{where}: gpu: {e}") from None


def load_gpu_calibration(path: str | Path) -> GpuCalibration:
    return parse_calibration(read_json(path, "calibration"), where=str(path))


def load_calibration(path: str | Path, base: Calibration | None = None) -> Calibration:
    """The default calibration (or ``base``) with the GPU calibration in ``path`` attached to its GPU."""
    return (base or default_calibration()).with_gpu(load_gpu_calibration(path))


def write_calibration(g: GpuCalibration, path: str | Path, source: str = "") -> None:
    """Write atomically (a temporary file renamed over ``path``), so a failure leaves nothing half-written.
    ``source`` (the profile it was fitted from) is named when the fit is not a calibration that loads."""
    p = Path(path)
    text = re.sub(r"\[\s*([-+0-9.e,\s]+?)\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]",
                  json.dumps(from_gpu_calibration(g), indent=1)) + "\n"  # number lists on one line
    where = f"{source}: the calibration fitted from it" if source else "calibration being written"
    parse_calibration(json.loads(text), where=where)  # what we write must load
    check_replaceable(p)
    tmp = p.with_name(p.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(p)
    except OSError as e:
        raise InputError(f"{p}: cannot write ({e.strerror or e})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
