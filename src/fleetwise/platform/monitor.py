"""Monitoring time series of a platform run: one row per (sample time, scaling group), kept as numpy columns.

The platform runner samples every ``interval_s`` of simulated time and calls :meth:`Monitor.add` once per scaling
group (or :meth:`Monitor.add_many` once per sample time). The columns (:data:`COLUMNS`):

=================== ======= =====================================================================================
time_s              float   simulated time of the sample, seconds
group               str     the scaling group (one model × region × zone × pool)
model, region,      str     its labels; given to :meth:`Monitor.register` once, or with each row
zone, pool
replicas_ready      int     replicas serving
replicas_starting   int     replicas provisioning (billed, not yet routable)
replicas_draining   int     replicas finishing their requests before they stop (scale-down or preemption notice)
waiting, running    int     requests queued / in a running batch at the sample time
kv_used             float   KV-cache blocks in use / blocks, over the group's ready replicas (0..1)
busy                float   fraction of the interval the group's GPUs were busy (0..1)
arrivals_rps        float   arrivals routed to the group over the interval / interval
completed, rejected int     requests completed / rejected *during the interval* (the exporters cumulate them)
ttft_p90_s          float   p90 TTFT of the requests that got their first token in the interval (NaN: none)
cost_usd            float   cost of the group since the start (cumulative, never decreasing)
spot_available      int     spot replicas the trace allows the group now; -1 for a group not on spot
=================== ======= =====================================================================================

Exports: :meth:`Monitor.to_prometheus` (text exposition format, or OpenMetrics for ``promtool tsdb
create-blocks-from openmetrics``), :meth:`Monitor.to_parquet` (pyarrow, the ``parquet`` extra), and the plots
:func:`plot_monitor` and :func:`plot_pareto` (matplotlib's Agg canvas, no display).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.errors import InputError, check_replaceable

STRING_COLUMNS: tuple[str, ...] = ("group", "model", "region", "zone", "pool")
LABEL_COLUMNS: tuple[str, ...] = STRING_COLUMNS[1:]
# numeric column -> (dtype, value when not given)
NUMERIC_COLUMNS: dict[str, tuple[type, float]] = {
    "time_s": (np.float64, math.nan),
    "replicas_ready": (np.int64, 0),
    "replicas_starting": (np.int64, 0),
    "replicas_draining": (np.int64, 0),
    "waiting": (np.int64, 0),
    "running": (np.int64, 0),
    "kv_used": (np.float64, 0.0),
    "busy": (np.float64, 0.0),
    "arrivals_rps": (np.float64, 0.0),
    "completed": (np.int64, 0),
    "rejected": (np.int64, 0),
    "ttft_p90_s": (np.float64, math.nan),
    "cost_usd": (np.float64, 0.0),
    "spot_available": (np.int64, -1),
}
COLUMNS: tuple[str, ...] = ("time_s", *STRING_COLUMNS, *[c for c in NUMERIC_COLUMNS if c != "time_s"])
_VALUE_COLUMNS = frozenset(c for c in NUMERIC_COLUMNS if c != "time_s") | frozenset(LABEL_COLUMNS)

# (family, type, help, column; state label value for fleetwise_replicas). Counters cumulate per-interval columns
# (completed, rejected) per series; cost_usd is already cumulative.
_FAMILIES: list[tuple[str, str, str, list[tuple[str, str | None]]]] = [
    ("fleetwise_replicas", "gauge", "Replicas of the scaling group by state.",
     [("replicas_ready", "ready"), ("replicas_starting", "starting"), ("replicas_draining", "draining")]),
    ("fleetwise_queue_requests", "gauge", "Requests waiting in the scaling group's queues.", [("waiting", None)]),
    ("fleetwise_running_requests", "gauge", "Requests in a running batch of the scaling group.", [("running", None)]),
    ("fleetwise_kv_cache_usage_ratio", "gauge", "KV-cache blocks in use over all blocks of the ready replicas.",
     [("kv_used", None)]),
    ("fleetwise_gpu_busy_ratio", "gauge", "Fraction of the last interval the group's GPUs were busy.",
     [("busy", None)]),
    ("fleetwise_arrivals_per_second", "gauge", "Requests routed to the group per second over the last interval.",
     [("arrivals_rps", None)]),
    ("fleetwise_ttft_p90_seconds", "gauge", "90th percentile time to first token over the last interval.",
     [("ttft_p90_s", None)]),
    ("fleetwise_spot_available_replicas", "gauge", "Spot replicas the capacity trace allows the group now.",
     [("spot_available", None)]),
    ("fleetwise_requests_completed_total", "counter", "Requests completed by the group since the start.",
     [("completed", None)]),
    ("fleetwise_requests_rejected_total", "counter", "Requests rejected by the group since the start.",
     [("rejected", None)]),
    ("fleetwise_cost_usd_total", "counter", "Cost of the group since the start, US dollars.", [("cost_usd", None)]),
]  # fmt: skip
_CUMULATE = frozenset({"completed", "rejected"})

POOL_COLORS = {"on-demand": "#1f5fa8", "ondemand": "#1f5fa8", "spot": "#e8870e", "reserved": "#2a9d4b"}
_EXTRA_COLORS = ["#7b4fa3", "#b9435a", "#3f8f8f", "#8c6d31", "#5a6b7d", "#c25a9e"]


# ---------------------------------------------------------------------------------------------------- helpers
def escape_label_value(v: str) -> str:
    """A label value as the exposition formats want it: backslash, double quote and newline escaped."""
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(v: str) -> str:
    """HELP text: backslash and newline escaped."""
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def _fmt_value(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


def _atomic_write(path: Path, data: bytes) -> None:
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # never a half-written file


# ---------------------------------------------------------------------------------------------------- the monitor
class Monitor:
    """Columnar store of monitoring samples (numpy arrays grown by doubling; strings kept as category codes)."""

    def __init__(self, interval_s: float = 10.0, capacity: int = 1024):
        if not interval_s > 0:
            raise InputError(f"monitor interval_s = {interval_s!r}: expected a positive number of seconds")
        self.interval_s = float(interval_s)
        self._n = 0
        self._cap = max(16, int(capacity))
        self._num = {c: np.full(self._cap, d, dtype=t) for c, (t, d) in NUMERIC_COLUMNS.items()}
        self._codes = {c: np.zeros(self._cap, dtype=np.int32) for c in STRING_COLUMNS}
        self._cats: dict[str, list[str]] = {c: [""] for c in STRING_COLUMNS}
        self._index: dict[str, dict[str, int]] = {c: {"": 0} for c in STRING_COLUMNS}
        self._labels: dict[str, dict[str, str]] = {}  # group -> registered labels
        self._batch_codes: dict[tuple[str, ...], dict[str, np.ndarray]] = {}  # add_many's cache per group list

    def __len__(self) -> int:
        return self._n

    # ------------------------------------------------------------------ filling
    def register(self, group: str, *, model: str = "", region: str = "", zone: str = "", pool: str = "") -> None:
        """Static labels of ``group``, used for its rows that do not give them."""
        self._labels[group] = {"model": model, "region": region, "zone": zone, "pool": pool}
        self._batch_codes.clear()

    def _code(self, col: str, value: Any) -> int:
        s = str(value)
        i = self._index[col].get(s)
        if i is None:
            i = self._index[col][s] = len(self._cats[col])
            self._cats[col].append(s)
        return i

    def _grow(self, need: int) -> None:
        if need <= self._cap:
            return
        cap = max(need, 2 * self._cap)
        for c, (t, d) in NUMERIC_COLUMNS.items():
            a = np.full(cap, d, dtype=t)
            a[: self._n] = self._num[c][: self._n]
            self._num[c] = a
        for c in STRING_COLUMNS:
            a = np.zeros(cap, dtype=np.int32)
            a[: self._n] = self._codes[c][: self._n]
            self._codes[c] = a
        self._cap = cap

    @staticmethod
    def _check(values: dict) -> None:
        bad = [k for k in values if k not in _VALUE_COLUMNS]
        if bad:
            raise InputError(f"monitor column {bad[0]!r}: unknown; columns: {', '.join(COLUMNS)}")

    def add(self, time_s: float, group: str, **values: Any) -> None:
        """One sample of ``group`` at ``time_s``; columns not given keep their defaults (see the module doc)."""
        self._check(values)
        if not math.isfinite(time_s):
            raise InputError(f"monitor sample time {time_s!r} for group {group!r}: expected a finite number")
        self._grow(self._n + 1)
        i = self._n
        self._num["time_s"][i] = time_s
        self._codes["group"][i] = self._code("group", group)
        labels = self._labels.get(group, {})
        for c in LABEL_COLUMNS:
            v = values.get(c, labels.get(c, ""))
            self._codes[c][i] = self._code(c, v)
        for c, v in values.items():
            if c not in self._codes:
                self._num[c][i] = v
        self._n += 1

    def add_many(self, time_s: float, groups: Sequence[str], **columns: Any) -> None:
        """One sample per group of ``groups`` at ``time_s``; each column a sequence as long as ``groups`` (or a
        scalar for all of them)."""
        self._check(columns)
        m = len(groups)
        if not m:
            return
        if not math.isfinite(time_s):
            raise InputError(f"monitor sample time {time_s!r}: expected a finite number")
        self._grow(self._n + m)
        sl = slice(self._n, self._n + m)
        self._num["time_s"][sl] = time_s
        key = tuple(groups)
        cached = self._batch_codes.get(key)
        if cached is None:  # group and registered label codes of this list of groups, computed once
            cached = {"group": np.array([self._code("group", g) for g in groups], dtype=np.int32)}
            for c in LABEL_COLUMNS:
                cached[c] = np.array([self._code(c, self._labels.get(g, {}).get(c, "")) for g in groups],
                                     dtype=np.int32)
            self._batch_codes[key] = cached
        for c in STRING_COLUMNS:
            if c in columns:
                v = columns[c]
                vals = [v] * m if isinstance(v, str) else list(v)
                if len(vals) != m:
                    raise InputError(f"monitor column {c!r}: {len(vals)} values for {m} groups")
                self._codes[c][sl] = [self._code(c, x) for x in vals]
            else:
                self._codes[c][sl] = cached[c]
        for c, v in columns.items():
            if c in self._codes:
                continue
            a = np.asarray(v)
            if a.ndim and len(a) != m:
                raise InputError(f"monitor column {c!r}: {len(a)} values for {m} groups")
            self._num[c][sl] = a
        self._n += m

    # ------------------------------------------------------------------ reading
    def codes(self, col: str) -> tuple[np.ndarray, list[str]]:
        """(int codes, categories) of a string column: ``categories[codes[i]]`` is row ``i``'s value."""
        return self._codes[col][: self._n], list(self._cats[col])

    def column(self, col: str) -> np.ndarray:
        """One column (a view for numeric ones; an object array of str for string ones)."""
        if col in self._num:
            return self._num[col][: self._n]
        if col in self._codes:
            return np.array(self._cats[col], dtype=object)[self._codes[col][: self._n]]
        raise InputError(f"monitor column {col!r}: unknown; columns: {', '.join(COLUMNS)}")

    def table(self) -> dict[str, np.ndarray]:
        """Every column as a numpy array (copies), in :data:`COLUMNS` order, rows in the order added."""
        return {c: (self.column(c).copy() if c in self._num else self.column(c)) for c in COLUMNS}

    def groups(self) -> list[str]:
        """Groups in the order first seen."""
        codes, cats = self.codes("group")
        return [cats[i] for i in dict.fromkeys(codes.tolist())]

    @classmethod
    def from_table(cls, table: dict[str, Any], interval_s: float = 10.0) -> Monitor:
        """A monitor holding the rows of ``table`` (as :meth:`table` returns it, or read back from Parquet)."""
        missing = [c for c in ("time_s", "group") if c not in table]
        if missing:
            raise InputError(f"monitor table: missing column {missing[0]!r}")
        unknown = [c for c in table if c not in COLUMNS]
        if unknown:
            raise InputError(f"monitor table: unknown column {unknown[0]!r}; columns: {', '.join(COLUMNS)}")
        n = len(table["time_s"])
        mon = cls(interval_s=interval_s, capacity=n)
        mon._grow(n)
        for c in NUMERIC_COLUMNS:
            if c in table:
                mon._num[c][:n] = np.asarray(table[c])
        for c in STRING_COLUMNS:
            if c in table:
                mon._codes[c][:n] = [mon._code(c, v) for v in table[c]]
        mon._n = n
        return mon

    # ------------------------------------------------------------------ exports
    def _series(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(row order sorted by series then time, series id per sorted row, label text per series)."""
        n = self._n
        keys = np.stack([self._codes[c][:n] for c in STRING_COLUMNS], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.lexsort((self._num["time_s"][:n], inv))
        labels = [",".join(f'{c}="{escape_label_value(self._cats[c][k])}"' for c, k in zip(STRING_COLUMNS, row))
                  for row in uniq.tolist()]
        return order, inv[order], labels

    def to_prometheus(self, path: str | Path | None = None, *, epoch_s: float = 0.0,
                      openmetrics: bool = False) -> str:
        """The samples in the Prometheus text exposition format (one HELP and TYPE per family, every sample with
        a millisecond timestamp = ``epoch_s`` + simulated time). ``openmetrics=True`` writes OpenMetrics 1.0
        instead (timestamps in seconds, counter families named without ``_total``, ``# EOF``), the input of
        ``promtool tsdb create-blocks-from openmetrics``. Written to ``path`` (atomically) when given."""
        n = self._n
        out: list[str] = []
        if n:
            order, sid, labels = self._series()
            starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
            ms = np.rint((self._num["time_s"][:n][order] + epoch_s) * 1000.0).astype(np.int64)
            ts = [f"{x / 1000:.3f}" for x in ms.tolist()] if openmetrics else [str(x) for x in ms.tolist()]
            lab = [labels[i] for i in sid.tolist()]
            for family, kind, help_text, cols in _FAMILIES:
                fam = family.removesuffix("_total") if openmetrics and kind == "counter" else family
                out.append(f"# HELP {fam} {escape_help(help_text)}")
                out.append(f"# TYPE {fam} {kind}")
                for col, state in cols:
                    v = self._num[col][:n][order]
                    keep = None
                    if col == "spot_available":
                        keep = v >= 0
                    if col in _CUMULATE:
                        v = np.cumsum(v)
                        v = v - np.repeat(np.r_[0, v[starts[1:] - 1]], np.diff(np.r_[starts, n]))
                    if kind == "counter":
                        self._check_monotone(col, v, sid, order)
                    extra = f',state="{state}"' if state else ""
                    if v.dtype.kind == "i":
                        vals = list(map(str, v.tolist()))
                    elif np.isfinite(v).all():
                        vals = list(map(repr, v.tolist()))
                    else:
                        vals = list(map(_fmt_value, v.tolist()))
                    rows = range(n) if keep is None else np.flatnonzero(keep).tolist()
                    head = f"{family}{{"
                    tail = f"{extra}}} "
                    out.extend([f"{head}{lab[i]}{tail}{vals[i]} {ts[i]}" for i in rows])
        if openmetrics:
            out.append("# EOF")
        text = "\n".join(out) + "\n" if out else ""
        if path is not None:
            _atomic_write(Path(path), text.encode("utf-8"))
        return text

    def _check_monotone(self, col: str, v: np.ndarray, sid: np.ndarray, order: np.ndarray) -> None:
        bad = np.flatnonzero((np.diff(v) < 0) & (sid[1:] == sid[:-1]))
        if len(bad):
            i = order[bad[0] + 1]
            g = self._cats["group"][self._codes["group"][i]]
            raise InputError(f"monitor column {col!r} of group {g!r} decreases at t={self._num['time_s'][i]:g} s; "
                             f"a counter must not (cost_usd is cumulative, completed/rejected per interval >= 0)")

    def to_parquet(self, path: str | Path) -> Path:
        """One row per sample, the :data:`COLUMNS`; written atomically (a temporary file, then a rename)."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError("writing Parquet needs pyarrow: pip install -c constraints.txt '.[parquet]'") from None
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cols = {}
        for c in COLUMNS:
            if c in self._codes:
                codes, cats = self.codes(c)
                cols[c] = pa.array(np.array(cats, dtype=object)[codes], type=pa.string())
            else:
                cols[c] = pa.array(self._num[c][: self._n])
        tab = pa.table(cols).replace_schema_metadata({"fleetwise.monitor.interval_s": repr(self.interval_s)})
        check_replaceable(path)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(tab, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def read_parquet(cls, path: str | Path) -> Monitor:
        """A monitor from a file :meth:`to_parquet` wrote."""
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError("reading Parquet needs pyarrow: pip install -c constraints.txt '.[parquet]'") from None
        p = Path(path)
        if not p.exists():
            raise InputError(f"{p}: file not found")
        tab = pq.read_table(p)
        meta = tab.schema.metadata or {}
        interval = float(meta.get(b"fleetwise.monitor.interval_s", b"10.0"))
        return cls.from_table({c: tab.column(c).to_numpy(zero_copy_only=False) for c in tab.column_names},
                              interval_s=interval)


# ---------------------------------------------------------------------------------------------------- plots
def _pool_order(pools: Sequence[str]) -> list[str]:
    pref = ["on-demand", "ondemand", "reserved", "spot"]
    return sorted(pools, key=lambda p: (pref.index(p) if p in pref else len(pref), p))


def _pool_color(pool: str, i: int) -> str:
    return POOL_COLORS.get(pool.lower(), _EXTRA_COLORS[i % len(_EXTRA_COLORS)])


def _time_axis(t_s: np.ndarray) -> tuple[float, str]:
    """(divisor, axis label): hours beyond 3 h, minutes beyond 3 min, else seconds."""
    span = float(t_s.max() - t_s.min()) if len(t_s) else 0.0
    if span > 3 * 3600:
        return 3600.0, "simulated time (h)"
    if span > 180:
        return 60.0, "simulated time (min)"
    return 1.0, "simulated time (s)"


def _sum_by(t_idx: np.ndarray, n_t: int, mask: np.ndarray, v: np.ndarray, per_bin: np.ndarray) -> np.ndarray:
    """Sum of ``v`` over the rows in ``mask`` per sample time, averaged over the sample times of each plot bin."""
    return np.bincount(t_idx[mask], weights=v[mask].astype(float), minlength=n_t) / per_bin


def _event_color(label: str) -> str:
    s = label.lower()
    if "preempt" in s or "spot" in s or "evict" in s:
        return "#e8870e"
    if "fault" in s or "fail" in s or "down" in s or "outage" in s:
        return "#c0392b"
    return "#555555"


def _save_png(fig, path: str | Path) -> Path:
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from fleetwise.metrics.plotting import literal_text

    FigureCanvasAgg(fig)
    literal_text(fig)  # (a scenario's name, never TeX)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, facecolor="white")
    p = Path(path)
    _atomic_write(p, buf.getvalue())
    return p


MAX_MODEL_PANELS = 4
EVENT_STYLES = ("-", "--", ":", "-.")
MAX_EVENT_LABELS = 8
MAX_PLOT_POINTS = 1500  # longer runs are drawn as means over bins of consecutive sample times


def plot_monitor(monitor: Monitor, path_png: str | Path, title: str = "Fleet monitor",
                 events: Sequence[tuple[float, str]] = ()) -> Path:
    """Stacked panels over simulated time: replicas per model (ready solid, starting hatched, stacked by pool;
    dashed: the ceiling the spot trace allows the spot layers), waiting requests per model, KV-cache use and GPU busy per model
    (weighted by ready replicas), cumulative cost stacked by pool. ``events`` ``(t_s, label)`` are vertical lines
    on every panel (preemptions orange, faults red, others grey), one legend entry per distinct label."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    tab = monitor.table()
    n = len(monitor)
    times, t_idx = np.unique(tab["time_s"], return_inverse=True) if n else (np.zeros(0), np.zeros(0, int))
    t_idx = t_idx.reshape(-1)
    n_t = len(times)
    div, xlabel = _time_axis(times)
    n_b = min(n_t, MAX_PLOT_POINTS)
    bin_of_t = np.arange(n_t) * n_b // max(n_t, 1)  # consecutive sample times share a bin
    per_bin = np.maximum(np.bincount(bin_of_t, minlength=n_b), 1)
    x = times[np.searchsorted(bin_of_t, np.arange(n_b))] / div if n_t else times
    t_idx = bin_of_t[t_idx] if n else t_idx
    n_t = n_b
    models = list(dict.fromkeys(tab["model"].tolist())) or [""]
    shown = models[:MAX_MODEL_PANELS]
    model_key = np.array([m if m in shown else "other models" for m in tab["model"].tolist()], dtype=object)
    if len(models) > MAX_MODEL_PANELS:
        shown = [*shown, "other models"]
    pools = _pool_order(list(dict.fromkeys(tab["pool"].tolist())))
    pcolor = {p: _pool_color(p, i) for i, p in enumerate(pools)}
    mcolor = {m: f"C{i % 10}" for i, m in enumerate(shown)}

    n_rep = len(shown)
    heights = [2.0] * n_rep + [1.7, 1.7, 1.7]
    width, left, right, top, bottom, gap = 12.0, 0.8, 2.6, 0.55, 0.55, 0.28
    h = top + bottom + sum(heights) + gap * (len(heights) - 1)
    fig = Figure(figsize=(width, h), dpi=100)
    fig.subplots_adjust(left=left / width, right=1 - right / width, top=1 - top / h, bottom=bottom / h,
                        hspace=gap / (sum(heights) / len(heights)))
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights})
    fig.suptitle(title, fontsize=12, y=1 - 0.12 / h, va="top")
    legend_kw = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 8, "frameon": False}

    def line_kw(ax):
        ax.grid(True, alpha=0.25)
        ax.margins(x=0)

    # replicas per model, stacked by pool
    for ax, m in zip(axes[:n_rep], shown):
        in_m = model_key == m
        layers, colors, hatches, names = [], [], [], []
        for p in pools:
            sel = in_m & (tab["pool"] == p)
            if not sel.any():
                continue
            for col, state in (("replicas_ready", "ready"), ("replicas_starting", "starting")):
                layers.append(_sum_by(t_idx, n_t, sel, tab[col], per_bin))
                colors.append(pcolor[p])
                hatches.append(None if state == "ready" else "////")
                names.append(f"{p or 'pool'} {state}")
        handles = []
        if layers and n_t:
            polys = ax.stackplot(x, *layers, colors=colors, step="post", linewidth=0)
            for poly, hatch, c in zip(polys, hatches, colors):
                if hatch:
                    poly.set_facecolor("none")
                    poly.set_edgecolor(c)
                    poly.set_hatch(hatch)
                else:
                    poly.set_alpha(0.85)
            handles = [Patch(facecolor=c if not hh else "none", edgecolor=c, hatch=hh, alpha=0.85 if not hh else 1,
                             label=nm) for c, hh, nm in zip(colors, hatches, names)]
            top = float(np.sum(layers, axis=0).max())
            spot = in_m & (tab["spot_available"] >= 0)
            if spot.any():  # the trace's ceiling for the spot layers: drawn on top of the other pools' replicas
                base = sum(_sum_by(t_idx, n_t, in_m & ~spot, tab[c], per_bin)
                           for c in ("replicas_ready", "replicas_starting"))
                ceiling = base + _sum_by(t_idx, n_t, spot, tab["spot_available"], per_bin)
                (ln,) = ax.step(x, ceiling, where="post", color="black", ls="--", lw=1.1,
                                label="spot ceiling (trace)")
                handles.append(ln)
                top = max(top, float(ceiling.max()))
            ax.set_ylim(0, max(1.0, top) * 1.12)
        ax.set_ylabel("replicas")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # (0.2 replicas were ticked)
        ax.set_title(f"Replicas · {m or 'all models'}", fontsize=9.5, loc="left")
        if handles:
            ax.legend(handles=handles, **legend_kw)
        line_kw(ax)

    ax_q, ax_u, ax_c = axes[n_rep:]
    for m in shown:
        in_m = model_key == m
        if n_t:
            ax_q.step(x, _sum_by(t_idx, n_t, in_m, tab["waiting"], per_bin), where="post", color=mcolor[m], lw=1.3,
                      label=m or "all")
            ready = _sum_by(t_idx, n_t, in_m, tab["replicas_ready"], per_bin)
            with np.errstate(invalid="ignore", divide="ignore"):
                kv = _sum_by(t_idx, n_t, in_m, tab["kv_used"] * tab["replicas_ready"], per_bin) / ready
                busy = _sum_by(t_idx, n_t, in_m, tab["busy"] * tab["replicas_ready"], per_bin) / ready
            ax_u.plot(x, kv, color=mcolor[m], lw=1.3, label=f"{m or 'all'} KV used")
            ax_u.plot(x, busy, color=mcolor[m], lw=1.1, ls=":", label=f"{m or 'all'} GPU busy")
    ax_q.set_ylabel("requests")
    ax_q.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_q.set_title("Waiting requests", fontsize=9.5, loc="left")
    ax_u.set_ylabel("fraction")
    ax_u.set_ylim(0, 1.05)
    ax_u.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax_u.set_title("KV-cache use (solid) and GPU busy (dotted), ready-replica weighted", fontsize=9.5, loc="left")
    for ax in (ax_q, ax_u):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(**legend_kw)
        line_kw(ax)

    if n_t:
        cost_layers = [_sum_by(t_idx, n_t, tab["pool"] == p, tab["cost_usd"], per_bin) for p in pools]
        ax_c.stackplot(x, *cost_layers, colors=[pcolor[p] for p in pools], alpha=0.8,
                       labels=[p or "pool" for p in pools])
        total = float(np.sum(cost_layers, axis=0)[-1])
        ax_c.set_title(f"Cumulative GPU cost by pool (total ${total:,.2f})", fontsize=9.5, loc="left")
        ax_c.legend(**legend_kw)
    else:
        ax_c.set_title("Cumulative GPU cost by pool", fontsize=9.5, loc="left")
        ax_c.text(0.5, 0.5, "no samples", transform=ax_c.transAxes, ha="center", va="center", color="#777")
    ax_c.set_ylabel("USD")
    line_kw(ax_c)
    ax_c.set_xlabel(xlabel)

    if events:
        seen: dict[str, Any] = {}
        style: dict[str, str] = {}  # each distinct label its own line style within its colour's family (a zone
        per_colour: dict[str, int] = defaultdict(int)  # fault and a GPU fault were the same red line)
        for t, label in sorted(events, key=lambda e: e[0]):
            c = _event_color(label)
            if label not in style:
                style[label] = EVENT_STYLES[per_colour[c] % len(EVENT_STYLES)]
                per_colour[c] += 1
            for ax in axes:
                ln = ax.axvline(float(t) / div, color=c, lw=1.0, ls=style[label], alpha=0.8, zorder=3)
            if label not in seen and len(seen) < MAX_EVENT_LABELS:
                seen[label] = ln
        h_c, l_c = ax_c.get_legend_handles_labels()
        ax_c.legend(h_c + list(seen.values()), l_c + [f"event: {lb}" for lb in seen], **legend_kw)
    return _save_png(fig, path_png)


def _point(p: Sequence) -> tuple[str, float, float, Any, Any]:
    if len(p) not in (3, 4, 5):
        raise InputError(f"pareto point {p!r}: expected (label, cost_per_mtok_usd, slo_attainment[, cost_ci, "
                         f"attainment_ci])")
    label, cost, att = str(p[0]), float(p[1]), float(p[2])
    return label, cost, att, (p[3] if len(p) > 3 else None), (p[4] if len(p) > 4 else None)


def pareto_front(points: Sequence[Sequence]) -> list[str]:
    """Labels of the points no other point dominates (at most the cost and at least the attainment, and better in
    one), sorted by cost. Points with a NaN cost or attainment are left out; identical points are all kept."""
    from fleetwise.metrics.pareto import pareto_front as front

    pts = [_point(p) for p in points]
    keep = front([q[1] for q in pts], [-q[2] for q in pts])
    return [pts[i][0] for i in sorted(keep.tolist(), key=lambda i: (pts[i][1], -pts[i][2], pts[i][0]))]


def _err(ci: Any, v: float) -> tuple[float, float]:
    if ci is None:
        return 0.0, 0.0
    lo, hi = float(ci[0]), float(ci[1])
    return (max(0.0, v - lo) if math.isfinite(lo) else 0.0), (max(0.0, hi - v) if math.isfinite(hi) else 0.0)


def plot_pareto(points: Sequence[Sequence], path_png: str | Path,
                title: str = "Cost vs SLO attainment") -> Path:
    """Each point ``(label, cost_per_mtok_usd, slo_attainment[, cost_ci, attainment_ci])`` (CIs as ``(lo, hi)``
    or None) with its error bars and label; the Pareto front (cheaper and better met SLOs) circled and drawn as a
    step line: the best attainment reachable for a budget."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    pts = [_point(p) for p in points]
    fig = Figure(figsize=(8.5, 5.2), dpi=100)
    fig.subplots_adjust(left=0.1, right=0.97, top=0.9, bottom=0.12)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title, fontsize=11)
    ok = [q for q in pts if math.isfinite(q[1]) and math.isfinite(q[2])]
    if not ok:
        ax.text(0.5, 0.5, "no point has both a cost and an SLO attainment", transform=ax.transAxes,
                ha="center", va="center", color="#777")
        return _save_png(fig, path_png)
    front = set(pareto_front(ok))
    for i, (label, cost, att, cci, aci) in enumerate(ok):
        xe, ye = _err(cci, cost), _err(aci, att)
        on = label in front
        ax.errorbar([cost], [att], xerr=[[xe[0]], [xe[1]]], yerr=[[ye[0]], [ye[1]]], fmt="o", ms=6,
                    color="#1f5fa8" if on else "#8a96a3", ecolor="#9aa5b1", elinewidth=1, capsize=2, zorder=3)
        ax.annotate(label, (cost, att), xytext=(5, 4), textcoords="offset points", fontsize=8,
                    color="#1d2733" if on else "#55616f")
    fr = [q for q in ok if q[0] in front]
    fr.sort(key=lambda q: (q[1], q[2]))
    fx, fy = [q[1] for q in fr], [q[2] for q in fr]
    ax.plot(fx, fy, drawstyle="steps-post", color="black", ls="--", lw=1.1, zorder=2, label="Pareto front")
    ax.scatter(fx, fy, s=150, facecolors="none", edgecolors="black", lw=1.3, zorder=4)
    costs = np.array([q[1] for q in ok])
    if costs.min() > 0 and costs.max() / costs.min() > 30:
        ax.set_xscale("log")
    atts = np.array([q[2] for q in ok])
    if atts.min() >= 0 and atts.max() <= 1:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlabel("cost ($ per million tokens, lower is better)")
    ax.set_ylabel("SLO attainment (higher is better)")
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=8.5, loc="lower right")
    return _save_png(fig, path_png)
