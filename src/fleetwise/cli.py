"""fleetwise command line: simulate, compare, perf (validate, profile, calibrate, predict), bench sim-speed.

Bad input (a scenario field, a trace row, a file, a policy name) prints one line naming what is wrong and where,
and exits with status 2, without a traceback.
"""

from __future__ import annotations

import errno
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from fleetwise.errors import InputError, check_replaceable, not_a_file
from fleetwise.limits import MAX_REPLICAS, MAX_REQUESTS, MAX_SEED, MAX_SEEDS, MAX_TRAIN_SEED, MAX_WORKERS

# a group named without its command prints its help (it said "error: Missing command.")
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Decide and learn how an LLM inference fleet spends its GPUs.")
perf_app = typer.Typer(add_completion=False, no_args_is_help=True, help="The GPU performance model.")
bench_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Benchmarks (commands whose output goes into the docs).")
reproduce_app = typer.Typer(add_completion=False, no_args_is_help=True,
                            help="Reproduce a paper's experiment (see docs/).")
train_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Train a learned policy on the shared recipe (docs/learning.md).")
app.add_typer(perf_app, name="perf")
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(bench_app, name="bench")
app.add_typer(train_app, name="train")

# no console markup: names, paths and errors are the user's text ("[/foo]" in a scenario's name failed the table
# title after the run; "[baseline]" vanished); styles are given as styles
console = Console(stderr=True, markup=False)
out = Console(markup=False) if sys.stdout.isatty() else Console(width=200, markup=False)


def _version(value: bool) -> None:
    if value:
        from fleetwise import __version__

        print(f"fleetwise {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Decide and learn how an LLM inference fleet spends its GPUs."""

# keys shown in tables: (summary key, column label, unit scale, format, shown without --wide)
TABLE_KEYS = [
    ("completed", "done", 1, "{:.0f}", False),
    ("ttft_p50_s", "TTFT p50 s", 1, "{:.3f}", False), ("ttft_p99_s", "TTFT p99 s", 1, "{:.2f}", True),
    ("tpot_p50_s", "TPOT p50 ms", 1e3, "{:.1f}", True), ("e2e_p99_s", "E2E p99 s", 1, "{:.1f}", False),
    ("goodput_rps", "goodput/s", 1, "{:.2f}", True), ("load_cv", "load CV", 1, "{:.3f}", False),
    ("slowdown_p50", "slowdown p50", 1, "{:.2f}", False), ("cost_per_mtok_usd", "$/Mtok", 1, "{:.3f}", False),
]
# paired changes against the baseline, in tables with a baseline (all shown without --wide)
CHANGE_KEYS = [("ttft_p99_s", "TTFT p99"), ("goodput_rps", "goodput")]

# Every terminal table fits this many columns: a table that would be wider is split into blocks of columns, each
# repeating the first (the row's name). --wide prints each table whole, as wide as it needs.
TABLE_WIDTH = 120
_WIDE = typer.Option(False, "--wide", help="every column, in one table as wide as it needs (default: fits 120 "
                     "columns)")


def _natural_width(renderable) -> int:
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update_width(100_000), renderable).maximum


def fit_tables(renderable, width: int = TABLE_WIDTH) -> list:
    """The tables of ``renderable`` (a Table, or a Group of them), each split into blocks of columns no wider than
    ``width``; every block repeats the first column, the title goes on the first block, the caption on the last.
    A column too wide to fit beside the first even alone wraps instead of being cut."""
    import copy
    from dataclasses import replace

    from rich.console import Group

    if isinstance(renderable, Group):
        return [t for r in renderable.renderables for t in fit_tables(r, width)]
    if not isinstance(renderable, Table) or len(renderable.columns) < 2 or _natural_width(renderable) <= width:
        return [renderable]

    def block(cols: list[int], first: bool, last: bool) -> Table:
        b = copy.copy(renderable)
        b.columns = [replace(renderable.columns[c], _index=k, _cells=list(renderable.columns[c].cells))
                     for k, c in enumerate(cols)]
        b.rows = list(renderable.rows)
        b.title = renderable.title if first else (f"{renderable.title} (continued)" if renderable.title else None)
        b.caption = renderable.caption if last else None
        return b

    blocks: list[list[int]] = [[0]]
    for c in range(1, len(renderable.columns)):
        if len(blocks[-1]) > 1 and _natural_width(block(blocks[-1] + [c], False, False)) > width:
            blocks.append([0])
        blocks[-1].append(c)
    tables = [block(cols, i == 0, i == len(blocks) - 1) for i, cols in enumerate(blocks)]
    for t in tables:
        if _natural_width(t) > width:  # one column too wide on its own: let it wrap
            t.columns[-1].no_wrap = False
            t.columns[-1].overflow = "fold"
    return tables


def print_tables(renderable, wide: bool = False) -> None:
    """Print a table (or a Group of tables) to stdout: fitted to TABLE_WIDTH columns, or whole with ``wide``."""
    if wide:
        need = _natural_width(renderable)
        if need > out.width and not out.is_terminal:  # a pipe or file: as wide as the table, nothing cut
            Console(width=need, file=out.file, markup=False).print(renderable)
        else:
            out.print(renderable)
        return
    for t in fit_tables(renderable, min(TABLE_WIDTH, out.width)):
        out.print(t)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                    disable=not console.is_terminal)


def _load(scenario: Optional[str], trace: Optional[str], load: Optional[str] = None, requests: Optional[int] = None):
    """The scenario, with a user's trace in place of its workload (keeping the scenario's context limit, time
    scale, SLO classes and tenants; docs/workloads.md#bring-your-own-trace), and one line per override for the
    caller to print once the scenario has built (a bad trace stays a one-line error). A platform scenario with a
    ``duration_s`` has the trace fill that window, so its faults and spot traces keep their times; with
    ``--requests`` the run ends with the trace instead."""
    from fleetwise.scenario import load_scenario
    from fleetwise.workload.spec import parse_load, resolve_trace, trace_in_place_of

    sc = load_scenario(scenario)
    lines: list[str] = []
    if trace is not None:
        resolve_trace(trace)  # a missing file fails here, with its name
        spec, lines = trace_in_place_of(sc.workload, trace, parse_load(load))
        plat = sc.platform
        if plat is not None and plat.duration_s is not None:
            faults = ", ".join(f"{f.kind} at {f.at_s:.0f} s" for f in plat.faults) or "none"
            if requests is None and spec.get("window_s") is None and spec.get("num_requests") is None:
                spec["duration_s"] = plat.duration_s
                lines.append(f"the trace fills the platform's {plat.duration_s:.0f} s window: faults ({faults}) and "
                             f"spot traces keep their times")
            else:
                sc = sc.model_copy(update={"platform": plat.model_copy(update={"duration_s": None})})
                lines.append(f"the run ends with the trace's window, not the platform's {plat.duration_s:.0f} s: "
                             f"faults after its last arrival ({faults}) do not happen")
        sc = sc.model_copy(update={"workload": spec})
    elif load is not None:
        if sc.workload.get("kind") != "trace":
            raise InputError(f"--load needs --trace (the scenario's workload is {sc.workload.get('kind')}, not a trace)")
        spec = {k: v for k, v in sc.workload.items() if k not in ("time_scale", "target_rate_rps")}
        spec["load"] = parse_load(load)
        lines = [f"--load {load}: replaces the scenario's trace rate"]
        sc = sc.model_copy(update={"workload": spec})
    if trace is not None or load is not None:
        from fleetwise.scenario import parse_scenario

        sc = parse_scenario(sc.model_dump(mode="json"), where=f"scenario {sc.name} with --trace/--load")
    return sc, lines


def _print_adaptations(lines: list[str], reports) -> None:
    for ln in lines + [x for rep in reports for x in rep.lines()]:
        console.print(ln, highlight=False, markup=False, soft_wrap=True)


def _warn_overload(reasons: dict, requests: int, where: str = "") -> None:
    from fleetwise.workload.adapt import overload_warning

    msg = overload_warning(reasons, requests, where)
    if msg:
        console.print(msg, style="yellow", highlight=False, markup=False, soft_wrap=True)


def _jsonable(v: Any) -> Any:
    from fleetwise.yamlio import json_safe

    return json_safe(v)


def _finite(lo: float, hi: float):
    """A float option's parser: a finite number from ``lo`` to ``hi`` (click's range said 'nan' should be at most the
    maximum, and let infinity through where there was no maximum)."""

    def parse(value) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{value!r} is not a number") from None
        if not math.isfinite(x) or not lo <= x <= hi:
            raise typer.BadParameter(f"{value!r} is not a number from {lo:g} to {hi:g}")
        return x

    return parse


def _items(value: str, opt: str) -> list[str]:
    """The items of a comma-separated option, stripped. An empty item ('a,,b', a trailing comma) is an error, not
    dropped: a list a user typed is used as typed or refused."""
    items = [x.strip() for x in value.split(",")]
    if items == [""]:
        return []
    if "" in items:
        raise InputError(f"{opt} {value!r}: an empty item (two commas, or a comma at an end)")
    return items


@app.command()
def simulate(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario YAML file or built-in name"),
    router: Optional[str] = typer.Option(None, help="router policy name (overrides the scenario)"),
    batcher: Optional[str] = typer.Option(None, help="batcher policy name (overrides the scenario)"),
    trace: Optional[str] = typer.Option(None, help="replay this trace file (or alias azure-conv, mooncake, ...) in "
                                        "place of the scenario's arrivals and lengths"),
    load: Optional[str] = typer.Option(None, help="with --trace: the arrival rate as a fraction of the fleet's "
                                       "capacity (0.7) or real (the trace's own rate; default)"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, max=MAX_REQUESTS,
                                           help="number of requests (a mix: its first ones)"),
    seed: Optional[int] = typer.Option(None, min=0, max=MAX_SEED, help="random seed (default: the scenario's)"),
    scaler: Optional[str] = typer.Option(None, help="autoscaler (runs the platform layer; overrides the scenario)"),
    monitor_arg: Optional[str] = typer.Option(None, "--monitor", metavar="FOLDER", help="platform runs: write the "
                                              "monitoring series into this folder (monitor.prom, .parquet, .png)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    records_file: Optional[Path] = typer.Option(None, "--records", metavar="FILE", help="write per-request records "
                                                "(docs/metrics.md): FILE.parquet (the parquet extra) or FILE.csv"),
    wide: bool = _WIDE,
) -> None:
    """Run one scenario (default: the embedded default) and print its summary. A scenario with a scaler
    (or --scaler) runs with the platform layer: autoscaling, spot, faults, tenants (docs/platform.md)."""
    from fleetwise.run import run_scenario

    if records_file is not None:
        _records_format(records_file)  # a wrong extension, a missing folder or no pyarrow: fail before the run
    sc, lines = _load(scenario, trace, load, requests)
    if monitor_arg is not None and not monitor_arg.strip():  # (as a Path, '' was '.': it wrote into the cwd)
        raise InputError("--monitor '': an empty path")
    monitor = None if monitor_arg is None else Path(monitor_arg)
    if monitor is not None:
        from fleetwise.experiments.store import check_writable_dir, check_writable_file

        if scaler is None and sc.scaler is None:  # (only the platform layer records the series)
            raise InputError(f"--monitor: {sc.name} is not a platform run; give --scaler (e.g. --scaler hpa) to "
                             "record its monitoring series")
        check_writable_dir(monitor, "--monitor folder")
        if monitor.is_dir():  # (a folder named monitor.png in it failed after the other two files were written)
            for name in ("monitor.prom", "monitor.parquet", "monitor.png"):
                check_writable_file(monitor / name, "monitoring")
    from fleetwise.policies import make

    for level, name in (("router", router), ("batcher", batcher), ("scaler", scaler)):
        if name is not None:  # a bad name fails before the workload is built
            make(level, name, where=f"--{level}: ")
    with _progress() as prog:
        task = prog.add_task(f"simulating {sc.name}", total=None)

        def built(b) -> None:
            _print_adaptations(lines, b.adaptations)
            if len(b.workload) == 0:  # (ran and printed a summary of nothing, exit 0)
                raise InputError(f"{sc.name}: the workload drew no request (a rate or a window too small for "
                                 "any arrival); nothing to simulate")
            prog.update(task, total=len(b.workload))

        try:
            r = run_scenario(sc, seed, router=router, batcher=batcher, scaler=scaler, num_requests=requests,
                             monitor=monitor is not None, on_built=built, progress=lambda k: prog.advance(task, k))
        except InputError as e:  # the scenario's parts are checked when built: name the scenario too
            raise InputError(f"{scenario or 'default'}: {e}") from None
    b, s, plat = r.built, r.summary, r.platform
    sc = b.scenario
    _warn_overload(s["reject_reasons"], len(r.records), sc.name)  # run_scenario put them in the summary
    if b.adaptations:
        s["adaptation"] = [a.as_dict() for a in b.adaptations]
    if plat is not None and monitor is not None:
        from fleetwise.platform.monitor import plot_monitor

        monitor.mkdir(parents=True, exist_ok=True)
        plat.monitor.to_prometheus(monitor / "monitor.prom")
        try:
            plat.monitor.to_parquet(monitor / "monitor.parquet")
        except InputError as e:
            console.print(str(e), markup=False)
        plot_monitor(plat.monitor, monitor / "monitor.png", title=f"{sc.name} ({sc.scaler.name})", events=plat.events)
        console.print(f"monitoring series written to {monitor}/ (monitor.prom, monitor.parquet, monitor.png)",
                      highlight=False, soft_wrap=True, markup=False)
    if records_file is not None:
        write_records(records_file, record_columns(r.records, b))
        console.print(f"{len(r.records)} request records written to {records_file}", highlight=False, soft_wrap=True)
    if as_json:
        out.print_json(json.dumps(_jsonable(s)))
        return
    t = Table(title=f"{sc.name}: {len(b.workload)} requests, seed {seed if seed is not None else sc.seed}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in s.items():
        if k == "adaptation":
            continue
        if isinstance(v, float):
            t.add_row(k, "-" if math.isnan(v) else f"{v:.4g}")  # (no request completed: no latency, as compare shows)
        else:
            t.add_row(k, str(v))
    print_tables(t, wide)


def record_columns(records, b) -> dict:
    """Per-request records as named columns (docs/metrics.md, "Per-request records"): numpy arrays, and
    categorical columns as ``(codes, names)`` pairs (status and reject reason by name, never a bare code)."""
    import numpy as np

    from fleetwise.sim.records import REJECT_REASONS, STATUS

    w = b.workload  # one record per workload request, in the same order
    cols: dict = {"request_id": np.arange(len(records), dtype=np.int64), "arrival_s": records.arrival_s,
                  "model": (w.model, list(w.models)), "tenant": (w.tenant, list(w.tenants)),
                  "origin": (w.origin, list(w.origins)), "slo_class": (w.slo_class, list(w.slo_classes))}
    cols |= {"prompt_tokens": records.prompt_tokens, "output_tokens": records.output_tokens,
             "status": (records.status, list(STATUS)), "reason": (records.reason, list(REJECT_REASONS)),
             "replica": records.replica,  # -1: never routed
             "region": (np.where(records.region < 0, len(b.fleet.regions), records.region),
                        [r.name for r in b.fleet.regions] + [""]),  # "": never routed
             "ttft_s": records.ttft_s, "tpot_s": records.tpot_s, "e2e_s": records.e2e_s,
             "queue_delay_s": records.queue_delay_s, "first_token_s": records.first_token_s,
             "completion_s": records.completion_s, "prefix_hit_tokens": records.prefix_hit_tokens,
             "preemptions": records.preemptions}
    return cols


def _records_format(path: Path) -> str:
    """``parquet`` or ``csv`` by the file's extension; checked before a run (folder, pyarrow) so it fails early."""
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".csv"):
        raise InputError(f"--records {path}: expected a .parquet or .csv file name")
    if path.is_dir():
        raise InputError(f"--records {path}: is a directory")
    try:
        _check_writable(path)  # (a missing folder is made when the records are written, as for every output)
    except InputError as e:
        raise InputError(f"--records {e}") from None
    if suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(f"--records {path}: writing Parquet needs pyarrow: "
                             "pip install -c constraints.txt 'fleetwise[parquet]' (or write a .csv)") from None
    return suffix[1:]


def write_records(path: Path, cols: dict) -> None:
    """Write ``record_columns`` to Parquet (categoricals dictionary-encoded, NaN where it never happened) or CSV
    (categoricals as names, empty where it never happened), atomically: a temporary file, then a rename."""
    import numpy as np

    fmt = _records_format(path)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        def column(v):
            if isinstance(v, tuple):  # (codes, names): dictionary-encoded strings
                return pa.DictionaryArray.from_arrays(pa.array(v[0].astype(np.int32)), pa.array(v[1], pa.string()))
            return v

        table = pa.table({k: column(v) for k, v in cols.items()})
        _write_atomic(path, write=lambda tmp: pq.write_table(table, tmp))
        return
    import csv

    lists = []
    for v in cols.values():
        if isinstance(v, tuple):
            lists.append(np.asarray(v[1], dtype=object)[v[0]].tolist())
        elif v.dtype.kind == "f":
            lists.append([None if math.isnan(x) else x for x in v.tolist()])  # NaN -> empty field
        else:
            lists.append(v.tolist())

    def write_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            wr = csv.writer(f, lineterminator="\n")
            wr.writerow(list(cols))
            wr.writerows(zip(*lists))

    _write_atomic(path, write=write_csv)


SUMMARY_METRICS = [k for k, *_ in TABLE_KEYS]


def _change_cell(ci, seeds: int | None = None) -> str:
    """A paired relative change with its 95% CI: ``-20.3% [-31.6, -11.3]`` (the bounds in percent too), and
    ``(n=2)`` when fewer pairs than ``seeds`` had a value (a missing or NaN metric, a zero baseline)."""
    if ci is None or math.isnan(ci.mean):
        return "-"
    few = f" (n={ci.n})" if seeds is not None and ci.n < seeds else ""
    if math.isnan(ci.lo):
        return f"{ci.mean:+.1%}{few}"
    return f"{ci.mean:+.1%} [{_pct(ci.lo)}, {_pct(ci.hi)}]{few}"


def _pct(x: float) -> str:
    """A bound in percent: one decimal, none from 100 on (a two-seed interval's bounds can be hundreds)."""
    return f"{x * 100:+.1f}" if abs(x) < 1.0 else f"{x * 100:+.0f}"


def _summary_tables(rows: list[dict], title: str, baseline: str | None = None, order: list[str] | None = None,
                    wide: bool = False) -> list[Table]:
    """One table per scenario and grid point: mean ± 95% t interval over seeds, and the paired change vs the
    baseline's TTFT p99 and goodput. Without ``wide``, the main columns only (the HTML report has them all)."""
    from collections import defaultdict

    keys = [k for k in TABLE_KEYS if wide or k[4]]
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["scenario"], json.dumps(r["params"], sort_keys=True))].append(r)
    tables = []
    for (scen, params), members in by.items():
        p = json.loads(params)
        tag = ", ".join(f"{k}={v}" for k, v in p.items() if not isinstance(v, (dict, list)))
        if order:
            members.sort(key=lambda r: order.index(r["router"]) if r["router"] in order else len(order))
        t = Table(title=(title if title == scen else f"{title} · {scen}") + (f" · {tag}" if tag else "") +
                  f" · mean ± 95% CI over {members[0]['seeds']} seeds",
                  caption=f"Δ: paired change vs {baseline} [95% CI, %]" if baseline else None)
        t.add_column("policy", no_wrap=True)
        for _, label, _, _, _ in keys:
            t.add_column(label, justify="right", no_wrap=True)
        if baseline:
            for _, label in CHANGE_KEYS:
                t.add_column(f"Δ {label}", justify="right", no_wrap=True)
        for r in members:
            name = r["router"] if len({m["batcher"] for m in members}) == 1 else f"{r['router']} / {r['batcher']}"
            row = [name]
            for key, _, scale, fmt, _ in keys:
                ci = r["ci"].get(key)
                if ci is None or math.isnan(ci.mean):
                    row.append("-")
                    continue
                cell = fmt.format(ci.mean * scale)
                if not math.isnan(ci.lo) and key != "completed":
                    cell += " ± " + fmt.format(ci.half * scale)
                if ci.n < r["seeds"]:  # seeds whose metric is missing or NaN (e.g. no request ended)
                    cell += f" (n={ci.n})"
                row.append(cell)
            if baseline:
                row += [_change_cell(r["vs_baseline"].get(key), r["seeds"]) for key, _ in CHANGE_KEYS]
            t.add_row(*row)
        tables.append(t)
    return tables


def _ci_dict(ci) -> dict:
    return {"mean": None if math.isnan(ci.mean) else ci.mean,
            "ci95": None if math.isnan(ci.lo) else [ci.lo, ci.hi], "n": ci.n}


def _ci_json(rows: list[dict]) -> dict:
    """``compare --json``: {router: {metric: {mean, ci95, n}, vs_baseline: {...}}} (one scenario, one batcher)."""
    out: dict = {}
    for r in rows:
        key = r["router"] if r["params"] == {} else f"{r['router']} {json.dumps(r['params'], sort_keys=True)}"
        out[key] = {m: _ci_dict(ci) for m, ci in r["ci"].items()}
        if r["vs_baseline"]:
            out[key]["vs_baseline"] = {m: _ci_dict(ci) for m, ci in r["vs_baseline"].items()}
    return out


def _rows_json(rows: list[dict]) -> list[dict]:
    """``sweep --json``: one object per scenario x grid point x batcher x router, each named by those fields (a
    mapping keyed by the router alone kept one scenario's numbers of several, and one batcher's)."""
    return [{"scenario": r["scenario"], "params": r["params"], "batcher": r["batcher"], "router": r["router"],
             "seeds": r["seeds"], "metrics": {m: _ci_dict(ci) for m, ci in r["ci"].items()},
             "vs_baseline": {m: _ci_dict(ci) for m, ci in r["vs_baseline"].items()}} for r in rows]


def _check_backend(backend: str, address: Optional[str]) -> None:
    """A sweep or training backend by name, and a Ray address only where Ray is the backend (not ignored)."""
    if backend not in ("local", "ray"):
        raise InputError(f"--backend {backend!r}: expected local or ray")
    if address is not None and backend != "ray":
        raise InputError(f"--address {address!r} goes with --backend ray (the local backend runs on this machine)")


def _execute(spec, db: Optional[str], backend: str, workers: Optional[int], address: Optional[str],
             label: str):
    from fleetwise.experiments.runner import run_sweep
    from fleetwise.experiments.spec import expand
    from fleetwise.experiments.store import Store

    runs = expand(spec, where=label, records_dir=str(Path(db).parent / "records") if db else None)
    created = db is not None and not Path(db).exists()
    store = Store(db)  # after the spec is expanded and validated: a bad spec writes nothing
    try:
        with _progress() as prog:
            task = prog.add_task(f"{spec.name}: {len(runs)} runs", total=len(runs))
            res = run_sweep(runs, store, backend=backend, workers=workers, address=address,
                            on_progress=lambda d, n: prog.update(task, completed=d + (len(runs) - n)))
    except BaseException:
        # a sweep that stored nothing (a Ray cluster not reached, interrupted before its first run) leaves no
        # store that it made behind it
        try:
            empty = created and store.count() == 0
        except Exception:  # noqa: BLE001 - (the sweep's own error is the one to see)
            empty = False
        if empty:
            for f in (Path(db), Path(str(db) + ".wal")):
                f.unlink(missing_ok=True)
        raise
    return store, runs, res


def _print_experiment_fit(spec, where: str) -> None:
    """Each scenario's trace fit for the first seed (each seed draws its own window)."""
    from fleetwise.experiments.spec import expand
    from fleetwise.scenario import build, parse_scenario

    seen = set()
    for run in expand(spec, where=where):
        if run.scenario_name in seen:
            continue
        seen.add(run.scenario_name)
        b = build(parse_scenario(run.scenario, where=where), run.seed, num_requests=run.requests)
        _print_adaptations([f"{run.scenario_name}: trace {spec.trace or 'of the scenario'}, load {spec.load or 'real'}"],
                           b.adaptations)


@app.command()
def sweep(
    spec_file: str = typer.Argument(..., metavar="EXPERIMENT", help="experiment YAML file or built-in name"),
    db: str = typer.Option(str(Path("results") / "fleetwise.duckdb"), help="results store (DuckDB file)"),
    backend: str = typer.Option("local", help="local (process pool) or ray"),
    address: Optional[str] = typer.Option(None, help="a Ray cluster's address (--backend ray)"),
    workers: Optional[int] = typer.Option(None, min=1, max=MAX_WORKERS, help="parallel runs (default: all cores)"),
    report: bool = typer.Option(False, "--report", help="write the HTML report when done"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
    wide: bool = _WIDE,
) -> None:
    """Run an experiment: every scenario x policy x grid point x seed not already in the store."""
    from fleetwise.experiments.spec import load_experiment
    from fleetwise.experiments.store import check_store_file, check_writable_dir
    from fleetwise.metrics.stats import aggregate

    _check_backend(backend, address)
    check_store_file(db)  # before any work: nothing is run for a store we cannot write
    if report:
        check_writable_dir(Path(db).parent / "report", "report folder")
    spec = load_experiment(spec_file)
    if spec.records:  # (a file named records beside the store failed every run)
        check_writable_dir(Path(db).parent / "records", "records folder (beside --db)")
    if spec.trace is not None or spec.load is not None:
        _print_experiment_fit(spec, spec_file)
    store, runs, res = _execute(spec, db, backend, workers, address, spec_file)
    if spec.baseline:  # so that a later `fleetwise report` pairs with it too
        store.set_meta(spec.name, {"baseline": json.dumps(spec.baseline)})
    ids = {r.run_id for r in runs}  # (a set: a sweep may hold up to MAX_RUNS runs)
    stored = [r for r in store.runs() if r["run_id"] in ids]
    _warn_stored_overload(stored)
    from fleetwise.experiments.report import auto_baseline

    # the baseline the report pairs with: the experiment's, else round_robin where every group has it (the table
    # showed no paired change where the report showed them against round_robin)
    baseline = spec.baseline or auto_baseline([r for r in stored if r.get("status") == "ok"]) or {}
    rows = aggregate(stored, SUMMARY_METRICS, baseline or None)
    console.print(f"{res.total} runs: {res.ok} ran, {res.failed} failed, {res.skipped} already stored "
                  f"({res.wall_s:.1f} s) -> {db}", highlight=False)
    failed = [f for f in store.runs(where="status = 'failed'") if f["run_id"] in ids]
    for f in failed[:5]:
        console.print(Text.assemble(("failed", "red"), f" {f['scenario']} {f['router_label']} seed {f['seed']}: "
                                    f"{f['error']}"),
                      highlight=False)
    if as_json:
        out.print_json(json.dumps(_jsonable(_rows_json(rows))))
    else:
        base = next(iter(baseline.values()), None)
        order = [ref_label for ref_label in (r.policy["router"] for r in runs)]
        for t in _summary_tables(rows, spec.name, base, list(dict.fromkeys(order)), wide):
            print_tables(t, wide)
    if report:
        _report(db, str(Path(db).parent / "report"), spec.name, spec.baseline or None)
    if failed:  # (everything else is stored and shown; a script or a CI job must still see the failure)
        console.print(f"{len(failed)} of {len(ids)} runs failed (stored as failed, errors above; the next sweep "
                      "retries them): exit status 1", highlight=False)
        raise typer.Exit(1)


@app.command()
def compare(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario YAML file or built-in name"),
    routers: str = typer.Option("round_robin,least_outstanding_requests,least_outstanding_tokens,power_of_two",
                                help="comma-separated router names; the first is the baseline"),
    batcher: Optional[str] = typer.Option(None, help="batcher for every run (default: the scenario's)"),
    seeds: int = typer.Option(3, min=1, max=MAX_SEEDS, help="number of seeds per router"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, max=MAX_REQUESTS),
    trace: Optional[str] = typer.Option(None, help="replay this trace file in place of the scenario's arrivals and "
                                        "lengths (each seed draws its own window or block bootstrap)"),
    load: Optional[str] = typer.Option(None, help="with --trace: the arrival rate as a fraction of the fleet's "
                                       "capacity (0.7) or real (the trace's own rate; default)"),
    workers: Optional[int] = typer.Option(None, min=1, max=MAX_WORKERS, help="parallel runs (default: all cores)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
    wide: bool = _WIDE,
) -> None:
    """Compare routers on one scenario: mean ± 95% CI over seeds, and the paired change against the first."""
    from fleetwise.experiments.spec import ExperimentSpec
    from fleetwise.metrics.stats import aggregate
    from fleetwise.scenario import load_scenario

    names = _items(routers, "--routers")
    if not names:
        raise InputError("--routers: give at least one router name")
    sc = load_scenario(scenario)  # validates early, with the file name in the message
    grid = {}
    if trace is not None or load is not None:
        from fleetwise.scenario import build

        sc, lines = _load(scenario, trace, load, requests)
        _print_adaptations(lines, build(sc, 0, num_requests=requests).adaptations)  # seed 0's (each seed its own)
        grid["workload"] = [sc.workload]
    data = {"name": "compare", "scenarios": [scenario or "default"], "policies": {"router": names},
            "seeds": seeds, "requests": requests, "grid": grid, "baseline": {"router": names[0]}}
    if batcher is not None:  # ('' was taken as no batcher given)
        from fleetwise.policies import make

        make("batcher", batcher, where="--batcher: ")
        data["policies"]["batcher"] = [batcher]
    from fleetwise.experiments.spec import parse_experiment

    spec: ExperimentSpec = parse_experiment(data, where="compare")
    store, runs, res = _execute(spec, None, "local", workers, None, "compare")
    rows = aggregate(store.runs(), SUMMARY_METRICS, spec.baseline)
    for r in rows:  # the one workload --trace put in the grid is not a grid point worth naming
        r["params"] = {k: v for k, v in r["params"].items() if k != "workload"}
    if res.failed:
        f = store.runs(where="status = 'failed'")[0]
        raise InputError(f"{f['router_label']} seed {f['seed']}: {f['error']}")
    _warn_stored_overload(store.runs())
    if as_json:
        out.print_json(json.dumps(_jsonable(_ci_json(rows))))
        return
    for t in _summary_tables(rows, sc.name, names[0] if len(names) > 1 else None, names, wide):
        print_tables(t, wide)


def _warn_stored_overload(runs: list[dict]) -> None:
    """One warning line per scenario and policy whose runs rejected > 1% of requests for unconfigured reasons."""
    from collections import defaultdict

    from fleetwise.workload.adapt import WARN_SHARE

    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        by[(r["scenario"], json.dumps(r.get("params") or {}, sort_keys=True), r["router_label"],
            r["batcher_label"])].append(r)
    for (scen, params, router, batcher), rs in by.items():
        bad = sum(float(r.get("rejected_unconfigured") or 0) for r in rs)
        n = sum(float(r.get("requests") or 0) for r in rs)
        if n > 0 and bad > WARN_SHARE * n:
            tag = "" if params == "{}" else f" {params}"
            console.print(f"warning: {scen}{tag} {router}/{batcher}: {bad / n:.1%} of requests rejected for reasons "
                          f"no setting asked for (context, KV, queue, horizon) over {len(rs)} seeds: overloaded, "
                          f"these numbers do not compare with a run that serves them (try --load 0.7)",
                          style="yellow", highlight=False, markup=False, soft_wrap=True)


def _report(db: str, out_dir: str, experiment: Optional[str] = None, baseline: Optional[dict] = None) -> None:
    from fleetwise.experiments.report import write_report
    from fleetwise.experiments.store import Store, check_writable_dir

    if not Path(db).is_file():
        raise InputError(f"{db}: {not_a_file(db, 'results store')}"
                         + (" (run `fleetwise sweep` first)" if not Path(db).exists() else ""))
    if not str(out_dir).strip():  # (as a path, '' is the current folder: the report was written into it)
        raise InputError("--out '': an empty path; give the report's folder")
    check_writable_dir(out_dir, "report folder (--out)")
    if Path(out_dir).is_dir():  # (a folder named index.html there failed at the end, leaving index.html.tmp)
        from fleetwise.experiments.store import check_writable_file

        for name in ("index.html", "report-manifest.json"):
            check_writable_file(Path(out_dir) / name, "report")
    import duckdb

    try:
        index = write_report(Store(db, read_only=True), Path(out_dir), experiment=experiment, baseline=baseline)
    except InputError:
        raise
    except (duckdb.Error, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        # a store that fleetwise did not write as it is (a column dropped or retyped, a view, text that is not
        # JSON): one line, and write_report has removed what it had drawn
        detail = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise InputError(f"{db}: not a results store this version can report on ({type(e).__name__}"
                         f"{': ' + detail if detail else ''})") from None
    console.print(f"report written: open file://{index.resolve()}", highlight=False, soft_wrap=True)


@app.command()
def report(
    db: str = typer.Option(str(Path("results") / "fleetwise.duckdb"), help="results store (DuckDB file)"),
    out_dir: str = typer.Option(str(Path("results") / "report"), "--out", help="folder for index.html and PNGs"),
    experiment: Optional[str] = typer.Option(None, help="only this experiment (default: all in the store)"),
    baseline: Optional[str] = typer.Option(None, help="paired comparisons against LEVEL=NAME, e.g. router=round_robin"),
) -> None:
    """Write a self-contained HTML report (plots embedded) and a PNG of each plot."""
    base = None
    if baseline is not None:
        level, sep, name = baseline.partition("=")
        if not sep or level not in ("router", "batcher") or not name:
            raise InputError(f"--baseline {baseline!r}: expected router=NAME or batcher=NAME")
        base = {level: name}
    _report(db, out_dir, experiment, base)


@app.command("policies")
def policies() -> None:
    """List the registered policies of every decision level."""
    from fleetwise.policies import LEVELS, names

    for level in LEVELS:
        n = names(level)
        out.print(Text.assemble((level, "bold"), f": {', '.join(n) if n else '-'}"))


@app.command("scenarios")
def scenarios(
    copy: Optional[str] = typer.Option(None, "--copy", metavar="NAME", help="write built-in scenario NAME to DEST "
                                       "to edit it"),
    dest_arg: Optional[str] = typer.Argument(None, metavar="[DEST]", help="with --copy: file or folder "
                                             "(default: ./NAME.yaml)", show_default=False),
    force: bool = typer.Option(False, "--force", help="with --copy: overwrite DEST"),
) -> None:
    """List the built-in scenarios; `--copy NAME [DEST]` writes one to a file to edit (then: simulate -s FILE)."""
    from fleetwise.scenario import SCENARIO_DIR, builtin_files, load_scenario, scenario_names

    if dest_arg is not None and not dest_arg.strip():  # (as a Path, '' was '.' and wrote ./NAME.yaml)
        raise InputError("DEST '': an empty path (leave it out to write ./NAME.yaml)")
    dest = None if dest_arg is None else Path(dest_arg)
    if copy is None:
        if dest is not None or force:
            raise InputError("DEST and --force go with --copy NAME")
        for n in scenario_names():
            out.print(Text.assemble((n, "bold"), f"  {load_scenario(n).description}"), highlight=False)
        console.print("copy one to edit: fleetwise scenarios --copy NAME [DEST]", highlight=False, soft_wrap=True)
        return
    builtin = builtin_files(SCENARIO_DIR)
    if copy not in builtin:
        raise InputError(f"--copy {copy!r}: no such built-in scenario (built-in: {', '.join(sorted(builtin))})")
    target = Path(f"{copy}.yaml") if dest is None else dest / f"{copy}.yaml" if dest.is_dir() else dest
    if target.exists() and not force:
        raise InputError(f"{target}: already exists (--force overwrites it)")
    _write_atomic(target, builtin[copy].read_bytes())
    console.print(f"wrote {target}: edit it, then `fleetwise simulate --scenario {target}`", highlight=False,
                  soft_wrap=True)


def _check_writable(target: Path) -> None:
    """``target`` can be written by :func:`_write_atomic`: its folder exists or can be made (as ``sweep --db`` and
    ``train --out`` make theirs; ``--records`` and ``perf calibrate --out`` refused a missing one), and it is not a
    directory, a device, a pipe or a socket. Checked before a command's work, so that the work is not lost at the
    end; nothing is made until the file is written."""
    from fleetwise.experiments.store import check_writable_dir

    parent = target.parent
    for q in [parent, *parent.parents]:  # (def.yaml/x.json: def.yaml is a file, not a folder)
        if q.exists() and not q.is_dir():
            raise InputError(f"{target}: {q} is a file, not a folder")
    if target.is_dir():
        raise InputError(f"{target}: is a directory")
    check_replaceable(target)
    check_writable_dir(parent, f"folder of {target}")


def _write_atomic(target: Path, data: bytes | None = None, write=None) -> None:
    """Write ``data`` (or call ``write(tmp_path)``) to a temporary file beside ``target``, then rename it into
    place: a reader never sees a half-written file. Unwritable places are one-line input errors."""
    import os
    import tempfile

    _check_writable(target)
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise InputError(f"{target}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            umask = os.umask(0o022)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual permissions
            if data is not None:
                f.write(data)
        if write is not None:
            write(Path(tmp))
        os.replace(tmp, target)
    except OSError as e:
        raise InputError(f"{target}: cannot write ({e.strerror})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _of_profile(path: Path, fn, *args, **kw):
    """``fn(*args, **kw)`` on the profile read from ``path``: what it finds wrong with the profile (too few rows, a
    device that is not a catalog GPU) names the file."""
    try:
        return fn(*args, **kw)
    except InputError as e:
        if str(e).startswith(str(path)):
            raise
        raise InputError(f"{path}: {e}") from None


@perf_app.command("validate")
def perf_validate(
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
    profile: Optional[Path] = typer.Option(None, "--profile", help="a GPU profile (perf profile; or the H200 timings): "
                                           "held-out error of the calibration fitted from it"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="catalog GPU the profile is fitted as (default: its device)"),
) -> None:
    """Error of the calibrated performance model on measured operator timings held out from its fit."""
    if gpu is not None and profile is None:
        raise InputError("--gpu goes with --profile (the GPU a profile is fitted as); without it, the catalog GPUs' "
                         "measured timings are validated")
    if profile is not None:
        from fleetwise.perf.profile_data import load_profile
        from fleetwise.perf.validate_profile import render_profile_table, validate_profile

        res = _of_profile(profile, validate_profile, load_profile(profile), gpu)
        if as_json:
            out.print_json(json.dumps(_jsonable(res)))
        else:
            out.print(render_profile_table(res, f"Held-out error of the calibration fitted from {profile.name} (percent)"))
        return
    from fleetwise.perf.validate import render_table, run_validation

    res = run_validation()
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))
    else:
        out.print(render_table(res))


@perf_app.command("profile")
def perf_profile(
    out_file: Path = typer.Option(Path("profile.json"), "--out", help="profile file to write (JSON)"),
    models: Optional[str] = typer.Option(None, "--models", help="comma-separated catalog models (default: the seven "
                                         "reference slices, internlm-20b and Mixtral; on a CPU a tiny model)"),
    quick: bool = typer.Option(False, "--quick", help="fewer shapes (about 30 s on a GPU)"),
) -> None:
    """Time the operators the models need on this machine's GPU (pure PyTorch; a CPU runs tiny shapes)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError("perf profile needs PyTorch: pip install 'fleetwise[profile]'") from None
    from fleetwise.catalog import get_model
    from fleetwise.profiler import round_profile, run_profile

    names = _items(models, "--models") if models is not None else None
    if names is not None and not names:  # ('' profiled the default models and replaced --out)
        raise InputError(f"--models {models!r}: expected comma-separated catalog model names")
    for n in names or []:
        get_model(n)  # an unknown name fails before any timing
    _check_writable(out_file)  # (before any work)
    with _progress() as prog:
        task = prog.add_task("profiling", total=None)
        res = run_profile(names, quick=quick,
                          on_step=lambda i, n, what: prog.update(task, completed=i, total=n, description=what))
    _write_atomic(out_file, (json.dumps(round_profile(res), indent=1) + "\n").encode())
    env = res["env"]
    console.print(f"{out_file}: {len(res['gemm'])} GEMMs, {len(res['attn_prefill'])} prefill and "
                  f"{len(res['attn_decode'])} decode attention shapes, {len(res['iterations'])} iterations on "
                  f"{env.get('name')} ({env['device']}) in {env['seconds']:.0f} s; {len(res['errors'])} refused or "
                  f"skipped (listed under errors)", highlight=False)


@perf_app.command("calibrate")
def perf_calibrate(
    profile: Path = typer.Option(..., "--profile", help="a GPU profile (perf profile; or the H200 timings)"),
    out_file: Path = typer.Option(..., "--out", help="calibration file to write (JSON)"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="catalog GPU the profile is fitted as (default: its device)"),
) -> None:
    """Fit a calibration for the profile's GPU; select it with deployments[].calibration or perf predict."""
    from fleetwise.perf.calfile import write_calibration
    from fleetwise.perf.profile_data import load_profile
    from fleetwise.perf.validate_profile import gpu_calibration_from_profile

    _check_writable(out_file)  # (before any work)
    gc = _of_profile(profile, gpu_calibration_from_profile, load_profile(profile), gpu, source=profile.name)
    write_calibration(gc, out_file, source=str(profile))
    d = gc.default_backend
    console.print(f"{out_file}: {gc.gpu}, {len(gc.gemm_shapes)} GEMM shapes, attention backends "
                  f"{', '.join(sorted(gc.backends))} (default: prefill {d['prefill']}, chunked {d['chunked']}, "
                  f"decode {d['decode']})", highlight=False)


@perf_app.command("predict")
def perf_predict(
    gpu: str = typer.Option(..., "--gpu"),
    model: str = typer.Option(..., "--model"),
    tp: int = typer.Option(1, "--tp"),
    pp: int = typer.Option(1, "--pp"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="a calibration file (perf calibrate)"),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens", help="new tokens of the one prefilling sequence"),
    prefill_context: int = typer.Option(0, "--prefill-context", help="tokens that sequence already has cached"),
    decode_seqs: int = typer.Option(0, "--decode-seqs", help="sequences decoding one token each"),
    decode_context: int = typer.Option(0, "--decode-context", help="cached tokens of each decoding sequence"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
) -> None:
    """The model's time for one iteration: iteration_s = gpu_s (per-GPU compute) + comm_s (collectives) + cpu_s."""
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel

    g, m = get_gpu(gpu), get_model(model)
    cal = None
    if calibration is not None:
        from fleetwise.perf.calfile import load_calibration

        cal = load_calibration(calibration)
        if g.name not in cal.gpus:
            raise InputError(f"{calibration}: a calibration of {next(iter(cal.gpus))}, not of {g.name}")
    pm = PerfModel(g, m, tp=tp, pp=pp, calibration=cal)
    b = pm.iteration_breakdown(prefill_tokens, prefill_context, decode_seqs, decode_context)  # (checks each bound)
    # an iteration no engine could run is refused, as a scenario's deployment is (not a time for it)
    cap = pm.kv_capacity_tokens(0.9)
    where = f"{m.name} on {tp * pp} x {g.name} (tp={tp}, pp={pp}) at gpu_memory_utilization 0.9"
    if cap <= 0:
        raise InputError(f"{where}: the model does not fit (no room left for the KV cache); more GPUs (--tp, --pp)")
    kv = prefill_context + prefill_tokens + decode_seqs * (decode_context + 1)
    if kv > cap:
        raise InputError(f"{where}: the iteration needs {kv:,} tokens of KV cache (--prefill-context + "
                         f"--prefill-tokens + --decode-seqs x (--decode-context + 1)), more than the {cap:,} that fit")
    if as_json:
        print(json.dumps(b))
        return
    t = Table(title=f"one iteration of {m.name} on {tp * pp} x {g.name} (tp={tp}, pp={pp})"
                    + (f", {calibration.name}" if calibration else ""))
    for k in b:
        t.add_column(k, justify="right")
    t.add_row(*(f"{v * 1e3:.3f} ms" for v in b.values()))
    out.print(t)


@bench_app.command("sim-speed")
def bench_sim_speed(
    sizes: Optional[str] = typer.Option(None, help="comma-separated request counts \\[default: 10000,100000]"),
    scenario: str = typer.Option("vidur-parity", "--scenario", "-s", help="scenario to simulate"),
    router: str = typer.Option("round_robin", help="router (a registered name: fleetwise policies)"),
    replicas: Optional[str] = typer.Option(None, help="comma-separated fleet sizes (e.g. 4,1024,10000): simulate "
                                           "--requests requests at each size, the load per replica kept as in the "
                                           "scenario"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, max=MAX_REQUESTS,
                                           help="requests per fleet size (with --replicas) \\[default: 50000]"),
    repeat: Optional[int] = typer.Option(None, min=1, max=20, help="with --replicas: rounds of runs, every size once "
                                         "per round; each size's median run, and its rate over the first size's rate "
                                         "in each round \\[default: 1]"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
) -> None:
    """Simulated requests per wall-second and peak memory, each size in a fresh process. With --replicas: the same
    against the number of replicas, printing [{replicas, requests, req_per_s, peak_rss_mb, ratio_to_first, ...}]."""
    from fleetwise.bench import sim_speed
    from fleetwise.policies import make
    from fleetwise.scenario import load_scenario

    sc0 = load_scenario(scenario)  # a bad name or file fails first, with its name
    if sc0.scaler is not None or sc0.platform is not None:  # (ignored: tenants, faults and admission silently
        # dropped, 200 of 200 completed where simulate completed 5)
        raise InputError(f"bench sim-speed times the simulator alone; {sc0.name} has a scaler or a platform: section "
                         "(time `fleetwise simulate -s ...` instead, or drop them)")
    # the two modes take different options: one given to the other mode is refused, not ignored
    if replicas is not None:
        if sizes is not None:
            raise InputError("--sizes does not go with --replicas: --requests gives the requests per fleet size")
        _bench_fleet_speed(replicas, 50_000 if requests is None else requests, scenario, router, as_json,
                           1 if repeat is None else repeat)
        return
    if requests is not None or repeat is not None:
        raise InputError(f"{'--requests' if requests is not None else '--repeat'} goes with --replicas (fleet sizes); "
                         "without it, --sizes gives the request counts")
    if sizes is None:
        sizes = "10000,100000"

    ns = []
    for x in _items(sizes, "--sizes"):
        try:
            n = int(x)
        except ValueError:
            raise InputError(f"--sizes {sizes!r}: {x.strip()!r} is not a whole number") from None
        if not 1 <= n <= MAX_REQUESTS:
            raise InputError(f"--sizes {sizes!r}: {n} is not from 1 to {MAX_REQUESTS:,} requests")
        ns.append(n)
    if not ns:
        raise InputError(f"--sizes {sizes!r}: give at least one request count")
    load_scenario(scenario)  # a bad name or file fails here, before any child process
    make("router", router, where="--router: ")
    with _progress() as prog:  # (each size runs in a child process; a large one took minutes without a sign)
        task = prog.add_task(f"sim-speed {scenario}", total=len(ns))
        res = sim_speed(ns, scenario=scenario, router=router, on_done=lambda n: prog.advance(task))
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))  # (a run that completed nothing has no quantiles)
        return
    t = Table(title=f"simulator speed on {scenario} ({router})")
    for c in ("requests", "requests/s", "wall s", "peak RSS MB", "events"):
        t.add_column(c, justify="right")
    for n, r in res.items():
        t.add_row(n, f"{r['requests_per_s']:.0f}", f"{r['wall_s']:.2f}", f"{r['peak_rss_mb']:.0f}", f"{r['events']}")
    out.print(t)


def _bench_fleet_speed(replicas: str, requests: int, scenario: str, router: str, as_json: bool, repeat: int = 1
                       ) -> None:
    from fleetwise.bench import fleet_speed, scaled_scenario
    from fleetwise.policies import make

    sizes = []
    for x in _items(replicas, "--replicas"):
        try:
            r = int(x)
        except ValueError:
            raise InputError(f"--replicas {replicas!r}: {x.strip()!r} is not a whole number") from None
        if not 1 <= r <= MAX_REPLICAS:
            raise InputError(f"--replicas {replicas!r}: {r} is not from 1 to {MAX_REPLICAS:,}")
        sizes.append(r)
    if not sizes:
        raise InputError(f"--replicas {replicas!r}: give at least one fleet size")
    if not 1 <= requests <= MAX_REQUESTS:
        raise InputError(f"--requests {requests}: expected 1 to {MAX_REQUESTS:,}")
    scaled_scenario(scenario, sizes[0])  # a bad name, file or workload kind fails here, before any child process
    make("router", router, where="--router: ")
    with _progress() as prog:
        task = prog.add_task(f"{len(sizes)} fleet sizes x {repeat}", total=len(sizes) * repeat)
        res = fleet_speed(sizes, requests, scenario=scenario, router=router, repeat=repeat,
                          on_run=lambda d, n: prog.update(task, completed=d))
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))
        return
    t = Table(title=f"simulator speed against fleet size on {scenario} ({router}, load per replica kept"
                    + (f", median of {repeat} rounds" if repeat > 1 else "") + ")")
    for c in ("replicas", "requests", "requests/s", f"÷ {sizes[0]:,} replicas", "wall s", "peak RSS MB"):
        t.add_column(c, justify="right")
    for r in res:
        ratios = ", ".join(f"{x:.2f}" for x in r["ratio_to_first_runs"])
        t.add_row(str(r["replicas"]), str(r["requests"]), f"{r['req_per_s']:.0f}",
                  f"{r['ratio_to_first']:.2f}" + (f" ({ratios})" if repeat > 1 else ""), f"{r['wall_s']:.2f}",
                  f"{r['peak_rss_mb']:.0f}")
    out.print(t)


def _missing_rl(e: ModuleNotFoundError) -> str:
    return (f"this command needs the rl extra (missing module {e.name!r}): "
            "pip install -c constraints.txt 'fleetwise[rl]'")


def _paper_module(name: str):
    import importlib

    try:
        return importlib.import_module(f"fleetwise.reproduce.{name.replace('-', '_')}")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("fleetwise"):
            raise
        raise InputError(_missing_rl(e)) from None


def _reproduce(name: str, quick: bool, as_json: bool, eval_trace: Optional[str], seeds: Optional[int],
               db: Optional[str], wide: bool = False, load: Optional[str] = None, **extra) -> None:
    from fleetwise.workload.spec import parse_load

    if load is not None and eval_trace is None:
        raise InputError("--load applies to --eval-trace (the held-out data keep the paper's load)")
    for opt, v in (("--eval-trace", eval_trace), ("--db", db)):
        if v is not None and not v.strip():
            raise InputError(f"{opt}: an empty path")
    if db:
        from fleetwise.experiments.store import check_store_file

        check_store_file(db)  # before training, not after
    mod = _paper_module(name)
    kw = {"load": parse_load(load if load is not None else "0.7")} if eval_trace is not None else {}
    try:
        res = mod.run(quick=quick, seeds=seeds, eval_trace=eval_trace, db=db, **kw, **extra)
    except ModuleNotFoundError as e:
        raise InputError(_missing_rl(e)) from None
    for ln in res.get("_trace_fit", []) if isinstance(res, dict) else []:
        console.print(ln, highlight=False, markup=False, soft_wrap=True)
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))
    else:
        print_tables(mod.render(res), wide)


_QUICK = typer.Option(False, "--quick", help="small budget (minutes on 2 cores)")
_JSON = typer.Option(False, "--json", help="print one JSON object")
_EVAL = typer.Option(None, "--eval-trace", help="evaluate on this trace file or folder instead of the held-out data")
_SEEDS = typer.Option(None, min=1, max=MAX_SEEDS, help="seeds (default: the paper's protocol; fewer with --quick)")
_DB = typer.Option(str(Path("results") / "fleetwise.duckdb"), help="results store for runs and learning curves")
_LOAD = typer.Option(None, "--load", help="with --eval-trace: the trace's rate as a fraction of the fleet's capacity "
                     "(default 0.7) or real (the trace's own rate); docs/workloads.md#bring-your-own-trace")


@reproduce_app.command("allocation")
def reproduce_allocation(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                         seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD,
                         column: Optional[str] = typer.Option(None, "--column", help="with --eval-trace: the CPU "
                                                              "column, a header name or a 1-based index"),
                         wide: bool = _WIDE) -> None:
    """Q-learning vs SARSA vs fixed policy for GPU count and parallelism, on real CPU-usage traces."""
    if column is not None and eval_trace is None:
        raise InputError("--column applies to --eval-trace")
    _reproduce("allocation", quick, as_json, eval_trace, seeds, db, wide, load, **({"column": column} if column else {}))


@reproduce_app.command("batching")
def reproduce_batching(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                       seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD,
                       train_seeds: Optional[int] = typer.Option(None, min=1, max=MAX_SEEDS,
                                                                 help="agents trained per variant (default 3; 1 "
                                                                 "with --quick)"),
                       workers: int = typer.Option(1, min=1, max=MAX_WORKERS, help="training processes"),
                       learner: str = typer.Option("cem", "--learner", help="DISPPO's learner: cem (policy search "
                                                   "on whole segments, the default) or ppo (the paper's SMDP PPO)"),
                       backend: str = typer.Option("local", help="training jobs: local (worker processes) or ray"),
                       address: Optional[str] = typer.Option(None, help="a Ray cluster's address (--backend ray)"),
                       wide: bool = _WIDE) -> None:
    """DISPPO (the semi-Markov batching policy adjusting the offload_greedy rule) vs batching baselines at edge
    nodes."""
    if learner not in ("cem", "ppo"):
        raise InputError(f"--learner {learner!r}: expected cem or ppo")
    _check_backend(backend, address)
    _reproduce("batching", quick, as_json, eval_trace, seeds, db, wide, load, train_seeds=train_seeds,
               workers=workers, learner=learner, backend=backend, address=address)


@reproduce_app.command("torta")
def reproduce_torta(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                    seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD,
                    train_seeds: Optional[int] = typer.Option(None, min=1, max=MAX_SEEDS,
                                                              help="agents trained per kind and "
                                                              "topology (default 3; 1 with --quick)"),
                    workers: Optional[int] = typer.Option(None, min=1, max=MAX_WORKERS,
                                                          help="worker processes (default: all cores)"),
                    learner: str = typer.Option("cem", "--learner", help="the macro agent's learner: cem (policy "
                                                "search on whole days, the default) or ppo (the paper's)"),
                    backend: str = typer.Option("local", help="training and evaluation jobs: local (worker "
                                                "processes) or ray"),
                    address: Optional[str] = typer.Option(None, help="a Ray cluster's address (--backend ray)"),
                    objective: Optional[str] = typer.Option(None, "--objective", help="the CEM learner's objective: "
                                                            "response (response time, cost the constraint; the "
                                                            "default) or cost (cost, response time the constraint)"),
                    wide: bool = _WIDE) -> None:
    """TORTA: RL + optimal transport across regions, switching-aware allocation within them."""
    if learner not in ("cem", "ppo"):
        raise InputError(f"--learner {learner!r}: expected cem or ppo")
    if objective is not None and objective not in ("response", "cost"):
        raise InputError(f"--objective {objective!r}: expected response or cost")
    if objective is not None and learner != "cem":
        raise InputError("--objective applies to --learner cem only")
    _check_backend(backend, address)
    _reproduce("torta", quick, as_json, eval_trace, seeds, db, wide, load, train_seeds=train_seeds, workers=workers,
               learner=learner, backend=backend, address=address,
               **({"cem": {"objective": objective}} if objective else {}))


@reproduce_app.command("graph-marl")
def reproduce_graph_marl(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                         seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD,
                         workers: int = typer.Option(1, min=1, max=MAX_WORKERS, help="training processes (each "
                                                     "learned variant and training seed is a job)"),
                         train_seeds: Optional[int] = typer.Option(None, min=1, max=MAX_SEEDS,
                                                                   help="training seeds per learned variant "
                                                                   "(default 3; 1 with --quick)"),
                         tail_quantile: Optional[float] = typer.Option(
                             None, "--tail-quantile", help="also constrain each class's TTFT tail: its share of "
                             "requests within the rule's quantile at least this (e.g. 0.99: no class's P99 above "
                             "the rule's; docs/graph-marl.md)"),
                         wide: bool = _WIDE) -> None:
    """Graph-MARL-CloudLLM: a heterogeneous GNN + MAPPO across clouds."""
    _reproduce("graph_marl", quick, as_json, eval_trace, seeds, db, wide, load, workers=workers,
               train_seeds=train_seeds, **({"tail_quantile": tail_quantile} if tail_quantile is not None else {}))


@reproduce_app.command("platform")
def reproduce_platform(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                       seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD,
                       rl_checkpoint: Optional[str] = typer.Option(
                           None, "--rl-checkpoint", help="evaluate this trained RL scaler (NAME.npz + NAME.card.json, "
                           "e.g. from `fleetwise train scaler`) instead of training one; its gate is its model card's"),
                       wide: bool = _WIDE) -> None:
    """Platform autoscaling: scalers on a day of multi-tenant load with faults and spot preemptions."""
    _reproduce("platform", quick, as_json, eval_trace, seeds, db, wide, load,
               **({"rl_checkpoint": rl_checkpoint} if rl_checkpoint is not None else {}))


@train_app.command("router")
def train_router_cmd(
    out_path: Path = typer.Option(..., "--out", help="the checkpoint to write (NAME.npz, with NAME.card.json beside it)"),
    scenario: str = typer.Option("default", "--scenario", "-s", help="a scenario whose workload has rate_rps"),
    trace: Optional[str] = typer.Option(None, help="train on this trace (file or alias) in place of the scenario's "
                                        "arrivals and lengths; --rates are then loads (fractions of capacity)"),
    rates: Optional[str] = typer.Option(None, help="comma-separated arrival rates (workload.rate_rps) to train "
                                        "at (default 12,18,24); with --trace, loads (default 0.5,0.7,0.9)"),
    requests: int = typer.Option(1500, "--requests", "-n", min=50, max=MAX_REQUESTS, help="requests per run"),
    iterations: int = typer.Option(6, min=1, max=1000, help="CEM iterations"),
    population: int = typer.Option(8, min=2, max=1000, help="parameter vectors tried per iteration"),
    elite: int = typer.Option(3, min=1, max=999, help="the best of them the next iteration is fitted to"),
    train_seeds: int = typer.Option(2, min=1, max=MAX_SEEDS, help="training seeds per rate (1000, 1001, ...)"),
    val_seeds: int = typer.Option(4, min=1, max=MAX_SEEDS, help="validation seeds per rate (2000, 2001, ...): "
                                  "choose the parameters kept"),
    gate_seeds: int = typer.Option(4, min=1, max=MAX_SEEDS, help="gate seeds per rate (3000, 3001, ...): the "
                                   "gate's own windows"),
    seed: int = typer.Option(0, min=0, max=MAX_TRAIN_SEED, help="the search's seed"),
    db: Optional[str] = typer.Option(None, "--db", help="also store the learning curve in this results store "
                                     "(`fleetwise report --db` draws it)"),
    as_json: bool = _JSON,
) -> None:
    """The learned router: least outstanding tokens with a learned correction, found by the cross-entropy method
    on training seeds (mean E2E latency, TTFT P99 within 2% of the rule's as a constraint), kept by validation,
    gated against the rule on seeds of its own (the gate's result goes into the model card)."""
    from fleetwise.control.checkpoint import card_path
    from fleetwise.experiments.store import check_writable_file
    from fleetwise.learn.router import RouterTrainConfig, train_router
    from fleetwise.scenario import load_scenario

    if not str(out_path).endswith(".npz"):
        raise InputError(f"--out {out_path}: expected a NAME.npz file name")
    check_writable_file(out_path, "checkpoint (--out)")
    check_writable_file(card_path(out_path), "model card (beside --out)")
    if db is not None:
        from fleetwise.experiments.store import check_store_file

        if not db.strip():
            raise InputError("--db '': expected a results store file name")
        check_store_file(db)  # (before any work)
    rates = rates if rates is not None else ("0.5,0.7,0.9" if trace else "12,18,24")
    try:
        rate_list = [float(x) for x in _items(rates, "--rates")]
    except ValueError:
        raise InputError(f"--rates {rates!r}: expected comma-separated numbers, e.g. 12,18,24") from None
    hi = 100.0 if trace else 1e6
    if not rate_list or not all(0 < r <= hi and math.isfinite(r) for r in rate_list):
        raise InputError(f"--rates {rates!r}: expected " + (f"loads above 0 and at most {hi:g}, e.g. 0.5,0.7,0.9"
                                                            if trace else f"request rates above 0 and at most "
                                                            f"{hi:g} per second, e.g. 12,18,24"))
    if trace is not None:
        from fleetwise.workload.spec import resolve_trace

        resolve_trace(trace)  # a missing file fails here, with its name
    if elite >= population:
        raise InputError(f"--elite {elite}: expected fewer than --population {population}")
    if gate_seeds * len(rate_list) < 2:
        raise InputError(f"--gate-seeds {gate_seeds}: the gate's 95% interval needs at least 2 gate runs "
                         f"(--gate-seeds x rates; {len(rate_list)} rate given)")
    try:
        cfg = RouterTrainConfig(scenario=scenario, rates=rate_list, trace=trace, requests=requests,
                                iterations=iterations, population=population, elite=elite, train_seeds=train_seeds,
                                val_seeds=val_seeds, gate_seeds=gate_seeds, seed=seed)
    except ValueError as e:
        raise InputError(str(e)) from None
    load_scenario(scenario)  # a bad name or file fails before any run
    if trace is not None:  # what fitting the trace does to it, as simulate and compare print it
        from fleetwise.learn.router import scenario_at
        from fleetwise.scenario import build

        first = build(scenario_at(scenario, rate_list[0], trace), 0, num_requests=requests)
        _print_adaptations([f"--trace {trace}: at load {rate_list[0]:g}, seed 0 (each training and validation run "
                            "fits its own)"], first.adaptations)
    with _progress() as prog:
        task = prog.add_task("training the learned router (CEM)", total=iterations)
        res = train_router(cfg, out=out_path, progress=lambda it, row: prog.update(task, completed=it))
    if db is not None:  # the validation curve, as the reproductions store theirs (the report's learning section)
        from fleetwise.experiments.store import Store

        its = [int(r["iteration"]) for r in res["curve"]]
        store, rid = Store(db), f"train-router-{out_path.stem}"
        store.add_learning_curve("learned router", its, [100 * (math.exp(r["val_log_e2e_ratio"]) - 1)
                                                         for r in res["curve"]],
                                 metric="validation E2E mean vs rule (%)", run_id=rid)
        store.add_learning_curve("learned router", its, [100 * (r["val_ttft_p99_ratio"] - 1) for r in res["curve"]],
                                 metric="validation TTFT p99 vs rule (%)", run_id=rid)
        console.print(f"learning curve stored in {db} (fleetwise report --db {db})", highlight=False, soft_wrap=True)
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))
        return
    g = res["gate"]
    on = scenario + (f" with {trace}" if trace else "")
    t = Table(title=f"learned router on {on}: learning curve (validation, against {g['rule']})")
    for c in ("iteration", "E2E mean vs rule", "TTFT P99 vs rule", "lambda"):
        t.add_column(c, justify="right")
    for row in res["curve"]:
        t.add_row(str(row["iteration"]), f"{math.exp(row['val_log_e2e_ratio']) - 1:+.2%}",
                  f"{row['val_ttft_p99_ratio'] - 1:+.2%}", f"{row['lambda']:.3g}")
    print_tables(t, False)
    lo, hi = g["ci95"]
    console.print(f"gate ({g['windows']} runs on gate seeds 3000+, mean E2E latency against {g['rule']}): "
                  f"{g['change']:+.2%} [{lo:+.2%}, {hi:+.2%}], TTFT P99 ratio {g['ttft_p99_ratio']:.3f}: "
                  f"{'passed' if g['passed'] else 'NOT passed (serve refuses it without --force)'}; "
                  f"checkpoint {res['checkpoint']}", highlight=False, soft_wrap=True)


@train_app.command("scaler")
def train_scaler_cmd(
    out_path: Path = typer.Option(..., "--out", help="the checkpoint to write (NAME.npz, with NAME.card.json beside it)"),
    quick: bool = typer.Option(False, "--quick", help="reproduce platform --quick's budget (1-hour training "
                               "windows, 3 iterations of 6, validated and gated on 12-hour windows) instead of the "
                               "full one (2-hour training windows, 6 iterations of 8, validated and gated on whole "
                               "days)"),
    seed: int = typer.Option(0, min=0, max=MAX_TRAIN_SEED, help="the search's seed"),
    searches: Optional[int] = typer.Option(None, min=1, max=64, help="independent searches (seeds SEED, SEED+1, ...; "
                                           "each its own training windows); validation keeps the best parameters "
                                           "over all of them (default: the budget's, 3 full, 1 --quick)"),
    init: str = typer.Option("calm_hour_low_need", "--init", help="where the search starts: "
                             "calm_hour_low_need (the budgets' default: a hand-written correction that lifts a "
                             "model's N+1 spread after a calm hour while its need is under 0.35 replica, restores it "
                             "when the need or the SLO ratio rises, and holds the need through dips while lifted, and "
                             "outside a lift for a replica under $12 an hour), calm_hour_need_restore (... lifted at "
                             "any need of a calm hour), calm_hour_price_hold (... restored on a short queue too), "
                             "calm_price_hold "
                             "(... lifted after a calm quarter-hour), calm_lift (its "
                             "hold for every model), calm_lift_only (its hold "
                             "only while the spread is lifted), calm_hold (... and in the hour after a restore), "
                             "calm_hold_multi (... and for a model needing more than one replica) or rule (zero "
                             "parameters, slo_aware itself)"),
    val_days: Optional[str] = typer.Option(None, "--val-days", help="the validation days, 1-based, as A-B or A,B "
                                           "(default 7-10): the choice's and the gate's windows take them in turn; "
                                           "never a training day (2-6)"),
    backend: str = typer.Option("local", help="local (worker processes) or ray"),
    address: Optional[str] = typer.Option(None, help="a Ray cluster's address (--backend ray)"),
    workers: Optional[int] = typer.Option(None, min=1, max=MAX_WORKERS, help="worker processes (default: all cores)"),
    as_json: bool = _JSON,
) -> None:
    """The RL scaler of `reproduce platform`: a model-level correction of slo_aware (its need and zone redundancy,
    per model and epoch), found by the cross-entropy method on windows of the platform scenario's ServeGen days
    2-6 and of two real traces in its place (cost per token, SLO attainment within 0.1 point of the rule's as a
    constraint), kept by validation on days 7-10, gated against slo_aware (the gate's result goes into the model
    card)."""
    from fleetwise.control.checkpoint import card_path
    from fleetwise.experiments.store import check_writable_file
    from fleetwise.learn.scaler_cem import CEM_BUDGETS, INITS, ScalerCEMConfig, parse_days, train_scaler_cem
    from fleetwise.scenario import SCENARIO_DIR, read_yaml

    if not str(out_path).endswith(".npz"):
        raise InputError(f"--out {out_path}: expected a NAME.npz file name")
    _check_backend(backend, address)
    check_writable_file(out_path, "checkpoint (--out)")
    check_writable_file(card_path(out_path), "model card (beside --out)")
    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    if init != "rule" and init not in INITS:
        raise InputError(f"--init {init!r}: expected one of {', '.join(['rule', *sorted(INITS)])}")
    extra: dict = {}
    if val_days is not None:
        try:
            extra["val_days"] = parse_days(val_days)
        except ValueError as e:
            raise InputError(f"--val-days {e}") from None
        both = sorted(set(extra["val_days"]) & set(ScalerCEMConfig().train_days))
        if both:
            raise InputError(f"--val-days {val_days!r}: day {both[0] + 1} is a training day (2-6)")
    cfg = ScalerCEMConfig(seed=seed, **(CEM_BUDGETS["quick" if quick else "full"] | (
        {"searches": searches} if searches is not None else {}) | (
        {"init": None, "sigma": ScalerCEMConfig.sigma} if init == "rule" else {"init": init}) | extra))
    with _progress() as prog:
        task = prog.add_task("training the RL scaler (CEM)", total=cfg.iterations * cfg.searches)
        res = train_scaler_cem(base, cfg, out_path, backend=backend, workers=workers, address=address,
                               progress=lambda it, row: prog.update(task, completed=it))
    if as_json:
        out.print_json(json.dumps(_jsonable(res), default=float))
        return
    g = res["gate"]
    t = Table(title="RL scaler on the platform scenario: learning curve (validation windows, against slo_aware)")
    for c in ("search", "iteration", "$/Mtok vs rule", "SLO attainment vs rule", "oscillations added", "lambda"):
        t.add_column(c, justify="right")
    for row in res["curve"]:
        t.add_row("-" if row["search"] is None else str(row["search"]), str(row["iteration"]),
                  f"{math.exp(row['val_log_cost_ratio']) - 1:+.2%}",
                  f"{row['val_attainment_diff'] * 100:+.2f} pt", f"{row['val_oscillations_added']:+.0f}",
                  f"{row['lambda']:.3g}")
    print_tables(t, False)
    lo, hi = g["ci95"]
    console.print(f"gate ({g['windows_detail']}, cost per million tokens against {g['rule']}): {g['change']:+.2%} "
                  f"[{lo:+.2%}, {hi:+.2%}], SLO attainment {g['attainment_diff'] * 100:+.2f} points"
                  + (" [{:+.2f}, {:+.2f}]".format(*(100 * v for v in g["attainment_diff_ci95"]))
                     if None not in g.get("attainment_diff_ci95", [None]) else "") + ": "
                  f"{'passed' if g['passed'] else 'NOT passed (serve refuses it without --force)'}; kept "
                  f"{res['kept']}; checkpoint {res['checkpoint']}", highlight=False,
                  soft_wrap=True)


@bench_app.command("env-steps")
def bench_env_steps(
    name: str = typer.Argument(..., metavar="NAME", help="allocation, batching, torta, graph-marl or platform"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
) -> None:
    """Environment steps per second on one core (and training wall time where the paper needs it)."""

    from fleetwise.reproduce import PAPERS

    if name not in PAPERS:
        raise InputError(f"unknown environment {name!r}; expected one of: {', '.join(PAPERS)}")
    try:
        with _progress() as prog:  # (batching's ran for 50 s without a sign)
            prog.add_task(f"env-steps {name}", total=None)
            res = _paper_module(name).bench()
    except ModuleNotFoundError as e:
        raise InputError(_missing_rl(e)) from None
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))
    else:
        for k, v in res.items():
            out.print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


@bench_app.command("sweep")
def bench_sweep(
    spec: str = typer.Option("default", help="experiment to run (file or built-in name)"),
    workers: Optional[int] = typer.Option(None, min=1, max=MAX_WORKERS, help="pool size (default: all cores)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
) -> None:
    """Sweep throughput: runs per minute one after another vs on the local process pool."""
    from fleetwise.bench import sweep_throughput

    res = sweep_throughput(spec, workers)
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))
        return
    out.print(f"{res['runs']} runs of {spec!r}: sequential {res['sequential_runs_per_min']:.0f} runs/min "
              f"({res['sequential_wall_s']:.1f} s), pool of {res['workers']} {res['pool_runs_per_min']:.0f} runs/min "
              f"({res['pool_wall_s']:.1f} s): {res['speedup']:.2f}x")


def _serve_module(name: str = "app"):
    import importlib

    try:
        return importlib.import_module(f"fleetwise.serve.{name}")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("fleetwise"):
            raise
        raise InputError(f"this command needs the serve extra (missing module {e.name!r}): "
                         "pip install -c constraints.txt 'fleetwise[serve]'") from None


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def _check_port_free(host: str, port: int) -> None:
    """Bind and release the address first, so that a port in use is one line and exit status 2 (uvicorn would
    log it and exit with status 3). Port 0 (any free port) always works."""
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(f"--host {host!r}: cannot resolve it ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            s.bind(addr)
        except OSError as e:
            raise InputError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="address to bind (not loopback: a token of 16+ characters is required)"),
    port: int = typer.Option(8000, min=0, max=65535),
    router: str = typer.Option("least_outstanding_tokens", help="router policy, e.g. prefix_aware?hit_weight=0.5"),
    scaler: Optional[str] = typer.Option(None, help="scaler policy for /v1/scale (default: none loaded)"),
    planner: Optional[str] = typer.Option(None, help="planner for /v1/plan (default: ot_capacity)"),
    checkpoint: Optional[str] = typer.Option(None, help="TORTA planner checkpoint (fleetwise NAME.npz + "
                                             "NAME.card.json; inside --checkpoint-dir when given)"),
    checkpoint_dir: Optional[str] = typer.Option(None, help="the folder checkpoints load from; a reload may name "
                                                 "files inside it only (without it, reloading a checkpoint is "
                                                 "refused)"),
    token_file: Optional[str] = typer.Option(None, help="file with the bearer token (default: $FLEETWISE_SERVE_TOKEN)"),
    insecure_admin: bool = typer.Option(False, "--insecure-admin", help="without a token, allow /v1/admin/* "
                                        "(loopback only; refused by default)"),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="seed of the random routers"),
    force: bool = typer.Option(False, "--force", help="serve checkpoints whose model card does not say they beat "
                               "their rule on validation (the deployment gate, docs/learning.md); refused by default"),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
    max_body_bytes: int = typer.Option(8 << 20, min=1, help="largest request body, every path (413 beyond)"),
    max_concurrency: int = typer.Option(500, min=1, help="connections + requests in progress (503 beyond)"),
    max_buffered_bytes: int = typer.Option(256 << 20, min=1, help="request bodies held in memory at once, all "
                                           "requests together (503 beyond; one body always fits)"),
    header_timeout: float = typer.Option(5.0, parser=_finite(0.1, 3600.0),
                                         help="seconds to receive a whole request head (0.1-3600)"),
    gateway: bool = typer.Option(False, "--gateway", help="run the OpenAI-compatible gateway in front of --backend "
                                 "servers instead (docs/serve.md#gateway); --router picks the backend"),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="with --gateway: an OpenAI-compatible "
                                                "server's base URL, e.g. http://127.0.0.1:8001 (repeat the option)"),
    max_attempts: Optional[int] = typer.Option(None, min=1, max=100, help="with --gateway: distinct backends tried per "
                                               "request \\[default: 3]"),
    backend_timeout: Optional[float] = typer.Option(None, parser=_finite(0.1, 86400.0),
                                                    help="with --gateway: seconds a backend may take for a whole "
                                                    "answer (a stream: for its first bytes), and its longest silence "
                                                    "\\[default: 600]"),
) -> None:
    """The decision service: route, scale and plan over HTTP (docs/serve.md, docs/security.md). With --gateway: an
    OpenAI-compatible proxy that routes each request to one of the --backend servers."""
    from fleetwise.serve.edge import Limits

    if log_level.lower() not in LOG_LEVELS:
        raise InputError(f"--log-level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    log_level = log_level.lower()
    limits = Limits(max_body_bytes=max_body_bytes, max_concurrency=max_concurrency, header_timeout_s=header_timeout,
                    max_buffered_bytes=max_buffered_bytes)
    _check_port_free(host, port)
    if gateway:
        if not backend:
            raise InputError("--gateway: give at least one --backend URL")
        if scaler is not None or planner is not None or checkpoint is not None or checkpoint_dir is not None:
            raise InputError("--gateway routes only: --scaler, --planner, --checkpoint and --checkpoint-dir do not "
                             "apply")
        timeouts = {} if backend_timeout is None else {"read_timeout_s": backend_timeout,
                                                         "attempt_timeout_s": backend_timeout}
        _serve_module("gateway").serve_gateway(list(backend), host=host, port=port, route_policy=router,
                                               token_file=token_file, log_level=log_level, seed=seed,
                                               max_attempts=3 if max_attempts is None else max_attempts,
                                               limits=limits, force=force, **timeouts)
        return
    if backend:
        raise InputError("--backend needs --gateway")
    if backend_timeout is not None:
        raise InputError("--backend-timeout needs --gateway")
    if max_attempts is not None:
        raise InputError("--max-attempts needs --gateway (the backends a request may try)")
    if planner is not None and checkpoint is not None:
        raise InputError("give --planner or --checkpoint, not both")
    for opt, v in (("--planner", planner), ("--checkpoint", checkpoint)):
        if v is not None and not v.strip():
            raise InputError(f"{opt}: an empty name")
    _serve_module().main(host=host, port=port, router=router, scaler=scaler, planner=planner, checkpoint=checkpoint,
                         token_file=token_file, seed=seed, log_level=log_level, checkpoint_dir=checkpoint_dir,
                         insecure_admin=insecure_admin, limits=limits, force=force)


@app.command("export-checkpoint")
def export_checkpoint(
    sb3_zip: str = typer.Argument(..., metavar="SB3_ZIP", help="a Stable-Baselines3 .zip YOU trained (trusted)"),
    out_path: str = typer.Argument(..., metavar="OUT", help="the checkpoint to write: OUT.npz + OUT.card.json"),
    level: str = typer.Option(..., help="decision level the policy decides: allocator, planner, scaler, router, "
                              "batcher"),
    policy: str = typer.Option(..., help="policy kind for the model card, e.g. torta or rl"),
    rule: Optional[str] = typer.Option(None, help="the hand-written rule the policy adjusts, if any"),
) -> None:
    """Export a Stable-Baselines3 .zip to a fleetwise policy checkpoint that loads without running code
    (docs/security.md). WARNING: reading the .zip unpickles objects from it, which can run code: use this only
    on files you trust, never on a file someone sent you."""
    from fleetwise.control.checkpoint import LEVELS, SUFFIX, card_path
    from fleetwise.experiments.store import check_writable_file

    if level not in LEVELS:
        raise InputError(f"--level {level!r}: expected one of {', '.join(LEVELS)}")
    for opt, v in (("--policy", policy), ("--rule", rule)):  # (the model card's names, checked before any work)
        if v is not None and not (0 < len(v.strip()) == len(v) <= 256):
            raise InputError(f"--{opt.lstrip('-')} {v!r}: expected a name (1-256 characters, no spaces around it)")
    if rule is not None:  # (a name no loader knows made a checkpoint that every loader refused)
        from fleetwise.policies import names
        from fleetwise.worlds.edge import RULE as EDGE_RULE
        from fleetwise.worlds.multicloud_rules import RULE as MULTICLOUD_RULE

        known = sorted({EDGE_RULE, MULTICLOUD_RULE, *(n for lv in LEVELS for n in names(lv))})
        if rule not in known:
            raise InputError(f"--rule {rule!r}: not a rule fleetwise knows; expected one of: {', '.join(known)}")
    if not Path(sb3_zip).is_file():
        raise InputError(f"{sb3_zip}: {not_a_file(sb3_zip, 'Stable-Baselines3 .zip')}")
    target = Path(out_path) if out_path.endswith(SUFFIX) else Path(out_path + SUFFIX)
    check_writable_file(target, "checkpoint (OUT)")  # before the .zip is read: nothing is unpickled for nothing
    check_writable_file(card_path(target), "model card (beside OUT)")
    console.print("warning: export-checkpoint unpickles the .zip (runs code from it): only for files you trust",
                  markup=False, highlight=False, soft_wrap=True)
    try:
        from fleetwise.learn.export import export_file
    except ModuleNotFoundError as e:
        raise InputError(f"export-checkpoint needs the rl extra (missing module {e.name!r}): "
                         "pip install -c constraints.txt 'fleetwise[rl]'") from None
    p = export_file(sb3_zip, out_path, level=level, policy=policy, rule=rule)
    out.print(f"wrote {p} and {card_path(p)}; serve it with `fleetwise serve --checkpoint-dir {p.parent} "
              f"--checkpoint {p.name}`", markup=False, highlight=False)


@bench_app.command("serve")
def bench_serve(
    rate: float = typer.Option(1000.0, parser=_finite(1.0, 1e6), help="calls per second (open loop)"),
    duration: float = typer.Option(10.0, parser=_finite(0.1, 86400.0),
                                   help="seconds; rate x duration calls in all"),
    connections: int = typer.Option(8, min=1, max=1000, help="keep-alive client connections"),
    replicas: int = typer.Option(8, min=1, max=MAX_REPLICAS, help="replicas in each route snapshot"),
    router: str = typer.Option("least_outstanding_tokens"),
    pin: bool = typer.Option(False, "--pin", help="service on CPU 0, load generator on CPU 1"),
    floor: bool = typer.Option(False, "--floor", help="the same load on a trivial app: HTTP + uvicorn alone"),
    repeat: int = typer.Option(1, min=1, max=100,
                               help="runs, each with a fresh service; prints every run and the median"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
) -> None:
    """Decision latency (P50/P99) and throughput of `fleetwise serve` on loopback under a bounded open-loop load."""
    if rate * duration < 1:
        raise InputError(f"--rate x --duration = {rate * duration:.3g} calls: expected at least one call")
    if rate * duration > MAX_REQUESTS:
        raise InputError(f"--rate x --duration = {rate * duration:.3g} calls, above the limit of {MAX_REQUESTS:,} "
                         "(docs/limits.md)")
    mod = _serve_module("loadgen")
    _serve_module()  # the service's own dependencies
    from fleetwise.serve.policy import load_route_policy

    load_route_policy(router)  # (a bad name in one line here, not from the service's process)
    runs = []
    for i in range(repeat):
        with _progress() as prog:  # (a run is seconds of load with nothing on the screen)
            prog.add_task(f"bench serve run {i + 1} of {repeat}", total=None)
            res = mod.run(rate=rate, duration_s=duration, connections=connections, replicas=replicas, router=router,
                          pin=pin, floor=floor)
        runs.append(res)
        if not as_json:
            out.print((f"run {i + 1} of {repeat}: " if repeat > 1 else "") + mod.render(res), highlight=False)
    if repeat > 1:
        summary = mod.summarize(runs)
        if as_json:
            out.print_json(json.dumps(_jsonable({"runs": runs, "summary": summary})))
        else:
            out.print(mod.render_summary(runs, summary), highlight=False)
    elif as_json:
        out.print_json(json.dumps(_jsonable(runs[0])))


@bench_app.command("scale")
def bench_scale(
    groups: str = typer.Option("250,1000,10000", help="comma-separated numbers of scaling groups"),
    scaler: str = typer.Option("slo_aware", help="the scaler loaded in the service"),
    repeat: int = typer.Option(5, min=1, max=100, help="runs per size (the median is printed)"),
    columns: bool = typer.Option(False, "--columns", help="post the groups as columns (field -> list of values)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
) -> None:
    """How POST /v1/scale grows with the number of scaling groups: request wall time on loopback, and the CPU time
    of parsing and of the scaler's decision (docs/serve.md)."""
    mod = _serve_module("bench_scale")
    _serve_module()
    try:
        sizes = [int(x) for x in _items(groups, "--groups")]
    except ValueError:
        raise InputError(f"--groups {groups!r}: expected comma-separated positive integers") from None
    if not sizes or any(n < 1 or n > 10_000 for n in sizes):
        raise InputError(f"--groups {groups!r}: each size must be 1..10000 (the service's limit)")
    from fleetwise.serve.adapters import load_scale_policy

    load_scale_policy(scaler)  # (a bad name in one line here, not from the service's process)
    rows = mod.run(sizes, scaler=scaler, repeat=repeat, columns=columns)
    if as_json:
        out.print_json(json.dumps(_jsonable(rows)))
    else:
        out.print(mod.render(rows), highlight=False, markup=False)


@bench_app.command("gateway")
def bench_gateway(
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="backend base URL (repeat); default: start "
                                                "--servers local llama.cpp servers with a tiny random model"),
    servers: int = typer.Option(3, min=1, max=MAX_WORKERS,
                                help="local llama.cpp servers to start when no --backend is given"),
    requests: int = typer.Option(200, "--requests", "-n", min=1, max=MAX_REQUESTS,
                                 help="requests per path (direct, gateway) and mode (plain, stream)"),
    concurrency: int = typer.Option(1, min=1, max=1000, help="client threads"),
    max_tokens: int = typer.Option(8, min=1, max=100_000),
    router: str = typer.Option("least_outstanding_tokens"),
    as_json: bool = typer.Option(False, "--json", help="print JSON on stdout (notes and progress on stderr)"),
) -> None:
    """Gateway overhead: the same completions straight to the backends and through `fleetwise serve --gateway`."""
    mod = _serve_module("bench_gateway")
    _serve_module("gateway")
    from fleetwise.serve.gateway import backend_urls
    from fleetwise.serve.policy import load_route_policy

    load_route_policy(router)  # (bad input in one line here, not from the gateway's process)
    if backend:
        backend_urls(list(backend))
    else:
        from fleetwise.serve.localbackends import llama_cpp_available

        if not llama_cpp_available():
            raise InputError("no --backend given and llama-cpp-python is not installed: "
                             "pip install -c constraints.txt 'fleetwise[backend]'")
    res = mod.gateway_overhead(list(backend) if backend else None, servers=servers, requests=requests,
                               concurrency=concurrency, max_tokens=max_tokens, policy=router)
    if as_json:
        out.print_json(json.dumps(_jsonable(res)))
    else:
        out.print(mod.render(res), highlight=False)


def main(argv: Optional[list[str]] = None) -> None:
    """The ``fleetwise`` entry point: bad input (an :class:`InputError` or a command-line usage error) prints one
    line on stderr and exits with status 2, without a traceback."""
    try:
        rc = app(args=argv, standalone_mode=False)
    except InputError as e:
        _error_line(str(e))
        sys.exit(2)
    except SystemExit:
        raise
    except OSError as e:  # a path no file system can hold (wherever it was opened): the user's, one line
        if e.errno not in (errno.ENAMETOOLONG, errno.ELOOP) or e.filename is None:
            raise
        name = str(e.filename)
        _error_line(f"{name if len(name) <= 80 else name[:60] + f'... ({len(name):,} characters)'}: {e.strerror}")
        sys.exit(2)
    except Exception as e:  # usage errors of the command-line parser (typer's click layer)
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError":  # a group without its subcommand: the help text
                e.show()
            else:
                hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
                _error_line(e.format_message().replace("\n", " ") + hint)
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            _error_line("interrupted")
            sys.exit(130)
        raise
    except KeyboardInterrupt:  # (outside click's own handling)
        _error_line("interrupted")
        sys.exit(130)
    if isinstance(rc, int) and rc:  # e.g. 130 after Ctrl-C (typer returns it instead of exiting)
        if rc == 130:
            _error_line("interrupted")
        sys.exit(rc)


def _error_line(msg: str) -> None:
    console.print("error: ", style="red", end="", soft_wrap=True)
    console.print(msg, soft_wrap=True, highlight=False, markup=False)


if __name__ == "__main__":
    main()
