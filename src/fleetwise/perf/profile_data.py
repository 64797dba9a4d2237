"""Reading a GPU profile: the JSON file ``fleetwise perf profile`` writes (schema: docs/perf-model.md).

The schema is that of the H200 operator timings in ``<data>/h200-operator-timings`` (``env``, ``gemm``,
``attn_prefill``, ``attn_decode``, ``errors``) plus optional sections the profiler adds: ``models`` (the shapes
of models that are not in the catalog, e.g. the tiny one a CPU run times), ``elementwise`` (norms, RoPE,
activation, residual add, embedding) and ``iterations`` (whole decoder iterations, the check). Rows name a model
and a tensor-parallel degree; attention rows take their per-GPU heads from that model's shape.

A profile is data: it is validated on load and every problem is one line naming the file, the row and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from fleetwise.catalog.specs import ModelSpec
from fleetwise.strict import StrictModel
from fleetwise.errors import InputError, format_validation_error, not_a_file  # noqa: F401 (re-exported)
from fleetwise.perf.profile_format import FORMAT, per_gpu_heads  # noqa: F401 (re-exported)

MAX_PROFILE_BYTES = 64 * 2**20  # a profile of every catalog model is a few MB


def read_json(path: str | Path, what: str) -> Any:
    """Parse a JSON file with one-line errors (missing, too large, not JSON)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: {not_a_file(p, what)}")
    if p.stat().st_size > MAX_PROFILE_BYTES:
        raise InputError(f"{p}: {what} file is larger than {MAX_PROFILE_BYTES // 2**20} MB")
    from fleetwise.yamlio import parse_json, read_text

    return parse_json(read_text(p, what), str(p))  # not UTF-8, invalid JSON, a key given twice: one line


class _Strict(StrictModel):  # no unknown fields, NaN, infinity or true for a number
    pass


Dim = Field(ge=1, le=2**31)  # a shape (tokens, features, sequences): beyond 2^31 it is not a GPU's, and floats overflow
Time = Field(ge=1e-9, lt=1e6)  # seconds: no GPU operator takes under a nanosecond or over 11 days


class ModelShape(_Strict):
    """A model that is not in the catalog (fields as ModelSpec)."""

    num_layers: int = Dim
    hidden_size: int = Dim
    num_heads: int = Dim
    num_kv_heads: int = Dim
    ffn_size: int = Dim
    vocab_size: int = Dim
    gated_mlp: bool = True

    @model_validator(mode="after")
    def _check_heads(self) -> ModelShape:  # (head_dim 0 and more KV heads than heads were fitted and written)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) is not a multiple of num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads ({self.num_kv_heads})")
        return self


class GemmRow(_Strict):
    model: str = ""
    tp: int = Field(default=1, ge=1, le=1024)
    op: str
    N: int = Dim
    K: int = Dim
    M: int = Dim
    s: float = Time


Backend = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]  # an attention backend's name, e.g. FLASH_ATTENTION
Times = dict[Backend, float | None]  # backend -> seconds, None where the backend refused the shape


def _check_times(s: Times) -> Times:
    for k, v in s.items():
        if v is not None and not (1e-9 <= v < 1e6):
            raise ValueError(f"time of {k} must be between 1e-9 and 1e6 seconds, got {v}")
    return s


class PrefillRow(_Strict):
    model: str
    tp: int = Field(default=1, ge=1, le=1024)
    q_len: int = Dim
    kv_len: int = Dim
    work: float | None = None
    s: Times
    kv_expanded: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> PrefillRow:
        if self.kv_len < self.q_len:
            raise ValueError(f"kv_len ({self.kv_len}) < q_len ({self.q_len})")
        _check_times(self.s)
        return self


class DecodeRow(_Strict):
    model: str
    tp: int = Field(default=1, ge=1, le=1024)
    B: int = Dim
    C: int = Dim
    s: Times
    kv_expanded: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> DecodeRow:
        _check_times(self.s)
        return self


class ElementwiseRow(_Strict):
    """A small op of one layer (names as perf.calibration.SMALL_OPS) at M tokens."""

    model: str
    tp: int = Field(default=1, ge=1, le=1024)
    op: Literal["input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add", "emb"]
    M: int = Dim
    s: float = Time


class IterationRow(_Strict):
    """A whole iteration of a decoder with ``layers`` layers of ``model``'s per-GPU slice (collectives left out):
    a prefill chunk of ``prefill_tokens`` after ``prefill_context`` cached tokens plus ``decode_seqs`` sequences
    with ``decode_context`` cached tokens; ``s`` is its GPU time."""

    model: str
    tp: int = Field(default=1, ge=1, le=1024)
    layers: int = Field(ge=1, le=10_000)
    prefill_tokens: int = Field(ge=0, le=2**31)
    prefill_context: int = Field(default=0, ge=0, le=2**31)
    decode_seqs: int = Field(ge=0, le=2**31)
    decode_context: int = Field(default=0, ge=0, le=2**31)
    # the attention backends the iteration ran, as the profiler notes them ("prefill=CUDNN_ATTENTION,chunked=...,
    # decode=...,cuda_graph"; None: PyTorch's own choice); a note, not read by the fit or the check
    backend: str | None = Field(None, max_length=256)
    s: float = Time

    @model_validator(mode="after")
    def _check(self) -> IterationRow:
        if self.prefill_tokens + self.decode_seqs == 0:
            raise ValueError("an iteration needs prefill tokens or decoding sequences")
        if self.prefill_context and not self.prefill_tokens:
            raise ValueError("prefill_context without prefill_tokens (no prefilling sequence to hold it)")
        if self.decode_context and not self.decode_seqs:
            raise ValueError("decode_context without decode_seqs (no decoding sequence to hold it)")
        return self


class Profile(_Strict):
    format: str | None = None
    env: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, ModelShape] = Field(default_factory=dict)
    gemm: list[GemmRow] = Field(default_factory=list)
    attn_prefill: list[PrefillRow] = Field(default_factory=list)
    attn_decode: list[DecodeRow] = Field(default_factory=list)
    elementwise: list[ElementwiseRow] = Field(default_factory=list)
    iterations: list[IterationRow] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_env(self) -> Profile:
        sms = self.env.get("sms")
        if sms is not None and not (isinstance(sms, int) and 0 < sms < 100_000):
            raise ValueError(f"env.sms must be a positive integer, got {sms!r}")
        if not (self.gemm or self.attn_prefill or self.attn_decode):
            raise ValueError("no gemm, attn_prefill or attn_decode rows")
        return self

    def model_spec(self, name: str) -> ModelSpec:
        """The shape of a model named in the rows: the profile's own ``models`` entry, else the catalog's."""
        m = self.models.get(name)
        if m is not None:
            return ModelSpec(name=name, num_params=0.0, **m.model_dump())
        from fleetwise.catalog import get_model

        return get_model(name)

    def gpu_name(self) -> str | None:
        """The catalog name of the GPU the profile was measured on, or None (a CPU, an unknown device)."""
        from fleetwise.catalog import get_gpu

        name = self.env.get("name")
        if not isinstance(name, str) or self.env.get("device") == "cpu":
            return None
        try:
            return get_gpu(name).name
        except InputError:
            return None


def parse_profile(data: Any, where: str = "profile") -> Profile:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object at the top level, got {type(data).__name__}")
    try:
        prof = Profile.model_validate(data)
    except ValidationError as e:
        raise InputError(format_validation_error(e, where)) from None
    names = {r.model for rows in (prof.attn_prefill, prof.attn_decode, prof.elementwise, prof.iterations) for r in rows}
    for i, n in enumerate(sorted(names)):
        try:
            spec = prof.model_spec(n)
        except InputError:
            raise InputError(f"{where}: model {n!r} is neither in the catalog nor in the profile's models") from None
        for rows, key in ((prof.attn_prefill, "attn_prefill"), (prof.attn_decode, "attn_decode")):
            for j, r in enumerate(rows):
                if r.model == n and spec.num_heads % r.tp:
                    raise InputError(f"{where}: {key}[{j}]: tp={r.tp} does not divide the {spec.num_heads} heads of {n}")
    return prof


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file (one-line InputError naming the file and the field)."""
    return parse_profile(read_json(path, "profile"), where=str(path))


