"""fleetwise command line: simulate, compare, perf validate, bench sim-speed.

Bad input (a scenario field, a trace row, a file, a policy name) prints one line naming what is wrong and where,
and exits with status 2, without a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fleetwise.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Decide and learn how an LLM inference fleet spends its GPUs.")
perf_app = typer.Typer(add_completion=False, help="The GPU performance model.")
bench_app = typer.Typer(add_completion=False, help="Benchmarks (commands whose output goes into the docs).")
reproduce_app = typer.Typer(add_completion=False, help="Reproduce a paper's experiment (see docs/).")
app.add_typer(perf_app, name="perf")
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(bench_app, name="bench")

console = Console(stderr=True)
out = Console() if sys.stdout.isatty() else Console(width=200)

# keys shown in tables, with the unit scale
TABLE_KEYS = [
    ("completed", "done", 1, "{:.0f}"),
    ("ttft_p50_s", "TTFT p50 s", 1, "{:.3f}"), ("ttft_p99_s", "TTFT p99 s", 1, "{:.2f}"),
    ("tpot_p50_s", "TPOT p50 ms", 1e3, "{:.1f}"), ("e2e_p99_s", "E2E p99 s", 1, "{:.1f}"),
    ("goodput_rps", "goodput/s", 1, "{:.2f}"), ("load_cv", "load CV", 1, "{:.3f}"),
    ("slowdown_p50", "slowdown p50", 1, "{:.2f}"), ("cost_per_mtok_usd", "$/Mtok", 1, "{:.3f}"),
]


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console, transient=True, disable=not console.is_terminal)


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


def _jsonable(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@app.command()
def simulate(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario YAML file or built-in name"),
    router: Optional[str] = typer.Option(None, help="router policy name (overrides the scenario)"),
    batcher: Optional[str] = typer.Option(None, help="batcher policy name (overrides the scenario)"),
    trace: Optional[str] = typer.Option(None, help="replay this trace file (or alias azure-conv, mooncake, ...) in "
                                        "place of the scenario's arrivals and lengths"),
    load: Optional[str] = typer.Option(None, help="with --trace: the arrival rate as a fraction of the fleet's "
                                       "capacity (0.7) or real (the trace's own rate; default)"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, help="number of requests"),
    seed: Optional[int] = typer.Option(None, help="random seed (default: the scenario's)"),
    scaler: Optional[str] = typer.Option(None, help="autoscaler (runs the platform layer; overrides the scenario)"),
    monitor: Optional[Path] = typer.Option(None, help="platform runs: write the monitoring series here "
                                           "(Prometheus text, Parquet, PNG)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Run one scenario (default: the embedded default) and print its summary. A scenario with a ``scaler``
    (or ``--scaler``) runs with the platform layer: autoscaling, spot, faults, tenants (docs/platform.md)."""
    from fleetwise.scenario import PolicyRef, build

    sc, lines = _load(scenario, trace, load, requests)
    if scaler is not None:
        sc = sc.model_copy(update={"scaler": PolicyRef(name=scaler)})
    b = build(sc, seed, num_requests=requests)
    _print_adaptations(lines, b.adaptations)
    plat = None
    if sc.scaler is not None:
        from fleetwise.platform.runner import Platform
        from fleetwise.policies import make

        plat = Platform(b, make("scaler", sc.scaler.name, sc.scaler.params, where="scaler: "),
                        seed=sc.seed if seed is None else seed, monitor=monitor is not None)
    with _progress() as prog:
        task = prog.add_task(f"simulating {sc.name}", total=len(b.workload))
        prog_fn = lambda k: prog.advance(task, k)  # noqa: E731
        records = b.run(router, batcher, progress=prog_fn) if plat is None else \
            plat.run(b.controller(router, batcher), progress=prog_fn)
    s = b.summary(records) if plat is None else plat.results(records)
    s["reject_reasons"] = records.reject_reasons()
    _warn_overload(s["reject_reasons"], len(records), sc.name)
    if b.adaptations:
        s["adaptation"] = [r.as_dict() for r in b.adaptations]
    if plat is not None and monitor is not None:
        from fleetwise.platform.monitor import plot_monitor

        monitor.mkdir(parents=True, exist_ok=True)
        plat.monitor.to_prometheus(monitor / "monitor.prom")
        try:
            plat.monitor.to_parquet(monitor / "monitor.parquet")
        except InputError as e:
            console.print(str(e), markup=False)
        plot_monitor(plat.monitor, monitor / "monitor.png", title=f"{sc.name} ({sc.scaler.name})", events=plat.events)
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
            t.add_row(k, f"{v:.4g}")
        else:
            t.add_row(k, str(v))
    out.print(t)


SUMMARY_METRICS = [k for k, *_ in TABLE_KEYS]


def _summary_tables(rows: list[dict], title: str, baseline: str | None = None, order: list[str] | None = None
                    ) -> list[Table]:
    """One table per scenario and grid point: mean ± 95% bootstrap CI over seeds, and the paired change vs the
    baseline's TTFT p99 and goodput."""
    from collections import defaultdict

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
                  f" · mean ± 95% CI over {members[0]['seeds']} seeds")
        t.add_column("policy", no_wrap=True)
        for _, label, _, _ in TABLE_KEYS:
            t.add_column(label, justify="right", no_wrap=True)
        if baseline:
            t.add_column(f"TTFT p99 vs {baseline}", justify="right", no_wrap=True)
            t.add_column(f"goodput vs {baseline}", justify="right", no_wrap=True)
        for r in members:
            name = r["router"] if len({m["batcher"] for m in members}) == 1 else f"{r['router']} / {r['batcher']}"
            row = [name]
            for key, _, scale, fmt in TABLE_KEYS:
                ci = r["ci"].get(key)
                if ci is None or math.isnan(ci.mean):
                    row.append("-")
                    continue
                cell = fmt.format(ci.mean * scale)
                if not math.isnan(ci.lo) and key != "completed":
                    cell += " ± " + fmt.format(ci.half * scale)
                row.append(cell)
            if baseline:
                for key in ("ttft_p99_s", "goodput_rps"):
                    ci = r["vs_baseline"].get(key)
                    row.append("-" if ci is None or math.isnan(ci.mean) else
                               f"{ci.mean:+.1%} [{ci.lo:+.1%}, {ci.hi:+.1%}]" if not math.isnan(ci.lo) else f"{ci.mean:+.1%}")
            t.add_row(*row)
        tables.append(t)
    return tables


def _ci_json(rows: list[dict]) -> dict:
    def c(ci):
        return {"mean": None if math.isnan(ci.mean) else ci.mean,
                "ci95": None if math.isnan(ci.lo) else [ci.lo, ci.hi], "n": ci.n}

    out: dict = {}
    for r in rows:
        key = r["router"] if r["params"] == {} else f"{r['router']} {json.dumps(r['params'], sort_keys=True)}"
        out[key] = {m: c(ci) for m, ci in r["ci"].items()}
        if r["vs_baseline"]:
            out[key]["vs_baseline"] = {m: c(ci) for m, ci in r["vs_baseline"].items()}
    return out


def _execute(spec, db: Optional[str], backend: str, workers: Optional[int], address: Optional[str],
             label: str):
    from fleetwise.experiments.runner import run_sweep
    from fleetwise.experiments.spec import expand
    from fleetwise.experiments.store import Store

    store = Store(db)
    runs = expand(spec, where=label, records_dir=str(Path(db).parent / "records") if db else None)
    with _progress() as prog:
        task = prog.add_task(f"{spec.name}: {len(runs)} runs", total=len(runs))
        res = run_sweep(runs, store, backend=backend, workers=workers, address=address,
                        on_progress=lambda d, n: prog.update(task, completed=d + (len(runs) - n)))
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
    address: Optional[str] = typer.Option(None, help="Ray cluster address (with --backend ray)"),
    workers: Optional[int] = typer.Option(None, min=1, help="parallel runs (default: all cores)"),
    report: bool = typer.Option(False, "--report", help="write the HTML report when done"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run an experiment: every scenario x policy x grid point x seed not already in the store."""
    from fleetwise.experiments.spec import load_experiment
    from fleetwise.metrics.stats import aggregate

    if backend not in ("local", "ray"):
        raise InputError(f"--backend {backend!r}: expected local or ray")
    spec = load_experiment(spec_file)
    if spec.trace is not None or spec.load is not None:
        _print_experiment_fit(spec, spec_file)
    store, runs, res = _execute(spec, db, backend, workers, address, spec_file)
    ids = [r.run_id for r in runs]
    stored = [r for r in store.runs() if r["run_id"] in set(ids)]
    _warn_stored_overload(stored)
    rows = aggregate(stored, SUMMARY_METRICS, spec.baseline or None)
    console.print(f"{res.total} runs: {res.ok} ran, {res.failed} failed, {res.skipped} already stored "
                  f"({res.wall_s:.1f} s) -> {db}", highlight=False)
    failed = store.runs(where="status = 'failed'")
    for f in [f for f in failed if f["run_id"] in set(ids)][:5]:
        console.print(f"[red]failed[/red] {f['scenario']} {f['router_label']} seed {f['seed']}: {f['error']}",
                      highlight=False)
    if as_json:
        out.print_json(json.dumps(_ci_json(rows)))
    else:
        base = next(iter(spec.baseline.values()), None)
        order = [ref_label for ref_label in (r.policy["router"] for r in runs)]
        for t in _summary_tables(rows, spec.name, base, list(dict.fromkeys(order))):
            out.print(t)
    if report:
        _report(db, str(Path(db).parent / "report"), spec.name, spec.baseline or None)


@app.command()
def compare(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario YAML file or built-in name"),
    routers: str = typer.Option("round_robin,least_outstanding_requests,least_outstanding_tokens,power_of_two",
                                help="comma-separated router names; the first is the baseline"),
    batcher: Optional[str] = typer.Option(None, help="batcher for every run (default: the scenario's)"),
    seeds: int = typer.Option(3, min=1, help="number of seeds per router"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1),
    trace: Optional[str] = typer.Option(None, help="replay this trace file in place of the scenario's arrivals and "
                                        "lengths (each seed draws its own window or block bootstrap)"),
    load: Optional[str] = typer.Option(None, help="with --trace: the arrival rate as a fraction of the fleet's "
                                       "capacity (0.7) or real (the trace's own rate; default)"),
    workers: Optional[int] = typer.Option(None, min=1, help="parallel runs (default: all cores)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Compare routers on one scenario: mean ± 95% CI over seeds, and the paired change against the first."""
    from fleetwise.experiments.spec import ExperimentSpec
    from fleetwise.metrics.stats import aggregate
    from fleetwise.scenario import load_scenario

    names = [r.strip() for r in routers.split(",") if r.strip()]
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
    if batcher:
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
        out.print_json(json.dumps(_ci_json(rows)))
        return
    for t in _summary_tables(rows, sc.name, names[0] if len(names) > 1 else None, names):
        out.print(t)


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
    from fleetwise.experiments.store import Store

    if not Path(db).exists():
        raise InputError(f"{db}: results store not found (run `fleetwise sweep` first)")
    index = write_report(Store(db), Path(out_dir), experiment=experiment, baseline=baseline)
    console.print(f"report written: open file://{index.resolve()}", highlight=False)


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
        out.print(f"[bold]{level}[/bold]: {', '.join(n) if n else '-'}")


@app.command("scenarios")
def scenarios() -> None:
    """List the built-in scenarios (copy one from src/fleetwise/scenarios/ to edit it)."""
    from fleetwise.scenario import SCENARIO_DIR, load_scenario, scenario_names

    for n in scenario_names():
        out.print(f"[bold]{n}[/bold]  {load_scenario(n).description}  ({SCENARIO_DIR / (n + '.yaml')})")


@perf_app.command("validate")
def perf_validate(as_json: bool = typer.Option(False, "--json")) -> None:
    """Error of the calibrated performance model on measured operator timings held out from its fit."""
    from fleetwise.perf.validate import render_table, run_validation

    res = run_validation()
    if as_json:
        out.print_json(json.dumps(res))
    else:
        out.print(render_table(res))


@bench_app.command("sim-speed")
def bench_sim_speed(
    sizes: str = typer.Option("10000,100000", help="comma-separated request counts"),
    scenario: str = typer.Option("vidur-parity", help="scenario to simulate"),
    router: str = typer.Option("round_robin"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Simulated requests per wall-second and peak memory, each size in a fresh process."""
    from fleetwise.bench import sim_speed

    res = sim_speed([int(x) for x in sizes.split(",") if x.strip()], scenario=scenario, router=router)
    if as_json:
        out.print_json(json.dumps(res))
        return
    t = Table(title=f"simulator speed on {scenario} ({router})")
    for c in ("requests", "requests/s", "wall s", "peak RSS MB", "events"):
        t.add_column(c, justify="right")
    for n, r in res.items():
        t.add_row(n, f"{r['requests_per_s']:.0f}", f"{r['wall_s']:.2f}", f"{r['peak_rss_mb']:.0f}", f"{r['events']}")
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
               db: Optional[str], load: Optional[str] = None, **extra) -> None:
    from fleetwise.workload.spec import parse_load

    if load is not None and eval_trace is None:
        raise InputError("--load applies to --eval-trace (the held-out data keep the paper's load)")
    mod = _paper_module(name)
    kw = {"load": parse_load(load if load is not None else "0.7")} if eval_trace is not None else {}
    try:
        res = mod.run(quick=quick, seeds=seeds, eval_trace=eval_trace, db=db, **kw, **extra)
    except ModuleNotFoundError as e:
        raise InputError(_missing_rl(e)) from None
    for ln in res.get("_trace_fit", []) if isinstance(res, dict) else []:
        console.print(ln, highlight=False, markup=False, soft_wrap=True)
    if as_json:
        out.print_json(json.dumps(res))
    else:
        out.print(mod.render(res))


_QUICK = typer.Option(False, "--quick", help="small budget (minutes on 2 cores)")
_JSON = typer.Option(False, "--json", help="print one JSON object")
_EVAL = typer.Option(None, "--eval-trace", help="evaluate on this trace file or folder instead of the held-out data")
_SEEDS = typer.Option(None, min=1, help="seeds (default: the paper's protocol; fewer with --quick)")
_DB = typer.Option(str(Path("results") / "fleetwise.duckdb"), help="results store for runs and learning curves")
_LOAD = typer.Option(None, "--load", help="with --eval-trace: the trace's rate as a fraction of the fleet's capacity "
                     "(default 0.7) or real (the trace's own rate); docs/workloads.md#bring-your-own-trace")


@reproduce_app.command("allocation")
def reproduce_allocation(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                         seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD,
                         column: Optional[str] = typer.Option(None, "--column", help="with --eval-trace: the CPU "
                                                              "column, a header name or a 1-based index")) -> None:
    """Q-learning vs SARSA vs fixed policy for GPU count and parallelism, on real CPU-usage traces."""
    if column is not None and eval_trace is None:
        raise InputError("--column applies to --eval-trace")
    _reproduce("allocation", quick, as_json, eval_trace, seeds, db, load, **({"column": column} if column else {}))


@reproduce_app.command("batching")
def reproduce_batching(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                       seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD) -> None:
    """DISPPO (semi-Markov PPO) vs batching baselines at edge nodes."""
    _reproduce("batching", quick, as_json, eval_trace, seeds, db, load)


@reproduce_app.command("torta")
def reproduce_torta(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                    seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD,
                    train_seeds: Optional[int] = typer.Option(None, min=1, help="agents trained per kind and "
                                                              "topology (default 3; 1 with --quick)"),
                    workers: Optional[int] = typer.Option(None, min=1, help="processes (default: one per CPU)")) -> None:
    """TORTA: RL + optimal transport across regions, switching-aware allocation within them."""
    _reproduce("torta", quick, as_json, eval_trace, seeds, db, load, train_seeds=train_seeds, workers=workers)


@reproduce_app.command("graph-marl")
def reproduce_graph_marl(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                         seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD) -> None:
    """Graph-MARL-CloudLLM: a heterogeneous GNN + MAPPO across clouds."""
    _reproduce("graph_marl", quick, as_json, eval_trace, seeds, db, load)


@reproduce_app.command("platform")
def reproduce_platform(quick: bool = _QUICK, as_json: bool = _JSON, eval_trace: Optional[str] = _EVAL,
                       seeds: Optional[int] = _SEEDS, db: str = _DB, load: Optional[str] = _LOAD) -> None:
    """Platform autoscaling: scalers on a day of multi-tenant load with faults and spot preemptions."""
    _reproduce("platform", quick, as_json, eval_trace, seeds, db, load)


@bench_app.command("env-steps")
def bench_env_steps(
    name: str = typer.Argument(..., help="allocation, batching, torta or graph-marl"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Environment steps per second on one core (and training wall time where the paper needs it)."""

    from fleetwise.reproduce import PAPERS

    if name not in PAPERS:
        raise InputError(f"unknown environment {name!r}; expected one of: {', '.join(PAPERS)}")
    try:
        res = _paper_module(name).bench()
    except ModuleNotFoundError as e:
        raise InputError(_missing_rl(e)) from None
    if as_json:
        out.print_json(json.dumps(res))
    else:
        for k, v in res.items():
            out.print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


@bench_app.command("sweep")
def bench_sweep(
    spec: str = typer.Option("default", help="experiment to run (file or built-in name)"),
    workers: Optional[int] = typer.Option(None, min=1, help="pool size (default: all cores)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Sweep throughput: runs per minute one after another vs on the local process pool."""
    from fleetwise.bench import sweep_throughput

    res = sweep_throughput(spec, workers)
    if as_json:
        out.print_json(json.dumps(res))
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


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="address to bind (not loopback: a token is required)"),
    port: int = typer.Option(8000, min=0, max=65535),
    router: str = typer.Option("least_outstanding_tokens", help="router policy, e.g. prefix_aware?hit_weight=0.5"),
    scaler: Optional[str] = typer.Option(None, help="scaler policy for /v1/scale (default: none loaded)"),
    planner: Optional[str] = typer.Option(None, help="planner for /v1/plan (default: ot_capacity)"),
    checkpoint: Optional[str] = typer.Option(None, help="TORTA planner checkpoint (Stable-Baselines3 .zip)"),
    token_file: Optional[str] = typer.Option(None, help="file with the bearer token (default: $FLEETWISE_SERVE_TOKEN)"),
    seed: int = typer.Option(0, help="seed of the random routers"),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
    gateway: bool = typer.Option(False, "--gateway", help="run the OpenAI-compatible gateway in front of --backend "
                                 "servers instead (docs/serve.md#gateway); --router picks the backend"),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="with --gateway: an OpenAI-compatible "
                                                "server's base URL, e.g. http://127.0.0.1:8001 (repeat the option)"),
    max_attempts: int = typer.Option(3, min=1, help="with --gateway: distinct backends tried per request"),
) -> None:
    """The decision service: route, scale and plan over HTTP (docs/serve.md). With --gateway: an OpenAI-compatible
    proxy that routes each request to one of the --backend servers."""
    if gateway:
        if not backend:
            raise InputError("--gateway: give at least one --backend URL")
        if scaler is not None or planner is not None or checkpoint is not None:
            raise InputError("--gateway routes only: --scaler, --planner and --checkpoint do not apply")
        _serve_module("gateway").serve_gateway(list(backend), host=host, port=port, route_policy=router,
                                               token_file=token_file, log_level=log_level, seed=seed,
                                               max_attempts=max_attempts)
        return
    if backend:
        raise InputError("--backend needs --gateway")
    if planner is not None and checkpoint is not None:
        raise InputError("give --planner or --checkpoint, not both")
    _serve_module().main(host=host, port=port, router=router, scaler=scaler, planner=planner, checkpoint=checkpoint,
                         token_file=token_file, seed=seed, log_level=log_level)


@bench_app.command("serve")
def bench_serve(
    rate: float = typer.Option(1000.0, min=1.0, help="calls per second (open loop)"),
    duration: float = typer.Option(10.0, min=0.1, help="seconds; rate x duration calls in all"),
    connections: int = typer.Option(8, min=1, help="keep-alive client connections"),
    replicas: int = typer.Option(8, min=1, help="replicas in each route snapshot"),
    router: str = typer.Option("least_outstanding_tokens"),
    pin: bool = typer.Option(False, "--pin", help="service on CPU 0, load generator on CPU 1"),
    floor: bool = typer.Option(False, "--floor", help="the same load on a trivial app: HTTP + uvicorn alone"),
    repeat: int = typer.Option(1, min=1, help="runs, each with a fresh service; prints every run and the median"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Decision latency (P50/P99) and throughput of `fleetwise serve` on loopback under a bounded open-loop load."""
    mod = _serve_module("loadgen")
    _serve_module()  # the service's own dependencies
    runs = []
    for i in range(repeat):
        res = mod.run(rate=rate, duration_s=duration, connections=connections, replicas=replicas, router=router,
                      pin=pin, floor=floor)
        runs.append(res)
        if not as_json:
            out.print((f"run {i + 1} of {repeat}: " if repeat > 1 else "") + mod.render(res), highlight=False)
    if repeat > 1:
        summary = mod.summarize(runs)
        if as_json:
            out.print_json(json.dumps({"runs": runs, "summary": summary}))
        else:
            out.print(mod.render_summary(runs, summary), highlight=False)
    elif as_json:
        out.print_json(json.dumps(runs[0]))


@bench_app.command("gateway")
def bench_gateway(
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="backend base URL (repeat); default: start "
                                                "--servers local llama.cpp servers with a tiny random model"),
    servers: int = typer.Option(3, min=1, help="local llama.cpp servers to start when no --backend is given"),
    requests: int = typer.Option(200, min=1, help="requests per path (direct, gateway) and mode (plain, stream)"),
    concurrency: int = typer.Option(1, min=1, help="client threads"),
    max_tokens: int = typer.Option(8, min=1),
    router: str = typer.Option("least_outstanding_tokens"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Gateway overhead: the same completions straight to the backends and through `fleetwise serve --gateway`."""
    mod = _serve_module("bench_gateway")
    _serve_module("gateway")
    if not backend:
        from fleetwise.serve.localbackends import llama_cpp_available

        if not llama_cpp_available():
            raise InputError("no --backend given and llama-cpp-python is not installed: "
                             "pip install -c constraints.txt 'fleetwise[backend]'")
    res = mod.gateway_overhead(list(backend) if backend else None, servers=servers, requests=requests,
                               concurrency=concurrency, max_tokens=max_tokens, policy=router)
    if as_json:
        out.print_json(json.dumps(res))
    else:
        out.print(mod.render(res), highlight=False)


def main() -> None:
    try:
        app(standalone_mode=False)
    except InputError as e:
        console.print("[red]error:[/red] ", end="", soft_wrap=True)
        console.print(str(e), soft_wrap=True, highlight=False, markup=False)
        sys.exit(2)
    except SystemExit:
        raise
    except Exception as e:  # usage errors of the command-line parser (typer's click layer)
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            sys.exit(130)
        raise

if __name__ == "__main__":
    main()
