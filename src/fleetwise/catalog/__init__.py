"""GPU and model catalogs with case-insensitive lookup (``get_gpu("a100")``, ``get_model("meta-llama/Llama-2-70b-hf")``)."""

from __future__ import annotations

from fleetwise.catalog.gpus import ALL_GPUS, GPU_ALIASES
from fleetwise.catalog.models import ALL_MODELS, MODEL_ALIASES, MODEL_HF_IDS
from fleetwise.catalog.specs import GPUSpec, ModelSpec, Price
from fleetwise.errors import InputError

__all__ = ["GPUS", "MODELS", "GPUSpec", "ModelSpec", "Price", "get_gpu", "get_model"]

GPUS: dict[str, GPUSpec] = {g.name: g for g in ALL_GPUS}
MODELS: dict[str, ModelSpec] = {m.name: m for m in ALL_MODELS}


def _norm(name: str) -> str:
    return " ".join(str(name).strip().lower().split())


_GPU_INDEX: dict[str, str] = {_norm(k): k for k in GPUS}
_GPU_INDEX.update({_norm(a): c for a, c in GPU_ALIASES.items()})

_MODEL_INDEX: dict[str, str] = {_norm(k): k for k in MODELS}
for _canon, _hf in MODEL_HF_IDS.items():
    _MODEL_INDEX[_norm(_hf)] = _canon
    _MODEL_INDEX[_norm(_hf.split("/", 1)[1])] = _canon
_MODEL_INDEX.update({_norm(a): c for a, c in MODEL_ALIASES.items()})


def _lookup(kind: str, name: str, index: dict[str, str], table: dict) -> object:
    if isinstance(name, str):
        key = _norm(name)
        canon = index.get(key)
        if canon is None:  # tolerate "_" for "-" and a trailing "-hf"
            alt = key.replace("_", "-")
            canon = index.get(alt) or index.get(alt.removesuffix("-hf"))
        if canon is not None:
            return table[canon]
    raise InputError(f"unknown {kind} {name!r}; expected one of: {', '.join(table)}")


def get_gpu(name: str) -> GPUSpec:
    """Catalog entry for a GPU name or alias (case-insensitive); InputError for an unknown name."""
    return _lookup("GPU", name, _GPU_INDEX, GPUS)  # type: ignore[return-value]


def get_model(name: str) -> ModelSpec:
    """Catalog entry for a model name, alias or Hugging Face id (case-insensitive); InputError if unknown."""
    return _lookup("model", name, _MODEL_INDEX, MODELS)  # type: ignore[return-value]
