"""What the command line writes: tables that fit 120 columns (every column with --wide), per-request records as
CSV and Parquet with the documented columns, and built-in scenarios copied out to edit."""

from __future__ import annotations

import csv
import importlib
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "fleetwise", *args], capture_output=True, text=True, cwd=cwd, env=env)


def _bad(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


# --- tables ------------------------------------------------------------------------------------------------------

ROUTERS = "round_robin,least_outstanding_requests,least_outstanding_tokens,power_of_two"


def test_compare_tables_fit_120_columns_and_wide_shows_every_column():
    from fleetwise.cli import CHANGE_KEYS, TABLE_KEYS

    p = cli("compare", "--routers", ROUTERS, "--seeds", "2", "--requests", "200")
    assert p.returncode == 0, p.stderr
    assert _widest(p.stdout) <= 120 and "…" not in p.stdout, p.stdout
    assert "least_outstanding_requests" in p.stdout and "± " in p.stdout
    assert "Δ TTFT p99" in p.stdout and "paired change vs round_robin" in p.stdout
    w = cli("compare", "--routers", ROUTERS, "--seeds", "2", "--requests", "200", "--wide")
    assert w.returncode == 0, w.stderr
    assert "…" not in w.stdout and _widest(w.stdout) > 120  # nothing cut, although wider than 120
    for _, label, *_ in TABLE_KEYS:
        assert label in w.stdout, label
    for _, label in CHANGE_KEYS:
        assert f"Δ {label}" in w.stdout


def test_sweep_and_simulate_tables_fit_120_columns(tmp_path):
    spec = tmp_path / "exp.yaml"
    spec.write_text("name: fit\nscenarios: [default]\n"
                    "policies: {router: [round_robin, least_outstanding_requests,\n"
                    "                    {name: prefix_aware, hit_weight: 2.0}]}\n"
                    "grid: {workload.rate_rps: [12, 24]}\nseeds: 2\nrequests: 150\nbaseline: {router: round_robin}\n")
    p = cli("sweep", str(spec), "--db", str(tmp_path / "r.duckdb"), "--workers", "2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("workload.rate_rps=") == 2  # one table per load (a split table would repeat it)
    assert _widest(p.stdout) <= 120 and "…" not in p.stdout, p.stdout
    assert "prefix_aware(hit_weight=2.0)" in p.stdout
    s = cli("simulate", "--requests", "200")
    assert s.returncode == 0, s.stderr
    assert _widest(s.stdout) <= 120 and "ttft_p99_s" in s.stdout


class Fake(dict):
    """A result row of a reproduce command: every metric -123.456 and every *_ci95 (-123.456, 123.456), wider
    numbers than real results; extra keys as given."""

    def __missing__(self, k):
        return (-123.456, 123.456) if k.endswith("_ci95") else -123.456

    def __contains__(self, k):
        return True


def _fake_results() -> dict:
    meta = {"model": "llama-3-8b", "gpu": "a100-80gb", "seeds": 10, "eval": "held-out PlanetLab days",
            "scenario": "platform", "best": "slo_aware"}
    change = {"change": -0.123, "ci95": (-0.2345, 0.0123), "vs": "least_loaded", "by_train_seed": [-0.1, -0.12, -0.08]}
    return {
        "allocation": {"_meta": meta,
                       **{p: Fake() for p in ("q_learning", "sarsa", "fixed", "oracle", "dqn", "random")}},
        "batching": {n: Fake(vs_best_baseline="sarathi_chunked") for n in ("disppo", "sarathi_chunked", "vllm")},
        "graph_marl": {n: Fake() for n in ("graph_marl", "flat_marl", "least_loaded_heuristic")},
        "platform": {"_meta": meta, **{n: Fake() for n in ("hpa", "slo_aware", "predictive", "rl_scaler")}},
        "torta": {topo: {"torta": Fake(changes={m: change for m in ("response_time_mean_s", "load_cv", "cost_usd")}),
                         "least_loaded": Fake(), "round_robin": Fake()} for topo in ("abilene", "polska")},
    }


def _texts(renderable) -> list[str]:
    """Every header and cell text of a table or a Group of tables."""
    from rich.console import Group

    if isinstance(renderable, Group):
        return [t for r in renderable.renderables for t in _texts(r)]
    return [str(c.header) for c in renderable.columns] + [str(x) for c in renderable.columns for x in c.cells]


@pytest.mark.parametrize("paper", ["allocation", "batching", "graph_marl", "platform", "torta"])
def test_reproduce_tables_fit_120_columns_with_every_cell(paper):
    from fleetwise.cli import fit_tables

    try:
        mod = importlib.import_module(f"fleetwise.reproduce.{paper}")
    except ModuleNotFoundError as e:
        pytest.skip(f"needs the rl extra ({e.name})")
    table = mod.render(_fake_results()[paper])
    buf = io.StringIO()
    con = Console(file=buf, width=120)
    whole = Console(file=io.StringIO(), width=1000)
    whole.print(table)
    assert _widest(whole.file.getvalue()) > 120  # the test means something: the table alone is wider
    for t in fit_tables(table, 120):
        con.print(t)
    text = buf.getvalue()
    assert _widest(text) <= 120 and "…" not in text
    flat = re.sub(r"[\s│┃]+", " ", text)
    for cell in _texts(table):  # nothing lost: every header and cell is printed whole (wrapped at most)
        assert re.sub(r"\s+", " ", cell).strip() in flat or all(w in text for w in cell.split()), cell


# --- per-request records -----------------------------------------------------------------------------------------

def _documented_columns() -> list[str]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text.split("## Per-request records", 1)[1].split("\n## ", 1)[0]
    return [m for line in section.splitlines() if line.startswith("| `")
            for m in re.findall(r"`([a-z_0-9]+)`", line.split("|")[1])]


def test_simulate_records_csv_and_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    p = cli("simulate", "--requests", "300", "--seed", "3", "--records", str(tmp_path / "r.csv"), "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)  # stdout stays one JSON object
    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == _documented_columns()
    assert [int(r["request_id"]) for r in rows] == list(range(300))
    assert sum(r["status"] == "completed" for r in rows) == summary["completed"]
    assert {r["status"] for r in rows} <= {"completed", "rejected"}
    assert all(r["reason"] == "" for r in rows if r["status"] == "completed")
    for r in rows:
        if r["status"] == "completed":
            assert math.isclose(float(r["ttft_s"]), float(r["first_token_s"]) - float(r["arrival_s"]), abs_tol=1e-9)
            assert math.isclose(float(r["e2e_s"]), float(r["completion_s"]) - float(r["arrival_s"]), abs_tol=1e-9)
    p = cli("simulate", "--requests", "300", "--seed", "3", "--records", str(tmp_path / "r.parquet"))
    assert p.returncode == 0, p.stderr
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.column_names == _documented_columns()
    cols = t.to_pydict()
    assert cols["status"] == [r["status"] for r in rows] and cols["reason"] == [r["reason"] for r in rows]
    for k in ("arrival_s", "ttft_s", "tpot_s", "e2e_s"):  # the same run: the same numbers in both formats
        a = [float(r[k]) if r[k] else math.nan for r in rows]
        assert all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, cols[k])), k
    assert sorted(q.name for q in tmp_path.iterdir()) == ["r.csv", "r.parquet"]  # no temporary file left


def test_simulate_records_bad_paths_fail_before_the_run(tmp_path):
    _bad(cli("simulate", "--records", str(tmp_path / "r.txt")), "r.txt", ".parquet or .csv")
    (tmp_path / "afile").write_text("x")
    _bad(cli("simulate", "--records", str(tmp_path / "afile" / "r.csv")), "--records", "afile is a file")
    # without pyarrow: one line naming the extra, and nothing written
    fake = tmp_path / "fake"
    (fake / "pyarrow").mkdir(parents=True)
    (fake / "pyarrow" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyarrow'\", name='pyarrow')\n")
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), *filter(None, [os.environ.get("PYTHONPATH")])])}
    _bad(cli("simulate", "--records", str(tmp_path / "r.parquet"), env=env), "pyarrow", "parquet", ".csv")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["afile", "fake"]
    # a missing folder is made when the records are written (as sweep --db and train --out make theirs)
    r = cli("simulate", "-n", "50", "--records", str(tmp_path / "new" / "deeper" / "r.csv"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "new" / "deeper" / "r.csv").read_text().startswith("request_id,")


# --- scenarios --copy --------------------------------------------------------------------------------------------

def test_scenarios_copy_writes_a_builtin_and_never_overwrites_without_force(tmp_path):
    builtin = (ROOT / "src" / "fleetwise" / "scenarios" / "default.yaml").read_text()
    p = cli("scenarios", "--copy", "default", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "default.yaml").read_text() == builtin
    (tmp_path / "default.yaml").write_text("# mine\n")
    _bad(cli("scenarios", "--copy", "default", cwd=tmp_path), "default.yaml", "already exists", "--force")
    assert (tmp_path / "default.yaml").read_text() == "# mine\n"
    assert cli("scenarios", "--copy", "default", "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "default.yaml").read_text() == builtin
    (tmp_path / "sub").mkdir()
    assert cli("scenarios", "--copy", "vidur-parity", "sub", cwd=tmp_path).returncode == 0
    assert (tmp_path / "sub" / "vidur-parity.yaml").exists()
    assert cli("scenarios", "--copy", "platform", str(tmp_path / "p.yaml")).returncode == 0
    assert (tmp_path / "p.yaml").read_text() == (ROOT / "scenarios" / "platform.yaml").read_text()
    _bad(cli("scenarios", "--copy", "nope", cwd=tmp_path), "nope", "default")
    _bad(cli("scenarios", "--copy", "default", str(tmp_path / "p.yaml" / "x.yaml")), "p.yaml is a file")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["default.yaml", "p.yaml", "sub"]
    # a missing folder is made, as for every output file (sweep --db, train --out, --records)
    assert cli("scenarios", "--copy", "default", str(tmp_path / "no" / "x.yaml")).returncode == 0
    assert (tmp_path / "no" / "x.yaml").read_text() == builtin


def test_version_and_a_group_without_its_command():
    from fleetwise import __version__

    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"fleetwise {__version__}"
    for args in ((), ("perf",), ("bench",)):  # the help text, not "error: Missing command."
        r = cli(*args)
        assert "Usage:" in r.stdout + r.stderr and "Missing command" not in r.stderr, (args, r.stderr)
