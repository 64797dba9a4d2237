"""The command line: the documented JSON keys, and one clear line with exit status 2 for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


KEYS = ["requests", "completed", "rejected", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s", "goodput_rps",
        "tokens_per_s", "gpu_util", "cost_usd", "energy_kwh", "load_cv"]


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fleetwise", *args], capture_output=True, text=True, cwd=cwd)


def test_simulate_json_default():
    p = cli("simulate", "--requests", "300", "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    for k in KEYS:
        assert k in s
    assert s["requests"] == 300 and s["completed"] + s["rejected"] == 300


def test_compare_table_and_json():
    p = cli("compare", "--routers", "round_robin,power_of_two", "--seeds", "2", "--requests", "200", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d) == {"round_robin", "power_of_two"}
    assert d["round_robin"]["ttft_p99_s"]["ci95"] is not None
    p = cli("compare", "--routers", "round_robin", "--seeds", "2", "--requests", "200")
    assert p.returncode == 0 and "round_robin" in p.stdout and "±" in p.stdout


def test_simulate_with_trace_and_policies(data_dir):
    p = cli("simulate", "--trace", "azure-code", "--requests", "300", "--router", "least_outstanding_tokens",
            "--batcher", "vllm", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["requests"] == 300


def _bad(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_bad_inputs(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text("name: x\ndeployments: [{model: llama-3-8b, gpu: a100}]\nbogus: 1\n")
    _bad(cli("simulate", "--scenario", str(sc)), "s.yaml", "bogus", "unknown field")

    sc.write_text("deployments: [{model: llama-3-8b, gpu: a100}]\nworkload: {kind: poisson, rate_rps: -3}\n")
    _bad(cli("simulate", "--scenario", str(sc)), "s.yaml", "rate_rps")

    sc.write_text("deployments: [{model: llama-3-8b, gpu: a100, tp: 0}]\n")
    _bad(cli("simulate", "--scenario", str(sc)), "deployments.0.tp")

    sc.write_text("deployments: [{model: gpt-17, gpu: a100}]\n")
    _bad(cli("simulate", "--scenario", str(sc)), "deployments.0.model", "unknown model", "gpt-17")

    sc.write_text("deployments: [{model: llama-2-70b, gpu: a40}]\n")
    _bad(cli("simulate", "--scenario", str(sc)), "does not fit")

    sc.write_text("deployments: [{model: llama-3-8b, gpu: a100\n")
    _bad(cli("simulate", "--scenario", str(sc)), "invalid YAML")

    _bad(cli("simulate", "--scenario", str(tmp_path / "nope.yaml")), "nope.yaml", "not found")

    tr = tmp_path / "t.csv"
    tr.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n"
                  "2023-11-16 18:17:04.0,abc,5\n")
    _bad(cli("simulate", "--trace", str(tr)), "t.csv", "row")

    _bad(cli("simulate", "--trace", str(tmp_path / "missing.csv")), "missing.csv")
    _bad(cli("simulate", "--router", "telepathy", "-n", "10"), "telepathy", "round_robin")
    _bad(cli("compare", "--routers", "round_robin,nope", "-n", "10"), "nope")
    _bad(cli("simulate", "--batcher", "nope", "-n", "10"), "nope", "sarathi")


def test_negative_requests_is_a_usage_error():
    p = cli("simulate", "--requests", "-5")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_bench_sim_speed_json():
    p = cli("bench", "sim-speed", "--sizes", "500", "--scenario", "default", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)["500"]
    assert d["requests_per_s"] > 0 and d["peak_rss_mb"] > 0 and d["wall_s"] > 0


def test_bench_sim_speed_against_fleet_size():
    p = cli("bench", "sim-speed", "--replicas", "2,8", "--requests", "300", "--scenario", "vidur-parity",
            "--router", "least_outstanding_tokens", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["replicas"] for r in rows] == [2, 8] and all(r["requests"] == 300 for r in rows)
    assert all(r["req_per_s"] > 0 and r["peak_rss_mb"] > 0 for r in rows)
    assert rows[1]["replicas_used"] == 8  # the load was scaled with the fleet: every replica got requests
    assert rows[0]["ratio_to_first"] == 1.0 and rows[1]["ratio_to_first"] == rows[1]["req_per_s"] / rows[0]["req_per_s"]
    p = cli("bench", "sim-speed", "--replicas", "2,8", "--requests", "200", "--scenario", "vidur-parity", "--repeat",
            "3", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    for r in rows:  # each size's median run of 3 rounds, and its rate over the 2-replica run of the same round
        assert len(r["req_per_s_runs"]) == len(r["ratio_to_first_runs"]) == 3
        assert r["req_per_s"] == sorted(r["req_per_s_runs"])[1] and r["events"] > 0
    assert rows[0]["ratio_to_first_runs"] == [1.0, 1.0, 1.0]
    assert rows[1]["ratio_to_first_runs"] == [a / b for a, b in zip(rows[1]["req_per_s_runs"], rows[0]["req_per_s_runs"])]
    assert rows[1]["ratio_to_first"] == sorted(rows[1]["ratio_to_first_runs"])[1]
    for bad in ("0", "4,x", "20000"):
        p = cli("bench", "sim-speed", "--replicas", bad, "--requests", "10")
        assert p.returncode == 2 and "--replicas" in p.stderr and "Traceback" not in p.stderr
    p = cli("bench", "sim-speed", "--replicas", "2", "--repeat", "0")
    assert p.returncode == 2 and "--repeat" in p.stderr and "Traceback" not in p.stderr


def test_bench_fleet_sizes_keep_each_deployments_share():
    # several deployments (multi-region: 2 replicas in each of 3 regions) keep their shares of the fleet, with the
    # arrival rate scaled as the total; fewer replicas than deployments is refused in one line
    from fleetwise.bench import scaled_scenario

    sc = scaled_scenario("multi-region", 1000)
    assert [d.replicas for d in sc.deployments] == [334, 333, 333]
    assert sc.workload["mean_rate_rps"] == pytest.approx(24.0 * 1000 / 6)
    p = cli("bench", "sim-speed", "--scenario", "multi-region", "--replicas", "3,12", "--requests", "300",
            "--router", "latency_aware", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["replicas_used"] for r in rows] == [3, 12]
    p = cli("bench", "sim-speed", "--scenario", "multi-region", "--replicas", "2", "--requests", "300")
    assert p.returncode == 2 and "at least one replica each" in p.stderr and "Traceback" not in p.stderr


def test_scenarios_and_policies_list():
    p = cli("scenarios")
    assert p.returncode == 0 and "vidur-parity" in p.stdout and "default" in p.stdout
    p = cli("policies")
    assert p.returncode == 0 and "prefix_aware" in p.stdout and "sarathi" in p.stdout
