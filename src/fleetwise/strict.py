"""``StrictModel``: the pydantic base of every file a user writes (scenario, experiment, workload, fleet,
calibration and profile files): unknown fields, NaN and infinity are refused, and so is ``true`` / ``false`` where
a number is expected (pydantic reads them as 1 and 0: ``replicas: yes`` in YAML ran one replica)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

_NUMBERS = (int, float)


def _numeric(annotation: Any) -> bool:
    """A number type, or a union of one with others but not with bool (``int | None`` yes, ``bool | int`` no)."""
    if annotation in _NUMBERS:
        return True
    if typing.get_origin(annotation) is typing.Annotated:  # Annotated[float, Field(...)] (`load: yes` was 1.0)
        return _numeric(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return bool not in args and any(_numeric(a) for a in args)
    return False


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # no NaN or infinity in any number

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fields = cls.model_fields
            for k, v in data.items():
                if isinstance(v, bool) and k in fields and _numeric(fields[k].annotation):
                    raise ValueError(f"{k}: expected a number, got {str(v).lower()}")
        return data
