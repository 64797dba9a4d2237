"""CPU-utilisation series: the PlanetLab VM traces (as distributed with CloudSim) and any user CSV.

Every reader returns utilisation as a float64 array of fractions in [0, 1], one value per sample (PlanetLab:
one per 5-minute window, 288 per VM-day). A malformed file raises :class:`~fleetwise.errors.InputError` with
one line naming the file, the row and what was expected.

Accepted formats (``read_cpu_series``)
--------------------------------------
* **PlanetLab** (CloudSim ``workload/planetlab/<day>/<vm>``): no header, one integer per line, percent 0–100.
* **CSV with a header**: the first column whose name (case-insensitive, spaces/dashes/brackets ignored) is one
  of :data:`CPU_COLUMNS` holds the utilisation, e.g. ``timestamp,cpu_util`` or Azure's
  ``avg cpu``. Scale: a column whose name contains ``percent``, ``pct`` or ``%`` is percent (0–100); otherwise
  ``scale="auto"`` reads the series as percent if any value exceeds 1, else as a fraction (0–1).
  ``scale="percent"`` / ``"fraction"`` forces one.
* **Headerless single-column numbers** (one value per line): as above with ``scale="auto"``; integers only
  (PlanetLab) are always percent.

``read_cpu_traces(path)`` takes a file, a folder (every regular file in it, sorted by name, hidden files
skipped) or a ``.tar.gz`` / ``.tgz`` archive (every regular member), and returns ``{name: series}``.
``planetlab_days()`` reads the 10-day PlanetLab archive in place (``tarfile``; nothing is unpacked).
"""

from __future__ import annotations

import csv
import io
import math
import re
import tarfile
from pathlib import Path
from typing import Iterable

import numpy as np

from fleetwise.errors import InputError

__all__ = [
    "CPU_COLUMNS", "PLANETLAB", "parse_cpu_text", "read_cpu_series", "read_cpu_traces", "planetlab_days",
    "planetlab_archive",
]

PLANETLAB = "planetlab-cpu-cloudsim"
ARCHIVE = "planetlab_10days.tar.gz"

# Recognised column names after normalisation (lower case; spaces, '-', '_', '[', ']', '(', ')' removed).
CPU_COLUMNS = (
    "cpu", "cpuutil", "cpuutilization", "cpuutilisation", "cpuusage", "cpuused", "cpuload",
    "cpupercent", "cpupct", "cpu%", "cpuusage%", "cpuutil%", "cpuutilization%", "percentcpu", "%cpu",
    "avgcpu", "meancpu", "cpuavg", "cpumean", "utilization", "utilisation", "util", "usage",
)
_PERCENT_HINT = ("percent", "pct", "%")


def _norm_col(name: str) -> str:
    return re.sub(r"[\s\-_\[\]()]+", "", name.strip().lower())


def _scale_series(where: str, vals: np.ndarray, rows: list[int], scale: str) -> np.ndarray:
    if scale == "auto":
        scale = "percent" if len(vals) and float(vals.max()) > 1.0 else "fraction"
    hi = 100.0 if scale == "percent" else 1.0
    bad = np.flatnonzero((vals < 0.0) | (vals > hi))
    if len(bad):
        i = int(bad[0])
        unit = "percent 0-100" if scale == "percent" else "a fraction 0-1"
        raise InputError(f"{where} row {rows[i]}: CPU utilisation {vals[i]:g} is out of range (expected {unit})")
    return vals / hi


def _float(where: str, row: int, s: str, col: str) -> float:
    try:
        x = float(s)
    except ValueError:
        raise InputError(f"{where} row {row}: {col} {s.strip()!r} is not a number "
                         f"(expected CPU utilisation, percent 0-100 or fraction 0-1)") from None
    if not math.isfinite(x):
        raise InputError(f"{where} row {row}: {col} {s.strip()!r} is not a finite number")
    return x


def parse_cpu_text(text: str, where: str, scale: str = "auto") -> np.ndarray:
    """Parse one trace's text (see the module docstring); ``where`` names it in error messages."""
    if scale not in ("auto", "percent", "fraction"):
        raise InputError(f"scale={scale!r}: expected auto, percent or fraction")
    lines = [ln for ln in text.splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or not any(ln.strip() for ln in lines):
        raise InputError(f"{where}: empty file (expected CPU utilisation values, one per line, or a CSV with a "
                         f"CPU column such as cpu_util)")
    first = lines[0].strip()
    try:
        float(first.split(",")[0])
        has_header = False
    except ValueError:
        has_header = True
    if not has_header:
        # one value per line (PlanetLab); a CSV without a header must have exactly one column
        vals, rows, all_int = [], [], True
        for i, ln in enumerate(lines, start=1):
            s = ln.strip()
            if not s:
                raise InputError(f"{where} row {i}: empty line (expected one CPU utilisation value per line)")
            if "," in s:
                raise InputError(f"{where} row {i}: {s!r} has several fields but the file has no header "
                                 f"(expected a header naming the CPU column, e.g. cpu_util)")
            x = _float(where, i, s, "value")
            all_int = all_int and x == int(x) and "." not in s
            vals.append(x)
            rows.append(i)
        arr = np.asarray(vals, float)
        if scale == "auto" and all_int:
            scale = "percent"
        return _scale_series(where, arr, rows, scale)
    reader = csv.reader(io.StringIO("\n".join(lines)))
    header = next(reader)
    col = None
    for j, h in enumerate(header):
        if _norm_col(h) in CPU_COLUMNS:
            col = j
            break
    if col is None:
        raise InputError(f"{where} header: no CPU-utilisation column (found {', '.join(h.strip() for h in header)}; "
                         f"expected one of cpu, cpu_util, cpu_utilization, cpu_usage, cpu_percent, avg cpu, "
                         f"utilization, util, usage)")
    name = header[col].strip()
    if scale == "auto" and any(k in name.lower() for k in _PERCENT_HINT):
        scale = "percent"
    vals, rows = [], []
    for i, r in enumerate(reader, start=1):
        if not any(x.strip() for x in r):
            continue
        if col >= len(r):
            raise InputError(f"{where} row {i}: missing field {name} (row has {len(r)} fields)")
        vals.append(_float(where, i, r[col], name))
        rows.append(i)
    if not vals:
        raise InputError(f"{where}: header but no data rows (expected CPU utilisation values in column {name})")
    return _scale_series(where, np.asarray(vals, float), rows, scale)


def _read_text(p: Path) -> str:
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text (expected CPU utilisation values or a CSV)") from None
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None


def read_cpu_series(path: str | Path, scale: str = "auto") -> np.ndarray:
    """One CPU-utilisation series (fractions 0–1) from a PlanetLab file or a CSV with a CPU column."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: file not found")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file")
    return parse_cpu_text(_read_text(p), str(p), scale)


def _is_archive(p: Path) -> bool:
    return p.name.endswith((".tar.gz", ".tgz", ".tar"))


def _read_tar(p: Path, prefix: str = "", scale: str = "auto", max_series: int | None = None,
              names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    want = None if names is None else set(names)
    out: dict[str, np.ndarray] = {}
    try:
        with tarfile.open(p, "r:*") as tf:
            for m in tf:
                if not m.isfile():
                    continue
                base = m.name.rsplit("/", 1)[-1]
                if base.startswith(".") or base.upper() == "PROVENANCE.MD" or not m.name.startswith(prefix):
                    continue
                if want is not None and m.name not in want:
                    continue
                f = tf.extractfile(m)
                assert f is not None
                try:
                    text = f.read().decode("utf-8")
                except UnicodeDecodeError:
                    raise InputError(f"{p}:{m.name}: not UTF-8 text") from None
                out[m.name] = parse_cpu_text(text, f"{p}:{m.name}", scale)
                if max_series is not None and len(out) >= max_series:
                    break
    except (tarfile.TarError, OSError, EOFError) as e:
        raise InputError(f"{p}: cannot read as a tar archive ({type(e).__name__}: {e})") from None
    if not out:
        raise InputError(f"{p}: no trace files{' under ' + prefix if prefix else ''} in the archive")
    return out


def read_cpu_traces(path: str | Path, scale: str = "auto", max_series: int | None = None) -> dict[str, np.ndarray]:
    """``{name: series}`` from a file, a folder of files or a tar(.gz) archive (see the module docstring)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: file or folder not found")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                       and f.name.upper() != "PROVENANCE.MD")
        if not files:
            raise InputError(f"{p}: folder holds no trace files")
        files = files[:max_series] if max_series is not None else files
        return {f.name: read_cpu_series(f, scale) for f in files}
    if _is_archive(p):
        return _read_tar(p, scale=scale, max_series=max_series)
    return {p.name: read_cpu_series(p, scale)}


def planetlab_archive() -> Path:
    from fleetwise.data import data_path

    return data_path(PLANETLAB, ARCHIVE)


def planetlab_days(days: Iterable[str] | None = None, max_vms: int | None = None,
                   archive: str | Path | None = None) -> dict[str, dict[str, np.ndarray]]:
    """``{day: {vm: series}}`` read from the 10-day PlanetLab archive without unpacking it.

    ``days``: day folder names (``"20110303"``...), all ten when None. ``max_vms``: the first ``max_vms`` VMs of
    each day by name (the archive is sorted by name)."""
    p = Path(archive) if archive is not None else planetlab_archive()
    want = None if days is None else {str(d) for d in days}
    out: dict[str, dict[str, np.ndarray]] = {}
    try:
        with tarfile.open(p, "r:*") as tf:
            for m in tf:
                if not m.isfile() or "/" not in m.name:
                    continue
                day, vm = m.name.split("/", 1)
                day = day.lstrip("./") or day
                if want is not None and day not in want:
                    continue
                d = out.setdefault(day, {})
                if max_vms is not None and len(d) >= max_vms:
                    continue
                f = tf.extractfile(m)
                assert f is not None
                d[vm] = parse_cpu_text(f.read().decode("utf-8", "replace"), f"{p}:{m.name}", "percent")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise InputError(f"{p}: cannot read as a tar archive ({type(e).__name__}: {e})") from None
    if want is not None:
        missing = sorted(want - set(out))
        if missing:
            raise InputError(f"{p}: day(s) {', '.join(missing)} not in the archive (found {', '.join(sorted(out))})")
    return out
