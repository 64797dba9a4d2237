"""Readers for public LLM request traces.

Every reader returns a :class:`~fleetwise.workload.request.Workload` sorted by arrival, with arrival times in
seconds starting at 0 (the first timestamp is subtracted). Every row is validated; a bad row raises
:class:`~fleetwise.errors.InputError` whose one-line message names the file, the row (1-based data row; the
header is not counted) or line, the column, and what was expected.

Supported formats
-----------------
* Azure LLM inference trace 2023 (Splitwise): ``TIMESTAMP,ContextTokens,GeneratedTokens``   -> :func:`read_azure`
* Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` -> :func:`read_mooncake`
* Vidur processed length CSV: ``num_prefill_tokens,num_decode_tokens,...`` (no arrivals)    -> :func:`read_vidur_lengths`
* BurstGPT CSV: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``   -> :func:`read_burstgpt`
* ServeGen per-client rate series (``chunk-<i>-trace.csv[.gz]``)                            -> :func:`read_servegen`
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from fleetwise.errors import InputError, short_repr
from fleetwise.limits import MAX_CV, MAX_LINE_CHARS, MAX_REQUESTS, MAX_SPAN_S, MAX_TOKENS
from fleetwise.workload.request import Workload

__all__ = [
    "read_azure",
    "read_mooncake",
    "read_vidur_lengths",
    "read_burstgpt",
    "read_servegen",
    "ServeGenRates",
    "servegen_arrivals",
    "servegen_workload",
]


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _check_file(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: file not found")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file")
    return p


def open_text(p: Path) -> io.TextIOBase:
    """UTF-8 text (a byte-order mark, as spreadsheet tools write, dropped), maybe gzipped; newlines kept for csv."""
    if p.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8-sig", newline="")
    return open(p, "r", encoding="utf-8-sig", newline="")


def bounded_lines(f, p: Path) -> Iterator:
    """The lines of ``f`` (text or bytes), each at most ``MAX_LINE_CHARS`` long: a longer one is an InputError
    before it is read whole (a gzipped line of 2 GB took 4 GB of memory)."""
    n = 0
    while True:
        line = f.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE_CHARS:
            raise InputError(f"{p.name} line {n}: longer than {MAX_LINE_CHARS:,} characters, the limit for a line of a "
                             "trace (docs/limits.md)")
        yield line


# what reading a text file (maybe gzipped) can raise on a bad file: not UTF-8, a truncated or corrupt .gz, I/O
READ_ERRORS = (UnicodeDecodeError, EOFError, zlib.error, OSError, csv.Error)


def read_error(p: Path, e: BaseException, where: str = "") -> InputError:
    """One line for a file that cannot be read as text (``where``: e.g. " line 12")."""
    if isinstance(e, UnicodeDecodeError):
        why = f"not UTF-8 text (byte 0x{e.object[e.start]:02x})"
    elif isinstance(e, EOFError):
        why = "the compressed file is truncated"
    elif isinstance(e, gzip.BadGzipFile):
        why = f"not a gzip file ({e})"
    elif isinstance(e, zlib.error):
        why = f"corrupt compressed data ({e})"
    elif isinstance(e, OSError):
        why = f"cannot read ({e.strerror or e})"
    else:
        why = f"cannot read as CSV text ({type(e).__name__}: {e})"
    return InputError(f"{p.name}{where}: {why}")


def _checked(rows: Iterable, p: Path) -> Iterator:
    """``rows`` (e.g. a ``csv.reader``), with a read error turned into one line naming the file."""
    try:
        yield from rows
    except READ_ERRORS as e:
        raise read_error(p, e) from None


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, (int, np.integer)) or limit < 0):
        raise InputError(f"limit={limit!r}: expected a non-negative integer or None")


def _read_csv(p: Path, required: Iterable[str], limit: int | None) -> tuple[dict[str, int], list[list[str]]]:
    """Header -> column index map, and the data rows (at most ``limit``). Checks required columns are present."""
    try:
        with open_text(p) as f:
            reader = csv.reader(bounded_lines(f, p))
            try:
                header = next(reader)
            except StopIteration:
                raise InputError(f"{p.name}: empty file (expected a CSV header with {', '.join(required)})") from None
            cols = {h.strip(): i for i, h in enumerate(header)}
            if len(cols) < len(header):  # (the last of two same-named columns was read)
                twice = next(h.strip() for i, h in enumerate(header) if cols[h.strip()] != i)
                raise InputError(f"{p.name} header: column {twice!r} appears twice")
            missing = [c for c in required if c not in cols]
            if missing:
                raise InputError(
                    f"{p.name} header: missing column(s) {', '.join(missing)} (found {', '.join(cols) or 'none'})"
                )
            if limit is None:
                rows = list(reader)
            else:
                rows = []
                for r in reader:
                    if len(rows) >= limit:
                        break
                    rows.append(r)
    except READ_ERRORS as e:
        raise read_error(p, e) from None
    # drop fully empty trailing lines
    while rows and not any(x.strip() for x in rows[-1]):
        rows.pop()
    return cols, rows


def _column(p: Path, rows: list[list[str]], idx: int, name: str) -> list[str]:
    out = []
    for i, r in enumerate(rows):
        if idx >= len(r):
            raise InputError(f"{p.name} row {i + 1}: missing field {name} (row has {len(r)} fields)")
        out.append(r[idx])
    return out


def _int_column(p: Path, values: list[str], name: str, allow_zero: bool = True,
                max_value: int = MAX_TOKENS) -> np.ndarray:
    """Parse token counts: integers in [0 (or 1 without ``allow_zero``), ``max_value``]; on any failure find the
    first bad row and name it."""
    try:
        arr = np.array(values, dtype=np.int64)
        ok = True
    except (ValueError, OverflowError):
        ok = False
    if ok and (arr.min(initial=0) < 0 or (not allow_zero and len(arr) and arr.min() == 0)
               or arr.max(initial=0) > max_value):
        ok = False
    if ok:
        return arr
    for i, v in enumerate(values):
        s = v.strip()
        try:
            x = int(s)
        except ValueError:
            try:
                fx = float(s)
            except ValueError:
                raise InputError(f"{p.name} row {i + 1}: {name} {v!r} is not an integer") from None
            if not math.isfinite(fx) or fx != int(fx):
                raise InputError(f"{p.name} row {i + 1}: {name} {v!r} is not an integer") from None
            x = int(fx)
        if x < 0:
            raise InputError(f"{p.name} row {i + 1}: {name} {v!r} is negative (expected a token count >= 0)")
        if x == 0 and not allow_zero:
            raise InputError(f"{p.name} row {i + 1}: {name} is 0 (expected a token count >= 1)")
        if x > max_value:
            raise InputError(f"{p.name} row {i + 1}: {name} {v.strip()} is above the limit of {max_value:,} tokens "
                             "(docs/limits.md)")
    # numpy failed on something int() accepts (e.g. '12.0' or spaces): parse row by row
    return np.array([int(float(v)) for v in values], dtype=np.int64)


def _float_column(p: Path, values: list[str], name: str) -> np.ndarray:
    try:
        arr = np.array(values, dtype=np.float64)
        if np.all(np.isfinite(arr)):
            return arr
    except ValueError:
        pass
    for i, v in enumerate(values):
        try:
            x = float(v)
        except ValueError:
            raise InputError(f"{p.name} row {i + 1}: {name} {v!r} is not a number") from None
        if not math.isfinite(x):
            raise InputError(f"{p.name} row {i + 1}: {name} {v!r} is not a finite number")
    raise InputError(f"{p.name}: column {name} could not be parsed")  # pragma: no cover


def _relative_sorted(
    p: Path, t: np.ndarray, require_sorted: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Shift times to start at 0. Returns (times, order) where order is a permutation if the input was unsorted."""
    if len(t) == 0:
        return t, None
    d = np.diff(t)
    order = None
    if len(d) and d.min() < 0:
        if require_sorted:
            i = int(np.argmax(d < 0)) + 2
            raise InputError(f"{p.name} row {i}: timestamp goes backwards (rows must be sorted by time)")
        order = np.argsort(t, kind="stable")
        t = t[order]
    return t - t[0], order


def _seconds_column(p: Path, rows: list[list[str]], cols: dict[str, int], name: str) -> np.ndarray:
    """Times in seconds: finite numbers >= 0 (the first bad row named)."""
    t = _float_column(p, _column(p, rows, cols[name], name), name)
    neg = t < 0
    if neg.any():
        i = int(np.argmax(neg))
        raise InputError(f"{p.name} row {i + 1}: {name} {rows[i][cols[name]]!r} is negative")
    return t


def _names_column(p: Path, rows: list[list[str]], cols: dict[str, int], name: str) -> tuple[list[str], np.ndarray]:
    """(sorted distinct names, each row's code); a blank or missing column is ``default``."""
    raw = [x.strip() or "default" for x in _column(p, rows, cols[name], name)] if name in cols else \
        ["default"] * len(rows)
    if not rows:
        return ["default"], np.zeros(0, np.int64)
    names, code = np.unique(np.asarray(raw, dtype=object), return_inverse=True)
    return [str(x) for x in names], np.asarray(code, dtype=np.int64)


# ----------------------------------------------------------------------------------------------------------------
# Azure


_NS_MIN, _NS_MAX = np.datetime64("1678-01-01", "s"), np.datetime64("2262-04-11", "s")


def read_azure(path: str | Path, limit: int | None = None, name: str | None = None) -> Workload:
    """Azure LLM inference trace 2023 (``AzureLLMInferenceTrace_{code,conv}.csv``).

    Columns ``TIMESTAMP`` (datetime, e.g. ``2023-11-16 18:17:03.9799600``), ``ContextTokens`` -> prompt,
    ``GeneratedTokens`` -> output. Rows out of time order are sorted (stable). ``limit`` keeps the first rows.
    """
    _check_limit(limit)
    p = _check_file(path)
    cols, rows = _read_csv(p, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), limit)
    ts = _column(p, rows, cols["TIMESTAMP"], "TIMESTAMP")
    prompt = _int_column(p, _column(p, rows, cols["ContextTokens"], "ContextTokens"), "ContextTokens", allow_zero=False)
    output = _int_column(p, _column(p, rows, cols["GeneratedTokens"], "GeneratedTokens"), "GeneratedTokens")
    try:
        t = np.array([s.strip() for s in ts], dtype="datetime64[ns]")
        bad = np.isnat(t)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{p.name} row {i + 1}: TIMESTAMP {ts[i]!r} is not a datetime (expected YYYY-MM-DD HH:MM:SS.fff)")
    except ValueError:
        for i, s in enumerate(ts):
            try:
                np.datetime64(s.strip(), "ns")
            except ValueError:
                raise InputError(
                    f"{p.name} row {i + 1}: TIMESTAMP {s!r} is not a datetime (expected YYYY-MM-DD HH:MM:SS.fff)"
                ) from None
        raise  # pragma: no cover
    if len(t):
        # datetime64[ns] wraps silently outside 1678-2262, and differences of far-apart times overflow int64 ns:
        # check on a seconds-resolution copy first
        t_s = np.array([s.strip() for s in ts], dtype="datetime64[s]")
        out = (t_s < _NS_MIN) | (t_s > _NS_MAX)
        if out.any():
            i = int(np.argmax(out))
            raise InputError(f"{p.name} row {i + 1}: TIMESTAMP {ts[i]!r} is outside 1678-2262 (the range of "
                             "nanosecond times)")
        span = int((t_s.max() - t_s.min()).astype(np.int64))
        if span > MAX_SPAN_S:
            raise InputError(f"{p.name}: TIMESTAMPs span {span} s, above the limit of {MAX_SPAN_S:.0f} s "
                             "(docs/limits.md)")
    sec = (t - t[0]).astype(np.int64) / 1e9 if len(t) else np.zeros(0)
    sec, order = _relative_sorted(p, sec, require_sorted=False)
    if order is not None:
        prompt, output = prompt[order], output[order]
    return Workload(arrival_s=sec, prompt_tokens=prompt, output_tokens=output, name=name or p.stem)


# ----------------------------------------------------------------------------------------------------------------
# Mooncake


def read_mooncake(path: str | Path, limit: int | None = None, name: str | None = None) -> Workload:
    """Mooncake FAST'25 JSONL trace (``synthetic_trace.jsonl``, ``conversation_trace.jsonl``...).

    One JSON object per line with ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
    (prefix-block ids, 512 tokens per block). Block ids go into the workload's CSR prefix columns
    (``prefix_offsets``/``prefix_blocks``, ``block_tokens=512``). Blank lines are skipped; line numbers in
    errors are 1-based file lines.
    """
    _check_limit(limit)
    p = _check_file(path)
    ts: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    lens: list[int] = []
    blocks: list[int] = []
    with gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb") as f:  # bytes: a bad line is named exactly
        for lineno, raw in enumerate(_checked(bounded_lines(f, p), p), start=1):
            if limit is not None and len(ts) >= limit:
                break
            try:
                s = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise read_error(p, e, f" line {lineno}") from None
            if lineno == 1:
                s = s.removeprefix("\ufeff").strip()  # (a byte-order mark)
            if not s:
                continue
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as e:
                raise InputError(f"{p.name} line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            except RecursionError:
                raise InputError(f"{p.name} line {lineno}: not valid JSON (nested too deeply)") from None
            except ValueError:  # (an integer of more than 4,300 digits: Python's conversion limit)
                raise InputError(f"{p.name} line {lineno}: not valid JSON here (a number of more than 4,300 digits)"
                                 ) from None
            if not isinstance(obj, dict):
                raise InputError(f"{p.name} line {lineno}: expected a JSON object, got {type(obj).__name__}")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in obj:
                    raise InputError(f"{p.name} line {lineno}: missing field {key}")
            t = obj["timestamp"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or (isinstance(t, int) and abs(t) > 2**62) \
                    or not math.isfinite(t) or t < 0:  # (a 400-digit integer overflowed math.isfinite)
                raise InputError(f"{p.name} line {lineno}: timestamp {short_repr(t)} is not a non-negative number "
                                 "of ms")
            vals = []
            for key in ("input_length", "output_length"):
                v = obj[key]
                if isinstance(v, bool) or not isinstance(v, int):
                    if isinstance(v, float) and v.is_integer():
                        v = int(v)
                    else:
                        raise InputError(f"{p.name} line {lineno}: {key} {short_repr(v)} is not an integer")
                if v < 0:
                    raise InputError(f"{p.name} line {lineno}: {key} {v} is negative (expected a token count >= 0)")
                if v == 0 and key == "input_length":
                    raise InputError(f"{p.name} line {lineno}: input_length is 0 (expected a token count >= 1)")
                if v > MAX_TOKENS:
                    raise InputError(f"{p.name} line {lineno}: {key} {short_repr(v)} is above the limit of "
                                     f"{MAX_TOKENS:,} tokens (docs/limits.md)")
                vals.append(v)
            h = obj.get("hash_ids", [])
            if not isinstance(h, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in h):
                raise InputError(f"{p.name} line {lineno}: hash_ids must be a list of integers")
            if h and (min(h) < 0 or max(h) >= 2**63):
                raise InputError(f"{p.name} line {lineno}: hash_ids must lie in [0, 2^63)")
            if len(h) > -(-vals[0] // 512):  # (blocks past the prompt went into the prefix caches as if cached)
                raise InputError(f"{p.name} line {lineno}: {len(h)} hash_ids, more than the {-(-vals[0] // 512)} "
                                 f"blocks of 512 tokens that input_length {vals[0]} fills")
            ts.append(float(t))
            prompt.append(vals[0])
            output.append(vals[1])
            lens.append(len(h))
            blocks.extend(h)
    t_arr = np.asarray(ts, dtype=np.float64) / 1000.0
    pr = np.asarray(prompt, dtype=np.int64)
    out = np.asarray(output, dtype=np.int64)
    ln = np.asarray(lens, dtype=np.int64)
    po = np.zeros(len(ts) + 1, dtype=np.int64)
    np.cumsum(ln, out=po[1:])
    pb = np.asarray(blocks, dtype=np.int64)
    w = Workload(
        arrival_s=t_arr - (t_arr[0] if len(t_arr) else 0.0), prompt_tokens=pr, output_tokens=out,
        prefix_offsets=po, prefix_blocks=pb, block_tokens=512, name=name or p.stem,
    )
    return w.sorted()


# ----------------------------------------------------------------------------------------------------------------
# Vidur lengths


def read_vidur_lengths(path: str | Path, limit: int | None = None, name: str | None = None) -> Workload:
    """Vidur processed length trace (e.g. ``arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv``).

    Columns ``num_prefill_tokens`` -> prompt, ``num_decode_tokens`` -> output (other columns ignored). The file
    has no arrival times: every arrival is 0. Pair it with an arrival process (see ``synthetic``).
    If an ``arrived_at`` column is present (Vidur's ``splitwise_*.csv``), it is used as arrival seconds.
    """
    _check_limit(limit)
    p = _check_file(path)
    cols, rows = _read_csv(p, ("num_prefill_tokens", "num_decode_tokens"), limit)
    prompt = _int_column(p, _column(p, rows, cols["num_prefill_tokens"], "num_prefill_tokens"), "num_prefill_tokens",
                         allow_zero=False)
    output = _int_column(p, _column(p, rows, cols["num_decode_tokens"], "num_decode_tokens"), "num_decode_tokens")
    if "arrived_at" in cols:
        t = _float_column(p, _column(p, rows, cols["arrived_at"], "arrived_at"), "arrived_at")
        t, order = _relative_sorted(p, t, require_sorted=False)
        if order is not None:
            prompt, output = prompt[order], output[order]
    else:
        t = np.zeros(len(prompt))
    return Workload(arrival_s=t, prompt_tokens=prompt, output_tokens=output, name=name or p.stem)


# ----------------------------------------------------------------------------------------------------------------
# BurstGPT


BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")


def read_burstgpt(
    path: str | Path, limit: int | None = None, skip_failed: bool = True, name: str | None = None
) -> Workload:
    """BurstGPT CSV (``Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type``).

    ``Timestamp`` is seconds (float) from the trace start. Model names (e.g. ``ChatGPT``, ``GPT-4``) go into the
    workload's ``models`` list / ``model`` codes. ``Log Type`` (``Conversation log`` / ``API log``) goes into
    ``tenants``.

    Failed requests: BurstGPT records failures as rows with ``Response tokens`` = 0. With ``skip_failed=True``
    (default) those rows are dropped, because a request that generates nothing does not exercise the decode
    path the simulator models; with ``skip_failed=False`` they are kept with output 0. Rows with ``Request
    tokens`` = 0 are dropped with them (``skip_failed=False``: an error, no engine serves an empty prompt).
    ``limit`` counts rows read from the file (before skipping).
    """
    _check_limit(limit)
    p = _check_file(path)
    cols, rows = _read_csv(p, BURSTGPT_COLUMNS, limit)
    t = _seconds_column(p, rows, cols, "Timestamp")
    prompt = _int_column(p, _column(p, rows, cols["Request tokens"], "Request tokens"), "Request tokens",
                         allow_zero=skip_failed)
    output = _int_column(p, _column(p, rows, cols["Response tokens"], "Response tokens"), "Response tokens")
    models, mcode = _names_column(p, rows, cols, "Model")
    tenants, tcode = _names_column(p, rows, cols, "Log Type")
    if "Total tokens" in cols:
        tot = _int_column(p, _column(p, rows, cols["Total tokens"], "Total tokens"), "Total tokens",
                          max_value=2 * MAX_TOKENS)
        bad = tot != prompt + output
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(
                f"{p.name} row {i + 1}: Total tokens {tot[i]} != Request tokens {prompt[i]} + Response tokens {output[i]}"
            )
    keep = (output > 0) & (prompt > 0) if skip_failed else np.ones(len(output), dtype=bool)
    return _named_workload(p, t[keep], prompt[keep], output[keep], mcode[keep], tcode[keep], models, tenants, name)


def _named_workload(p: Path, t, prompt, output, mcode, tcode, models, tenants, name) -> Workload:
    """A workload with model and tenant names, times shifted to 0 and rows sorted by time (stable)."""
    t, order = _relative_sorted(p, t, require_sorted=False)
    if order is not None:
        prompt, output, mcode, tcode = prompt[order], output[order], mcode[order], tcode[order]
    return Workload(arrival_s=t, prompt_tokens=prompt, output_tokens=output, model=mcode, tenant=tcode,
                    models=models, tenants=tenants, name=name or p.stem)


# ----------------------------------------------------------------------------------------------------------------
# plain CSV (a user's own trace)


PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


def read_plain(path: str | Path, limit: int | None = None, name: str | None = None) -> Workload:
    """A trace in the workload's own columns (``PLAIN_COLUMNS``): ``arrival_s`` (seconds, a number >= 0),
    ``prompt_tokens`` (>= 1) and ``output_tokens`` (>= 0); optional ``model`` and ``tenant`` (names, as
    BurstGPT's: into the workload's ``models`` / ``tenants``; blank is ``default``); other columns ignored.
    Times are shifted to start at 0; rows out of time order are sorted (stable)."""
    _check_limit(limit)
    p = _check_file(path)
    cols, rows = _read_csv(p, PLAIN_COLUMNS, limit)
    t = _seconds_column(p, rows, cols, "arrival_s")
    prompt = _int_column(p, _column(p, rows, cols["prompt_tokens"], "prompt_tokens"), "prompt_tokens",
                         allow_zero=False)
    output = _int_column(p, _column(p, rows, cols["output_tokens"], "output_tokens"), "output_tokens")
    models, mcode = _names_column(p, rows, cols, "model")
    tenants, tcode = _names_column(p, rows, cols, "tenant")
    return _named_workload(p, t, prompt, output, mcode, tcode, models, tenants, name)


# ----------------------------------------------------------------------------------------------------------------
# ServeGen


PATTERN_NONE, PATTERN_GAMMA, PATTERN_WEIBULL = 0, 1, 2
_PATTERN_CODES = {"": PATTERN_NONE, "Gamma": PATTERN_GAMMA, "Weibull": PATTERN_WEIBULL}
_CHUNK_RE = re.compile(r"^chunk-(\d+)-trace\.csv(\.gz)?$")


@dataclass
class ServeGenRates:
    """Per-client arrival statistics of one ServeGen model (all clients share the window grid).

    Arrays are ``(num_clients, num_windows)``. ``pattern`` holds codes: 0 = inactive, 1 = Gamma, 2 = Weibull.
    ``shape``/``scale`` are the fitted inter-arrival parameters as shipped (numpy ``gamma(shape, scale)`` and
    ``scale * weibull(shape)`` conventions); ``cv`` the measured CV of inter-arrival times.
    """

    model: str
    clients: list[str]  # "chunk-<i>", sorted by i
    window_start_s: np.ndarray  # (W,) float64, relative to trace start
    window_s: float  # window length (600 s)
    rate: np.ndarray  # (C, W) requests / s
    cv: np.ndarray  # (C, W)
    pattern: np.ndarray  # (C, W) int8 codes
    shape: np.ndarray  # (C, W)
    scale: np.ndarray  # (C, W) seconds

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def total_rate(self) -> np.ndarray:
        """Aggregate rate per window (sum over clients), requests / s."""
        return self.rate.sum(axis=0)


def _servegen_model_dir(path: Path, model: str | None) -> Path:
    def has_chunks(d: Path) -> bool:
        return any(_CHUNK_RE.match(x.name) for x in d.iterdir()) if d.is_dir() else False

    if has_chunks(path):
        return path
    if model is None:
        raise InputError(f"{path}: no chunk-<i>-trace.csv[.gz] files here; pass model= (e.g. 'm-large', 'deepseek-r1')")
    for cand in (path / model, *(d / model for d in path.iterdir() if d.is_dir())):
        if has_chunks(cand):
            return cand
    raise InputError(f"{path}: no ServeGen model folder {model!r} with chunk-<i>-trace.csv[.gz] files")


def read_servegen(
    folder_or_model_dir: str | Path, model: str | None = None, limit: int | None = None
) -> ServeGenRates:
    """Read ServeGen ``chunk-<i>-trace.csv[.gz]`` files (no header: timestamp, rate, cv, pattern, shape, scale).

    ``folder_or_model_dir`` is a model folder (e.g. ``.../servegen-alibaba-modelstudio/language/m-large``) or
    any folder above it together with ``model=`` (``m-large``, ``m-mid``, ``m-small``, ``deepseek-r1``,
    ``mm-image``). ``limit`` keeps the first ``limit`` clients (by chunk index).
    """
    _check_limit(limit)
    root = Path(folder_or_model_dir).expanduser()
    if not root.exists():
        raise InputError(f"{root}: folder not found")
    if not root.is_dir():
        raise InputError(f"{root}: not a folder (expected a ServeGen model folder with chunk-<i>-trace.csv files)")
    d = _servegen_model_dir(root, model)
    files = {}
    for x in d.iterdir():
        m = _CHUNK_RE.match(x.name)
        if m:
            i = int(m.group(1))
            if i not in files or x.suffix != ".gz":  # prefer an uncompressed copy if both exist
                files[i] = x
    idx = sorted(files)
    if limit is not None:
        idx = idx[:limit]
    grid: np.ndarray | None = None
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("rate", "cv", "pattern", "shape", "scale")}
    for i in idx:
        f = files[i]
        ts, rate, cv, pat, shp, scl = [], [], [], [], [], []
        with open_text(f) as fh:
            for r, row in enumerate(csv.reader(bounded_lines(fh, f)), start=1):
                if not row or not any(c.strip() for c in row):
                    continue
                if len(row) != 6:
                    raise InputError(f"{f.name} row {r}: expected 6 fields (timestamp,rate,cv,pattern,shape,scale), got {len(row)}")
                try:
                    vals = [float(row[j]) for j in (0, 1, 2, 4, 5)]
                except ValueError:
                    j = next(j for j in (0, 1, 2, 4, 5) if not _is_float(row[j]))
                    fld = ("timestamp", "rate", "cv", "pattern", "shape", "scale")[j]
                    raise InputError(f"{f.name} row {r}: {fld} {row[j]!r} is not a number") from None
                if any(not math.isfinite(v) or v < 0 for v in vals):
                    j = next(k for k, v in enumerate(vals) if not math.isfinite(v) or v < 0)
                    fld = ("timestamp", "rate", "cv", "shape", "scale")[j]
                    raise InputError(f"{f.name} row {r}: {fld} {vals[j]!r} must be a finite number >= 0")
                p = row[3].strip()
                if p not in _PATTERN_CODES:
                    raise InputError(f"{f.name} row {r}: pattern {p!r} is not one of Gamma, Weibull or empty")
                if p and (vals[3] <= 0 or vals[4] <= 0):
                    raise InputError(f"{f.name} row {r}: pattern {p} needs shape > 0 and scale > 0")
                if p and vals[3] < MIN_SHAPE[p]:  # (a Gamma shape of 1e-300 drew gaps of 0 for ever; a Weibull
                    # shape of 0.001 overflowed math.gamma): beyond a CV of about MAX_CV
                    raise InputError(f"{f.name} row {r}: {p} shape {vals[3]!r} is below {MIN_SHAPE[p]:g} (a "
                                     f"coefficient of variation of the gaps above {MAX_CV:g}; docs/limits.md)")
                ts.append(vals[0]); rate.append(vals[1]); cv.append(vals[2]); pat.append(_PATTERN_CODES[p])
                shp.append(vals[3]); scl.append(vals[4])
        t = np.asarray(ts)
        if grid is None:
            grid = t
        elif len(t) != len(grid) or not np.array_equal(t, grid):
            raise InputError(f"{f.name}: window timestamps differ from {files[idx[0]].name} (clients must share one grid)")
        cols["rate"].append(np.asarray(rate)); cols["cv"].append(np.asarray(cv))
        cols["pattern"].append(np.asarray(pat, dtype=np.int8)); cols["shape"].append(np.asarray(shp))
        cols["scale"].append(np.asarray(scl))
    if grid is None:
        raise InputError(f"{d}: no chunk-<i>-trace.csv[.gz] files")
    window = float(np.median(np.diff(grid))) if len(grid) > 1 else 600.0
    return ServeGenRates(
        model=d.name, clients=[f"chunk-{i}" for i in idx], window_start_s=grid - grid[0], window_s=window,
        **{k: np.vstack(v) for k, v in cols.items()},
    )


# the smallest fitted shape a window may have: Gamma's CV is 1/sqrt(shape) (MAX_CV at 1e-4); Weibull's is MAX_CV at
# a shape of about 0.13 (e.g. 430 at 0.1)
MIN_SHAPE = {"Gamma": 1.0 / MAX_CV ** 2, "Weibull": 0.13}


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _unit_mean_gaps(rng: np.random.Generator, code: int, shape: float, n: int) -> np.ndarray:
    """``n`` inter-arrival gaps with the fitted shape, scaled to mean 1."""
    if code == PATTERN_GAMMA:
        return rng.gamma(shape, 1.0 / shape, size=n)
    # Weibull: mean of weibull(c) is Gamma(1 + 1/c)
    return rng.weibull(shape, size=n) / math.gamma(1.0 + 1.0 / shape)


def servegen_arrivals(
    rates: ServeGenRates,
    rng: np.random.Generator,
    start_s: float = 0.0,
    end_s: float | None = None,
    clients: Iterable[int] | None = None,
    rate_scale: float = 1.0,
    max_requests: int | None = 10_000_000,
) -> tuple[np.ndarray, np.ndarray]:
    """Generate arrivals from ServeGen per-client window statistics.

    For each client and each active window in ``[start_s, end_s)`` a renewal process runs from the window start
    to its end with inter-arrival gaps drawn from the window's fitted family (Gamma or Weibull) and the fitted
    *shape* (which fixes the CV: for Gamma CV = 1/sqrt(shape), matching the ``cv`` column), rescaled so that the
    mean gap is ``1 / (rate * rate_scale)``, i.e. the window's recorded rate. The shipped *scale* is not used
    directly: the fits' implied mean gap agrees with 1/rate only on average (measured on deepseek-r1: median of
    fitted-mean x rate = 0.99 for Gamma windows, 1.08 for Weibull windows, single windows far off, e.g. m-large
    chunk-0 at 2400 s: Gamma mean 1.6 s vs 1/rate 11.8 s), and the rate column is the documented request rate.
    For Gamma windows the shipped ``cv`` equals 1/sqrt(shape) exactly, so the generated CV is the recorded one.
    Inactive windows (empty pattern) produce no arrivals. Returns ``(arrival_s, client_index)`` sorted by time,
    times relative to ``start_s``.
    """
    if rate_scale <= 0:
        raise InputError(f"rate_scale={rate_scale}: expected > 0")
    end = float(rates.window_start_s[-1] + rates.window_s) if end_s is None else float(end_s)
    if end <= start_s:
        raise InputError(f"servegen window: end_s={end} must be > start_s={start_s}")
    cl = range(rates.num_clients) if clients is None else list(clients)
    cap = MAX_REQUESTS if max_requests is None else max_requests
    out_t: list[np.ndarray] = []
    out_c: list[np.ndarray] = []
    total = 0
    W = rates.window_s
    for w, ws in enumerate(rates.window_start_s):
        lo, hi = max(ws, start_s), min(ws + W, end)
        if hi <= lo:
            continue
        for c in cl:
            code = int(rates.pattern[c, w])
            r = float(rates.rate[c, w]) * rate_scale
            if code == PATTERN_NONE or r <= 0:
                continue
            shape = float(rates.shape[c, w])
            mean_gap = 1.0 / r
            span = ws + W - ws  # renewal process starts at the window start (not at start_s)
            if total + r * (hi - lo) > cap or r * span > 4 * cap:  # (checked before drawing: rate_scale 1e30
                raise InputError(  # asked numpy for 1e31 gaps)
                    f"servegen {rates.model}: about {total + r * (hi - lo):.3g} arrivals in [{start_s}, {end}) s, "
                    f"more than {cap:,}; narrow the time range, pick fewer clients or lower rate_scale")
            need = int(r * span * 1.25) + 16
            gaps = _unit_mean_gaps(rng, code, shape, need) * mean_gap
            t = ws + np.cumsum(gaps)
            while t[-1] < ws + W:
                more = ws + np.cumsum(_unit_mean_gaps(rng, code, shape, need) * mean_gap) + (t[-1] - ws)
                t = np.concatenate([t, more])
            t = t[(t >= lo) & (t < hi)]
            out_t.append(t)
            out_c.append(np.full(len(t), c, dtype=np.int64))
            total += len(t)
            if max_requests is not None and total > max_requests:
                raise InputError(
                    f"servegen {rates.model}: more than {max_requests} arrivals in [{start_s}, {end}) s; "
                    "narrow the time range, pick fewer clients or lower rate_scale"
                )
    if not out_t:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    t = np.concatenate(out_t)
    c = np.concatenate(out_c)
    order = np.argsort(t, kind="stable")
    return t[order] - start_s, c[order]


def servegen_workload(
    rates: ServeGenRates,
    rng: np.random.Generator,
    lengths=None,
    start_s: float = 0.0,
    end_s: float | None = None,
    rate_scale: float = 1.0,
    clients: Iterable[int] | None = None,
) -> Workload:
    """A Workload from :func:`servegen_arrivals`; clients become tenants. ``lengths`` is a length sampler with
    ``sample(rng, n) -> (prompt, output)`` (default: the embedded default lognormal lengths)."""
    t, c = servegen_arrivals(rates, rng, start_s=start_s, end_s=end_s, clients=clients, rate_scale=rate_scale)
    if lengths is None:
        from fleetwise.workload.default import default_lengths

        lengths = default_lengths()
    prompt, output = lengths.sample(rng, len(t))
    return Workload(
        arrival_s=t, prompt_tokens=prompt, output_tokens=output, tenant=c.astype(np.int16),
        tenants=list(rates.clients), name=f"servegen-{rates.model}",
    )


_SERVEGEN: dict = {}


@contextlib.contextmanager
def cached_servegen():
    """Within the block, ServeGen rate files are read once per process: ``read_servegen`` parses the 160
    CSV files of a model (~6 s) on every ``build``. The rates are only read, so the workload is the same."""
    import fleetwise.workload.readers as readers

    orig = readers.read_servegen
    if getattr(orig, "fleetwise_cached", False):
        yield
        return

    def cached(folder_or_model_dir, model=None, limit=None):
        key = (str(folder_or_model_dir), model, limit)
        if key not in _SERVEGEN:
            _SERVEGEN[key] = orig(folder_or_model_dir, model=model, limit=limit)
        return _SERVEGEN[key]

    cached.fleetwise_cached = True  # type: ignore[attr-defined]
    readers.read_servegen = cached
    try:
        yield
    finally:
        readers.read_servegen = orig
