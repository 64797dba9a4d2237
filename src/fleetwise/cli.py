"""fleetwise command line: simulate, compare, perf validate, bench sim-speed.

Bad input (a scenario field, a trace row, a file, a policy name) prints one line naming what is wrong and where,
and exits with status 2, without a traceback.
"""

from __future__ import annotations

import json
import math
import sys
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
app.add_typer(perf_app, name="perf")
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


def _load(scenario: Optional[str], trace: Optional[str], requests: Optional[int]):
    from fleetwise.scenario import load_scenario

    sc = load_scenario(scenario)
    workload = None
    if trace is not None:
        from fleetwise.workload.spec import load_trace

        workload = load_trace(trace, limit=requests)
    return sc, workload


def _jsonable(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@app.command()
def simulate(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario YAML file or built-in name"),
    router: Optional[str] = typer.Option(None, help="router policy name (overrides the scenario)"),
    batcher: Optional[str] = typer.Option(None, help="batcher policy name (overrides the scenario)"),
    trace: Optional[str] = typer.Option(None, help="replay this trace file (or alias azure-conv, mooncake, ...)"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, help="number of requests"),
    seed: Optional[int] = typer.Option(None, help="random seed (default: the scenario's)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Run one scenario (default: the embedded default) and print its summary."""
    from fleetwise.scenario import build

    sc, workload = _load(scenario, trace, requests)
    b = build(sc, seed, workload=workload, num_requests=requests)
    with _progress() as prog:
        task = prog.add_task(f"simulating {sc.name}", total=len(b.workload))
        records = b.run(router, batcher, progress=lambda k: prog.advance(task, k))
    s = b.summary(records)
    s["reject_reasons"] = records.reject_reasons()
    if as_json:
        out.print_json(json.dumps(_jsonable(s)))
        return
    t = Table(title=f"{sc.name}: {len(b.workload)} requests, seed {seed if seed is not None else sc.seed}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in s.items():
        if isinstance(v, float):
            t.add_row(k, f"{v:.4g}")
        else:
            t.add_row(k, str(v))
    out.print(t)


@app.command()
def compare(
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario YAML file or built-in name"),
    routers: str = typer.Option("round_robin,least_outstanding_requests,least_outstanding_tokens,power_of_two",
                                help="comma-separated router names"),
    batcher: Optional[str] = typer.Option(None, help="batcher for every run (default: the scenario's)"),
    seeds: int = typer.Option(3, min=1, help="number of seeds per router"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1),
    trace: Optional[str] = typer.Option(None, help="replay this trace file instead of the scenario's workload"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Compare routers on one scenario: mean ± 95% CI over seeds of each summary metric."""
    from fleetwise.control.registry import make
    from fleetwise.metrics.stats import mean_ci
    from fleetwise.scenario import build

    names = [r.strip() for r in routers.split(",") if r.strip()]
    for r in names:
        make("router", r, where="--routers: ")
    sc, workload = _load(scenario, trace, requests)
    results: dict[str, list[dict]] = {r: [] for r in names}
    with _progress() as prog:
        task = prog.add_task(f"{sc.name}: {len(names)} routers x {seeds} seeds", total=len(names) * seeds)
        for r in names:
            for k in range(seeds):
                b = build(sc, sc.seed + k, workload=workload, num_requests=requests)
                results[r].append(b.summary(b.run(r, batcher)))
                prog.advance(task)
    agg = {r: {key: mean_ci([s[key] for s in runs]) for key in runs[0] if isinstance(runs[0][key], (int, float))}
           for r, runs in results.items()}
    if as_json:
        out.print_json(json.dumps({r: {k: {"mean": m, "ci95": None if math.isnan(h) else h} for k, (m, h) in d.items()}
                                   for r, d in agg.items()}))
        return
    t = Table(title=f"{sc.name}: mean ± 95% CI over {seeds} seeds ({len(b.workload)} requests each)")
    t.add_column("router")
    for _, label, _, _ in TABLE_KEYS:
        t.add_column(label, justify="right")
    for r, d in agg.items():
        row = [r]
        for key, _, scale, fmt in TABLE_KEYS:
            m, h = d.get(key, (math.nan, math.nan))
            cell = fmt.format(m * scale)
            if not math.isnan(h) and key not in ("completed", "rejected"):
                cell += " ± " + fmt.format(h * scale)
            row.append(cell)
        t.add_row(*row)
    out.print(t)


@app.command("policies")
def policies() -> None:
    """List the registered policies of every decision level."""
    from fleetwise.control.registry import LEVELS, names

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


def main() -> None:
    try:
        app(standalone_mode=False)
    except InputError as e:
        console.print(f"[red]error:[/red] {e}", soft_wrap=True, highlight=False)
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
