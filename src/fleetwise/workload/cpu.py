"""CPU-utilisation series: the PlanetLab VM traces (as distributed with CloudSim) and the CPU files users have.

Every reader returns utilisation as float64 arrays of fractions in [0, 1], one value per sample (PlanetLab:
one per 5-minute window, 288 per VM-day). A malformed file raises :class:`~fleetwise.errors.InputError` with
one line naming the file, the row, the delimiter it read the row with and what was expected.

Accepted files (``read_cpu_traces`` / ``read_cpu_series``)
---------------------------------------------------------
* **Delimiters** are sniffed from the first lines: comma, semicolon, tab, the mixed ``;<tab>`` of the
  Bitbrains GWA-T-12 traces, or runs of spaces. Fields are stripped of surrounding blanks.
* **Compression**: a ``.gz`` file (or any gzip stream) is decompressed on the fly.
* **PlanetLab** (CloudSim ``workload/planetlab/<day>/<vm>``): no header, one integer per line, percent 0–100.
* **A header** is a first row in which no field is a number. The CPU column is ``column=`` (a header name, or a
  1-based index as ``cut -f`` counts) or else the first column whose normalised name (lower case; spaces,
  ``-``, ``_``, brackets removed) is one of :data:`CPU_COLUMNS`: e.g. ``cpu_util``, Azure's ``avg cpu``,
  Bitbrains' ``CPU usage [%]``, Alibaba's ``cpu_util_percent``.
* **Headerless numbers**: one column (one value per line), or several columns with ``column=N`` (1-based).
* **Alibaba cluster-trace 2018 ``machine_usage.csv``** (no header; ``machine_id, time_stamp,
  cpu_util_percent, mem_util_percent, mem_gps, mkpi, net_in, net_out, disk_io_percent``; recognised by a first
  field like ``m_1932``): one series per machine, samples sorted by ``time_stamp``.
* **Several machines in one file**: a header column named ``machine_id`` (or ``machine``, ``vm_id``, ``vm``,
  ``instance_id``, ``host_id``, ``container_id``, ``container_ip``, ``container``, ``pod_id``, ``pod_name``,
  ``pod``) splits the file into one series per id, named ``<file>:<id>``.
* **Timestamps**: a header column named ``timestamp`` / ``time_stamp`` / ``time`` / ``ts`` or starting with
  ``timestamp`` (milliseconds when the name says ``ms``, e.g. Bitbrains' ``Timestamp [ms]``; otherwise seconds)
  orders the samples; with
  ``window_s`` the samples are averaged into windows of that length (windows without a sample are left out).
* **Scale**: a column whose name contains ``percent``, ``pct`` or ``%`` is percent (0–100); otherwise
  ``scale="auto"`` reads the series as percent if any value exceeds 1, else as a fraction (0–1); integer-only
  headerless files are percent. ``scale="percent"`` / ``"fraction"`` forces one.

``read_cpu_traces(path)`` takes a file, a folder (every regular file below it, recursively, sorted by relative
path; hidden files and PROVENANCE.md skipped) or a ``.tar.gz`` / ``.tgz`` archive (every regular member), and
returns ``{name: series}``. ``planetlab_days()`` reads the 10-day PlanetLab archive in place (``tarfile``;
nothing is unpacked).
"""

from __future__ import annotations

import csv
import gzip
import math
import re
import tarfile
import zlib
from pathlib import Path
from typing import Iterable

import numpy as np

from fleetwise.errors import InputError

__all__ = [
    "CPU_COLUMNS", "PLANETLAB", "parse_cpu_text", "parse_cpu_table", "read_cpu_series", "read_cpu_traces",
    "planetlab_days", "planetlab_archive",
]

PLANETLAB = "planetlab-cpu-cloudsim"
ARCHIVE = "planetlab_10days.tar.gz"

# Recognised column names after normalisation (lower case; spaces, '-', '_', '[', ']', '(', ')' removed).
CPU_COLUMNS = (
    "cpu", "cpuutil", "cpuutilization", "cpuutilisation", "cpuusage", "cpuused", "cpuload",
    "cpupercent", "cpupct", "cpu%", "cpuusage%", "cpuutil%", "cpuutilization%", "percentcpu", "%cpu",
    "cpuutilpercent", "cpuusagepercent", "cpuutilizationpercent", "cpuutilisationpercent", "cpupercentage",
    "avgcpu", "meancpu", "cpuavg", "cpumean", "utilization", "utilisation", "util", "usage",
)
ID_COLUMNS = ("machineid", "machine", "vmid", "vm", "instanceid", "hostid", "containerid", "containerip", "container",
              "podid", "podname", "pod")
TIME_COLUMNS = ("timestamp", "timestampms", "timestamps", "time", "times", "timems", "ts")  # or any "timestamp..."
_PERCENT_HINT = ("percent", "pct", "%")
_ALIBABA_ID = re.compile(r"^m_\d+$")
ALIBABA_2018_COLUMNS = ("machine_id", "time_stamp", "cpu_util_percent", "mem_util_percent", "mem_gps", "mkpi",
                        "net_in", "net_out", "disk_io_percent")

# delimiter name -> how a line is split
_DELIMS = {"semicolon": ";", "tab": "\t", "comma": ",", "spaces": " "}


def _norm_col(name: str) -> str:
    return re.sub(r"[\s\-_\[\]()]+", "", name.strip().lower())


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


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


def _sniff(lines: list[str]) -> tuple[str, str | None]:
    """(name, delimiter) for the file's lines: the first of semicolon, tab, comma that splits the first lines
    into the same number (> 1) of fields; a line with both ';' and a tab is the mixed ``;<tab>`` (split at ';',
    fields stripped). ("none", None) when no delimiter splits them consistently."""
    sample = [ln for ln in lines[:20] if ln.strip()]
    for name in ("semicolon", "tab", "comma"):
        d = _DELIMS[name]
        counts = {ln.count(d) for ln in sample}
        if len(counts) == 1 and counts.pop() > 0:
            if name == "semicolon" and all("\t" in ln for ln in sample):
                return "semicolon+tab", ";"
            return name, d
    counts = {len(ln.split()) for ln in sample}
    if len(counts) == 1 and counts.pop() > 1:
        return "spaces", " "
    # not consistent: the delimiter of the first line (errors then name the row that differs)
    first = sample[0] if sample else ""
    for name in ("semicolon", "tab", "comma"):
        if _DELIMS[name] in first:
            return name, _DELIMS[name]
    return "none", None


def _split_rows(text_lines: list[str], delim: str | None) -> list[list[str]]:
    if delim is None:  # no delimiter: the whole line is one field
        return [[ln.strip()] for ln in text_lines]
    if delim == " ":
        return [ln.split() for ln in text_lines]
    return [[f.strip() for f in r] for r in csv.reader(text_lines, delimiter=delim)]


def _pick(header: list[str], column: str | int | None, names: tuple[str, ...], where: str, what: str,
          required: bool, sep: str = "") -> int | None:
    if column is not None:
        return _column_index(header, column, where)
    for j, h in enumerate(header):
        if _norm_col(h) in names:
            return j
    if names is TIME_COLUMNS:
        for j, h in enumerate(header):
            if _norm_col(h).startswith("timestamp"):
                return j
    if required:
        raise InputError(f"{where} header: no {what} column (found {', '.join(h.strip() for h in header)}{sep}; "
                         f"expected one of cpu, cpu_util, cpu_utilization, cpu_usage, cpu_percent, cpu_util_percent, "
                         f"avg cpu, CPU usage [%], utilization, util, usage; or pass column=NAME)")
    return None


def _column_index(header: list[str] | None, column: str | int, where: str) -> int:
    """A 1-based index (int or digits) or a header name -> 0-based index."""
    s = str(column).strip()
    if s.isascii() and s.isdigit():  # (isdigit alone takes '²')
        j = int(s) - 1
        if j < 0:
            raise InputError(f"{where}: column {column!r}: expected a 1-based index (1 = first column) or a name")
        return j
    if header is None:
        raise InputError(f"{where}: column {column!r} names a header column but the file has no header "
                         f"(pass a 1-based index)")
    want = _norm_col(s)
    for j, h in enumerate(header):
        if _norm_col(h) == want:
            return j
    raise InputError(f"{where} header: no column {column!r} (found {', '.join(header)})")


def _window(t: np.ndarray, v: np.ndarray, window_s: float) -> np.ndarray:
    """Mean of the samples in each ``window_s`` window from the first sample (windows without one left out)."""
    k = np.floor((t - t[0]) / window_s).astype(np.int64)
    uniq, inv = np.unique(k, return_inverse=True)
    return np.bincount(inv, weights=v) / np.bincount(inv)


def parse_cpu_table(text: str, where: str, scale: str = "auto", column: str | int | None = None,
                    window_s: float | None = None) -> dict[str, np.ndarray]:
    """Parse one file's text (see the module docstring) into ``{machine id: series}`` ("" for a file that holds
    one series); ``where`` names the file in error messages."""
    if scale not in ("auto", "percent", "fraction"):
        raise InputError(f"scale={scale!r}: expected auto, percent or fraction")
    if window_s is not None and not (window_s > 0 and math.isfinite(window_s)):
        raise InputError(f"window_s={window_s!r}: expected a number of seconds > 0")
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    lead = 0
    while lead < len(lines) and not lines[lead].strip():
        lead += 1
    lines = lines[lead:]
    if not lines or not any(ln.strip() for ln in lines):
        raise InputError(f"{where}: empty file (expected CPU utilisation values, one per line, or a CSV with a "
                         f"CPU column such as cpu_util)")
    dname, delim = _sniff(lines)
    sep = f" (read as {dname}-separated)" if dname != "none" else ""
    first = _split_rows(lines[:1], delim)[0]
    has_header = not any(_is_number(f) for f in first if f)
    alibaba = (not has_header and len(first) >= 3 and bool(_ALIBABA_ID.match(first[0])))
    header: list[str] | None = None
    body = lines
    if has_header:
        header, body = first, lines[1:]
        if len(header) == 1 and dname == "none" and column is None and _norm_col(header[0]) not in CPU_COLUMNS:
            raise InputError(f"{where} header: no CPU-utilisation column (found {header[0].strip()!r} as the only "
                             f"field: no comma, semicolon or tab delimiter found; expected a column such as "
                             f"cpu_util, or pass column=NAME)")
    elif alibaba:
        header = list(ALIBABA_2018_COLUMNS[: len(first)]) + [f"col{j + 1}" for j in range(len(ALIBABA_2018_COLUMNS),
                                                                                             len(first))]
    if header is not None:
        col = _pick(header, column, CPU_COLUMNS, where, "CPU-utilisation", True, sep)
        if col >= len(header):
            raise InputError(f"{where}: column {column} (1-based) is past the last of the {len(header)} columns"
                             f"{sep}")
        id_col = _pick(header, None, ID_COLUMNS, where, "id", False)
        t_col = _pick(header, None, TIME_COLUMNS, where, "time", False)
        name = header[col].strip()
        t_scale = 1e-3 if t_col is not None and "ms" in header[t_col].lower() else 1.0
        if scale == "auto" and any(k in name.lower() for k in _PERCENT_HINT):
            scale = "percent"
    else:
        ncol = len(first)
        if column is None and ncol > 1:
            raise InputError(f"{where} row 1: {ncol} fields{sep} and no header (expected one value per line, a "
                             f"header naming the CPU column such as cpu_util, or column=N, 1-based)")
        col = 0 if column is None else _column_index(None, column, where)
        if col >= ncol:
            raise InputError(f"{where} row 1: column {col + 1} (1-based) is past the last of {ncol} fields{sep}")
        id_col = t_col = None
        name, t_scale = "value" if ncol == 1 else f"column {col + 1}", 1.0
    rows_all = _split_rows(body, delim)
    vals: list[float] = []
    rows: list[int] = []
    ids: list[str] = []
    ts: list[float] = []
    all_int = True
    width = len(header) if header is not None else len(first)
    base = 0 if has_header else lead  # rows: data rows after a header, else line numbers
    for i, r in enumerate(rows_all, start=1):
        row = i + base
        if not any(x for x in r):
            if header is None and not has_header:
                raise InputError(f"{where} row {row}: empty line (expected one CPU utilisation value per line)")
            continue
        if header is None and len(r) != width:
            raise InputError(f"{where} row {row}: {len(r)} fields{sep}, but row 1 has {width} "
                             f"(expected the same columns on every row)")
        if col >= len(r):
            raise InputError(f"{where} row {row}: missing field {name} (row has {len(r)} fields{sep})")
        s = r[col]
        if not s:
            raise InputError(f"{where} row {row}: {name} is empty (expected CPU utilisation)")
        x = _float(where, row, s, name)
        all_int = all_int and x == int(x) and "." not in s and "e" not in s.lower()
        vals.append(x)
        rows.append(row)
        if id_col is not None:
            if id_col >= len(r):
                raise InputError(f"{where} row {row}: missing field {header[id_col]} (row has {len(r)} fields{sep})")
            ids.append(r[id_col])
        if t_col is not None:
            if t_col >= len(r):
                raise InputError(f"{where} row {row}: missing field {header[t_col]} (row has {len(r)} fields{sep})")
            ts.append(_float(where, row, r[t_col], header[t_col].strip()) * t_scale)
    if not vals:
        raise InputError(f"{where}: header but no data rows (expected CPU utilisation values in column {name})")
    if scale == "auto" and header is None and all_int:
        scale = "percent"
    arr = _scale_series(where, np.asarray(vals, float), rows, scale)
    keys = np.asarray(ids) if ids else np.full(len(arr), "", dtype=object)
    tarr = np.asarray(ts, float) if ts else None
    out: dict[str, np.ndarray] = {}
    for k in dict.fromkeys(keys.tolist()):
        m = keys == k if ids else np.ones(len(arr), bool)
        v = arr[m]
        if tarr is not None:
            order = np.argsort(tarr[m], kind="stable")
            v, t = v[order], tarr[m][order]
            if window_s is not None:
                v = _window(t, v, window_s)
        out[str(k)] = v
    return out


def parse_cpu_text(text: str, where: str, scale: str = "auto", column: str | int | None = None,
                   window_s: float | None = None) -> np.ndarray:
    """One series from one file's text (see the module docstring); a file with several machines is an error
    here (``read_cpu_traces`` splits it)."""
    d = parse_cpu_table(text, where, scale, column, window_s)
    if len(d) != 1:
        raise InputError(f"{where}: holds {len(d)} machines' series (read it with read_cpu_traces, which splits "
                         f"them per machine)")
    return next(iter(d.values()))


def _decode(data: bytes, where: str) -> str:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(f"{where}: cannot decompress as gzip ({e})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{where}: not UTF-8 text (expected CPU utilisation values or a CSV)") from None


def _read_text(p: Path) -> str:
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    return _decode(data, str(p))


def read_cpu_series(path: str | Path, scale: str = "auto", column: str | int | None = None,
                    window_s: float | None = None) -> np.ndarray:
    """One CPU-utilisation series (fractions 0–1) from a file holding one (see the module docstring)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: file not found")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file")
    return parse_cpu_text(_read_text(p), str(p), scale, column, window_s)


def _is_archive(p: Path) -> bool:
    return p.name.endswith((".tar.gz", ".tgz", ".tar"))


def _named(name: str, table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name if k == "" else f"{name}:{k}": v for k, v in table.items()}


def _skip(base: str) -> bool:
    return base.startswith(".") or base.upper() == "PROVENANCE.MD"


def _read_tar(p: Path, prefix: str = "", scale: str = "auto", max_series: int | None = None,
              names: Iterable[str] | None = None, column: str | int | None = None,
              window_s: float | None = None) -> dict[str, np.ndarray]:
    want = None if names is None else set(names)
    out: dict[str, np.ndarray] = {}
    try:
        with tarfile.open(p, "r:*") as tf:
            for m in tf:
                if not m.isfile():
                    continue
                base = m.name.rsplit("/", 1)[-1]
                if _skip(base) or not m.name.startswith(prefix):
                    continue
                if want is not None and m.name not in want:
                    continue
                f = tf.extractfile(m)
                assert f is not None
                where = f"{p}:{m.name}"
                out.update(_named(m.name, parse_cpu_table(_decode(f.read(), where), where, scale, column, window_s)))
                if max_series is not None and len(out) >= max_series:
                    break
    except (tarfile.TarError, OSError, EOFError) as e:
        raise InputError(f"{p}: cannot read as a tar archive ({type(e).__name__}: {e})") from None
    if not out:
        raise InputError(f"{p}: no trace files{' under ' + prefix if prefix else ''} in the archive")
    return dict(list(out.items())[:max_series]) if max_series is not None else out


def _trace_files(folder: Path) -> list[Path]:
    """The regular files below ``folder`` (recursively; hidden ones and PROVENANCE.md skipped), at most
    ``limits.MAX_TRACE_FILES``; a folder that cannot be read is an InputError."""
    from fleetwise.limits import MAX_TRACE_FILES

    out = []
    try:
        for f in folder.rglob("*"):
            if f.is_file() and not _skip(f.name) and not any(part.startswith(".") for part in
                                                              f.relative_to(folder).parts):
                out.append(f)
                if len(out) > MAX_TRACE_FILES:
                    raise InputError(f"{folder}: more than {MAX_TRACE_FILES:,} files below it; point --eval-trace "
                                     "at the folder of the traces (docs/limits.md)")
    except OSError as e:
        raise InputError(f"{folder}: cannot read the folder ({e.strerror or e}: {e.filename})") from None
    return out


def read_cpu_traces(path: str | Path, scale: str = "auto", max_series: int | None = None,
                    column: str | int | None = None, window_s: float | None = None) -> dict[str, np.ndarray]:
    """``{name: series}`` from a file, a folder (recursively) or a tar(.gz) archive (see the module docstring).
    A file with several machines gives one series per machine (``<file>:<machine id>``); ``column`` picks the
    CPU column (header name or 1-based index); ``window_s`` averages timestamped samples into windows."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: file or folder not found")
    if p.is_dir():
        files = sorted(_trace_files(p), key=lambda f: f.relative_to(p).as_posix())
        if not files:
            raise InputError(f"{p}: folder holds no trace files (searched its subfolders too)")
        out: dict[str, np.ndarray] = {}
        for f in files:
            if max_series is not None and len(out) >= max_series:
                break
            if _is_archive(f):
                out.update(_read_tar(f, scale=scale, column=column, window_s=window_s))
                continue
            out.update(_named(f.relative_to(p).as_posix(),
                              parse_cpu_table(_read_text(f), str(f), scale, column, window_s)))
        return dict(list(out.items())[:max_series]) if max_series is not None else out
    if not p.is_file():
        raise InputError(f"{p}: not a regular file or a folder (a device, a pipe or a socket)")
    if _is_archive(p):
        return _read_tar(p, scale=scale, max_series=max_series, column=column, window_s=window_s)
    out = _named(p.name, parse_cpu_table(_read_text(p), str(p), scale, column, window_s))
    return dict(list(out.items())[:max_series]) if max_series is not None else out


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
