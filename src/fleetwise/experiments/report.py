"""The HTML report of a results store: one self-contained ``index.html`` (plots embedded as base64 PNG, inline
CSS, no script, no external reference: it opens offline) and one PNG file per plot next to it.

Sections, each grouped by experiment (and inside by scenario and grid point):

1. summary tables: mean ± 95% t interval over seeds of the key metrics (``stats.aggregate``), the paired
   change against the baseline policy, ok/failed run counts and the failed runs' errors;
2. latency CDFs (TTFT and E2E) from the ``quantiles`` table, the quantile curves averaged over seeds;
3. metric-vs-load curves for every numeric grid parameter, with 95% CI bands;
4. cost vs latency, every (policy, grid point) a point with its CIs, the Pareto front highlighted;
5. per-replica GPU utilisation over time (``timeline`` table) for the lowest seed of each policy at the
   highest load;
6. learning curves of learned policies (``learning`` table).

A section without data says so in a sentence. Plots are drawn with matplotlib's Agg canvas (no display).
"""

from __future__ import annotations

import contextlib

import base64
import html
import io
import json
import math
import os
import re
import struct
import sys
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fleetwise.errors import InputError, check_replaceable
from fleetwise.metrics.pareto import pareto_front
from fleetwise.metrics.plotting import literal_text
from fleetwise.metrics.stats import CI, aggregate

# (summary key, label, unit shown, scale applied for display, direction: +1 higher is better, -1 lower is, 0 neither)
KEY_METRICS: list[tuple[str, str, str, float, int]] = [
    ("ttft_p50_s", "TTFT p50", "s", 1.0, -1),
    ("ttft_p99_s", "TTFT p99", "s", 1.0, -1),
    ("tpot_p50_s", "TPOT p50", "ms", 1e3, -1),
    ("e2e_p99_s", "E2E p99", "s", 1.0, -1),
    ("goodput_rps", "Goodput", "req/s", 1.0, +1),
    ("tokens_per_s", "Output tokens/s", "tok/s", 1.0, +1),
    ("gpu_util", "GPU util", "%", 100.0, 0),
    ("load_cv", "Load CV", "", 1.0, -1),
    ("cost_per_mtok_usd", "Cost", "$/Mtok", 1.0, -1),
    ("slowdown_p50", "Slowdown p50", "×", 1.0, -1),
]
# the headline metrics a reproduction names for itself (the store's ``meta`` table, key ``metrics``); a key not
# listed here is shown under its own name, with no direction
REPRO_METRICS: list[tuple[str, str, str, float, int]] = [
    ("deadline_rps", "Within deadline", "req/s", 1.0, +1),
    ("ttft_attainment", "TTFT attainment", "%", 100.0, +1),
    ("slo_attainment", "SLO attainment", "%", 100.0, +1),
    ("response_time_mean_s", "Response mean", "s", 1.0, -1),
    ("response_time_p99_s", "Response p99", "s", 1.0, -1),
    ("latency_p99_s", "Latency p99", "s", 1.0, -1),
    ("cost_usd", "Cost", "$", 1.0, -1),
    ("oscillations", "Oscillations", "", 1.0, -1),
    ("lost_requests", "Lost", "", 1.0, -1),
    ("switches", "Switches", "", 1.0, 0),
    ("rejected", "Rejected", "", 1.0, -1),
    ("accuracy", "Accuracy", "%", 100.0, +1),  # (reproduce allocation: the oracle's labels)
    ("f1", "F1", "", 1.0, +1),
    ("mean_total_reward", "Episode reward", "", 1.0, +1),
]
METRIC_INFO = {k: (label, unit, scale, better) for k, label, unit, scale, better in KEY_METRICS + REPRO_METRICS}
LOAD_METRICS = ["ttft_p99_s", "e2e_p99_s", "goodput_rps", "gpu_util"]
PARETO_LATENCIES = ["e2e_p99_s", "ttft_p99_s"]
DEFAULT_BASELINE_ROUTER = "round_robin"
DPI = 100
MAX_FAILED_SHOWN = 50
MAX_LOAD_ROWS = 6
MAX_CDF_ROWS = 8
MAX_CHANGE_ROWS = 40  # policies x grid points in the paired-change plot
MAX_CHANGE_METRICS = 4
CHANGE_HEADLINE = ("ttft_p99_s", "e2e_p99_s", "goodput_rps", "cost_per_mtok_usd")
MIN_SEEDS_COLOUR = 3  # two seeds: rests on one difference of two runs (its t interval is 12.7 standard errors wide)
MANIFEST = "report-manifest.json"
# figure margins in inches: left (tick labels + y label), right, top (figure title + axes title),
# bottom (tick labels + x label), and between axes
M_LEFT, M_RIGHT, M_TOP, M_BOTTOM, M_WSPACE, M_HSPACE = 0.85, 0.2, 0.68, 0.6, 0.95, 0.95
LEGEND_FONT = 8.5
_LEGENDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # figure -> (legend columns, title)

SECTIONS = [
    ("summary", "1. Summary"),
    ("cdf", "2. Latency CDFs"),
    ("load", "3. Metrics vs load"),
    ("pareto", "4. Cost vs latency"),
    ("timeline", "5. Per-replica utilisation over time"),
    ("learning", "6. Learning curves"),
]

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d2733;background:#fff;
margin:0;line-height:1.45}
main{max-width:1220px;margin:0 auto;padding:18px 20px 60px}
h1{font-size:1.6em;margin:.3em 0}
h2{font-size:1.3em;border-bottom:2px solid #d8dee6;padding-bottom:.2em;margin-top:1.8em}
h3{font-size:1.08em;margin:1.3em 0 .4em}h4{font-size:.98em;margin:1em 0 .3em;color:#3a4756}
p.meta,p.note{color:#55616f;font-size:.9em;margin:.3em 0}p.empty{color:#55616f;font-style:italic}
nav ol{margin:.4em 0;padding-left:1.4em}nav li{display:inline-block;margin-right:1.2em}
a{color:#1f5fa8}
.tablewrap{overflow-x:auto;margin:.4em 0 1em}
table{border-collapse:collapse;font-size:11.5px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d8dee6;padding:3px 4px;text-align:right;vertical-align:top;white-space:nowrap}
th{white-space:normal;vertical-align:bottom}
th{background:#f2f5f8;font-weight:600}td.l,th.l{text-align:left}
tr.base td{background:#fafbfc}
.pm{color:#6b7785}.chg{font-size:10.5px;color:#6b7785}
.good{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}
td.gp{white-space:normal;min-width:6em;max-width:11em;text-align:left}
td.err{white-space:normal;max-width:520px;
font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11.5px;text-align:left}
figure{margin:.6em 0 1.4em}figure img.plot{max-width:100%;height:auto;display:block;border:1px solid #eef1f4}
figcaption{color:#55616f;font-size:.88em;margin-top:.3em}
"""


# ---------------------------------------------------------------------------------------------------- helpers
def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _pkey(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def _short_key(k: str) -> str:
    return k.split(".")[-1] if not k.split(".")[-1].isdigit() else k


def _short_val(v: Any) -> str:
    if _is_num(v) or isinstance(v, str):
        return str(v)
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= 40 else s[:37] + "…"


def _tag(params: dict, keys: Sequence[str] | None = None, limit: int = 0) -> str:
    """``rate_rps=12, replicas=2``: the grid point (only ``keys`` when given), cut to ``limit`` characters."""
    s = ", ".join(f"{_short_key(k)}={_short_val(v)}" for k, v in params.items() if keys is None or k in keys)
    return s if not limit or len(s) <= limit else s[:limit - 1] + "…"


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _point_sort_key(params: dict) -> tuple:
    return tuple((0, float(v), "") if _is_num(v) else (1, 0.0, _short_val(v)) for _, v in sorted(params.items()))


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", s.lower()).strip("-.")[:80] or "x"


def _decimals(x: float) -> int:
    if x == 0 or not math.isfinite(x):
        return 3
    return int(min(6, max(0, 2 - math.floor(math.log10(abs(x))))))


def _fmt(x: float, d: int | None = None) -> str:
    if _nan(x):
        return "—"
    d = _decimals(x) if d is None else d
    s = f"{x:,.{d}f}" if abs(x) >= 10000 else f"{x:.{d}f}"
    return s.replace("-", "−")


def _breakable(text: str) -> str:
    """Escaped, with line-break opportunities after ``_``, ``=``, ``.`` and ``,`` (long grid keys in narrow cells)."""
    return re.sub(r"([_=.,])", r"\1<wbr>", _esc(text))


def _unit(u: str) -> str:
    return f" ({u})" if u else ""


def _param_unit(key: str) -> str:
    k = key.split(".")[-1]
    if k.endswith("_rps"):
        return " (req/s)"
    if k.endswith("_s"):
        return " (s)"
    if k == "replicas":
        return " (count)"
    return ""


def _png_size(data: bytes) -> tuple[int, int]:
    return struct.unpack(">II", data[16:24])


# ---------------------------------------------------------------------------------------------------- the model
@dataclass
class _Experiment:
    name: str
    ok: list[dict]
    failed: list[dict]
    baseline: dict | None = None
    # the summary's columns: (key, label, unit, scale, direction); KEY_METRICS unless the experiment names its own
    metrics: list[tuple[str, str, str, float, int]] = field(default_factory=lambda: list(KEY_METRICS))
    rows: list[dict] = field(default_factory=list)
    agg: dict[tuple, dict] = field(default_factory=dict)  # (scenario, pkey, batcher, router) -> aggregate row
    policies: list[tuple[str, str]] = field(default_factory=list)  # (router_label, batcher_label)
    names: dict[tuple[str, str], str] = field(default_factory=dict)
    colors: dict[tuple[str, str], Any] = field(default_factory=dict)
    scenarios: list[str] = field(default_factory=list)
    points: dict[str, list[dict]] = field(default_factory=dict)  # scenario -> grid points in order (all runs)
    ok_points: dict[str, list[dict]] = field(default_factory=dict)  # ... of the ok runs (what the plots show)
    grid_keys: list[str] = field(default_factory=list)
    varying: dict[str, list[str]] = field(default_factory=dict)  # scenario -> grid keys that vary

    def tag(self, scenario: str, params: dict, limit: int = 0) -> str:
        return _tag(params, self.varying.get(scenario, []), limit)

    def policy(self, run_or_row: dict) -> tuple[str, str]:
        if "router_label" in run_or_row:
            return (str(run_or_row.get("router_label") or run_or_row.get("router")),
                    str(run_or_row.get("batcher_label") or run_or_row.get("batcher")))
        return (str(run_or_row["router"]), str(run_or_row["batcher"]))

    def row(self, scenario: str, params: dict, pol: tuple[str, str]) -> dict | None:
        return self.agg.get((scenario, _pkey(params), pol[1], pol[0]))

    def is_base(self, pol: tuple[str, str]) -> bool:
        """Whether ``pol`` is the baseline of the paired changes."""
        if not self.baseline:
            return False
        level, name = next(iter(self.baseline.items()))
        return pol[0 if level == "router" else 1] == name

    def label(self, pol: tuple[str, str]) -> str:
        """A policy's name in a plot's legend, the baseline marked as the tables mark it."""
        return self.names[pol] + (" (baseline)" if self.is_base(pol) else "")

    def line_kw(self, pol: tuple[str, str]) -> dict:
        """Its line: the baseline dashed, a little thicker and on top (drawn first, under the others, it was hidden
        by a policy that follows it closely)."""
        if self.is_base(pol):
            return {"color": self.colors[pol], "lw": 2.1, "ls": "--", "zorder": 4}
        return {"color": self.colors[pol], "lw": 1.6, "zorder": 3}

    @property
    def slug(self) -> str:
        return _slug(self.name)


def auto_baseline(runs: list[dict]) -> dict | None:
    """The baseline of an experiment that names none: the router ``round_robin`` when every group (scenario, grid
    point, batcher) of ``runs`` has it beside another router; else None. ``sweep`` and the report use the same."""
    groups: dict[tuple, set] = defaultdict(set)
    for r in runs:
        groups[(r["scenario"], _pkey(r["params"]), r.get("batcher_label"))].add(r.get("router_label"))
    if not groups or not any(len(s) > 1 for s in groups.values()):
        return None
    if all(DEFAULT_BASELINE_ROUTER in s for s in groups.values()):
        return {"router": DEFAULT_BASELINE_ROUTER}
    return None


def _meta_metrics(meta: dict, ok: list[dict]) -> list[tuple[str, str, str, float, int]]:
    """The summary's columns: the metrics the experiment names (a reproduction's headline metrics), then the
    usual ones that its runs have; without names, the usual ones."""
    try:
        named = [str(k) for k in json.loads(meta.get("metrics", "[]"))]
    except (ValueError, TypeError):
        named = []
    if not named:
        return list(KEY_METRICS)
    cols = [(k, *METRIC_INFO[k]) if k in METRIC_INFO else (k, k, "", 1.0, 0) for k in dict.fromkeys(named)]
    cols += [m for m in KEY_METRICS if m[0] not in named and any(r.get(m[0]) is not None for r in ok)]
    return cols


def _meta_baseline(meta: dict, runs: list[dict]) -> dict | None:
    """The baseline an experiment names (a reproduction's rule), if its runs have that policy."""
    try:
        b = json.loads(meta.get("baseline", "null"))
        (level, name), = b.items()
    except (ValueError, TypeError, AttributeError):
        return None
    if level not in ("router", "batcher") or not any(r.get(f"{level}_label") == name for r in runs):
        return None
    return {level: str(name)}


def _build_experiment(name: str, runs: list[dict], baseline: dict | None, meta: dict | None = None) -> _Experiment:
    ok = [r for r in runs if r.get("status") == "ok"]
    failed = [r for r in runs if r.get("status") != "ok"]
    ex = _Experiment(name=name, ok=ok, failed=failed)
    meta = meta or {}
    ex.metrics = _meta_metrics(meta, ok)
    ex.baseline = baseline if baseline is not None else (_meta_baseline(meta, ok) or auto_baseline(ok))
    ex.rows = aggregate(ok, [k for k, *_ in ex.metrics], ex.baseline or None) if ok else []
    for row in ex.rows:
        ex.agg[(row["scenario"], _pkey(row["params"]), row["batcher"], row["router"])] = row
    pols = list(dict.fromkeys(ex.policy(r) for r in runs))
    if ex.baseline:
        level, bname = next(iter(ex.baseline.items()))
        idx = 0 if level == "router" else 1
        pols.sort(key=lambda p: p[idx] != bname)  # stable: the baseline first, the rest in store order
    ex.policies = pols
    routers = {p[0] for p in pols}
    batchers = {p[1] for p in pols}
    for p in pols:
        if len(batchers) <= 1:
            ex.names[p] = p[0]
        elif len(routers) <= 1:
            ex.names[p] = p[1]
        else:
            ex.names[p] = f"{p[0]} / {p[1]}"
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(pols) <= 10 else "tab20"]
    for i, p in enumerate(pols):
        ex.colors[p] = cmap(i % cmap.N)
    ex.scenarios = list(dict.fromkeys(r["scenario"] for r in runs))
    for s in ex.scenarios:
        pts = {_pkey(r["params"]): r["params"] for r in runs if r["scenario"] == s}
        ex.points[s] = sorted(pts.values(), key=_point_sort_key)
        ok_keys = {_pkey(r["params"]) for r in ok if r["scenario"] == s}
        ex.ok_points[s] = [p for p in ex.points[s] if _pkey(p) in ok_keys]
    ex.grid_keys = list(dict.fromkeys(k for r in runs for k in r["params"]))
    for s in ex.scenarios:  # keys whose value differs between grid points: what tells the points apart
        vals = defaultdict(set)
        for p in ex.points[s]:
            for k in ex.grid_keys:
                vals[k].add(json.dumps(p.get(k), sort_keys=True))
        ex.varying[s] = [k for k in ex.grid_keys if len(vals[k]) > 1]
    return ex


def _numeric_params(ex: _Experiment, scenario: str) -> list[str]:
    """Grid keys with numbers for values and at least two of them among the ok runs' grid points."""
    out = []
    for k in ex.grid_keys:
        vals = [p[k] for p in ex.ok_points[scenario] if k in p]
        if vals and all(_is_num(v) for v in vals) and len(set(vals)) > 1:
            out.append(k)
    return out


def _load_combos(ex: _Experiment, scenario: str, k: str) -> list[tuple[str, list[dict]]]:
    """The ok grid points holding ``k``, grouped by the values of the other grid keys (only groups where ``k``
    takes at least two values: a curve needs two points)."""
    others: dict[str, list[dict]] = defaultdict(list)
    for p in ex.ok_points[scenario]:
        if k in p:
            others[_pkey({kk: v for kk, v in p.items() if kk != k})].append(p)
    return [(o, sorted(pts, key=lambda p: p[k])) for o, pts in others.items() if len({p[k] for p in pts}) > 1]


# ---------------------------------------------------------------------------------------------------- plots
class _Plots:
    """Renders figures to PNG once: the bytes go to a file and, base64-encoded, into the page."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.files: list[str] = []
        self.ids: set[str] = set()

    def grid(self, nrows: int, ncols: int, width: float, ax_h: float, title: str,
             legend: Sequence[str] = (), legend_title: str | None = None, left: float = M_LEFT, **kw):
        """A figure of ``nrows x ncols`` axes ``ax_h`` inches high with fixed margins (in inches; a layout engine
        would double the drawing time; ``left`` wider for long tick labels), the title on top and room for a
        figure legend of ``legend`` below."""
        from matplotlib.figure import Figure

        ncol, extra = _legend_geometry(legend, width, legend_title)
        ax_w = (width - left - M_RIGHT - (ncols - 1) * M_WSPACE) / ncols
        h = M_TOP + M_BOTTOM + extra + nrows * ax_h + (nrows - 1) * M_HSPACE
        fig = Figure(figsize=(width, h), dpi=DPI)
        fig.subplots_adjust(left=left / width, right=1 - M_RIGHT / width, top=1 - M_TOP / h,
                            bottom=(M_BOTTOM + extra) / h, wspace=M_WSPACE / ax_w, hspace=M_HSPACE / ax_h)
        axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
        fig.suptitle(title, fontsize=11, y=1 - 0.1 / h, va="top")
        _LEGENDS[fig] = (ncol, legend_title)
        return fig, axes

    @staticmethod
    def legend(fig, handles, labels) -> None:
        ncol, title = _LEGENDS.get(fig, (len(labels), None))
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.06 / fig.get_size_inches()[1]),
                   ncol=ncol, fontsize=LEGEND_FONT, title=title, title_fontsize=LEGEND_FONT, frameon=True)

    def html(self, fig, pid: str, alt: str, caption: str) -> str:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        base, i = _slug(pid), 2
        pid = base
        while pid in self.ids:
            pid, i = f"{base}-{i}", i + 1
        self.ids.add(pid)
        FigureCanvasAgg(fig)
        literal_text(fig)  # (names, never TeX)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
        data = buf.getvalue()
        fname = f"{pid}.png"
        (self.out_dir / fname).write_bytes(data)
        self.files.append(fname)
        w, h = _png_size(data)
        b64 = base64.b64encode(data).decode("ascii")
        return (f'<figure><img class="plot" data-plot="{_esc(pid)}" alt="{_esc(alt)}" width="{w}" height="{h}" '
                f'src="data:image/png;base64,{b64}"><figcaption>{_esc(caption)} '
                f'<span class="meta">(file: {_esc(fname)})</span></figcaption></figure>')


def _where(ex: _Experiment, scenario: str) -> str:
    return scenario if scenario == ex.name else f"{ex.name} · {scenario}"


def _legend_geometry(labels: Sequence[str], width: float, title: str | None) -> tuple[int, float]:
    """Columns of a figure legend that fits the width, and the height it needs (inches)."""
    if not labels:
        return 1, 0.0
    entry_w = 0.55 + 0.066 * max(len(lab) for lab in labels)
    ncol = max(1, min(len(labels), int((width - 0.4) // entry_w)))
    rows = -(-len(labels) // ncol)
    return ncol, 0.18 + 0.19 * rows + (0.2 if title else 0.0)


def _ci_arrays(ex: _Experiment, scenario: str, points: list[dict], pol, metric: str, scale: float = 1.0):
    m, lo, hi = [], [], []
    for p in points:
        row = ex.row(scenario, p, pol)
        ci: CI | None = row["ci"].get(metric) if row else None
        m.append(np.nan if ci is None or _nan(ci.mean) else ci.mean * scale)
        lo.append(np.nan if ci is None or _nan(ci.lo) else ci.lo * scale)
        hi.append(np.nan if ci is None or _nan(ci.hi) else ci.hi * scale)
    return np.array(m, float), np.array(lo, float), np.array(hi, float)


def _few_seeds(ex: _Experiment, scenario: str) -> str:
    """A caption's warning when some policy of ``scenario`` has two seeds: its "interval" is just their range."""
    if any(r["scenario"] == scenario and 1 < r["seeds"] < MIN_SEEDS_COLOUR for r in ex.rows):
        return (f" Where a policy has fewer than {MIN_SEEDS_COLOUR} seeds, its bars are those seeds' range, not a "
                f"confidence interval.")
    return ""


def _no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#888", fontsize=10)


def _maybe_log_y(ax, values: np.ndarray) -> None:
    v = values[np.isfinite(values) & (values > 0)]
    if len(v) and v.max() / v.min() > 30:
        ax.set_yscale("log")


# ---------------------------------------------------------------------------------------------------- section 1
def _summary_html(ex: _Experiment) -> str:
    n_ok, n_failed = len(ex.ok), len(ex.failed)
    parts = [f'<p class="meta">{n_ok + n_failed} runs: <b>{n_ok} ok</b>, '
             f'<b class="{"bad" if n_failed else ""}">{n_failed} failed</b>; '
             f'{_plural(len(ex.scenarios), "scenario")}, {_plural(len(ex.policies), "policy", "policies")}, '
             f'{_plural(sum(len(v) for v in ex.points.values()), "(scenario, grid point) combination")}.</p>']
    if ex.baseline:
        level, bname = next(iter(ex.baseline.items()))
        parts.append(f'<p class="note">Cells: mean <span class="pm">± half-width of the 95% t interval over seeds'
                     f'</span> (hover a cell for the interval). Second line: paired change against the baseline '
                     f'{_esc(level)} <b>{_esc(bname)}</b> (same seed, scenario and grid point) in %, '
                     f'with its 95% CI [low, high]; <span class="good">green</span> = better, '
                     f'<span class="bad">red</span> = worse, '
                     f'coloured only where the interval excludes 0 '
                     f'and at least {MIN_SEEDS_COLOUR} seeds are paired.</p>')
    else:
        parts.append('<p class="note">Cells: mean <span class="pm">± half-width of the 95% t interval over seeds'
                     '</span> (hover a cell for the interval). No baseline policy (no router named '
                     f'<code>{DEFAULT_BASELINE_ROUTER}</code> in every group), so no paired changes.</p>')
    fails = defaultdict(int)
    for r in ex.failed:
        fails[(r["scenario"], _pkey(r["params"]), *ex.policy(r))] += 1
    oks = defaultdict(int)
    for r in ex.ok:
        oks[(r["scenario"], _pkey(r["params"]), *ex.policy(r))] += 1
    for s in ex.scenarios:
        gk = ex.varying[s]
        fixed = {k: v for k, v in ex.points[s][0].items() if k not in gk} if ex.points[s] else {}
        if len(gk) == 1:
            head = f'<th class="l" title="{_esc(gk[0])}">{_esc(_short_key(gk[0]))}</th>'
        elif gk:
            head = f'<th class="l" title="{_esc(", ".join(gk))}">grid point</th>'
        else:
            head = ""
        head += '<th class="l">policy</th><th title="ok runs (failed)">runs</th>'
        head += "".join(f"<th>{_esc(label)}{_esc(_unit(unit))}</th>" for _, label, unit, _, _ in ex.metrics)
        body = []
        for p in ex.points[s]:
            pols = [pol for pol in ex.policies if oks.get((s, _pkey(p), *pol)) or fails.get((s, _pkey(p), *pol))]
            for i, pol in enumerate(pols):
                row = ex.row(s, p, pol)
                n_ok_g, n_f_g = oks.get((s, _pkey(p), *pol), 0), fails.get((s, _pkey(p), *pol), 0)
                is_base = ex.is_base(pol)
                cells = []
                if i == 0:
                    if len(gk) == 1:
                        cells.append(f'<td class="l" rowspan="{len(pols)}">{_esc(_short_val(p.get(gk[0], "")))}</td>')
                    elif gk:
                        point = "<br>".join(_breakable(f"{_short_key(k)}={_short_val(p[k])}") for k in gk if k in p)
                        cells.append(f'<td class="gp" rowspan="{len(pols)}">{point}</td>')
                name = _esc(ex.names[pol]) + (' <span class="pm">(baseline)</span>' if is_base else "")
                cells.append(f'<td class="l">{name}</td>')
                failed_note = f' <span class="bad">({n_f_g} failed)</span>' if n_f_g else ""
                cells.append(f"<td>{n_ok_g}{failed_note}</td>")
                for key, _, _, scale, better in ex.metrics:
                    ci = row["ci"].get(key) if row else None
                    if ci is None or _nan(ci.mean):
                        cells.append("<td>—</td>")
                        continue
                    d = _decimals(ci.mean * scale)
                    txt = _fmt(ci.mean * scale, d)
                    title = f"n={ci.n} seeds"
                    if not _nan(ci.lo):
                        txt += f' <span class="pm">± {_fmt(ci.half * scale, d)}</span>'
                        title = f"95% CI [{_fmt(ci.lo * scale, d)}, {_fmt(ci.hi * scale, d)}], " + title
                    chg = row["vs_baseline"].get(key) if row else None
                    if chg is not None and not _nan(chg.mean):
                        cls = ""
                        if better and chg.n >= MIN_SEEDS_COLOUR and not _nan(chg.lo) and (chg.lo > 0 or chg.hi < 0):
                            cls = " good" if chg.mean * better > 0 else " bad"
                        ctxt = f"{chg.mean * 100:+.1f}%"
                        ctitle = f"change vs baseline {ctxt}"
                        if not _nan(chg.lo):  # (its bounds, as the command line prints them)
                            ctxt += f" [{chg.lo * 100:+.1f}, {chg.hi * 100:+.1f}]"
                            ctitle += f", 95% CI [{chg.lo * 100:+.1f}%, {chg.hi * 100:+.1f}%]"
                        txt += (f'<br><span class="chg{cls}" title="{_esc(ctitle)}">'
                                f'{_esc(ctxt.replace("-", "−"))}</span>')
                    cells.append(f'<td title="{_esc(title)}">{txt}</td>')
                body.append(f'<tr class="{"base" if is_base else ""}">' + "".join(cells) + "</tr>")
        parts.append(f"<h4>Scenario {_esc(s)}</h4>")
        if fixed:
            parts.append(f'<p class="note">Same in every run: {_esc(_tag(fixed))}</p>')
        parts.append(f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
                     f"</tbody></table></div>")
    if ex.failed:
        parts.append(f"<h4>Failed runs ({len(ex.failed)})</h4>")
        rows = []
        for r in ex.failed[:MAX_FAILED_SHOWN]:
            rows.append(f'<tr><td class="l">{_esc(r["scenario"])}</td><td class="l">{_esc(_tag(r["params"]))}</td>'
                        f'<td class="l">{_esc(ex.names.get(ex.policy(r), ""))}</td><td>{_esc(r.get("seed"))}</td>'
                        f'<td class="err">{_esc(r.get("error") or "(no error recorded)")}</td></tr>')
        more = (f'<p class="note">… and {len(ex.failed) - MAX_FAILED_SHOWN} more failed runs.</p>'
                if len(ex.failed) > MAX_FAILED_SHOWN else "")
        parts.append('<div class="tablewrap"><table><thead><tr><th class="l">scenario</th><th class="l">grid point</th>'
                     '<th class="l">policy</th><th>seed</th><th class="l">error</th></tr></thead><tbody>'
                     + "".join(rows) + "</tbody></table></div>" + more)
    else:
        parts.append('<p class="note">No failed runs.</p>')
    return "".join(parts)


def _changes_html(ex: _Experiment, plots: _Plots) -> str:
    """The paired changes against the baseline the summary's second lines give, drawn: per metric (the summary's
    first ones with a direction), one row per policy and grid point, the mean change and its 95% CI; a filled
    marker where the interval excludes 0 over at least MIN_SEEDS_COLOUR paired seeds."""
    if not ex.baseline:
        return ""
    parts = []
    for s in ex.scenarios:
        rows = []
        for p in ex.ok_points[s]:
            tag = ex.tag(s, p, 30)
            for pol in ex.policies:
                row = ex.row(s, p, pol)
                if not ex.is_base(pol) and row and row["vs_baseline"]:
                    rows.append((tag or ex.names[pol], pol, row["vs_baseline"]))
        usable = [m for m in ex.metrics if m[4] != 0 and any(
            (c := r[2].get(m[0])) is not None and not _nan(c.mean) for r in rows)]
        headline = [m for m in usable if m[0] in CHANGE_HEADLINE]  # (the tail, goodput and cost first)
        metrics = (headline or usable)[:MAX_CHANGE_METRICS]
        if not rows or not metrics:
            continue
        n_all = len(rows)
        rows = rows[:MAX_CHANGE_ROWS]
        pols = list(dict.fromkeys(r[1] for r in rows))
        labels = [r[0][:22] for r in rows]  # (8-point tick labels: about 0.065 inches a character)
        fig, axes = plots.grid(1, len(metrics), 11.5, 0.6 + 0.24 * len(rows),
                               f"Paired change vs {next(iter(ex.baseline.values()))} · {_where(ex, s)} "
                               f"(mean and 95% CI over seeds)", legend=[ex.names[q] for q in pols],
                               legend_title="policy", sharey="row",
                               left=max(M_LEFT, 0.25 + 0.065 * max(map(len, labels))))
        y = np.arange(len(rows))[::-1]
        for ax, (key, label, _, _, better) in zip(axes[0], metrics):
            for yi, (_, pol, chg) in zip(y, rows):
                c = chg.get(key)
                if c is None or _nan(c.mean):
                    continue
                lo = c.lo if not _nan(c.lo) else c.mean
                hi = c.hi if not _nan(c.hi) else c.mean
                sure = c.n >= MIN_SEEDS_COLOUR and not _nan(c.lo) and (c.lo > 0 or c.hi < 0)
                ax.errorbar([c.mean * 100], [yi], xerr=[[(c.mean - lo) * 100], [(hi - c.mean) * 100]], fmt="o", ms=5,
                            color=ex.colors[pol], mfc=ex.colors[pol] if sure else "white", capsize=2, elinewidth=1.2)
            ax.axvline(0.0, color="black", lw=0.9)
            ax.set_title(f"{label} ({'lower' if better < 0 else 'higher'} is better)", fontsize=10)
            ax.set_xlabel("change vs baseline (%)")
            ax.grid(True, axis="x", alpha=0.3)
        axes[0][0].set_yticks(y)
        axes[0][0].set_yticklabels(labels, fontsize=8)
        from matplotlib.lines import Line2D

        plots.legend(fig, [Line2D([], [], color=ex.colors[q], marker="o", lw=1.2) for q in pols],
                     [ex.names[q] for q in pols])
        parts.append(plots.html(
            fig, f"changes-{ex.slug}-{s}", f"Paired changes against the baseline for scenario {s} of {ex.name}",
            f"Scenario {s}: each row a policy at a grid point, its change against the baseline at the same seed, "
            f"scenario and grid point (mean over seeds, bars: 95% t interval; filled where the interval excludes 0 "
            f"over at least {MIN_SEEDS_COLOUR} seeds)" + (f"; the first {len(rows)} of {n_all} rows" if n_all > len(rows)
                                                          else "") + "." + _few_seeds(ex, s)))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------- section 2
def _cdf_html(ex: _Experiment, quant: dict, plots: _Plots) -> str:
    """``quant[(scenario, pkey, router, batcher, metric)] = (q, mean value over seeds)``."""
    parts = []
    for s in ex.scenarios:
        pts = [p for p in ex.ok_points[s] if any((s, _pkey(p), *pol, m) in quant for pol in ex.policies
                                              for m in ("ttft_s", "e2e_s"))]
        if not pts:
            why = ("a paper reproduction stores its runs' summaries, not their distributions"
                   if ex.ok and all("-" in (r.get("router"), r.get("batcher")) for r in ex.ok)
                   else "no completed requests in any ok run")
            parts.append(f'<p class="empty">Scenario {_esc(s)}: no latency quantiles stored ({why}).</p>')
            continue
        n_all = len(pts)
        if n_all > MAX_CDF_ROWS:  # evenly spaced grid points, the first and the last included
            pts = [pts[i] for i in sorted({round(j * (n_all - 1) / (MAX_CDF_ROWS - 1)) for j in range(MAX_CDF_ROWS)})]
        fig, axes = plots.grid(len(pts), 2, 10.5, 2.1, f"Latency CDFs · {_where(ex, s)} (quantiles averaged over "
                               f"seeds; band: their range)", sharex="col")
        for i, p in enumerate(pts):
            for j, (m, label) in enumerate((("ttft_s", "TTFT"), ("e2e_s", "E2E latency"))):
                ax = axes[i][j]
                for pol in ex.policies:
                    c = quant.get((s, _pkey(p), *pol, m))
                    if c is None:
                        continue
                    q, v, lo, hi = c
                    keep = v > 0
                    ax.plot(v[keep], q[keep], label=ex.label(pol), **ex.line_kw(pol))
                    band = keep & (lo > 0) & (hi > lo)  # (the seeds' range at each percentile: the spread the mean hid)
                    if band.any():
                        ax.fill_betweenx(q[band], lo[band], hi[band], color=ex.colors[pol], alpha=0.12, lw=0)
                ax.set_xscale("log")
                ax.set_ylim(0, 100)
                ax.grid(True, which="major", alpha=0.3)
                ax.set_xlabel(f"{label} (s, log scale)")
                ax.set_ylabel("percentile of requests (%)")
                ptag = ex.tag(s, p, 60)
                ax.set_title(f"{label}" + (f" · {ptag}" if ptag else ""), fontsize=10)
                if not ax.lines:
                    _no_data(ax)
        first = next((ax for ax in axes.flat if ax.lines), None)
        if first is not None:
            first.legend(loc="lower right", fontsize=8, title="policy", title_fontsize=8)
        parts.append(plots.html(
            fig, f"cdf-{ex.slug}-{s}", f"TTFT and E2E latency CDFs per policy for scenario {s} of {ex.name}",
            f"Scenario {s}: one row per grid point" + (f" ({len(pts)} of {n_all}, evenly spaced)" if n_all > len(pts)
                                                        else "") +
            "; each line is a policy's latency distribution, the 0–100th percentiles averaged over seeds, the band "
            "their range over the seeds."))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------- section 3
def _load_html(ex: _Experiment, plots: _Plots) -> str:
    parts = []
    for s in ex.scenarios:
        nparams = [k for k in _numeric_params(ex, s) if _load_combos(ex, s, k)]
        if not nparams:
            parts.append(f'<p class="empty">Scenario {_esc(s)}: the experiment has no numeric grid parameter with '
                         f'more than one value, so there are no metric-vs-load curves.</p>')
            continue
        for k in nparams:
            combos = _load_combos(ex, s, k)
            shown = combos[:MAX_LOAD_ROWS]
            ltitle = "policy (mean over seeds, bars and bands: 95% CI)"
            fig, axes = plots.grid(len(shown), len(LOAD_METRICS), 11.5, 2.1,
                                   f"Metrics vs {_short_key(k)} · {_where(ex, s)}",
                                   legend=[ex.label(p) for p in ex.policies], legend_title=ltitle)
            for i, (okey, pts) in enumerate(shown):
                x = np.array([p[k] for p in pts], float)
                otag = ex.tag(s, json.loads(okey), 34)
                for j, m in enumerate(LOAD_METRICS):
                    label, unit, scale, _ = METRIC_INFO[m]
                    ax = axes[i][j]
                    allv = []
                    for pol in ex.policies:
                        mean, lo, hi = _ci_arrays(ex, s, pts, pol, m, scale)
                        if not np.isfinite(mean).any():
                            continue
                        c = ex.colors[pol]
                        err = np.vstack([np.where(np.isfinite(lo), mean - lo, 0),
                                         np.where(np.isfinite(hi), hi - mean, 0)])
                        kw = ex.line_kw(pol)
                        ax.errorbar(x, mean, yerr=err, marker="o", ms=3.5, capsize=2.5, label=ex.label(pol), **kw)
                        ok = np.isfinite(lo) & np.isfinite(hi)
                        if ok.sum() > 1:
                            ax.fill_between(x[ok], lo[ok], hi[ok], color=c, alpha=0.13, lw=0)
                        allv.append(mean)
                    if allv and m != "gpu_util":
                        _maybe_log_y(ax, np.concatenate(allv))
                    if not allv:
                        _no_data(ax)
                    if len(x) <= 8:
                        ax.set_xticks(x)
                        ax.set_xticklabels([_short_val(v) for v in (p[k] for p in pts)])
                    ax.set_xlabel(_short_key(k) + _param_unit(k))
                    ax.set_ylabel(label + _unit(unit))
                    ax.set_title(label + (f" · {otag}" if otag else ""), fontsize=10)
                    ax.grid(True, alpha=0.25)
            found: dict[str, Any] = {}
            for ax in axes.flat:
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    found.setdefault(lab, h)
            labels = [ex.label(p) for p in ex.policies if ex.label(p) in found]
            if labels:
                plots.legend(fig, [found[lab] for lab in labels], labels)
            cap = (f"Scenario {s}: TTFT p99, E2E p99, goodput and GPU utilisation against {k}; one line per policy "
                   f"with its 95% CI over seeds.{_few_seeds(ex, s)}")
            if len(combos) > len(shown):
                cap += f" Showing {len(shown)} of {len(combos)} combinations of the other grid parameters."
            elif len(combos) > 1:
                cap += " One row per combination of the other grid parameters."
            parts.append(plots.html(fig, f"load-{ex.slug}-{s}-{_short_key(k)}",
                                    f"Metrics against {k} per policy for scenario {s} of {ex.name}", cap))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------- section 4
def _pareto_html(ex: _Experiment, plots: _Plots) -> str:
    parts = []
    for s in ex.scenarios:
        anything = False
        pts = ex.ok_points[s]
        show_tag = len(pts) > 1
        keys = ex.varying[s]
        show_tag = show_tag and bool(keys)
        title = f"Cost vs latency · {_where(ex, s)}" + (
            f" (point labels: {', '.join(_short_key(k) for k in keys)})" if show_tag else "")
        fig, axes = plots.grid(1, len(PARETO_LATENCIES), 11.5, 3.8, title)
        axes = axes[0]
        for ax, lat in zip(axes, PARETO_LATENCIES):
            llabel, lunit, lscale, _ = METRIC_INFO[lat]
            xs, ys, gs = [], [], []  # (gs: the grid point of each point: one front per grid point)
            for pol in ex.policies:
                xm, xlo, xhi = _ci_arrays(ex, s, pts, pol, lat, lscale)
                ym, ylo, yhi = _ci_arrays(ex, s, pts, pol, "cost_per_mtok_usd")
                ok = np.isfinite(xm) & np.isfinite(ym)
                if not ok.any():
                    continue
                anything = True
                xerr = np.vstack([np.nan_to_num(xm - xlo), np.nan_to_num(xhi - xm)])[:, ok]
                yerr = np.vstack([np.nan_to_num(ym - ylo), np.nan_to_num(yhi - ym)])[:, ok]
                base = ex.is_base(pol)
                ax.errorbar(xm[ok], ym[ok], xerr=xerr, yerr=yerr, fmt="D" if base else "o", ms=6 if base else 5,
                            color=ex.colors[pol], capsize=2, elinewidth=1, label=ex.label(pol),
                            zorder=4 if base else 3)
                xs.append(xm[ok])
                ys.append(ym[ok])
                gs.append(np.flatnonzero(ok))
            if xs:
                x, y, g = np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)
                # the cost of a token moves with the load far more than with the policy: a front over every grid
                # point was a front of loads; each grid point gets its own, named once beside its cheapest point
                for gi in np.unique(g):
                    sel = np.flatnonzero(g == gi)
                    f = sel[pareto_front(x[sel], y[sel])]
                    f = f[np.argsort(x[f])]
                    ax.plot(x[f], y[f], ls="--", color="black", lw=1, drawstyle="steps-post", zorder=1)
                    ax.scatter(x[f], y[f], s=130, facecolors="none", edgecolors="black", lw=1.4, zorder=2,
                               label="Pareto front (per grid point)" if gi == g.min() else None)
                    if show_tag:
                        k_low = sel[np.argmin(y[sel])]
                        ax.annotate(", ".join(_short_val(pts[gi].get(k)) for k in keys)[:24], (x[k_low], y[k_low]),
                                    fontsize=7, xytext=(0, -11), textcoords="offset points", ha="center",
                                    color="#333")
                if x.min() > 0 and x.max() / x.min() > 30:
                    ax.set_xscale("log")
            ax.set_xlabel(f"{llabel}{_unit(lunit)}")
            ax.set_ylabel("cost ($ per million tokens)")
            ax.set_title(f"Cost vs {llabel}", fontsize=10)
            ax.grid(True, alpha=0.25)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="best")
            else:
                _no_data(ax)
        if not anything:
            parts.append(f'<p class="empty">Scenario {_esc(s)}: no run has both a cost and a latency, so there is '
                         f"no cost-vs-latency plot.</p>")
            continue
        parts.append(plots.html(
            fig, f"pareto-{ex.slug}-{s}", f"Cost per million tokens against tail latency for scenario {s} of {ex.name}",
            f"Scenario {s}: each point is a policy at a grid point (mean over seeds, bars: 95% CI; the baseline a "
            f"diamond); circled points form each grid point's Pareto front (no other policy at that grid point is both "
            f"cheaper and faster), the grid point named below its cheapest policy.{_few_seeds(ex, s)}"))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------- section 5
def _load_key(ex: _Experiment, s: str) -> str | None:
    nums = _numeric_params(ex, s)
    for k in nums:
        if "rate" in k.split(".")[-1]:
            return k
    return nums[0] if nums else None


def _timeline_html(ex: _Experiment, with_tl: set, store, plots: _Plots) -> str:
    """``with_tl``: the run ids that have timeline rows."""
    parts = []
    runs = [r for r in ex.ok if r["run_id"] in with_tl]
    if not runs:
        return ('<p class="empty">This experiment stored no utilisation timeline (set <code>timeline_bucket_s</code> '
                'in the experiment spec to record one).</p>')
    for s in ex.scenarios:
        rs = [r for r in runs if r["scenario"] == s]
        if not rs:
            parts.append(f'<p class="empty">Scenario {_esc(s)}: no utilisation timeline stored.</p>')
            continue
        k = _load_key(ex, s)
        pts = {_pkey(r["params"]): r["params"] for r in rs}
        if k is not None:
            point = max(pts.values(), key=lambda p: ((p.get(k) if _is_num(p.get(k)) else -math.inf),
                                                      _point_sort_key(p)))
        else:
            point = max(pts.values(), key=_point_sort_key)
        chosen = {}
        for r in sorted((r for r in rs if _pkey(r["params"]) == _pkey(point)), key=lambda r: r["seed"]):
            chosen.setdefault(ex.policy(r), r)
        pols = [p for p in ex.policies if p in chosen]
        ids = [chosen[p]["run_id"] for p in pols]
        ph = ", ".join("?" * len(ids))
        d = store.query(f"SELECT run_id, replica, t_s, util FROM timeline WHERE run_id IN ({ph}) "
                        "ORDER BY run_id, replica, t_s", ids)
        series: dict[str, dict[int, tuple[list, list]]] = defaultdict(lambda: defaultdict(lambda: ([], [])))
        for rid, rep, t, u in zip(d["run_id"], d["replica"], d["t_s"], d["util"]):
            xs, ys = series[rid][int(rep)]
            xs.append(float(t))
            ys.append(float(u) * 100)
        replicas = sorted({rep for v in series.values() for rep in v})
        n_rep = max(replicas, default=0) + 1
        step = -(-len(replicas) // 16)  # many replicas: a sample of them in the legend
        labels = [f"replica {rep}" for rep in replicas[::step]] + ["mean over replicas"]
        ncols = 2 if len(pols) > 1 else 1
        nrows = -(-len(pols) // ncols)
        tag = ex.tag(s, point, 60)
        fig, axes = plots.grid(nrows, ncols, 11.5 if ncols == 2 else 7.5, 2.3,
                               f"Per-replica GPU utilisation · {_where(ex, s)}" + (f" · {tag}" if tag else ""),
                               legend=labels, sharey=True)
        from matplotlib import colormaps

        cmap = colormaps["tab10" if n_rep <= 10 else "tab20" if n_rep <= 20 else "viridis"]
        colour = (lambda i: cmap(i % cmap.N)) if n_rep <= 20 else (lambda i: cmap(i / max(1, n_rep - 1)))
        handles: dict[str, Any] = {}
        for idx, pol in enumerate(pols):
            ax = axes[idx // ncols][idx % ncols]
            run = chosen[pol]
            reps = series.get(run["run_id"], {})
            for rep in sorted(reps):
                xs, ys = reps[rep]
                (ln,) = ax.plot(xs, ys, lw=1.1, color=colour(rep), alpha=0.9)
                handles.setdefault(f"replica {rep}", ln)
            if reps:
                t = np.array(next(iter(reps.values()))[0])
                if all(len(v[0]) == len(t) for v in reps.values()):
                    mean = np.mean([v[1] for v in reps.values()], axis=0)
                    (ln,) = ax.plot(t, mean, lw=3, color="#444", alpha=0.45, ls="--", zorder=1)
                    handles.setdefault("mean over replicas", ln)
            ax.set_title(f"{ex.names[pol]} · seed {run['seed']}", fontsize=10)
            ax.set_xlabel("time (s)")
            ax.set_ylabel("GPU busy (%)")
            ax.set_ylim(-2, 102)
            ax.grid(True, alpha=0.25)
        for idx in range(len(pols), nrows * ncols):
            axes[idx // ncols][idx % ncols].set_visible(False)
        labels = [lab for lab in labels if lab in handles]
        plots.legend(fig, [handles[lab] for lab in labels], labels)
        parts.append(plots.html(
            fig, f"timeline-{ex.slug}-{s}", f"Per-replica GPU utilisation over time for scenario {s} of {ex.name}",
            f"Scenario {s}" + (f" at {tag}" + (" (the highest load)" if k else "") if tag else "") +
            ": one panel per policy (its lowest seed), one line per replica; the GPU-busy fraction per time bucket."))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------- section 6
def _curve_band(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, over the runs (rows; NaN where a run has no value): the 95% CI of the mean (Student's t) with 3
    runs or more, the min-max range with 2 (a two-run interval is their range anyway)."""
    from scipy import stats

    n = np.sum(np.isfinite(vals), axis=0)
    mean = np.nanmean(vals, axis=0)
    if vals.shape[0] < 3:
        return np.nanmin(vals, axis=0), np.nanmax(vals, axis=0)
    sd = np.nanstd(vals, axis=0, ddof=1)
    half = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * sd / np.sqrt(np.maximum(n, 1))
    half = np.where(n >= 2, half, np.nan)
    return mean - half, mean + half


def _learning_html(data: dict, plots: _Plots, title_suffix: str) -> str:
    if not len(data["policy"]):
        return '<p class="empty">No learned policies are in this store (the <code>learning</code> table is empty).</p>'
    by: dict[str, dict[str, dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for rid, pol, step, metric, val in zip(data["run_id"], data["policy"], data["step"], data["metric"], data["value"]):
        by[str(metric)][str(pol)][str(rid or "")].append((int(step), float(val)))
    metrics = sorted(by)
    pols = sorted({p for m in by.values() for p in m})
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(pols) <= 10 else "tab20"]
    colors = {p: cmap(i % cmap.N) for i, p in enumerate(pols)}
    ncols = min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = plots.grid(nrows, ncols, min(11.5, 3.6 * ncols + 2.2), 2.6, "Learning curves" + title_suffix)
    styles = ("-", "--", "-.", ":")  # (two curves that follow each other stay apart: q_learning hid under sarsa)
    for i, m in enumerate(metrics):
        ax = axes[i // ncols][i % ncols]
        ends = [max(s for pts in runs.values() for s, _ in pts) for runs in by[m].values()]
        log_x = min(ends) > 0 and max(ends) / min(ends) > 10  # (8k DQN steps squeezed beside 300k tabular ones)
        for k, (pol, runs) in enumerate(by[m].items()):
            steps = sorted({s for pts in runs.values() for s, _ in pts})
            vals = np.full((len(runs), len(steps)), np.nan)
            pos = {s: j for j, s in enumerate(steps)}
            for r, pts in enumerate(runs.values()):
                for s, v in pts:
                    vals[r, pos[s]] = v
            x = np.array(steps, float)
            with np.errstate(all="ignore"):
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean = np.nanmean(vals, axis=0)
                    lo, hi = _curve_band(vals)
            n = len(runs)
            label = pol + (f" (mean of {n} runs, band: {'95% CI' if n >= 3 else 'min–max'})" if n > 1 else "")
            keep = x > 0 if log_x else np.ones(len(x), bool)
            ax.plot(x[keep], mean[keep], color=colors[pol], lw=1.6, ls=styles[k % len(styles)],
                    marker="o" if len(x) <= 30 else None, ms=3, label=label)
            if n > 1:
                ax.fill_between(x[keep], lo[keep], hi[keep], color=colors[pol], alpha=0.15, lw=0)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel("training step" + (" (log scale)" if log_x else ""))
        name = m.replace("_", " ")
        ax.set_ylabel(name + (" (reward units)" if m in ("return", "reward", "episode_return") else _param_unit(m)))
        ax.set_title(f"{name} during training", fontsize=10)
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=8, title="policy", title_fontsize=8)
    for idx in range(len(metrics), nrows * ncols):
        axes[idx // ncols][idx % ncols].set_visible(False)
    return plots.html(fig, "learning", "Learning curves of the learned policies",
                      f"{len(pols)} learned {'policy' if len(pols) == 1 else 'policies'}, {len(metrics)} "
                      f"metric{'' if len(metrics) == 1 else 's'}: value against training step"
                      + (" (mean over runs where a policy has several)." if any(
                          len(r) > 1 for m in by.values() for r in m.values()) else "."))


# ---------------------------------------------------------------------------------------------------- the page
def _query_quantiles(store, experiments: list[str]) -> dict[str, dict]:
    if not experiments:
        return {}
    ph = ", ".join("?" * len(experiments))
    d = store.query(
        "SELECT r.experiment, r.scenario, r.params, r.router_label, r.batcher_label, q.metric, q.q, avg(q.value) AS v, "
        "min(q.value) AS lo, max(q.value) AS hi FROM quantiles q JOIN runs r ON q.run_id = r.run_id "
        f"WHERE r.status = 'ok' AND q.metric IN ('ttft_s', 'e2e_s') AND r.experiment IN ({ph}) "
        "GROUP BY ALL ORDER BY ALL", experiments)
    acc: dict[str, dict[tuple, tuple[list, ...]]] = defaultdict(lambda: defaultdict(lambda: ([], [], [], [])))
    for e, s, p, rl, bl, m, q, v, lo, hi in zip(d["experiment"], d["scenario"], d["params"], d["router_label"],
                                                d["batcher_label"], d["metric"], d["q"], d["v"], d["lo"], d["hi"]):
        cols = acc[e][(s, _pkey(json.loads(p) if p else {}), str(rl), str(bl), m)]
        for col, x in zip(cols, (q, v, lo, hi)):
            col.append(float(x))
    return {e: {k: tuple(np.array(x) for x in cols) for k, cols in c.items()} for e, c in acc.items()}


def write_report(store, out_dir: str | Path, experiment: str | None = None, baseline: dict | None = None) -> Path:
    """Write ``out_dir/index.html`` (self-contained) and one PNG per plot; returns the path of index.html.

    ``experiment``: report only this experiment (default: every experiment in the store, one after another).
    ``baseline``: e.g. ``{"router": "least_outstanding_requests"}`` for the paired changes; default: the baseline
    the experiment names in the store (a reproduction's rule, ``Store.set_meta``), else the router ``round_robin``
    when every group of an experiment has it. An experiment that names its headline metrics (a reproduction) shows
    those first in its summary.
    """
    t0 = time.perf_counter()
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # never switch the backend of an interactive session
        matplotlib.use("Agg")
    out = Path(out_dir)
    from fleetwise.experiments.store import check_writable_dir

    check_writable_dir(out, "report folder")

    all_runs = store.runs(where="TRUE")
    names = list(dict.fromkeys(str(r["experiment"]) for r in all_runs))
    if experiment is not None:
        if experiment not in names:
            raise InputError(f"experiment {experiment!r} is not in the store "
                             f"(it holds: {', '.join(names) or 'no runs'})")
        names = [experiment]
    if baseline:  # a baseline no run has would silently drop every paired comparison
        level, bname = next(iter(baseline.items()))
        have = sorted({str(r.get(f"{level}_label")) for r in all_runs if str(r["experiment"]) in names})
        if bname not in have:
            raise InputError(f"--baseline {level}={bname}: no run in the store has that {level} "
                             f"(it has: {', '.join(have) or 'none'})")
    meta = store.meta()
    exps = [_build_experiment(n, [r for r in all_runs if str(r["experiment"]) == n], baseline, meta.get(n))
            for n in names]
    quant = _query_quantiles(store, names)
    tl = store.query("SELECT DISTINCT run_id FROM timeline")
    with_tl = set(tl["run_id"].tolist())
    learn = store.query(
        "SELECT l.run_id, l.policy, l.step, l.metric, l.value, r.experiment FROM learning l "
        "LEFT JOIN runs r ON l.run_id = r.run_id ORDER BY l.policy, l.metric, l.step")
    if experiment is not None and len(learn["policy"]):
        keep = [e is None or e == experiment for e in learn["experiment"]]
        learn = {k: v[np.array(keep, bool)] for k, v in learn.items()}

    created = not out.exists()
    before = {p.name for p in out.glob("*.png")} if out.is_dir() else set()
    out.mkdir(parents=True, exist_ok=True)  # only once the inputs are known to be good
    plots = _Plots(out)
    try:
        return _render(out, plots, exps, quant, with_tl, store, learn, experiment, t0)
    except BaseException:  # nothing half-written: the PNGs this report made go (an earlier report's stay)
        for f in plots.files:
            if f not in before:
                (out / f).unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _render(out: Path, plots: _Plots, exps: list, quant: dict, with_tl: set, store, learn: dict,
            experiment: str | None, t0: float) -> Path:
    body: dict[str, list[str]] = {k: [] for k, _ in SECTIONS}
    for ex in exps:
        for key, _ in SECTIONS[:5]:
            body[key].append(f'<h3 id="{key}-{_esc(ex.slug)}">Experiment {_esc(ex.name)}</h3>')
        body["summary"].append(_summary_html(ex))
        body["summary"].append(_changes_html(ex, plots))
        if not ex.ok:
            for key in ("cdf", "load", "pareto", "timeline"):
                body[key].append('<p class="empty">This experiment has no successful run, so there is nothing to '
                                 'plot.</p>')
            continue
        body["cdf"].append(_cdf_html(ex, quant.get(ex.name, {}), plots))
        body["load"].append(_load_html(ex, plots))
        body["pareto"].append(_pareto_html(ex, plots))
        body["timeline"].append(_timeline_html(ex, with_tl, store, plots))
    if not exps:
        for key in ("summary", "cdf", "load", "pareto", "timeline"):
            body[key].append('<p class="empty">The store holds no runs.</p>')
    body["learning"].append(_learning_html(learn, plots, f" · {experiment}" if experiment else ""))

    n_plots = len(plots.files)
    n_ok = sum(len(e.ok) for e in exps)
    n_failed = sum(len(e.failed) for e in exps)
    versions = sorted({str(r.get("code_version")) for e in exps for r in e.ok + e.failed if r.get("code_version")})
    src = getattr(store, "path", None)
    elapsed = time.perf_counter() - t0
    head = (f'<p class="meta">Store: <code>{_esc(src if src is not None else "(in memory)")}</code> · '
            f'{len(exps)} experiment(s): {_esc(", ".join(e.name for e in exps) or "none")} · {n_ok + n_failed} runs '
            f'({n_ok} ok, {n_failed} failed) · code version(s): {_esc(", ".join(versions) or "—")}</p>'
            f'<p class="meta">Generated {_esc(time.strftime("%Y-%m-%d %H:%M:%S"))} in {elapsed:.1f} s · '
            f'<span id="plot-count" data-plots="{n_plots}">{n_plots} plots</span> (each also saved as a PNG file '
            f'next to this page).</p>')
    nav = "<nav><ol>" + "".join(f'<li><a href="#{k}">{_esc(t)}</a></li>' for k, t in SECTIONS) + "</ol></nav>"
    sections = "".join(f'<section id="{k}"><h2>{_esc(t)}</h2>{"".join(body[k])}</section>' for k, t in SECTIONS)
    title = "fleetwise report" + (f" · {experiment}" if experiment else "")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>{_esc(title)}</title><style>{CSS}</style></head>'
            f'<body><main data-plots="{n_plots}"><h1>{_esc(title)}</h1>{head}{nav}{sections}</main></body></html>\n')

    index = out / "index.html"
    check_replaceable(index)
    tmp = out / "index.html.tmp"
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, index)
    except BaseException:
        tmp.unlink(missing_ok=True)  # (nothing half-written left behind)
        raise
    _clean_stale(out, plots.files)
    return index


def _clean_stale(out: Path, files: Sequence[str]) -> None:
    """Remove the PNGs an earlier report in this folder wrote that this one did not (only files it listed)."""
    man = out / MANIFEST
    try:
        old = json.loads(man.read_text()).get("plots", []) if man.exists() else []
    except (OSError, ValueError):
        old = []
    keep = set(files)
    for f in old:
        if isinstance(f, str) and f not in keep and "/" not in f and "\\" not in f and f.endswith(".png"):
            (out / f).unlink(missing_ok=True)
    man.write_text(json.dumps({"plots": list(files)}, indent=1))
