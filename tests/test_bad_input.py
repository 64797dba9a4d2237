"""Every bad input of issue 14 §4-§6: one line on stderr, exit status 2, no traceback, nothing written.

The table runs the CLI in-process through its real entry point ``fleetwise.cli.main(argv)`` (so the InputError and
usage-error handling is the one users get; typer's CliRunner would bypass it), in a fresh folder that must be
unchanged afterwards. A few cases run ``python -m fleetwise`` in a subprocess to prove the real exit status.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleetwise.errors import InputError

DEP = "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: 2}]\n"
WL = "workload: {kind: poisson, rate_rps: 5, num_requests: 40}\n"
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _files(d: Path) -> None:
    """Every input the cases use, written into ``d``."""
    w = lambda name, text: (d / name).write_text(text)  # noqa: E731
    wb = lambda name, data: (d / name).write_bytes(data)  # noqa: E731
    w("ok.yaml", DEP + WL)
    w("window_long.yaml", DEP + "workload: {kind: trace, path: mooncake, window_s: 1.0e300}\n")
    w("duration_long.yaml", DEP + "workload: {kind: trace, path: mooncake, duration_s: 31000000}\n")
    w("bigts.jsonl", '{"timestamp": 1' + "0" * 400 + ', "input_length": 5, "output_length": 5}\n')
    w("block_tokens.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: 2000, block_tokens: 300000}]\n"
      + WL)
    tr = "workload: {kind: trace, path: azure-conv, num_requests: 50, %s}\n"
    w("block_tiny.yaml", DEP + tr % "resample: bootstrap, block_s: 1.0e-300")
    w("block_window.yaml", DEP + tr % "resample: window, block_s: 5")
    w("tenants_and_class.yaml", DEP + tr % "slo_class: batch, tenants: [{tenant: t, share: 1}]")
    w("time_scale_tiny.yaml", DEP + tr % "time_scale: 1.0e-320")
    w("default_lengths.yaml", DEP + "workload: {kind: default, rate_rps: 5, num_requests: 50, lengths: {kind: "
                                    "lognormal, prompt_mu: 3, prompt_sigma: 0.1, output_mu: 3, output_sigma: 0.1}}\n")
    w("self_link.yaml", DEP + WL + "fleet: {topology: backbone, regions: [us-east-1, eu-central-1], links: "
                                   "[{src: us-east-1, dst: us-east-1, rtt_s: 60}]}\n")
    w("spot_offset_od.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: 2, spot_offset_s: 100}]\n"
      + WL)
    w("servegen_empty.yaml", DEP + "workload: {kind: servegen, servegen_model: m-large, end_s: 600, "
                                   "rate_scale: 1.0e-300}\n")
    pl = DEP + WL + "scaler: hpa\nplatform: %s\n"
    w("gpu_fault_duration.yaml", pl % "{faults: [{at_s: 5, kind: gpu, target: r0, duration_s: 10}]}")
    w("gpu_fault_factor.yaml", pl % "{faults: [{at_s: 5, kind: gpu, target: r0, factor: 500}]}")
    w("link_factor_huge.yaml", pl % "{faults: [{at_s: 5, kind: link, target: 'local,local', factor: 1000000}]}")
    w("tenant_twice.yaml", pl % "{tenants: [{name: default, rate_limit_rps: 0.1}, {name: default}]}")
    w("backoff_over_cap.yaml", pl % "{retry_backoff_s: 100, retry_backoff_max_s: 1}")
    # a sixth pass (2026-12-07, files): each was a traceback, a quadratic parse, a 4 GB read or a silent pass
    w("bad_date.yaml", DEP + WL + "description: 2001-13-45\n")
    w("hex_seed.yaml", DEP + WL + "seed: 0x" + "f" * 5000 + "\n")
    w("base60.yaml", DEP + WL + "description: " + "1:" * 50_000 + "1\n")
    w("binary_model.yaml", DEP + "workload: {kind: poisson, rate_rps: 5, num_requests: 40, model: !!binary "
                                 "bGxhbWFYWA==}\n")
    deep = "[" * 500 + "1" + "]" * 500
    w("deep_param.json", '{"deployments": [{"model": "llama-3-8b", "gpu": "a100-80gb", "replicas": 2}], '
                         '"workload": {"kind": "poisson", "rate_rps": 5, "num_requests": 40}, '
                         '"batcher": {"name": "sarathi", "chunk_tokens": %s}}' % deep)
    w("bigint_len.jsonl", '{"timestamp": 0, "input_length": %s, "output_length": 5}\n' % ("9" * 5000))
    wb("longline.csv.gz", gzip.compress(b"arrival_s,prompt_tokens,output_tokens\n" + b" " * (3 << 20)))
    w("dupcols.csv", "arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,10,5,999\n1,10,5,999\n")
    wb("nul_token", b"abcdefghijklmnop\x00qrst\n")
    shape = '"models": {"tiny": {"num_layers": 1, "hidden_size": %d, "num_heads": 2, "num_kv_heads": %d, ' \
            '"ffn_size": 8, "vocab_size": 8}}, '
    row = '"attn_decode": [{"model": "tiny", "B": 1, "C": 8, "s": {"MATH": 0.001}}]'
    w("profile_head_dim_0.json", "{" + shape % (1, 2) + row + "}")
    w("profile_kv_heads.json", "{" + shape % (8, 3) + row + "}")
    w("profile_backend_empty.json", "{" + shape % (8, 2) + row.replace('"MATH"', '""') + "}")
    r = np.random.default_rng(7)  # (lengths of any draw: seed 1001's segment is the one at one instant)
    rows = "".join(f"{t},{p},{o}\n" for t, p, o in zip(np.repeat([0, 100, 200], 500), r.integers(200, 2000, 1500),
                                                       r.integers(20, 300, 1500)))
    w("three_instants.csv", "arrival_s,prompt_tokens,output_tokens\n" + rows)
    (d / "devnull.npz").symlink_to("/dev/null")
    w("learned_devnull.yaml", DEP + WL + "router: {name: learned, checkpoint: devnull.npz}\n")
    w("replicas_yes.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: yes}]\n" + WL)
    w("rate_true.yaml", DEP + "workload: {kind: poisson, rate_rps: true, num_requests: 50}\n")
    w("replicas_over_max.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: 5, max_replicas: 2}]\n"
      + WL + "scaler: hpa\n")
    w("tenant_unknown.yaml", pl % "{tenants: [{name: x, rate_limit_rps: 1}]}")
    w("sweep_failing.yaml", "name: f\nscenarios: [tenant_unknown.yaml]\nseeds: 1\nrequests: 20\n")
    w("requests_bool.yaml", "name: r\nscenarios: [default]\nseeds: 1\nrequests: true\n")
    w("seeds_bools.yaml", "name: r\nscenarios: [default]\nseeds: [true, false]\nrequests: 20\n")
    w("model_not_deployed.yaml", DEP + "workload: {kind: poisson, rate_rps: 5, num_requests: 20, "
                                       "model: codellama-34b}\n")
    grid = "name: g\nscenarios: [default]\nseeds: 1\nrequests: 50\n"
    w("grid_dup.yaml", grid + "grid: {workload.rate_rps: [5, 5.0]}\n")
    w("baseline_none.yaml", grid + "baseline: {router: no_such_router}\n")
    w("grid_router.yaml", grid + "policies: {router: [round_robin]}\ngrid: {router: [power_of_two]}\n")
    w("grid_seed.yaml", grid + "grid: {seed: [1, 2]}\n")
    wb("latin1.yaml", b"name: caf\xe9\n" + DEP.encode())
    (d / "folder.yaml").mkdir()
    os.mkfifo(d / "pipe.json")  # an output path that is not a regular file (as /dev/null is)
    w("duration.yaml", DEP + "workload: {kind: poisson, rate_rps: 5, duration_s: 1e12}\n")
    w("rate_x_duration.yaml", DEP + "workload: {kind: poisson, rate_rps: 1000, duration_s: 1.0e6}\n")
    w("negseed.yaml", DEP + WL + "seed: -1\n")
    w("cv.yaml", DEP + "workload: {kind: gamma, rate_rps: 5, cv: 1e200, num_requests: 40}\n")
    w("cv_tiny.yaml", DEP + "workload: {kind: gamma, rate_rps: 5, cv: 1.0e-300, num_requests: 40}\n")
    w("mmpp_sojourn.yaml", DEP + "workload: {kind: mmpp, base_rate_rps: 1.0e+300, burst_rate_rps: 1, mean_base_s: 60, "
                                 "mean_burst_s: 10, num_requests: 20}\n")
    w("lognormal_mu.yaml", DEP + "workload: {kind: poisson, rate_rps: 5, num_requests: 40, lengths: {kind: lognormal, "
                                 "prompt_mu: 800, prompt_sigma: 1, output_mu: 4, output_sigma: 1}}\n")
    w("origin_weights.yaml", DEP + "fleet: {topology: backbone, regions: [us-east-1, us-west-2]}\n"
                                   "workload: {kind: poisson, rate_rps: 5, num_requests: 20, origin: "
                                   "[{region: us-east-1, weight: 1.0e308}, {region: us-west-2, weight: 1.0e308}]}\n")
    w("nan_chunk.yaml", DEP + WL + "batcher: {name: sarathi, chunk_tokens: .nan}\n")
    w("static_zero.yaml", DEP + WL + "batcher: {name: static, max_batch: 0}\n")
    w("router_inf.yaml", DEP + WL + "router: {name: prefix_aware, hit_weight: .inf}\n")
    w("inf_provision.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, cold_start: true, "
                            "provision_s: .inf}]\n" + WL)
    w("nan_mu.yaml", DEP + "workload: {kind: poisson, rate_rps: 5, num_requests: 40, lengths: {kind: lognormal, "
                           "prompt_mu: .nan, prompt_sigma: 1, output_mu: 4, output_sigma: 1}}\n")
    w("nan_fleet.yaml", DEP + WL + "fleet: {topology: backbone, bandwidth_gbps: .nan}\n")
    plat = DEP + WL + "scaler: hpa\nplatform: {faults: [{at_s: 10, kind: %s, target: '%s', duration_s: 60}]}\n"
    w("fault_zone.yaml", plat % ("zone", "nowhere"))
    w("fault_region.yaml", plat % ("region", "nowhere"))
    w("fault_link.yaml", plat % ("link", "local,nowhere"))
    w("fault_gpu.yaml", plat.replace(", duration_s: 60", "") % ("gpu", "nowhere"))
    # '²': str.isdigit says yes, int() says no
    w("fault_gpu_digit.yaml", plat.replace(", duration_s: 60", "") % ("gpu", "g\u00b2"))
    w("link_rtt.yaml", DEP + WL.replace("40}", "40, origin: [{region: us-west-2}]}") +
      "fleet: {topology: backbone, regions: [us-east-1, us-west-2], links: [{src: us-east-1, dst: us-west-2, "
      "rtt_s: 1.0e308}]}\n")
    w("model_nope.yaml", "deployments: [{model: nope, gpu: a100-80gb, replicas: 2}]\n" + WL)
    laughs = "".join(f"  k{i}: [&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]]\n" for i in range(1, 9))
    w("exp_laughs.yaml", "name: g\nscenarios: [ok.yaml]\nseeds: 1\ngrid:\n  k0: [&a0 [x, x, x, x, x, x, x, x, x]]\n"
      + laughs)
    w("profile_bigint.json", '{"gemm": [{"model": "Llama-3-8B", "op": "mlp_up_proj", "N": 1%s, "K": 4096, "M": 64, '
                             '"s": 0.0001}]}' % ("0" * 400))
    w("dupkey.yaml", DEP + WL + "workload: {kind: poisson, rate_rps: 3, num_requests: 10}\n")
    w("replicas.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: 1000000000}]\n" + WL)
    w("max_replicas.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: 1, max_replicas: 9000},"
                           " {model: llama-3-8b, gpu: a100-80gb, replicas: 1, max_replicas: 9000}]\n" + WL
                           + "scaler: hpa\n")
    w("mmpp.yaml", DEP + "workload: {kind: mmpp, base_rate_rps: 1.0e-300, burst_rate_rps: 1.0e-300, "
                         "mean_base_s: 60, mean_burst_s: 10, num_requests: 100}\n")
    w("mmpp_switches.yaml", DEP + "workload: {kind: mmpp, base_rate_rps: 1, burst_rate_rps: 10, mean_base_s: 0.001, "
                                  "mean_burst_s: 0.001, duration_s: 10000}\n")
    w("epoch.yaml", DEP + WL + "scaler: hpa\nplatform: {epoch_s: 1e-9}\n")
    w("epochs_horizon.yaml", DEP + WL + "scaler: hpa\nplatform: {epoch_s: 1, duration_s: 3.0e7}\n")
    w("platform_no_scaler.yaml", DEP + WL + "platform: {epoch_s: 30}\n")
    w("grid_size.yaml", DEP + WL + "fleet: {topology: grid, rows: 1000, cols: 1000}\n")
    # traces
    w("big.csv", AZ + "2023-11-16 18:17:03.9799600,10,5\n2023-11-16 18:17:04.0,99999999999999999999999,5\n")
    w("zero.csv", AZ + "2023-11-16 18:17:03.9799600,0,5\n2023-11-16 18:17:04.0,10,5\n")
    w("empty.csv", AZ)
    w("ts_overflow.csv", AZ + "2023-11-16 18:17:03,10,5\n2500-01-01 00:00:00,10,5\n")
    w("ts_span.csv", AZ + "2023-11-16 18:17:03,10,5\n2025-11-16 18:17:03,10,5\n")
    w("one.csv", AZ + "2023-11-16 18:17:03.9799600,10,5\n")
    wb("latin1.csv", AZ.encode() + b"2023-11-16 18:17:03,10,5\n\xe9\n")
    data = (AZ + "".join(f"2023-11-16 18:17:{i % 60:02d}.0,10,5\n" for i in range(20000))).encode()
    gz = gzip.compress(data)
    wb("truncated.csv.gz", gz[: len(gz) // 2])
    wb("notgzip.csv.gz", b"not gzip at all\n")
    line = '{"timestamp": %s, "input_length": %s, "output_length": 5, "hash_ids": [%s]}\n'
    w("hash.jsonl", line % (0, 10, 1) + line % (1, 10, 99999999999999999999999))
    w("bigint.jsonl", line % (0, 18446744073709551616, 1))
    w("zero.jsonl", line % (0, 0, 1))
    wb("latin1.jsonl", (line % (0, 10, 1)).encode() + b'{"x": "caf\xe9"}\n')
    w("empty.jsonl", "")
    w("span.jsonl", line % (0, 10, 1) + line % ("1e300", 10, 2))
    w("nested.jsonl", line % (0, 10, 1) + "[" * 100000 + "]" * 100000 + "\n")  # (was a RecursionError)
    (d / "sg" / "m-x").mkdir(parents=True)
    wb("sg/m-x/chunk-0-trace.csv", b"0,1,1,Gamma,1,1\n\xe9\n")
    w("servegen_latin1.yaml", DEP + "workload: {kind: servegen, servegen_model: m-x, path: sg}\n")
    # experiments
    exp = "name: g\nscenarios: [ok.yaml]\n"
    wb("latin1_exp.yaml", exp.encode() + b"description: caf\xe9\n")
    w("grid_inf.yaml", exp + "seeds: 1\ngrid: {workload.rate_rps: [5, .inf]}\n")
    w("grid_requests.yaml", exp + "seeds: 1\ngrid: {workload.num_requests: [1000000000000]}\n")
    w("exp_negseed.yaml", exp + "seeds: [-1, 2]\n")
    w("exp_requests.yaml", exp + "seeds: 1\nrequests: 1000000000000\n")
    w("exp_requests_span.yaml", exp + "seeds: 1\nrequests: 10000000\ngrid: {workload.rate_rps: [0.01]}\n")
    w("exp_seeds.yaml", exp + "seeds: 100000000\n")
    w("exp_runs.yaml", exp + "seeds: 1000\ngrid: {workload.rate_rps: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
                             "15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, "
                             "36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, "
                             "57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, "
                             "78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, "
                             "99, 100, 101]}\n")
    w("exp_timeline.yaml", exp + "seeds: 1\ntimeline_bucket_s: 1e-9\n")
    w("exp_timeline_span.yaml", exp + "seeds: 1\ntimeline_bucket_s: 0.01\ngrid: {workload.rate_rps: [0.001]}\n")
    w("exp_dupkey.yaml", exp + "seeds: 1\nseeds: 2\n")
    w("exp_empty_name.yaml", "name: ''\nscenarios: [ok.yaml]\nseeds: 1\n")
    w("exp_trace.yaml", exp + "seeds: 1\ngrid: {workload: [{kind: trace, path: zero.csv}]}\n")
    w("exp_fault.yaml", "name: g\nscenarios: [fault_zone.yaml]\nseeds: 1\n")
    w("exp_no_scaler.yaml", "name: g\nscenarios: [platform_no_scaler.yaml]\nseeds: 1\n")
    w("exp_policy_nan.yaml", exp + "seeds: 1\npolicies: {batcher: [{name: sarathi, chunk_tokens: .nan}]}\n")
    w("exp_grid_digit.yaml", exp + "seeds: 1\ngrid: {deployments.\u00b2.replicas: [1]}\n")
    w("exp_model_nope.yaml", "name: g\nscenarios: [model_nope.yaml]\nseeds: 1\n")  # (was a failed run, stored)
    # files in the way of outputs
    w("afile", "not a folder\n")
    (d / "ckdir.card.json").mkdir()  # a folder where a checkpoint's model card goes
    w("scaler_big.yaml", DEP + WL + "scaler: {name: slo_aware, min_zones: %s}\n" % ("9" * 400))
    w("static_big.yaml", DEP + WL + "scaler: {name: static, replicas: 20000}\n")
    w("backoff_tiny.yaml", DEP + WL + "scaler: hpa\nplatform: {retry_backoff_s: 1.0e-3, retry_backoff_max_s: 1.0e-3, "
                                      "health_check_s: 1000}\n")
    w("workload_model.yaml", DEP + "workload: {kind: poisson, rate_rps: 5, num_requests: 20, model: nope}\n")
    w("notduckdb.duckdb", "not a DuckDB file\n")
    # a fuzzing audit, 2026-12-07 (hangs, tracebacks, bad values taken)
    w("diurnal_period.yaml", DEP + "workload: {kind: diurnal, mean_rate_rps: 5, num_requests: 20, period_h: 1.0e-310}\n")
    (d / "sg2/m-g").mkdir(parents=True)
    w("sg2/m-g/chunk-0-trace.csv", "0,1,1,Gamma,1.0e-300,1\n600,1,1,Gamma,1,1\n")
    w("servegen_gamma_tiny.yaml", DEP + "workload: {kind: servegen, servegen_model: m-g, path: sg2}\n")
    (d / "sg3/m-w").mkdir(parents=True)
    w("sg3/m-w/chunk-0-trace.csv", "0,1,1,Weibull,0.001,1\n600,1,1,Weibull,1,1\n")
    w("servegen_weibull_tiny.yaml", DEP + "workload: {kind: servegen, servegen_model: m-w, path: sg3}\n")
    w("fault_digits.yaml", "deployments: [{model: llama-3-8b, gpu: a100-80gb, replicas: 2, min_replicas: 1}]\n" + WL
      + "scaler: {name: hpa}\nplatform: {faults: [{kind: gpu, at_s: 1, target: r" + "9" * 5000 + "}]}\n")
    w("load_yes.yaml", DEP + "workload: {kind: trace, path: azure-conv, num_requests: 20, load: yes}\n")
    w("bucket_huge.yaml", "name: bh\nscenarios: [ok.yaml]\npolicies: {router: [round_robin]}\nseeds: 1\n"
      "timeline_bucket_s: 1.0e+308\n")
    w("grid_zero.yaml", "name: gz\nscenarios: [ok.yaml]\npolicies: {router: [round_robin]}\nseeds: 1\n"
      "grid: {deployments.0.replicas: [0]}\n")
    w("with_records.yaml", "name: wr\nscenarios: [ok.yaml]\npolicies: {router: [round_robin]}\nseeds: 1\n"
      "records: true\n")
    (d / "rf").mkdir()
    w("rf/records", "a file where the records folder goes\n")
    wb("rt.parquet", b"PAR1\xc0\x00 not really\n")


@pytest.fixture
def work(tmp_path, monkeypatch):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)  # default outputs (results/...) would land here and be seen
    return tmp_path


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.is_dir(), None if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns))
            for p in sorted(d.rglob("*"))}


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    from fleetwise.cli import main

    try:
        main(list(args))
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def _store_with_runs(path: Path) -> None:
    """A small results store (two runs of round robin) for the report cases."""
    from fleetwise.experiments.runner import run_sweep
    from fleetwise.experiments.spec import expand, parse_experiment
    from fleetwise.experiments.store import Store

    spec = parse_experiment({"name": "e", "scenarios": [str(path.parent / "ok.yaml")],
                             "policies": {"router": ["round_robin"]}, "seeds": 2})
    run_sweep(expand(spec), Store(path), workers=1)


# (case id, issue section, argv, words the one error line must contain)
CASES = [
    # §4: files that are not UTF-8 or are folders
    ("scenario-not-utf8", "4", ["simulate", "-s", "latin1.yaml"], ["latin1.yaml", "not UTF-8"]),
    ("scenario-folder", "4", ["simulate", "-s", "folder.yaml"], ["folder.yaml", "folder"]),
    ("experiment-not-utf8", "4", ["sweep", "latin1_exp.yaml", "--db", "r/x.duckdb"], ["latin1_exp.yaml", "UTF-8"]),
    ("experiment-folder", "4", ["sweep", "folder.yaml", "--db", "r/x.duckdb"], ["folder.yaml", "folder"]),
    ("compare-scenario-folder", "4", ["compare", "-s", "folder.yaml", "-n", "10"], ["folder.yaml", "folder"]),
    ("trace-a-device", "4", ["simulate", "--trace", "/dev/zero", "-n", "10"], ["/dev/zero", "not a regular file"]),
    ("trace-a-folder", "4", ["compare", "--trace", "folder.yaml", "-n", "10"], ["folder.yaml", "a directory"]),
    # §4: absurd request counts
    ("requests-1e12", "4", ["simulate", "-n", "1000000000000"], ["--requests", "10000000"]),
    ("compare-requests-1e12", "4", ["compare", "-n", "1000000000000"], ["--requests"]),
    ("duration-1e12", "4", ["simulate", "-s", "duration.yaml"], ["duration.yaml", "duration_s"]),
    ("rate-x-duration", "4", ["simulate", "-s", "rate_x_duration.yaml"], ["rate x duration_s", "docs/limits.md"]),
    ("perf-predict-tokens-beyond-bound", "4", ["perf", "predict", "--gpu", "h100", "--model", "Llama-3-8B",
                                               "--prefill-tokens", "99999999999"], ["10,000,000 tokens", "limits"]),
    # §4: negative seeds
    ("seed-option-negative", "4", ["simulate", "--seed", "-1", "-n", "10"], ["--seed"]),
    ("seed-option-huge", "4", ["simulate", "--seed", str(2**64), "-n", "10"], ["--seed"]),
    ("scenario-seed-negative", "4", ["simulate", "-s", "negseed.yaml"], ["negseed.yaml", "seed"]),
    ("experiment-seed-negative", "4", ["sweep", "exp_negseed.yaml", "--db", "r/x.duckdb"], ["seed -1"]),
    # §4: cv
    ("cv-1e200", "4", ["simulate", "-s", "cv.yaml"], ["cv.yaml", "cv", "100"]),
    # §4: trace numbers beyond int64, a 0-token prompt, not UTF-8, truncated .gz
    ("csv-tokens-beyond-int64", "4", ["simulate", "--trace", "big.csv"], ["big.csv row 2", "ContextTokens"]),
    ("jsonl-hash-beyond-int64", "4", ["simulate", "--trace", "hash.jsonl"], ["hash.jsonl line 2", "hash_ids"]),
    ("jsonl-tokens-beyond-int64", "4", ["simulate", "--trace", "bigint.jsonl"], ["bigint.jsonl line 1",
                                                                                  "input_length"]),
    ("csv-zero-token-prompt", "4", ["simulate", "--trace", "zero.csv"], ["zero.csv row 1", "ContextTokens is 0"]),
    ("jsonl-zero-token-prompt", "4", ["simulate", "--trace", "zero.jsonl"], ["zero.jsonl line 1", "input_length"]),
    ("jsonl-not-utf8", "4", ["simulate", "--trace", "latin1.jsonl"], ["latin1.jsonl line 2", "not UTF-8"]),
    ("csv-not-utf8", "4", ["simulate", "--trace", "latin1.csv"], ["latin1.csv", "not UTF-8"]),
    ("csv-gz-truncated", "4", ["simulate", "--trace", "truncated.csv.gz"], ["truncated.csv.gz", "truncated"]),
    ("csv-gz-not-gzip", "4", ["simulate", "--trace", "notgzip.csv.gz"], ["notgzip.csv.gz", "gzip"]),
    ("servegen-not-utf8", "4", ["simulate", "-s", "servegen_latin1.yaml"], ["servegen folder sg", "not UTF-8"]),
    # §4: output paths that cannot be written (checked before any work)
    ("sweep-db-under-a-file", "4", ["sweep", "default", "--db", "afile/x.duckdb"], ["afile", "is a file"]),
    ("sweep-db-is-a-folder", "4", ["sweep", "default", "--db", "folder.yaml"], ["folder.yaml", "folder"]),
    ("sweep-db-not-duckdb", "4", ["sweep", "exp_seeds.yaml", "--db", "notduckdb.duckdb"],
     ["notduckdb.duckdb", "not a valid DuckDB database"]),
    ("sweep-db-unwritable", "4", ["sweep", "default", "--db", "/proc/fleetwise-test/x.duckdb"], ["/proc"]),
    ("sweep-db-a-pipe", "4", ["sweep", "default", "--db", "pipe.json"], ["pipe.json", "not a regular file"]),
    ("reproduce-db-a-device", "4", ["reproduce", "platform", "--quick", "--db", "/dev/null"],
     ["/dev/null", "not a regular file"]),
    ("report-out-under-a-file", "4", ["report", "--db", "store.duckdb", "--out", "afile/report"], ["afile"]),
    ("report-out-is-a-file", "4", ["report", "--db", "store.duckdb", "--out", "afile"], ["afile", "is a file"]),
    ("report-db-missing", "4", ["report", "--db", "nope.duckdb"], ["nope.duckdb", "not found"]),
    ("reproduce-db-under-a-file", "4", ["reproduce", "platform", "--quick", "--db", "afile/x.duckdb"], ["afile"]),
    ("perf-profile-out-a-pipe", "4", ["perf", "profile", "--quick", "--out", "pipe.json"],
     ["pipe.json", "not a regular file"]),
    ("scenarios-copy-over-a-pipe", "4", ["scenarios", "--copy", "default", "pipe.json", "--force"],
     ["pipe.json", "not a regular file"]),
    ("scenarios-copy-to-an-empty-path", "4", ["scenarios", "--copy", "default", ""], ["DEST ''", "empty path"]),
    ("compare-batcher-empty", "4", ["compare", "--batcher", "", "-n", "10"], ["--batcher", "unknown batcher ''"]),
    ("train-scaler-out-not-npz", "4", ["train", "scaler", "--out", "x.zip"], ["--out", "NAME.npz"]),
    ("train-scaler-out-under-a-file", "4", ["train", "scaler", "--out", "afile/x.npz"], ["afile"]),
    ("train-scaler-backend", "4", ["train", "scaler", "--out", "x.npz", "--backend", "slurm"], ["--backend", "slurm"]),
    ("train-scaler-init", "4", ["train", "scaler", "--out", "x.npz", "--init", "nope"],
     ["--init", "nope", "calm_price_hold"]),
    ("train-scaler-searches-0", "4", ["train", "scaler", "--out", "x.npz", "--searches", "0"], ["--searches"]),
    ("train-scaler-val-days-training", "4", ["train", "scaler", "--out", "x.npz", "--val-days", "5-8"],
     ["--val-days", "day 5 is a training day"]),
    ("train-scaler-val-days-form", "4", ["train", "scaler", "--out", "x.npz", "--val-days", "7-x"],
     ["--val-days", "A-B or A,B,C"]),
    ("train-scaler-val-days-range", "4", ["train", "scaler", "--out", "x.npz", "--val-days", "12-15"],
     ["--val-days", "1 to 14", "15 is not one"]),
    ("reproduce-platform-rl-checkpoint-missing", "4",
     ["reproduce", "platform", "--quick", "--rl-checkpoint", "nope.npz"], ["--rl-checkpoint", "nope.npz", "not found"]),
    ("reproduce-platform-rl-checkpoint-not-npz", "4",
     ["reproduce", "platform", "--quick", "--rl-checkpoint", "latin1.yaml"],
     ["--rl-checkpoint", "latin1.yaml", "not a fleetwise policy checkpoint"]),
    ("simulate-monitor-under-a-file", "4", ["simulate", "--scaler", "hpa", "-n", "10", "--monitor", "afile/m"],
     ["afile"]),
    # §4: bench sim-speed, serve
    ("bench-sizes-abc", "4", ["bench", "sim-speed", "--sizes", "abc"], ["--sizes", "abc"]),
    ("bench-sizes-0", "4", ["bench", "sim-speed", "--sizes", "0"], ["--sizes", "0"]),
    ("bench-sizes-negative", "4", ["bench", "sim-speed", "--sizes=-5"], ["--sizes", "-5"]),
    ("bench-sizes-huge", "4", ["bench", "sim-speed", "--sizes", "1000000000000"], ["--sizes"]),
    ("bench-scenario-nope", "4", ["bench", "sim-speed", "--sizes", "10", "--scenario", "nope"], ["nope", "not found"]),
    ("bench-requests-without-replicas", "4", ["bench", "sim-speed", "--requests", "5"], ["--requests", "--replicas"]),
    ("bench-repeat-without-replicas", "4", ["bench", "sim-speed", "--repeat", "3"], ["--repeat", "--replicas"]),
    ("bench-sizes-with-replicas", "4", ["bench", "sim-speed", "--replicas", "4", "--sizes", "10"], ["--sizes", "--replicas"]),
    # §4: an option of another mode is refused, not ignored
    ("simulate-monitor-without-platform", "4", ["simulate", "-n", "10", "--monitor", "m"], ["--monitor", "--scaler"]),
    ("perf-validate-gpu-without-profile", "4", ["perf", "validate", "--gpu", "h200"], ["--gpu", "--profile"]),
    # found by fuzzing the service, 2026-12-06: a FIFO token file hung the start; a negative seed, a planner's
    # code-only parameter and Arabic-Indic digits in a parameter went through; a space in a backend URL started
    # found by fuzzing the CLI, 2026-12-06: a 1e300 s trace window overflowed, a duration of 121 M requests ran
    # out of memory, a 400-digit timestamp overflowed; --models '' replaced the profile; grid keys that the
    # policies, the seeds or requests override were stored as if they had run
    ("trace-window-too-long", "4", ["simulate", "-s", "window_long.yaml"], ["window_s", "10,000,000 requests"]),
    ("trace-duration-too-long", "4", ["simulate", "-s", "duration_long.yaml"], ["duration_s", "10,000,000"]),
    ("jsonl-timestamp-400-digits", "4", ["simulate", "--trace", "bigts.jsonl"], ["bigts.jsonl line 1", "timestamp"]),
    ("block-tokens-huge", "4", ["simulate", "-s", "block_tokens.yaml"], ["block_tokens", "1024"]),
    ("perf-profile-models-empty", "4", ["perf", "profile", "--quick", "--models", "", "--out", "p.json"],
     ["--models ''"]),
    ("sweep-grid-overridden-router", "4", ["sweep", "grid_router.yaml", "--db", "g.duckdb"],
     ["grid key 'router'", "policies.router"]),
    ("sweep-grid-overridden-seed", "4", ["sweep", "grid_seed.yaml", "--db", "g.duckdb"], ["grid key 'seed'"]),
    ("train-scaler-seed-beyond-derived-seeds", "4",
     ["train", "scaler", "--out", "x.npz", "--seed", "10000000000000000"], ["--seed"]),
    # found by fuzzing workloads, fleets and sweeps, 2026-12-06: each was taken (and ignored, or ran minutes, or
    # ran nothing) with exit 0
    ("trace-block-s-tiny", "4", ["simulate", "-s", "block_tiny.yaml"], ["block_s", "100,000"]),
    ("trace-block-s-without-bootstrap", "4", ["simulate", "-s", "block_window.yaml"], ["block_s", "bootstrap"]),
    ("trace-tenants-and-slo-class", "4", ["simulate", "-s", "tenants_and_class.yaml"], ["slo_class", "tenant"]),
    ("trace-time-scale-tiny", "4", ["simulate", "-s", "time_scale_tiny.yaml"], ["time_scale", "1e-6"]),
    ("default-kind-with-lengths", "4", ["simulate", "-s", "default_lengths.yaml"], ["kind: default", "poisson"]),
    ("fleet-self-link", "4", ["simulate", "-s", "self_link.yaml"], ["src and dst", "us-east-1"]),
    ("spot-offset-on-demand", "4", ["simulate", "-s", "spot_offset_od.yaml"], ["spot_offset_s", "pool: spot"]),
    ("workload-with-no-request", "4", ["simulate", "-s", "servegen_empty.yaml"], ["drew no request"]),
    ("sweep-grid-duplicate-value", "4", ["sweep", "grid_dup.yaml", "--db", "g.duckdb"], ["listed twice"]),
    ("sweep-baseline-no-run-uses", "4", ["sweep", "baseline_none.yaml", "--db", "g.duckdb"],
     ["baseline.router", "no_such_router"]),
    # found by fuzzing the platform layer and the benchmarks, 2026-12-06
    ("simulate-monitor-empty", "4", ["simulate", "--scaler", "hpa", "-n", "10", "--monitor", ""], ["--monitor ''"]),
    ("gpu-fault-duration", "4", ["simulate", "-s", "gpu_fault_duration.yaml"], ["duration_s", "permanent"]),
    ("gpu-fault-factor", "4", ["simulate", "-s", "gpu_fault_factor.yaml"], ["factor is for link faults"]),
    ("link-factor-huge", "4", ["simulate", "-s", "link_factor_huge.yaml"], ["factor", "1000"]),
    ("tenant-listed-twice", "4", ["simulate", "-s", "tenant_twice.yaml"], ["tenants", "'default' is listed twice"]),
    ("backoff-over-cap", "4", ["simulate", "-s", "backoff_over_cap.yaml"], ["retry_backoff_s", "retry_backoff_max_s"]),
    ("replicas-over-max", "4", ["simulate", "-s", "replicas_over_max.yaml"], ["replicas (5) > max_replicas (2)"]),
    ("bench-sweep-failing-run", "4", ["bench", "sweep", "--spec", "sweep_failing.yaml", "--workers", "1"],
     ["bench sweep", "runs failed", "tenant"]),
    ("bench-sim-speed-platform", "4", ["bench", "sim-speed", "--sizes", "100", "--scenario", "platform"],
     ["simulator alone", "platform"]),
    # the regression pass, 2026-12-06: booleans were read as counts; a catalog model no deployment serves ran
    # with every request rejected (no_replica), exit 0
    ("sweep-requests-bool", "4", ["sweep", "requests_bool.yaml", "--db", "g.duckdb"], ["requests", "got true"]),
    ("sweep-seeds-bools", "4", ["sweep", "seeds_bools.yaml", "--db", "g.duckdb"], ["seeds"]),
    ("workload-model-not-deployed", "4", ["simulate", "-s", "model_not_deployed.yaml"],
     ["CodeLlama-34B", "served by no deployment"]),
    ("serve-token-file-a-pipe", "4", ["serve", "--port", "0", "--token-file", "pipe.json"],
     ["--token-file", "pipe.json", "not a regular file"]),
    ("serve-seed-negative", "4", ["serve", "--port", "0", "--seed", "-1"], ["--seed"]),
    ("serve-planner-code-parameter", "4", ["serve", "--port", "0", "--planner", "ot?cfg=foo"],
     ["planner 'ot' has no parameter 'cfg'", "allowed: weights"]),
    ("serve-planner-weights", "4", ["serve", "--port", "0", "--planner", "ot?weights=zzz"], ["weights 'zzz'"]),
    ("serve-param-arabic-digits", "4", ["serve", "--port", "0", "--router", "prefix_aware?hit_weight=١٢"],
     ["hit_weight", "١٢"]),
    ("serve-backend-url-space", "4", ["serve", "--gateway", "--port", "0", "--backend", "http://a b"],
     ["http://a b", "a space"]),
    ("serve-max-attempts-without-gateway", "4", ["serve", "--max-attempts", "2", "--port", "0"],
     ["--max-attempts", "--gateway"]),
    ("sweep-address-without-ray", "4", ["sweep", "default", "--address", "10.0.0.1:6379"], ["--address", "ray"]),
    ("reproduce-address-without-ray", "4", ["reproduce", "torta", "--quick", "--address", "10.0.0.1:6379"],
     ["--address", "ray"]),
    ("train-scaler-address-without-ray", "4", ["train", "scaler", "--out", "x.npz", "--address", "10.0.0.1:6379"],
     ["--address", "ray"]),
    ("serve-log-level", "4", ["serve", "--log-level", "bogus", "--port", "0"], ["--log-level", "bogus"]),
    ("bench-serve-calls", "6", ["bench", "serve", "--rate", "1000000", "--duration", "86400"], ["--rate x --duration"]),
    ("bench-serve-rate-nan", "5", ["bench", "serve", "--rate", "nan"], ["--rate", "'nan' is not a number from 1"]),
    ("sweep-workers-huge", "6", ["sweep", "default", "--workers", "100000"], ["--workers"]),
    # §4: --eval-trace checked before any training, in every reproduction
    ("reproduce-platform-eval-trace", "4", ["reproduce", "platform", "--quick", "--eval-trace", "zero.csv"],
     ["zero.csv row 1"]),
    ("reproduce-batching-eval-trace", "4", ["reproduce", "batching", "--quick", "--eval-trace", "zero.csv"],
     ["zero.csv row 1"]),
    ("reproduce-torta-eval-trace", "4", ["reproduce", "torta", "--quick", "--eval-trace", "zero.jsonl"],
     ["zero.jsonl line 1"]),
    ("reproduce-graph-marl-eval-trace", "4", ["reproduce", "graph-marl", "--quick", "--eval-trace", "one.csv"],
     ["at least 2 requests"]),
    ("reproduce-allocation-eval-trace", "4", ["reproduce", "allocation", "--quick", "--eval-trace", "zero.csv"],
     ["zero.csv"]),
    ("reproduce-eval-trace-missing", "4", ["reproduce", "batching", "--quick", "--eval-trace", "missing.csv"],
     ["missing.csv"]),
    ("reproduce-torta-learner", "4", ["reproduce", "torta", "--quick", "--learner", "sgd"], ["--learner", "sgd"]),
    ("reproduce-torta-backend", "4", ["reproduce", "torta", "--quick", "--backend", "mpi"], ["--backend", "mpi"]),
    ("reproduce-torta-objective", "4", ["reproduce", "torta", "--quick", "--objective", "speed"],
     ["--objective", "speed"]),
    ("reproduce-torta-objective-ppo", "4", ["reproduce", "torta", "--quick", "--learner", "ppo", "--objective", "cost"],
     ["--objective", "cem"]),
    ("reproduce-batching-learner", "4", ["reproduce", "batching", "--quick", "--learner", "sgd"], ["--learner", "sgd"]),
    ("reproduce-graph-marl-tail-quantile", "4", ["reproduce", "graph-marl", "--quick", "--tail-quantile", "1"],
     ["tail_quantile=1.0", "(0, 1)"]),
    ("reproduce-graph-marl-tail-quantile-nan", "5", ["reproduce", "graph-marl", "--quick", "--tail-quantile", "nan"],
     ["tail_quantile=nan"]),
    ("reproduce-batching-backend", "4", ["reproduce", "batching", "--quick", "--backend", "mpi"],
     ["--backend", "mpi"]),
    # §4: a usage error of the parser is one line too
    ("usage-negative-requests", "4", ["simulate", "--requests", "-5"], ["--requests"]),
    ("usage-unknown-option", "4", ["simulate", "--bogus"], ["--bogus"]),
    # §5: NaN / infinity anywhere, policy parameters included
    ("chunk-tokens-nan", "5", ["simulate", "-s", "nan_chunk.yaml"], ["nan_chunk.yaml", "chunk_tokens", "nan"]),
    ("static-max-batch-0", "5", ["simulate", "-s", "static_zero.yaml"], ["static_zero.yaml", "max_batch"]),
    ("router-param-inf", "5", ["simulate", "-s", "router_inf.yaml"], ["hit_weight", "inf"]),
    ("provision-inf", "5", ["simulate", "-s", "inf_provision.yaml"], ["provision_s", "finite"]),
    ("prompt-mu-nan", "5", ["simulate", "-s", "nan_mu.yaml"], ["prompt_mu", "finite"]),
    ("fleet-bandwidth-nan", "5", ["simulate", "-s", "nan_fleet.yaml"], ["bandwidth_gbps", "finite"]),
    ("experiment-policy-nan", "5", ["sweep", "exp_policy_nan.yaml", "--db", "r/x.duckdb"], ["chunk_tokens"]),
    # §5: fault targets
    ("fault-zone-nowhere", "5", ["simulate", "-s", "fault_zone.yaml"], ["fault_zone.yaml", "nowhere", "zone"]),
    ("fault-region-nowhere", "5", ["simulate", "-s", "fault_region.yaml"], ["nowhere", "region"]),
    ("fault-link-nowhere", "5", ["simulate", "-s", "fault_link.yaml"], ["nowhere", "link"]),
    ("fault-gpu-nowhere", "5", ["simulate", "-s", "fault_gpu.yaml"], ["nowhere", "gpu"]),
    ("sweep-fault-zone-nowhere", "5", ["sweep", "exp_fault.yaml", "--db", "r/x.duckdb"], ["nowhere", "zone"]),
    ("sweep-platform-without-scaler", "5", ["sweep", "exp_no_scaler.yaml", "--db", "r/x.duckdb"], ["scaler"]),
    ("platform-without-scaler", "5", ["simulate", "-s", "platform_no_scaler.yaml"], ["platform", "scaler"]),
    # §5: sweep grids validated up front (docs/experiments.md)
    ("grid-inf", "5", ["sweep", "grid_inf.yaml", "--db", "r/x.duckdb"], ["grid_inf.yaml", "rate_rps=inf"]),
    ("grid-requests-1e12", "5", ["sweep", "grid_requests.yaml", "--db", "r/x.duckdb"], ["num_requests"]),
    ("experiment-requests-1e12", "5", ["sweep", "exp_requests.yaml", "--db", "r/x.duckdb"], ["requests"]),
    ("grid-trace-zero-tokens", "5", ["sweep", "exp_trace.yaml", "--db", "r/x.duckdb"], ["zero.csv row 1"]),
    ("experiment-requests-span", "5", ["sweep", "exp_requests_span.yaml", "--db", "r/x.duckdb"], ["span"]),
    # §5: empty traces, report baseline, Azure timestamps, duplicate keys
    ("trace-empty-csv", "5", ["simulate", "--trace", "empty.csv"], ["empty.csv", "no requests"]),
    ("trace-empty-jsonl", "5", ["simulate", "--trace", "empty.jsonl"], ["empty.jsonl", "no requests"]),
    ("compare-trace-empty", "5", ["compare", "--trace", "empty.csv", "-n", "10"], ["empty.csv", "no requests"]),
    ("report-baseline-nope", "5", ["report", "--db", "store.duckdb", "--out", "rep", "--baseline", "router=nope"],
     ["router=nope"]),
    ("azure-timestamp-overflow", "5", ["simulate", "--trace", "ts_overflow.csv"], ["ts_overflow.csv row 2", "2262"]),
    ("azure-timestamp-span", "5", ["simulate", "--trace", "ts_span.csv"], ["ts_span.csv", "span"]),
    ("jsonl-timestamp-span", "5", ["simulate", "--trace", "span.jsonl"], ["span.jsonl", "span"]),
    ("scenario-duplicate-key", "5", ["simulate", "-s", "dupkey.yaml"], ["dupkey.yaml", "duplicate key 'workload'"]),
    ("experiment-empty-name", "5", ["sweep", "exp_empty_name.yaml", "--db", "r/x.duckdb"],
     ["exp_empty_name.yaml", "name", "at least 1 character"]),
    ("experiment-duplicate-key", "5", ["sweep", "exp_dupkey.yaml", "--db", "r/x.duckdb"], ["duplicate key 'seeds'"]),
    # §6: bounds checked up front
    ("replicas-1e9", "6", ["simulate", "-s", "replicas.yaml"], ["replicas", "10000"]),
    ("max-replicas-sum", "6", ["simulate", "-s", "max_replicas.yaml"], ["18,000 replicas"]),
    ("mmpp-rates-1e-300", "6", ["simulate", "-s", "mmpp.yaml"], ["mmpp.yaml", "span"]),
    ("mmpp-switches", "6", ["simulate", "-s", "mmpp_switches.yaml"], ["state switches"]),
    ("epoch-1e-9", "6", ["simulate", "-s", "epoch.yaml"], ["epoch_s"]),
    ("epochs-over-horizon", "6", ["simulate", "-s", "epochs_horizon.yaml"], ["epoch_s", "events"]),
    ("experiment-seeds-1e8", "6", ["sweep", "exp_seeds.yaml", "--db", "r/x.duckdb"], ["seeds", "1,000"]),
    ("compare-seeds-1e8", "6", ["compare", "--seeds", "100000000", "-n", "10"], ["--seeds"]),
    ("experiment-runs", "6", ["sweep", "exp_runs.yaml", "--db", "r/x.duckdb"], ["101,000 runs"]),
    ("timeline-bucket-1e-9", "6", ["sweep", "exp_timeline.yaml", "--db", "r/x.duckdb"], ["timeline_bucket_s"]),
    ("timeline-buckets-span", "6", ["sweep", "exp_timeline_span.yaml", "--db", "r/x.duckdb"], ["buckets"]),
    ("fleet-grid-size", "6", ["simulate", "-s", "grid_size.yaml"], ["rows x cols"]),
    ("cv-1e-300", "6", ["simulate", "-s", "cv_tiny.yaml"], ["cv"]),
    ("mmpp-arrivals-per-sojourn", "6", ["simulate", "-s", "mmpp_sojourn.yaml"], ["per sojourn"]),
    ("lognormal-mu-800", "6", ["simulate", "-s", "lognormal_mu.yaml"], ["prompt_mu"]),
    ("origin-weights-sum", "6", ["simulate", "-s", "origin_weights.yaml"], ["weight"]),
    # found by trying bad values on every option (2026-12-05): paths no file system holds, devices and folders
    # where a file is read or written, empty paths, names checked before a benchmark starts its servers, limits
    ("scenario-name-too-long", "5", ["simulate", "-s", "a" * 3000], ["(3,000 characters)", "File name too long"]),
    ("trace-name-too-long", "5", ["simulate", "--trace", "a" * 3000], ["File name too long"]),
    ("db-name-too-long", "5", ["report", "--db", "a" * 3000], ["File name too long"]),
    ("profile-out-folder", "5", ["perf", "profile", "--out", "folder.yaml", "--quick"], ["folder.yaml", "directory"]),
    ("calibrate-out-folder", "5", ["perf", "calibrate", "--profile", "ok.yaml", "--out", "folder.yaml"],
     ["folder.yaml", "directory"]),
    ("cpu-trace-device", "5", ["reproduce", "allocation", "--quick", "--eval-trace", "/dev/zero"],
     ["/dev/zero", "not a regular file"]),
    ("reproduce-empty-eval-trace", "5", ["reproduce", "platform", "--quick", "--eval-trace", ""], ["--eval-trace"]),
    ("reproduce-empty-db", "5", ["reproduce", "torta", "--quick", "--db", ""], ["--db", "empty"]),
    ("bench-serve-router", "5", ["bench", "serve", "--router", "nope"], ["unknown router 'nope'"]),
    ("bench-scale-scaler", "5", ["bench", "scale", "--scaler", "nope"], ["unknown scaler 'nope'"]),
    ("bench-gateway-router", "5", ["bench", "gateway", "--backend", "http://127.0.0.1:9", "--router", "nope"],
     ["unknown router 'nope'"]),
    ("bench-gateway-backend", "5", ["bench", "gateway", "--backend", "/"], ["backend '/'"]),
    ("serve-empty-planner", "5", ["serve", "--planner", ""], ["--planner", "empty"]),
    ("serve-body-limit-1e20", "6", ["serve", "--max-body-bytes", "99999999999999999999"], ["max_body_bytes"]),
    ("serve-concurrency-1e6", "6", ["serve", "--max-concurrency", "1000000"], ["max_concurrency", "100,000"]),
    ("serve-buffered-1e12", "6", ["serve", "--max-buffered-bytes", "1000000000000"],
     ["max_buffered_bytes", "68,719,476,736"]),
    # found by a fuzzing pass (2026-12-06): each was a traceback, an Infinity result or a stored failed run
    ("fault-target-unicode-digit", "6", ["simulate", "-s", "fault_gpu_digit.yaml"], ["platform.faults[0]", "g\u00b2"]),
    ("grid-key-unicode-digit", "6", ["sweep", "exp_grid_digit.yaml", "--db", "r/x.duckdb"], ["grid key"]),
    ("jsonl-nested-too-deeply", "4", ["simulate", "--trace", "nested.jsonl"], ["nested.jsonl line 2", "nested"]),
    ("profile-int-beyond-float", "6", ["perf", "validate", "--profile", "profile_bigint.json"], ["gemm.0.N"]),
    ("link-rtt-1e308", "6", ["simulate", "-s", "link_rtt.yaml"], ["rtt_s"]),
    ("yaml-alias-bomb-in-grid", "6", ["sweep", "exp_laughs.yaml", "--db", "r/x.duckdb"], ["aliases", "1,000,000"]),
    ("sweep-unknown-model", "4", ["sweep", "exp_model_nope.yaml", "--db", "r/x.duckdb"], ["deployments.0.model",
                                                                                         "unknown model 'nope'"]),
    # found by a fuzzing pass (2026-12-07): pydantic read true / yes as 1 for a number
    ("replicas-yes", "6", ["simulate", "-s", "replicas_yes.yaml"], ["deployments.0", "replicas", "got true"]),
    ("rate-true", "6", ["simulate", "-s", "rate_true.yaml"], ["rate_rps", "got true"]),
    ("yaml-bad-date", "6", ["simulate", "-s", "bad_date.yaml"], ["line 3", "not a valid date", "month"]),
    ("yaml-hex-5000-digits", "6", ["simulate", "-s", "hex_seed.yaml"], ["line 3", "5,002 characters"]),
    ("yaml-base-60-long", "6", ["simulate", "-s", "base60.yaml"], ["line 3", "100,001 characters"]),
    ("yaml-binary-model", "6", ["simulate", "-s", "binary_model.yaml"], ["line 2", "!!binary"]),
    ("json-param-nested-500", "6", ["simulate", "-s", "deep_param.json"], ["chunk_tokens", "1,001 characters"]),
    ("jsonl-int-5000-digits", "4", ["simulate", "--trace", "bigint_len.jsonl"], ["bigint_len.jsonl line 1",
                                                                                 "4,300 digits"]),
    ("csv-gz-line-3mb", "4", ["simulate", "--trace", "longline.csv.gz"], ["longline.csv.gz line 2",
                                                                          "1,048,576 characters"]),
    ("csv-column-twice", "4", ["simulate", "--trace", "dupcols.csv"], ["'prompt_tokens' appears twice"]),
    ("serve-token-nul", "5", ["serve", "--port", "0", "--token-file", "nul_token"], ["control characters"]),
    ("profile-head-dim-0", "6", ["perf", "calibrate", "--profile", "profile_head_dim_0.json", "--out", "c.json"],
     ["models.tiny", "not a multiple of num_heads"]),
    ("profile-kv-heads", "6", ["perf", "calibrate", "--profile", "profile_kv_heads.json", "--out", "c.json"],
     ["num_kv_heads (3)"]),
    ("profile-backend-empty", "6", ["perf", "validate", "--profile", "profile_backend_empty.json"],
     ["attn_decode.0.s", "String should match pattern"]),  # ('' became the default backend)
    ("eval-trace-fails-on-a-later-seed", "4", ["reproduce", "batching", "--quick", "--learner", "ppo", "--eval-trace",
                                               "three_instants.csv", "--db", "r/b.duckdb"],
     ["three_instants", "one instant"]),  # (seed 1000's segment fits, 1001's not: it failed after 153 s of training)
    ("learned-checkpoint-a-device", "6", ["simulate", "-s", "learned_devnull.yaml"],
     ["devnull.npz' is not a regular file"]),  # ("not found")
    ("report-out-proc", "5", ["report", "--db", "store.duckdb", "--out", "/proc/fleetwise-report"], ["/proc"]),
    ("calibrate-out-sys", "5", ["perf", "calibrate", "--profile", "ok.yaml", "--out", "/sys/x.json"], ["/sys"]),
    ("train-router-one-gate-run", "6", ["train", "router", "--out", "ck.npz", "--gate-seeds", "1", "--rates",
                                        "12"], ["--gate-seeds 1", "at least 2 gate runs"]),
    ("train-card-path-a-folder", "5", ["train", "router", "--out", "ckdir.npz"], ["ckdir.card.json", "folder"]),
    ("train-scaler-val-days-huge", "6", ["train", "scaler", "--out", "x.npz", "--val-days", "7-99999999999"],
     ["--val-days", "99999999999 is not one"]),
    ("scaler-param-400-digits", "6", ["simulate", "-s", "scaler_big.yaml"], ["min_zones", "2^53"]),
    ("static-replicas-bound", "6", ["simulate", "-s", "static_big.yaml"], ["replicas must be 0 to 10,000"]),
    # a third fuzzing pass (2026-12-06)
    ("retry-backoff-cap-1ms", "6", ["simulate", "-s", "backoff_tiny.yaml"], ["retry_backoff_max_s"]),
    ("workload-model-unknown", "4", ["simulate", "-s", "workload_model.yaml"], ["model", "unknown model 'nope'"]),
    ("bench-serve-under-one-call", "6", ["bench", "serve", "--rate", "1", "--duration", "0.1"],
     ["at least one call"]),
    ("gateway-backend-unclosed-ipv6", "5", ["bench", "gateway", "--backend", "http://[::1"], ["Invalid IPv6 URL"]),
    ("gateway-backend-port-range", "5", ["serve", "--gateway", "--backend", "http://127.0.0.1:99999"],
     ["Port out of range"]),
    # a fourth fuzzing pass (2026-12-07)
    ("export-out-under-a-file", "5", ["export-checkpoint", "ok.yaml", "afile/x", "--level", "router", "--policy", "rl"],
     ["afile", "is a file"]),  # (was a FileExistsError traceback, after the .zip was unpickled)
    ("export-out-unwritable", "5", ["export-checkpoint", "ok.yaml", "/proc/fleetwise-x", "--level", "router",
                                    "--policy", "rl"], ["/proc"]),
    ("export-policy-empty", "6", ["export-checkpoint", "ok.yaml", "x", "--level", "router", "--policy", ""],
     ["--policy ''", "a name"]),  # (named the temporary file)
    ("export-rule-unknown", "6", ["export-checkpoint", "ok.yaml", "x", "--level", "router", "--policy", "rl",
                                  "--rule", "least_outstanding_token"], ["--rule", "offload_greedy"]),
    ("export-zip-a-folder", "4", ["export-checkpoint", "folder.yaml", "x", "--level", "router", "--policy", "rl"],
     ["folder.yaml", "a folder"]),  # ("no such file")
    ("reproduce-db-not-duckdb", "4", ["reproduce", "allocation", "--quick", "--db", "notduckdb.duckdb"],
     ["notduckdb.duckdb", "not a valid DuckDB database"]),  # (found after the training, 15 s to minutes later)
    ("report-db-a-folder", "4", ["report", "--db", "folder.yaml"], ["folder.yaml", "a folder"]),
    ("bench-replicas-empty", "6", ["bench", "sim-speed", "--replicas", ""], ["--replicas", "at least one"]),  # (rc 0)
    ("bench-replicas-empty-item", "6", ["bench", "sim-speed", "--replicas", "4,,10"], ["an empty item"]),
    ("compare-routers-empty-item", "6", ["compare", "--routers", "round_robin,,random"], ["an empty item"]),
    ("serve-header-timeout-inf", "6", ["serve", "--header-timeout", "inf"], ["--header-timeout", "from 0.1 to 3600"]),
    ("load-above-100", "6", ["simulate", "--trace", "one.csv", "--load", "1000"], ["to 100"]),
    ("train-router-rates-1e300", "6", ["train", "router", "--out", "r.npz", "--rates", "1e300"], ["at most 1e+06"]),
    ("calibrate-out-under-a-file", "5", ["perf", "calibrate", "--profile", "ok.yaml", "--out", "afile/c.json"],
     ["afile is a file"]),  # ("folder afile does not exist")
    ("predict-does-not-fit", "6", ["perf", "predict", "--gpu", "t4", "--model", "llama-2-70b", "--decode-seqs", "8",
                                   "--decode-context", "512"], ["Llama-2-70B", "does not fit"]),  # (printed a time)
    ("diurnal-period-tiny-hung", "4", ["simulate", "-s", "diurnal_period.yaml"], ["period_h"]),
    ("servegen-gamma-shape-tiny-hung", "4", ["simulate", "-s", "servegen_gamma_tiny.yaml"], ["row 1", "Gamma shape"]),
    ("servegen-weibull-shape-overflow", "4", ["simulate", "-s", "servegen_weibull_tiny.yaml"],
     ["row 1", "Weibull shape"]),
    ("fault-target-5000-digits", "4", ["simulate", "-s", "fault_digits.yaml"], ["faults[0]", "target"]),
    ("trace-load-yes", "4", ["simulate", "-s", "load_yes.yaml"], ["load", "expected a number"]),
    ("trace-parquet", "4", ["simulate", "--trace", "rt.parquet", "-n", "20"], ["rt.parquet", "Parquet"]),
    ("sweep-timeline-bucket-huge", "5", ["sweep", "bucket_huge.yaml", "--db", "r/a.duckdb"], ["timeline_bucket_s"]),
    ("sweep-grid-no-replicas", "5", ["sweep", "grid_zero.yaml", "--db", "r/b.duckdb"], ["no replicas"]),
    ("sweep-records-folder-a-file", "5", ["sweep", "with_records.yaml", "--db", "rf/x.duckdb"], ["records", "file"]),
    ("train-router-rate-twice", "6", ["train", "router", "--out", "ck.npz", "--rates", "12,12"], ["given twice"]),
    ("report-out-empty", "5", ["report", "--db", "store.duckdb", "--out", ""], ["--out ''", "empty"]),
    ("predict-kv-beyond-capacity", "6", ["perf", "predict", "--gpu", "h100", "--model", "llama-3-8b", "--decode-seqs",
                                         "2000", "--decode-context", "100000"], ["tokens of KV cache", "that fit"]),
]


@pytest.mark.parametrize("case,section,argv,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(case, section, argv, needles, work, capsys):
    if case.startswith("report-"):
        _store_with_runs(work / "store.duckdb")
    before = _snapshot(work)
    rc, out, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    assert rc == 2, (case, rc, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("error: ")
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert _snapshot(work) == before, "something was written"


def test_every_section_has_cases():
    assert {c[1] for c in CASES} == {"4", "5", "6"} and len({c[0] for c in CASES}) == len(CASES)


# ------------------------------------------------------------------------------------------------- what must run
def test_platform_scenario_runs_with_requests(capsys):
    """`-n` on a mix workload takes its first n requests (issue 14 §4, issue 15)."""
    import json

    for argv in (["simulate", "-s", "platform", "-n", "50", "--json"],
                 ["simulate", "--scenario", "platform", "--requests", "100", "--json"]):
        rc, out, err = run_cli(argv, capsys)
        assert rc == 0, err
        s = json.loads(out)
        assert s["requests"] == int(argv[-2]) and s["completed"] + s["rejected"] == s["requests"]


def test_a_gpu_fault_on_a_replica_that_is_not_there_kills_nothing(work, capsys):
    """``r<N>`` may name a replica the scaler adds later, so it is not refused up front; when it fires on one that
    is not there it kills nothing (it was an IndexError), and a target's stray spaces are read as the check reads
    them (a fault on ' g0' passed the check and then killed nothing)."""
    import json

    plat = DEP + WL + "scaler: hpa\nplatform: {faults: [{at_s: 1, kind: gpu, target: '%s'}]}\n"
    (work / "r999.yaml").write_text(plat % "r999")
    (work / "g0.yaml").write_text(plat % " g0")
    hit = {}
    for f in ("r999.yaml", "g0.yaml"):
        rc, out, err = run_cli(["simulate", "-s", f, "--json"], capsys)
        assert rc == 0, err
        assert json.loads(out)["faults"] == 1, out
        hit[f] = json.loads(out)["fault_requests_affected"]
    assert hit["r999.yaml"] == 0 and hit["g0.yaml"] > 0, hit


def test_requests_on_a_mix_takes_its_first_requests():
    import numpy as np

    from fleetwise.scenario import build, parse_scenario

    sc = parse_scenario({"deployments": [{"model": "llama-3-8b", "gpu": "a100-80gb"}], "workload": {
        "kind": "mix", "parts": [
            {"tenant": "a", "workload": {"kind": "poisson", "rate_rps": 2, "duration_s": 600}},
            {"tenant": "b", "workload": {"kind": "poisson", "rate_rps": 5, "num_requests": 300}}]}})
    full = build(sc, 0).workload
    w = build(sc, 0, num_requests=40).workload
    assert len(w) == 40 and len(full) > 40 and np.all(np.diff(w.arrival_s) >= 0)
    assert set(w.tenants) == {"a", "b"} and w.arrival_s[-1] <= full.arrival_s[-1]


def test_duplicate_keys_in_topology_files_and_merge_keys(tmp_path):
    from fleetwise.yamlio import parse_yaml

    with pytest.raises(InputError, match="duplicate key 'a'"):
        parse_yaml("a: 1\nb: {c: 2}\na: 3\n", "x.yaml")
    with pytest.raises(InputError, match="duplicate key 'c'"):
        parse_yaml("b: {c: 2, c: 3}\n", "x.yaml")
    # a << merge may be overridden (YAML's merge-key rule), that is not a duplicate
    assert parse_yaml("base: &b {x: 1, y: 2}\nd: {<<: *b, y: 3}\n", "x.yaml")["d"] == {"x": 1, "y": 3}
    from fleetwise.worlds.torta import load_topology_file

    p = tmp_path / "topo.json"
    p.write_text('{"topology": "ring", "n": 4, "n": 5}')
    with pytest.raises(InputError, match="duplicate key 'n'"):
        load_topology_file(str(p))


def test_policy_params_checked_in_make():
    from fleetwise.policies import make

    for level, name, params, needle in [
        ("batcher", "sarathi", {"chunk_tokens": float("nan")}, "chunk_tokens"),
        ("batcher", "sarathi", {"chunk_tokens": 1.5}, "integer"),
        ("batcher", "vllm", {"max_num_seqs": 0}, "max_num_seqs"),
        ("router", "prefix_aware", {"hit_weight": float("inf")}, "hit_weight"),
        ("router", "prefix_aware", {"hit_weight": 1e308}, "between -1,000,000 and 1,000,000"),
        ("router", "prefix_aware", {"hit_weight": True}, "expected a number, got true"),
        ("batcher", "sarathi", {"chunk_tokens": False}, "expected a number, got false"),
        ("scaler", "hpa", {"tolerance": -1.0}, "tolerance"),
        ("scaler", "hpa", {"target": "x"}, "target"),
    ]:
        with pytest.raises(InputError, match=needle):
            make(level, name, params)
    assert make("batcher", "sarathi", {"chunk_tokens": 256}).chunk_tokens == 256


def test_full_disk_reports_the_real_error_and_keeps_stored_rows(tmp_path, monkeypatch):
    """A COMMIT that fails for lack of space ends the transaction (as DuckDB does), so the ROLLBACK after it
    fails too: the error shown must be the disk's, and what was stored before stays readable."""
    import duckdb

    from fleetwise.experiments.runner import run_sweep
    from fleetwise.experiments.spec import expand, parse_experiment
    from fleetwise.experiments.store import Store

    (tmp_path / "ok.yaml").write_text(DEP + WL)
    spec = parse_experiment({"name": "e", "scenarios": [str(tmp_path / "ok.yaml")],
                             "policies": {"router": ["round_robin"]}, "seeds": 4})
    runs = expand(spec)
    store = Store(tmp_path / "r.duckdb")
    run_sweep(runs[:2], store, workers=1)
    real = Store._connect

    class FullDisk:
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *a):
            if sql == "COMMIT":
                self.con.execute("ROLLBACK")
                raise duckdb.TransactionException('Failed to commit: Could not write file "r.duckdb.wal": '
                                                  "No space left on device")
            return self.con.execute(sql, *a)

        def __getattr__(self, k):
            return getattr(self.con, k)

    monkeypatch.setattr(Store, "_connect", lambda self, read_only=False: FullDisk(real(self, read_only)))
    with pytest.raises(InputError) as e:
        run_sweep(runs[2:], store, workers=1)
    assert "No space left on device" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setattr(Store, "_connect", real)
    assert Store(tmp_path / "r.duckdb").count() == 2


def _small_tmpfs(path: Path) -> bool:
    path.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def test_full_disk_on_a_real_small_filesystem(tmp_path):
    """The same on a 2 MB tmpfs (where the test may mount one): a first sweep stores its runs, a file fills the
    rest of the disk, a second sweep fails with one line naming ENOSPC, exit 2, and the first runs stay."""
    fs = tmp_path / "fs"
    if not _small_tmpfs(fs):
        pytest.skip("cannot mount a tmpfs here")
    try:
        (tmp_path / "ok.yaml").write_text(DEP + WL)
        for name, seeds in (("a", 3), ("b", 3)):
            (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nscenarios: [{tmp_path / 'ok.yaml'}]\n"
                                                   f"seeds: {seeds}\npolicies: {{router: [round_robin]}}\n")
        db = str(fs / "x.duckdb")
        assert cli("sweep", str(tmp_path / "a.yaml"), "--db", db, "--workers", "1", cwd=tmp_path).returncode == 0
        st = os.statvfs(fs)
        with open(fs / "filler", "wb") as f:  # leave a few KB: the next commit's WAL does not fit
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - 8192))
        p = cli("sweep", str(tmp_path / "b.yaml"), "--db", db, "--workers", "1", cwd=tmp_path)
        _one_line_exit_2(p, "No space left on device")
        (fs / "filler").unlink()
        from fleetwise.experiments.store import Store

        assert Store(db).count() == 3
    finally:
        subprocess.run(["umount", str(fs)], capture_output=True, timeout=30)


# ----------------------------------------------------------------------------------- the real entry point
def cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "fleetwise", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def _one_line_exit_2(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("argv,needles", [
    (["simulate", "-s", "latin1.yaml"], ["not UTF-8"]),
    (["simulate", "--trace", "truncated.csv.gz"], ["truncated"]),  # was exit 130 with an empty line
    (["simulate", "--requests", "1000000000000"], ["--requests"]),
    (["sweep", "grid_inf.yaml", "--db", "r/x.duckdb"], ["rate_rps=inf"]),
], ids=["not-utf8", "truncated-gz", "requests-1e12", "grid-inf"])
def test_subprocess_exit_status(argv, needles, tmp_path):
    _files(tmp_path)
    before = _snapshot(tmp_path)
    _one_line_exit_2(cli(*argv, cwd=tmp_path), *needles)
    assert _snapshot(tmp_path) == before


def test_port_in_use_is_one_line_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _one_line_exit_2(cli("serve", "--port", str(port), cwd=tmp_path), str(port), "in use")


def test_writers_replace_a_file_or_a_link_but_never_a_device_or_a_pipe(tmp_path):
    """An output path is written by renaming a temporary file over it (nothing half-written): a regular file or a
    symbolic link is replaced (the link itself, not what it points to); a device or a pipe is refused, since as
    root the rename would replace ``/dev/null`` itself with a file."""
    import stat

    from fleetwise.cli import _write_atomic
    from fleetwise.errors import check_replaceable

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.yaml"
    link.symlink_to(fifo)
    check_replaceable(tmp_path / "absent.json")
    (tmp_path / "f.json").write_text("{}")
    check_replaceable(tmp_path / "f.json")
    for bad in (fifo, Path("/dev/null")):
        with pytest.raises(InputError, match="not a regular file"):
            check_replaceable(bad)
    with pytest.raises(InputError, match="not a regular file"):
        _write_atomic(fifo, b"x")
    _write_atomic(link, b"x")  # the link is replaced by the file; the pipe it pointed to is left as it was
    assert link.read_bytes() == b"x" and not link.is_symlink()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_config_file_over_the_size_bound_or_not_a_regular_file_is_one_line(tmp_path, monkeypatch):
    from fleetwise import yamlio
    from fleetwise.scenario import load_scenario

    f = tmp_path / "big.yaml"
    f.write_text("name: x\n" + "# padding\n" * 200)
    monkeypatch.setattr(yamlio, "MAX_FILE_BYTES", 1000)
    with pytest.raises(InputError, match="big.yaml: larger than 0 MiB, the limit for a scenario file"):
        load_scenario(str(f))
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)  # (a writer holds it open, so that opening it to read does not block)
    try:
        with pytest.raises(InputError, match="pipe.yaml: not a regular file"):
            yamlio.read_text(fifo, "scenario")
    finally:
        os.close(fd)


def test_a_cpu_trace_folder_unreadable_or_too_large_is_one_input_error(tmp_path, monkeypatch):
    """``--eval-trace FOLDER`` of reproduce allocation is read recursively: a folder that cannot be walked (``/``:
    /proc/1/cwd) and one with more files than ``limits.MAX_TRACE_FILES`` are one line each, before any reading."""
    from fleetwise import limits
    from fleetwise.workload import cpu

    for i in range(5):
        (tmp_path / f"vm{i}.txt").write_text("10\n20\n30\n")
    assert len(cpu.read_cpu_traces(tmp_path)) == 5
    monkeypatch.setattr(limits, "MAX_TRACE_FILES", 3)
    with pytest.raises(InputError, match="more than 3 files"):
        cpu.read_cpu_traces(tmp_path)
    monkeypatch.undo()

    def denied(self, pattern):
        raise PermissionError(13, "Permission denied", str(self / "proc"))

    monkeypatch.setattr(Path, "rglob", denied)
    with pytest.raises(InputError, match="cannot read the folder .Permission denied"):
        cpu.read_cpu_traces(tmp_path)


def test_a_folder_named_like_a_builtin_scenario_does_not_hide_it(tmp_path, monkeypatch):
    """reproduce platform writes its checkpoints under ``platform/`` beside the store; a folder of a built-in
    scenario's name in the working directory is not a scenario file, so the name still loads the built-in."""
    from fleetwise.scenario import load_scenario

    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").mkdir()
    assert load_scenario("default") == load_scenario(None)
    with pytest.raises(InputError, match="a folder, not a scenario file"):
        load_scenario(str(tmp_path / "default"))  # (a path to a folder, not a built-in's name, is still an error)


def test_a_servegen_rate_scale_past_the_request_bound_is_refused_before_drawing(tmp_path, capsys):
    """``rate_scale: 1e30`` on a ServeGen workload asked numpy for ~1e31 gaps (a ValueError traceback); the expected
    arrivals are now checked against the request bound before any is drawn."""
    from fleetwise.data import data_path

    if not data_path("servegen-alibaba-modelstudio").exists():
        pytest.skip("ServeGen data not available")
    (tmp_path / "sg.yaml").write_text(DEP + "workload: {kind: servegen, servegen_model: m-large, start_s: 0, "
                                            "end_s: 3600, rate_scale: 1.0e+30}\n")
    rc, out, err = run_cli(["simulate", "-s", str(tmp_path / "sg.yaml"), "-n", "30"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "arrivals" in err and "10,000,000" in err and "rate_scale" in err


def test_a_servegen_window_past_its_recorded_days_is_refused(tmp_path, capsys):
    """A ServeGen window that starts after its 14 recorded days drew no request and ran, printing a summary of
    nothing; it is one line and exit 2 now."""
    from fleetwise.data import data_path

    if not data_path("servegen-alibaba-modelstudio").exists():
        pytest.skip("ServeGen data not available")
    (tmp_path / "sg.yaml").write_text(DEP + "workload: {kind: servegen, servegen_model: m-large, "
                                            "start_s: 30000000, end_s: 30000001}\n")
    rc, out, err = run_cli(["simulate", "-s", str(tmp_path / "sg.yaml")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "start_s 3e+07 is past the end of its recorded rates" in err


def test_report_on_a_damaged_store_is_one_line_and_writes_nothing(work, capsys):
    """A store with a column dropped, or text that is not JSON where parameters go, made `report` print a DuckDB
    or JSON traceback after drawing some PNGs (found by fuzzing, 2026-12-06)."""
    import duckdb

    for name, sql in (("dropped", "ALTER TABLE runs DROP COLUMN seed"),
                      ("badjson", "UPDATE runs SET params = '{not json'")):
        db = work / f"{name}.duckdb"
        _store_with_runs(db)
        con = duckdb.connect(str(db))
        con.execute(sql)
        con.close()
        rc, out, err = run_cli(["report", "--db", str(db), "--out", str(work / f"rep_{name}")], capsys)
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert "not a results store this version can" in err  # (read: a column dropped; report on: bad JSON)
        assert not (work / f"rep_{name}").exists()


def test_numbers_written_as_yaml_1_1_strings_are_numbers_to_a_policy(work, capsys):
    """PyYAML reads ``1e3`` (no dot) as a string: the registry checked it as a number and passed the text on, and
    ``prefix_aware`` compared a string with 0 mid-run (a traceback); ``1e999`` passed as text, not as infinity."""
    from fleetwise.policies import make

    assert make("router", "prefix_aware", {"hit_weight": "1e3"}).hit_weight == 1000.0
    with pytest.raises(InputError, match="hit_weight"):
        make("router", "prefix_aware", {"hit_weight": "1e999"})
    (work / "pa.yaml").write_text(DEP + WL + "router: {name: prefix_aware, hit_weight: 1e3}\n")
    rc, out, err = run_cli(["simulate", "-s", "pa.yaml", "--json"], capsys)
    assert rc == 0, err


def test_a_sweep_with_a_timeline_whose_runs_serve_nothing_stores_them(work, capsys):
    """Every request rejected (max_waiting: 0) left no timeline bucket, and DuckDB refused the empty insert: the
    sweep failed with a traceback, and again on every rerun."""
    import json

    (work / "rej.yaml").write_text(DEP + WL + "options: {max_waiting: 0}\n")
    (work / "rej_exp.yaml").write_text("name: rej\nscenarios: [rej.yaml]\nseeds: 2\ntimeline_bucket_s: 1\n")
    rc, out, err = run_cli(["sweep", "rej_exp.yaml", "--db", "r/rej.duckdb", "--workers", "1"], capsys)
    assert rc == 0 and "Traceback" not in err, err
    from fleetwise.cli import _jsonable

    assert json.dumps(_jsonable({"5": {"ttft_p50_s": float("nan"), "x": [float("nan"), 1.0]}})) == \
        '{"5": {"ttft_p50_s": null, "x": [null, 1.0]}}'  # (bench sim-speed --json printed NaN)



def test_the_policy_api_names_a_bad_level_name_or_params():
    """``make("nope", ...)`` and ``names("nope")`` were a bare KeyError; a list as the name was "unhashable", a
    string as params a dict-update error (found by fuzzing the Python API, 2026-12-06)."""
    from fleetwise.policies import make, names

    with pytest.raises(InputError, match="unknown decision level 'nope'; expected one of: allocator"):
        make("nope", "x")
    with pytest.raises(InputError, match="unknown decision level"):
        names("nope")
    with pytest.raises(InputError, match="expected a string"):
        make("router", ["round_robin"])
    with pytest.raises(InputError, match="expected a mapping"):
        make("router", "round_robin", "x")


def test_the_run_api_names_a_wrong_argument_in_one_line():
    """``fleetwise.simulate`` / ``run_scenario`` with an argument of the wrong type failed deep in the build
    (``simulate(None)``: AttributeError 'seed'; ``router=5``: a multi-line pydantic error; ``workload="x"``:
    AttributeError 'block_tokens'; ``num_requests="10"``: a comparison TypeError), and the reproductions' Python
    ``run(seeds=0)`` ran nothing (found by fuzzing the Python API, 2026-12-06). A scenario may be given by name."""
    import fleetwise
    from fleetwise.reproduce.platform import run as platform_run
    from fleetwise.reproduce.torta import run as torta_run

    records, summary = fleetwise.simulate("default", num_requests=20)  # by name, as load_scenario takes it
    assert len(records) == 20
    sc = fleetwise.load_scenario("default")
    for kwargs, needle in [
        ({"router": 5}, "router=5: expected a router name"),
        ({"batcher": ["vllm"]}, "batcher=['vllm']: expected a batcher name"),
        ({"router": {"params": {}}}, "name: Field required"),
        ({"num_requests": "10"}, "num_requests '10': expected an integer"),
        ({"workload": "azure-conv"}, "workload str: expected a fleetwise.workload.Workload"),
        ({"progress": 5}, "progress 5: expected a callable"),
        ({"progress": lambda: None}, "progress '<lambda>': expected a callable of one argument"),
    ]:
        with pytest.raises(InputError, match=re.escape(needle)):
            fleetwise.simulate(sc, **kwargs)
    with pytest.raises(InputError, match="scenario NoneType: expected a Scenario"):
        fleetwise.simulate(None)
    with pytest.raises(InputError, match=re.escape("on_built '<lambda>': expected a callable of one argument")):
        fleetwise.run_scenario(sc, on_built=lambda a, b: None, num_requests=10)
    with pytest.raises(InputError, match=re.escape("sim_overrides ['nope']")):
        fleetwise.run_scenario(sc, sim_overrides={"nope": 1}, num_requests=10)
    # values too: a negative timeline bucket hung the run, NaN failed mid-run, a negative horizon rejected every
    # request; an option the scenario sets (max_waiting) was a duplicate-keyword TypeError and now overrides it
    for over, needle in [({"timeline_bucket_s": -1.0}, "timeline_bucket_s -1.0"),
                         ({"timeline_bucket_s": float("nan")}, "timeline_bucket_s nan"),
                         ({"max_time_s": -1.0}, "max_time_s -1.0"), ({"retry_backoff_s": 0}, "retry_backoff_s 0")]:
        with pytest.raises(InputError, match=re.escape(f"sim_overrides: {needle}")):
            fleetwise.run_scenario(sc, sim_overrides=over, num_requests=10)
    assert fleetwise.run_scenario(sc, sim_overrides={"max_waiting": 0}, num_requests=10).summary["rejected"] > 0
    with pytest.raises(InputError, match="scaler=5"):
        fleetwise.run_scenario(sc, scaler=5, num_requests=10)
    with pytest.raises(InputError, match="scenario 5: expected"):
        fleetwise.load_scenario(5)
    with pytest.raises(InputError, match=re.escape("seeds=0: expected an integer from 1 to 1,000")):
        platform_run(quick=True, seeds=0)
    with pytest.raises(InputError, match=re.escape("train_seeds=-1")):
        torta_run(quick=True, train_seeds=-1)
    with pytest.raises(InputError, match=re.escape("workers=True")):
        torta_run(quick=True, workers=True)
    # the other arguments, before any work (found by fuzzing, 2026-12-06: db="/proc/x" failed after training,
    # topologies=5 and cem=5 were TypeErrors inside, scalers=["nosuch"] was dropped and then crashed)
    for run, kw, needle in [(torta_run, {"topologies": 5}, "topologies=5"), (torta_run, {"cem": 5}, "cem=5"),
                            (torta_run, {"load": "abc"}, "load='abc'"), (torta_run, {"address": "h:1"}, "address"),
                            (platform_run, {"scalers": ["nosuch"]}, "'nosuch' is not one of"),
                            (platform_run, {"window": (5, 1)}, "window=(5, 1)"), (platform_run, {"db": 5}, "db=5"),
                            (platform_run, {"db": "/proc/fleetwise-x/r.duckdb"}, "/proc")]:
        with pytest.raises(InputError, match=re.escape(needle)):
            run(quick=True, progress=False, **kw)


def test_a_db_that_is_not_a_fleetwise_store_is_left_as_it_is(tmp_path):
    """Found by fuzzing, 2026-12-06: a DuckDB file with other tables got the store's columns and tables added, then
    a traceback; a corrupt store (a checksum error) was a 48-line traceback; a SQLite file made DuckDB try to
    download an extension. Each is one line now, and the file is not changed."""
    import hashlib
    import sqlite3

    import duckdb

    from fleetwise.experiments.store import Store

    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE runs (x INTEGER)")
    con.close()
    before = hashlib.sha256(foreign.read_bytes()).hexdigest()
    with pytest.raises(InputError, match="not a fleetwise results store"):
        Store(foreign)
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == before
    good = tmp_path / "good.duckdb"
    Store(good)
    data = bytearray(good.read_bytes())
    data[5000:8000] = b"\xff" * 3000
    (tmp_path / "garbled.duckdb").write_bytes(bytes(data))
    lite = tmp_path / "lite.duckdb"
    sqlite3.connect(str(lite)).execute("CREATE TABLE t (x)").connection.commit()
    for name in ("garbled.duckdb", "lite.duckdb"):
        with pytest.raises(InputError, match="cannot open results store"):
            Store(tmp_path / name)


def test_a_foreign_database_is_refused_before_any_work_and_left_as_it_is(work, capsys):
    """Found by fuzzing, 2026-12-07: `report` on a DuckDB file of another program wrote an empty report (rc 0), and
    `reproduce` found it only after training (15 s to minutes later); each is one line now, before any work."""
    import hashlib

    import duckdb

    foreign = work / "other.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE foo (a INTEGER)")
    con.close()
    before = hashlib.sha256(foreign.read_bytes()).hexdigest()
    for argv in (["report", "--db", "other.duckdb", "--out", "rep"],
                 ["reproduce", "allocation", "--quick", "--db", "other.duckdb"]):
        rc, out, err = run_cli(argv, capsys)
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert "not a fleetwise results store (tables: foo)" in err, err
    assert not (work / "rep").exists() and not (work / "results").exists()
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == before


def test_a_sweep_that_stores_nothing_leaves_no_store_it_made(work, capsys):
    """Found by fuzzing, 2026-12-07: a sweep whose Ray cluster could not be reached said so in one line and left a
    new, empty store behind. (No cluster is started: port 1 on loopback refuses the connection.)"""
    pytest.importorskip("ray")
    (work / "exp.yaml").write_text("name: t\nscenarios: [default]\nseeds: 1\nrequests: 20\n")
    rc, out, err = run_cli(["sweep", "exp.yaml", "--backend", "ray", "--address", "127.0.0.1:1", "--db", "n.duckdb"],
                           capsys)
    assert rc == 2 and "cannot reach a Ray cluster" in err, err
    assert not list(work.glob("n.duckdb*"))


def test_errors_name_their_file_once(tmp_path, capsys):
    """A profile that cannot be fitted names its file (it said "the profile needs at least 5 gemm rows"); a
    policy's own message is not prefixed with its name twice ("router 'learned': router 'learned': ...")."""
    import json

    from fleetwise.data import data_dir
    from fleetwise.policies import make

    root = data_dir(required=False)
    h200 = root / "h200-operator-timings" / "h200-ops-2026-11-30.json" if root else None
    if h200 is not None and h200.is_file():  # (without the data, the file-naming half is not checked)
        src = json.loads(h200.read_text())
        few = tmp_path / "few.json"
        few.write_text(json.dumps(dict(src, gemm=src["gemm"][:3])))
        for argv in (["perf", "validate", "--profile", str(few)],
                     ["perf", "calibrate", "--profile", str(few), "--out", str(tmp_path / "c.json")]):
            rc, out, err = run_cli(argv, capsys)
            assert rc == 2 and f"{few}: the profile needs at least 5 gemm rows" in err, err
        assert not (tmp_path / "c.json").exists()
    with pytest.raises(InputError) as e:
        make("router", "learned", {"checkpoint": str(tmp_path / "none.npz")}, where="route policy: ")
    assert str(e.value).count("router 'learned'") == 1, e.value


# ------------------------------------------------------------------------------------------- the Python API, again
def _api_cases():
    """(case id, call, words of the one-line error): a fuzzing pass of the Python API, 2026-12-07. Each was a hang,
    a silent wrong result or an error from deep inside (named in the comment)."""
    import numpy as np

    from fleetwise.control.checkpoint import load_policy, read_card
    from fleetwise.perf.model import PerfModel
    from fleetwise.workload import Workload, build_workload, diurnal_arrivals, poisson_arrivals
    from fleetwise.workload.synthetic import LognormalLengths, clip_total_tokens

    rng = np.random.default_rng(0)

    def wl(**kw):
        base = dict(arrival_s=[0.5, 1.0], prompt_tokens=[100, 100], output_tokens=[5, 5])
        base.update(kw)
        return Workload(**{k: np.asarray(v) for k, v in base.items()})

    def run(w):
        import fleetwise

        fleetwise.simulate(fleetwise.load_scenario("default"), seed=1, workload=w)

    return [
        ("diurnal-nan-hour", lambda: diurnal_arrivals(rng, 5.0, peak_hour_local=float("nan"), num_requests=10),
         ["peak_hour_local", "finite"]),  # (never returned)
        ("workload-arrival-negative", lambda: run(wl(arrival_s=[-100.0, 1.0])), ["arrival_s[0]"]),  # (vanished)
        ("workload-arrival-nan", lambda: run(wl(arrival_s=[float("nan"), 1.0])), ["arrival_s[0]"]),
        ("workload-unsorted", lambda: run(wl(arrival_s=[2.0, 1.0])), ["sorted"]),
        ("workload-output-negative", lambda: run(wl(output_tokens=[-50, 5])), ["output_tokens[0]"]),  # (-3,651 tok/s)
        ("workload-prompt-zero", lambda: run(wl(prompt_tokens=[0, 5])), ["prompt_tokens[0]"]),
        ("workload-model-code", lambda: run(wl(model=[7, 0])), ["model[0]", "models"]),  # (an IndexError)
        ("workload-empty", lambda: run(wl(arrival_s=[], prompt_tokens=[], output_tokens=[])), ["no request"]),
        ("poisson-span-huge", lambda: poisson_arrivals(rng, 5, duration_s=1e12), ["duration_s", "366 days"]),
        ("poisson-count-huge", lambda: poisson_arrivals(rng, 5, num_requests=10**10), ["num_requests"]),  # (MemoryError)
        ("poisson-rng-none", lambda: poisson_arrivals(None, 5, num_requests=10), ["rng", "Generator"]),
        ("build-workload-missing-field", lambda: build_workload({"kind": "poisson"}, rng), ["rate_rps"]),  # (pydantic)
        ("build-workload-a-string", lambda: build_workload("poisson", rng), ["expected a mapping"]),
        ("lognormal-nan-mu", lambda: LognormalLengths(float("nan"), 1, 5, 1), ["prompt_mu"]),  # (prompts of -2^63)
        ("lognormal-min-zero", lambda: LognormalLengths(1, 1, 5, 1, prompt_min=0), ["prompt_min"]),
        ("clip-shapes", lambda: clip_total_tokens(np.array([5, 6]), np.array([5]), 4), ["2 prompts and 1 outputs"]),
        ("perf-model-none", lambda: PerfModel(None, "llama-3-8b"), ["PerfModel gpu"]),  # (an AttributeError)
        ("perf-breakdown-nan", lambda: PerfModel("a100-80gb", "llama-3-8b").iteration_breakdown(float("nan"), 0, 0, 0),
         ["whole numbers"]),
        ("load-policy-none", lambda: load_policy(None), ["expected a path"]),  # (a TypeError)
        ("read-card-none", lambda: read_card(None), ["expected a path"]),
    ]


@pytest.mark.parametrize("case,call,needles", _api_cases(), ids=[c[0] for c in _api_cases()])
def test_python_api_bad_input_is_one_input_error(case, call, needles):
    with pytest.raises(InputError) as e:
        call()
    assert "\n" not in str(e.value)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_environments_refuse_what_they_cannot_take_and_go_on():
    """Autoscaling-v0: a refused answer left the episode stuck ("no decision pending" at every later step); NaN and
    out-of-range actions were cast and clamped with no flag; an infinite multiplier gave infinite rewards. The
    other environments' configs and options, and a loaded policy's observations, named as well."""
    import numpy as np

    from fleetwise.control.checkpoint import load_policy
    from fleetwise.envs.autoscaling import AutoscalingConfig, AutoscalingEnv
    from fleetwise.envs.torta import TortaEnv
    from fleetwise.policies.allocation_model import AllocationConfig
    from fleetwise.policies.routers_learned import packaged_checkpoint
    from fleetwise.worlds.edge import EdgeConfig

    env = AutoscalingEnv()
    env.reset(seed=0)
    key = env.scale_obs.groups[0].key
    for bad in ({key: -5}, {key: float("nan")}, {key: "x"}, [1]):
        with pytest.raises(InputError, match="scaler answered"):
            env.step_targets(bad)
    assert np.isfinite(env.step(env.rule_action())[1])  # the episode goes on
    for bad in (np.full(4, np.nan), np.full(4, 99), np.array([2, 2])):
        with pytest.raises(ValueError, match="expected integers of shape"):
            env.step(bad)
    with pytest.raises(InputError, match="lambda"):
        env.set_lambda(float("inf"))
    for kw in ({"cost_scale_usd_per_hour": float("nan")}, {"deltas": (float("nan"),)}, {"on_demand_floor": -1},
               {"max_groups": 2.5}):
        with pytest.raises(InputError, match=f"AutoscalingConfig.{next(iter(kw))}"):
            AutoscalingConfig(**kw)
    with pytest.raises(InputError, match="expected an AutoscalingConfig"):
        AutoscalingEnv(config={})
    with pytest.raises(ValueError, match="expected a TortaConfig"):
        TortaEnv(config={"load": 5})
    for cs in ((), (0,), "512"):
        with pytest.raises(ValueError, match="EdgeConfig.chunk_sizes"):
            EdgeConfig(chunk_sizes=cs)
    with pytest.raises(InputError, match="weights"):
        AllocationConfig(weights=(float("nan"),) * 6)
    pol = load_policy(packaged_checkpoint())
    with pytest.raises(InputError, match="NaN or infinity"):
        pol.predict(np.full(pol.obs_shape, np.nan))


def test_names_and_paths_are_text_not_console_markup(work, capsys):
    """A fuzzing audit, 2026-12-07: a scenario named "x [/foo]" failed the table title with a MarkupError after the
    run, and "[baseline]" in a name vanished from it."""
    (work / "mk.yaml").write_text('name: "x [/foo] [baseline] v2"\n' + DEP + WL)
    rc, out, err = run_cli(["simulate", "-s", "mk.yaml"], capsys)
    assert rc == 0, err
    assert "x [/foo] [baseline] v2" in out.replace("\n", " ") or "[baseline]" in out


def test_an_output_file_that_is_a_folder_is_refused_before_the_report_and_the_run(work, capsys):
    _store_with_runs(work / "store.duckdb")
    (work / "rep" / "index.html").mkdir(parents=True)
    rc, out, err = run_cli(["report", "--db", "store.duckdb", "--out", "rep"], capsys)
    assert rc == 2 and "index.html" in err and "folder" in err
    assert sorted(p.name for p in (work / "rep").iterdir()) == ["index.html"]  # no index.html.tmp, no PNG
    (work / "mon" / "monitor.png").mkdir(parents=True)
    rc, out, err = run_cli(["simulate", "-s", "platform", "-n", "50", "--monitor", "mon"], capsys)
    assert rc == 2 and "monitor.png" in err
    assert sorted(p.name for p in (work / "mon").iterdir()) == ["monitor.png"]


def test_compare_on_a_workload_that_draws_nothing_says_so_in_one_line(work, capsys):
    """compare and sweep printed a summary of nothing, exit 0 (only simulate refused it)."""
    (work / "tiny.yaml").write_text(DEP + "workload: {kind: poisson, rate_rps: 1.0e-9, duration_s: 1}\n")
    rc, out, err = run_cli(["compare", "-s", "tiny.yaml", "--seeds", "2", "--workers", "1"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "drew no request" in err and "InputError" not in err, err
