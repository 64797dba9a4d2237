"""Where the real public datasets live.

The project never ships them. They are looked up in ``$FLEETWISE_DATA`` if set, else in ``shared/data``
beside (or above) the current checkout. See docs/data.md for the public source of each folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from fleetwise.errors import InputError

ENV_VAR = "FLEETWISE_DATA"


def data_dir(required: bool = True) -> Path | None:
    """Return the folder holding the real datasets (``azure-llm-inference-2023/`` etc.)."""
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            return p
        if required:
            raise InputError(f"{ENV_VAR}={env}: not a directory")
        return None
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *Path.cwd().parents, *here.parents]:
        for cand in (base / "shared" / "data", base.parent / "shared" / "data"):
            if (cand / "azure-llm-inference-2023").is_dir():
                return cand
    if required:
        raise InputError(f"real datasets not found: set {ENV_VAR} to the folder that holds azure-llm-inference-2023/")
    return None


def data_path(*parts: str) -> Path:
    """Path to a file or folder inside the data directory; a clear error if it is missing."""
    root = data_dir()
    assert root is not None
    p = root.joinpath(*parts)
    if not p.exists():
        raise InputError(f"{p}: file not found (dataset folder {root})")
    return p
