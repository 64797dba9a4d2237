"""docs/tutorial.md's six commands, run as written but on small inputs (fewer requests, seeds and iterations)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "tutorial.md").read_text(encoding="utf-8")

# (the command as the tutorial writes it, what the test changes to keep it small)
STEPS = [
    ("fleetwise simulate --trace azure-conv --load 0.7 -n 2000 --records requests.csv", [("-n 2000", "-n 300")]),
    ("fleetwise compare --trace azure-conv --load 0.7 --routers least_outstanding_tokens,power_of_two,round_robin "
     "--seeds 3 -n 2000", [("--seeds 3 -n 2000", "--seeds 2 -n 300 --workers 1")]),
    ("fleetwise train router --trace azure-conv --out checkpoints/my-router.npz --iterations 3 --population 6 "
     "--elite 2 --requests 1000",
     [("--iterations 3 --population 6 --elite 2 --requests 1000",
       "--iterations 1 --population 2 --elite 1 --requests 200 --rates 0.7 --train-seeds 1 --val-seeds 2")]),
    ("fleetwise sweep tutorial.yaml --db results/tutorial.duckdb", [("sweep", "sweep --workers 1")]),
    ("fleetwise report --db results/tutorial.duckdb --out results/tutorial-report", []),
]
SERVE = "fleetwise serve --port 8000 --router learned &"  # the shipped router: the tutorial's is refused by its gate


def _yaml_block() -> str:
    return DOC.split("with `tutorial.yaml`:\n\n```yaml\n")[1].split("```")[0]


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    args = cmd.split()
    assert args[0] == "fleetwise"
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="120")
    return subprocess.run([sys.executable, "-m", "fleetwise", *args[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_doc_shows_every_command():
    for cmd, _ in STEPS:
        assert cmd in DOC.replace("\\\n", ""), cmd
    assert SERVE in DOC and "/v1/route" in DOC


def test_the_tutorial_runs_on_small_inputs(tmp_path, data_dir):
    pytest.importorskip("fastapi")
    (tmp_path / "tutorial.yaml").write_text(_yaml_block().replace("requests: 2000", "requests: 200")
                                            .replace("seeds: 3", "seeds: 2")
                                            .replace("workload.load: [0.5, 0.7, 0.9]", "workload.load: [0.7]"))
    outs = []
    for cmd, changes in STEPS:
        for a, b in changes:
            cmd = cmd.replace(a, b)
        r = _run(cmd, tmp_path)
        assert r.returncode == 0, f"{cmd}\n{r.stderr[-3000:]}"
        outs.append(r.stdout + r.stderr)
    assert "load 0.7:" in outs[0] and (tmp_path / "requests.csv").stat().st_size > 0
    assert "least_outstanding_tokens" in outs[1] and "Δ TTFT p99" in outs[1]
    assert "gate (" in outs[2] and (tmp_path / "checkpoints" / "my-router.card.json").is_file()
    card = json.loads((tmp_path / "checkpoints" / "my-router.card.json").read_text())
    assert card["rule"] == "least_outstanding_tokens" and isinstance(card["validation"]["passed"], bool)
    assert "learned(checkpoint=checkpoints/my-router.npz)" in outs[3]
    page = (tmp_path / "results" / "tutorial-report" / "index.html").read_text(encoding="utf-8")
    assert 'least_outstanding_tokens <span class="pm">(baseline)</span>' in page  # the spec's, kept in the store

    # 6: a checkpoint that did not pass its gate is refused; serve the shipped learned router (loopback) and ask it
    # for a decision
    if not card["validation"]["passed"]:
        r = _run("fleetwise serve --port 1 --router learned?checkpoint=checkpoints/my-router.npz", tmp_path)
        assert r.returncode != 0 and "did not pass its deployment gate" in r.stderr, r.stderr
    port = _free_port()
    args = SERVE.rstrip(" &").replace("--port 8000", f"--port {port}").split()
    proc = subprocess.Popen([sys.executable, "-m", "fleetwise", *args[1:]], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(proc.stderr.read())
                time.sleep(0.1)
        body = json.dumps({"prompt_tokens": 812, "replicas": [
            {"id": "r0", "outstanding_requests": 4, "outstanding_tokens": 5200, "waiting": 2, "kv_used_fraction": 0.41},
            {"id": "r1", "outstanding_requests": 9, "outstanding_tokens": 4900, "waiting": 6,
             "kv_used_fraction": 0.35}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/route", data=body,
                                     headers={"content-type": "application/json"})
        got = json.loads(urllib.request.urlopen(req, timeout=10).read())
        assert got["policy"] == "learned" and got["replica_id"] in ("r0", "r1")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
