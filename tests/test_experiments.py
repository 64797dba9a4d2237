"""Experiments: spec validation, sweeps, resume after a kill, concurrent writers, statistics, Ray backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from fleetwise.errors import InputError
from fleetwise.experiments.runner import execute_run, run_sweep
from fleetwise.experiments.spec import expand, load_experiment, parse_experiment
from fleetwise.metrics.stats import mean_ci, paired_change
from fleetwise.experiments.store import Store

THIRD = {
    "name": "h100-70b",
    "description": "Llama-3-70B on two H100 replicas with TP2",
    "deployments": [{"model": "llama-3-70b", "gpu": "h100-80gb", "tp": 2, "replicas": 2, "cloud": "aws"}],
    "workload": {"kind": "default", "rate_rps": 3.0, "max_total_tokens": 8192},
}
ROUTERS = ["round_robin", "least_outstanding_requests", "least_outstanding_tokens", "power_of_two"]


def big_spec(tmp_path: Path, requests: int = 120) -> Path:
    """3 scenarios x 4 routers x 5 seeds = 60 runs."""
    third = tmp_path / "h100-70b.yaml"
    third.write_text(yaml.safe_dump(THIRD))
    spec = {"name": "acceptance", "scenarios": ["default", "multi-region", str(third)],
            "policies": {"router": ROUTERS}, "seeds": 5, "requests": requests, "baseline": {"router": "round_robin"}}
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def small(**kw) -> dict:
    d = {"name": "small", "scenarios": ["default"], "policies": {"router": ["round_robin", "least_outstanding_tokens"]},
         "grid": {"workload.rate_rps": [10, 20]}, "seeds": 2, "requests": 150}
    d.update(kw)
    return d


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "fleetwise", *args], capture_output=True, text=True, **kw)


# ---------------------------------------------------------------- spec
def test_expand_counts_and_stable_ids():
    spec = parse_experiment(small())
    runs = expand(spec)
    assert len(runs) == 1 * 2 * 2 * 2
    assert len({r.run_id for r in runs}) == len(runs)
    assert [r.run_id for r in expand(parse_experiment(small()))] == [r.run_id for r in runs]
    assert {r.scenario["workload"]["rate_rps"] for r in runs} == {10, 20}


@pytest.mark.parametrize("bad, needle", [
    ({"bogus": 1}, "bogus"),
    ({"policies": {"router": ["telepathy"]}}, "telepathy"),
    ({"policies": {"scaler": ["x"]}}, "decision level"),
    ({"scenarios": ["no-such-scenario"]}, "no-such-scenario"),
    ({"grid": {"deployments.7.replicas": [1]}}, "deployments.7"),
    ({"grid": {"workload.rate_rps": [-1]}}, "rate_rps"),
    ({"seeds": 0}, "seeds"),
    ({"baseline": {"router": "random"}}, "baseline"),
])
def test_bad_specs_raise_one_clear_error(bad, needle):
    with pytest.raises(InputError) as e:
        expand(parse_experiment(small(**bad)))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_spec_cli_exit_2(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text("name: x\nscenarios: [default]\npolicies: {router: [nope]}\n")
    r = cli("sweep", str(p), "--db", str(tmp_path / "db.duckdb"))
    assert r.returncode == 2 and "nope" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unreachable_ray_address_exit_2(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(small(requests=50, seeds=1)))
    r = cli("sweep", str(p), "--db", str(tmp_path / "db.duckdb"), "--backend", "ray", "--address", "127.0.0.1:1",
            timeout=60)
    assert r.returncode == 2, r.stderr
    assert "127.0.0.1:1" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- sweeps and the store
def test_sweep_stores_one_row_per_run_and_resumes(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    runs = expand(parse_experiment(small(timeline_bucket_s=5.0)))
    res = run_sweep(runs, store, workers=2)
    assert (res.ok, res.failed, res.skipped) == (len(runs), 0, 0)
    again = run_sweep(runs, store, workers=2)
    assert again.skipped == len(runs) and again.ok == 0
    assert store.count() == len(runs)
    rows = store.runs()
    assert all(r["code_version"] for r in rows) and all(r["wall_s"] > 0 for r in rows)
    assert rows[0]["ttft_p99_s"] > 0 and "goodput_rps" in rows[0]
    q = store.query("SELECT count(*) AS n FROM quantiles")["n"][0]
    assert q == len(runs) * 3 * 101
    assert store.query("SELECT count(*) AS n FROM timeline")["n"][0] > 0
    files = store.export_parquet(tmp_path / "pq")
    import pyarrow.parquet as pq

    assert pq.read_table(files[0]).num_rows == len(runs)


def test_per_request_records_as_parquet(tmp_path):
    import pyarrow.parquet as pq

    runs = expand(parse_experiment(small(records=True, seeds=1, policies={"router": ["round_robin"]},
                                         grid={})), records_dir=str(tmp_path / "records"))
    run_sweep(runs, Store(tmp_path / "r.duckdb"), workers=1)
    t = pq.read_table(tmp_path / "records" / f"{runs[0].run_id}.parquet")
    assert t.num_rows == 150 and "first_token_s" in t.column_names


def test_failing_run_is_recorded_and_does_not_stop_the_sweep(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    spec = parse_experiment(small(grid={"deployments.0.gpu_memory_utilization": [0.9, 0.1]}, seeds=1,
                                  policies={"router": ["round_robin"]}))
    res = run_sweep(expand(spec), store, workers=1)
    assert (res.ok, res.failed) == (1, 1)
    failed = store.runs(where="status = 'failed'")
    assert len(failed) == 1 and "does not fit" in failed[0]["error"]


def test_a_sweep_with_a_failed_run_stores_the_rest_and_exits_1(tmp_path):
    """`fleetwise sweep`: a run that fails is stored as failed and the others run and are shown, but the exit status
    is 1, so that a script or a CI job sees it (it was 0)."""
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(small(grid={"deployments.0.gpu_memory_utilization": [0.9, 0.1]}, seeds=1,
                                      policies={"router": ["round_robin"]})))
    r = cli("sweep", str(f), "--db", str(tmp_path / "r.duckdb"))
    assert r.returncode == 1, r.stderr
    assert "1 of 2 runs failed" in " ".join((r.stdout + r.stderr).split())
    runs = Store(tmp_path / "r.duckdb").runs(where="true")
    assert sorted(x["status"] for x in runs) == ["failed", "ok"]
    assert "does not fit" in next(x["error"] for x in runs if x["status"] == "failed")


def test_same_seed_same_metrics_in_process_and_pool(tmp_path):
    runs = expand(parse_experiment(small(seeds=1)))
    a = [execute_run(r)["metrics"] for r in runs]
    store = Store(tmp_path / "r.duckdb")
    run_sweep(runs, store, workers=2)
    by = {r["run_id"]: r for r in store.runs()}
    for r, m in zip(runs, a):
        assert by[r.run_id]["ttft_p99_s"] == pytest.approx(m["ttft_p99_s"], rel=1e-12)


def test_killed_sweep_resumes_to_exactly_one_row_per_run(tmp_path):
    spec = big_spec(tmp_path, requests=2500)  # runs long enough to be caught midway
    db = tmp_path / "kill.duckdb"
    cmd = [sys.executable, "-m", "fleetwise", "sweep", str(spec), "--db", str(db), "--workers", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    n = 0
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if db.exists():
            try:
                n = Store(db, lock_timeout_s=5).count()
            except InputError:
                continue
            if n >= 4:
                break
    os.killpg(p.pid, signal.SIGKILL)  # the sweep and its workers, mid-run
    p.wait()
    assert 0 < n < 60, n
    r = cli("sweep", str(spec), "--db", str(db), "--workers", "2", "--json")
    assert r.returncode == 0, r.stderr
    store = Store(db)
    assert store.count() == 60
    ids = store.query("SELECT run_id FROM runs")["run_id"]
    assert len(set(ids)) == 60
    assert "already stored" in r.stderr


def test_concurrent_writers_lose_nothing(tmp_path):
    db = tmp_path / "shared.duckdb"
    specs = []
    for i, rates in enumerate(([8, 12], [16, 20])):
        p = tmp_path / f"e{i}.yaml"
        p.write_text(yaml.safe_dump(small(name=f"w{i}", grid={"workload.rate_rps": rates}, requests=200)))
        specs.append(p)
    procs = [subprocess.Popen([sys.executable, "-m", "fleetwise", "sweep", str(s), "--db", str(db), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for s in specs]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    store = Store(db)
    assert store.count() == 16
    assert len(set(store.query("SELECT run_id FROM runs")["run_id"])) == 16


# ---------------------------------------------------------------- statistics
def test_mean_ci_and_paired_change():
    rng = np.random.default_rng(0)
    x = rng.normal(10.0, 1.0, 30)
    ci = mean_ci(x)
    assert ci.lo < x.mean() < ci.hi and ci.hi - ci.lo < 1.5
    assert mean_ci([3.0]).n == 1 and np.isnan(mean_ci([3.0]).lo)
    base = {s: v for s, v in enumerate(x)}
    better = {s: 0.88 * v for s, v in base.items()}
    ch = paired_change(base, better)
    assert ch.mean == pytest.approx(-0.12) and ch.lo == pytest.approx(-0.12) and ch.hi == pytest.approx(-0.12)
    noisy = {s: v * (1 + rng.normal(0, 0.05)) for s, v in base.items()}
    ch = paired_change(base, noisy)
    assert ch.lo < 0.0 < ch.hi


def test_mean_ci_is_the_t_interval_and_covers_at_few_seeds():
    """Student's t with n - 1 degrees of freedom, as SciPy computes it; at 3 seeds it covers the true mean about 95%
    of the time (the percentile bootstrap it replaced: about 73%, its interval being the three values' range)."""
    from scipy import stats

    x = [1.0, 2.5, 4.0]
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean(x), scale=stats.sem(x))
    ci = mean_ci(x)
    assert (ci.lo, ci.hi, ci.n) == (pytest.approx(lo), pytest.approx(hi), 3)
    assert ci.lo < min(x) and ci.hi > max(x)
    rng = np.random.default_rng(1)
    covered = [(c.lo <= 0.0 <= c.hi) for c in (mean_ci(rng.normal(0.0, 1.0, 3)) for _ in range(4000))]
    assert 0.935 < np.mean(covered) < 0.965


def test_paired_change_leaves_out_missing_and_nan_of_any_float_type():
    base = {0: 1.0, 1: 2.0, 2: 0.0, 3: np.float32("nan"), 4: 4.0}
    other = {0: 1.1, 1: np.float32("nan"), 2: 1.0, 3: 1.0, 4: 4.4, 5: 9.0}
    ch = paired_change(base, other)
    assert ch.n == 2 and ch.mean == pytest.approx(0.1)


def test_compare_cli_reports_ci_and_paired_change():
    r = cli("compare", "--routers", "round_robin,least_outstanding_tokens", "--seeds", "3", "-n", "300", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    lot = d["least_outstanding_tokens"]
    assert lot["ttft_p99_s"]["ci95"][0] <= lot["ttft_p99_s"]["mean"] <= lot["ttft_p99_s"]["ci95"][1]
    assert "vs_baseline" in lot and "vs_baseline" not in d["round_robin"]


# ---------------------------------------------------------------- Ray backend
@pytest.mark.ray
def test_ray_backend_matches_local(tmp_path, local_ray):
    spec = load_experiment(big_spec(tmp_path))
    runs = expand(spec)
    assert len(runs) == 60
    local, remote = Store(tmp_path / "local.duckdb"), Store(tmp_path / "ray.duckdb")
    assert run_sweep(runs, local, workers=2).ok == 60
    assert run_sweep(runs, remote, backend="ray").ok == 60
    a = {r["run_id"]: r for r in local.runs()}
    b = {r["run_id"]: r for r in remote.runs()}
    assert a.keys() == b.keys()
    for rid, ra in a.items():
        for k in ("ttft_p99_s", "e2e_p99_s", "goodput_rps", "cost_usd", "completed"):
            assert ra[k] == b[rid][k], (rid, k)


def test_reproduction_rows_land_in_the_store(tmp_path):
    from fleetwise.reproduce.common import store_rows, summarize_rows

    rows = [{"seed": s, "requests": 10, "deadline_rps": 1.0 + s, "offloaded": 2} for s in range(3)]
    s = summarize_rows(rows, ["deadline_rps"])
    assert s["deadline_rps"] == pytest.approx(2.0) and s["seeds"] == 3
    assert s["deadline_rps_ci95"][0] <= 2.0 <= s["deadline_rps_ci95"][1]
    db = str(tmp_path / "r.duckdb")
    store_rows(db, "reproduce-x", "edge", "disppo", rows, level="batcher")
    store_rows(db, "reproduce-x", "edge", "disppo", rows, level="batcher")  # idempotent: one row per seed
    got = Store(db).runs()
    assert len(got) == 3 and {r["batcher_label"] for r in got} == {"disppo"}
    assert {(r["level"], r["policy"]) for r in got} == {("batcher", "disppo")}
    assert sorted(r["deadline_rps"] for r in got) == [1.0, 2.0, 3.0]
    # run again after a change, a reproduction's rows are replaced: the report shows what its JSON says
    store_rows(db, "reproduce-x", "edge", "disppo", [{**r, "deadline_rps": 10.0 + r["seed"]} for r in rows],
               level="batcher")
    got = Store(db).runs()
    assert len(got) == 3 and sorted(r["deadline_rps"] for r in got) == [10.0, 11.0, 12.0]


def test_a_learning_curve_stored_again_replaces_its_points(tmp_path):
    """One curve per (run id, policy, metric): a training run again (or a reproduction rerun with its checkpoints)
    replaces its curve; other curves stay. Appending had given the report every point once per rerun."""
    st = Store(str(tmp_path / "l.duckdb"))
    st.add_learning_curve("graph_marl", [1, 2, 3], [0.1, 0.2, 0.3], "episode_return", "seed0")
    st.add_learning_curve("graph_marl", [1, 2], [0.5, 0.6], "validation_score", "seed0")
    st.add_learning_curve("graph_marl", [1, 2, 3], [0.1, 0.2, 0.3], "episode_return", "seed1")
    st.add_learning_curve("graph_marl", [1, 2], [9.0, 8.0], "episode_return", "seed0")
    got = st._with(lambda c: c.execute("SELECT run_id, metric, step, value FROM learning ORDER BY 1, 2, 3")
                   .fetchall(), read_only=True)
    assert got == [("seed0", "episode_return", 1, 9.0), ("seed0", "episode_return", 2, 8.0),
                   ("seed0", "validation_score", 1, 0.5), ("seed0", "validation_score", 2, 0.6),
                   ("seed1", "episode_return", 1, 0.1), ("seed1", "episode_return", 2, 0.2),
                   ("seed1", "episode_return", 3, 0.3)]


def test_the_store_records_each_policys_level(tmp_path):
    """A scaler is stored as a scaler (not as a router); a sweep's runs say which level they compare, and a store
    written before these columns existed gets them when opened."""
    import duckdb

    from fleetwise.reproduce.common import store_rows

    db = tmp_path / "r.duckdb"
    store_rows(str(db), "reproduce-platform", "platform", "slo_aware", [{"seed": 0, "cost_usd": 1.0}], level="scaler")
    (r,) = Store(db).runs()
    assert (r["level"], r["policy"], r["scaler"]) == ("scaler", "slo_aware", "slo_aware")
    runs = expand(parse_experiment(small()))
    assert {r.level for r in runs} == {"router"} and runs[0].policy_label == runs[0].policy["router"]
    old = tmp_path / "old.duckdb"  # the schema before: no level, policy, scaler
    con = duckdb.connect(str(old))
    from fleetwise.experiments.store import ADDED_COLUMNS, ID_COLUMNS

    cols = {k: t for k, t in ID_COLUMNS.items() if k not in ADDED_COLUMNS}
    con.execute("CREATE TABLE runs (" + ", ".join(f"{k} {t}" for k, t in cols.items()) + ")")
    con.execute("INSERT INTO runs (run_id, experiment, status) VALUES ('a', 'e', 'ok')")
    con.close()
    (r,) = Store(old).runs()
    assert r["level"] is None and r["run_id"] == "a"


def test_load_real_keeps_the_scenarios_time_scale_and_diurnal_origins_share_exactly():
    """Found by fuzzing, 2026-12-06: an experiment's ``load: real`` dropped the scenario's trace ``time_scale``
    (prefix-cache ran at twice its rate), and a diurnal workload split over origins rounded each share (3
    requests ran as 4, 1 as 0)."""
    import numpy as np

    from fleetwise.experiments.spec import expand, parse_experiment
    from fleetwise.scenario import load_scenario
    from fleetwise.workload.spec import build_workload, parse_workload_spec

    base = load_scenario("prefix-cache").workload
    runs = expand(parse_experiment({"name": "lr", "scenarios": ["prefix-cache"], "seeds": 1, "requests": 50,
                                    "load": "real"}))
    assert runs[0].scenario["workload"]["time_scale"] == base["time_scale"] != 1.0
    for n in (1, 3, 7):
        spec = parse_workload_spec({"kind": "diurnal", "mean_rate_rps": 5, "num_requests": n,
                                    "origin": [{"region": "us-east-1", "utc_offset_h": -5},
                                               {"region": "eu-central-1", "utc_offset_h": 1}]})
        assert len(build_workload(spec, np.random.default_rng(0))) == n


def test_sweep_json_names_every_scenario_and_batcher(tmp_path):
    """`sweep --json` keyed rows by the router alone: of two scenarios (or batchers) one's numbers were kept."""
    spec = tmp_path / "two.yaml"
    spec.write_text(yaml.safe_dump(small(scenarios=["default", "vidur-parity"], grid={},
                                         policies={"router": ["round_robin"], "batcher": ["vllm", "sarathi"]},
                                         seeds=2, requests=60)))
    r = cli("sweep", str(spec), "--db", str(tmp_path / "r.duckdb"), "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert isinstance(rows, list) and len(rows) == 4
    assert {(x["scenario"], x["batcher"], x["router"]) for x in rows} == {
        (s, b, "round_robin") for s in ("default", "vidur-parity") for b in ("vllm", "sarathi")}
    for x in rows:
        assert x["seeds"] == 2 and x["metrics"]["ttft_p99_s"]["n"] == 2 and x["params"] == {}
    p99 = {x["scenario"]: x["metrics"]["ttft_p99_s"]["mean"] for x in rows if x["batcher"] == "vllm"}
    assert p99["default"] != p99["vidur-parity"]


def test_an_interrupted_store_query_is_a_ctrl_c():
    """A Ctrl-C that lands inside a DuckDB query (a parallel sweep's writes) was a traceback ending in "Query
    interrupted"; it is a KeyboardInterrupt, which the command line ends with "interrupted" and status 130."""
    import duckdb

    def boom(con):
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    with pytest.raises(KeyboardInterrupt):
        Store(None)._with(boom)


def test_ctrl_c_prints_one_line_and_exits_130(monkeypatch, capsys):
    import fleetwise.cli as cli_mod

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_mod, "app", interrupted)
    with pytest.raises(SystemExit) as e:
        cli_mod.main(["simulate"])
    assert e.value.code == 130 and capsys.readouterr().err.strip() == "error: interrupted"


def test_sweep_without_a_baseline_pairs_with_round_robin_as_the_report_does(tmp_path):
    """A spec naming no baseline: the report paired every router with round_robin while the sweep's own table showed
    no paired change (a helper's audit, 2026-12-07). Both use `report.auto_baseline` now."""
    spec = tmp_path / "nb.yaml"
    spec.write_text(yaml.safe_dump(small(grid={}, seeds=3, requests=100)))
    assert "baseline" not in yaml.safe_load(spec.read_text())
    r = cli("sweep", str(spec), "--db", str(tmp_path / "r.duckdb"), "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["router"]: x for x in json.loads(r.stdout)}
    assert rows["least_outstanding_tokens"]["vs_baseline"]["ttft_p99_s"]["n"] == 3
    assert rows["round_robin"]["vs_baseline"] == {}
