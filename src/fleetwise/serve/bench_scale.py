"""``fleetwise bench scale``: how ``POST /v1/scale`` grows with the number of scaling groups (docs/serve.md).

For each size, one model's groups spread over 50 zones, on-demand and spot, 1-4 replicas each: the whole request
through ``fleetwise serve`` in a subprocess on loopback (wall time, median of ``repeat``), and in this process the
two parts of it: parsing and validating the body (the service's msgspec path, ``serve/scale_wire.py``, and
pydantic's for comparison), and the scaler's decision (``ScalePolicy.scale``, which includes
``split_replicas``), both as CPU time (the machine's load average is printed: on a shared machine wall time is not
the cost).
"""

from __future__ import annotations

import json
import os
import statistics
import time

from fleetwise.serve.schemas import SCALE_EXAMPLE


def scale_body(n: int, zones: int = 50) -> dict:
    """A ``/v1/scale`` body with ``n`` groups of one model (deterministic)."""
    base = SCALE_EXAMPLE["groups"][0]
    groups = []
    for i in range(n):
        g = dict(base)
        g.update(key=f"llama-8b/g{i}", zone=f"z{i % zones}", pool="spot" if i % 3 == 0 else "on_demand",
                 price_usd_per_hour=1.0 + (i * 7919 % 1000) / 1000.0, ready=1 + i % 4, starting=0,
                 max_replicas=8, capacity_rps=2.0 + (i % 5) * 0.5, arrivals_rps=0.5 * n, waiting=n // 10)
        groups.append(g)
    return {"time_s": 3600.0, "epoch_s": 60.0, "groups": groups}


def as_columns(body: dict) -> dict:
    """The same body with its groups as columns (field -> one value per group)."""
    groups = body["groups"]
    return {"time_s": body["time_s"], "epoch_s": body["epoch_s"],
            "columns": {k: [g[k] for g in groups] for k in groups[0]}}


def _cpu_ms(f, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.process_time()
        f()
        ts.append(time.process_time() - t0)
    return 1e3 * statistics.median(ts)


def _service(port: int, scaler: str, token: str):
    """``fleetwise serve`` in a subprocess (as deployed), ready."""
    import subprocess
    import sys

    import httpx

    env = {**os.environ, "FLEETWISE_SERVE_TOKEN": token}
    proc = subprocess.Popen([sys.executable, "-m", "fleetwise", "serve", "--port", str(port), "--scaler", scaler,
                             "--max-body-bytes", str(16 << 20)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"fleetwise serve exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("fleetwise serve did not become ready in 60 s")


def run(groups: list[int], scaler: str = "slo_aware", repeat: int = 5, columns: bool = False) -> list[dict]:
    import httpx

    from fleetwise.serve.adapters import load_scale_policy
    from fleetwise.serve.localbackends import free_port
    from fleetwise.serve.scale_wire import decode_scale
    from fleetwise.serve.schemas import ScaleRequest

    token = "bench-token-0123456789"
    port = free_port()
    proc = _service(port, scaler, token)
    rows = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600,
                          headers={"authorization": f"Bearer {token}", "content-type": "application/json"}) as h:
            for n in groups:
                body = scale_body(n)
                raw = json.dumps(as_columns(body) if columns else body).encode()
                walls = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    r = h.post("/v1/scale", content=raw)
                    walls.append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        raise RuntimeError(f"/v1/scale with {n} groups: HTTP {r.status_code}: {r.text[:300]}")
                obs = decode_scale(raw)
                pol = load_scale_policy(scaler)
                rows.append({"groups": n, "body_mb": len(raw) / 1e6, "request_ms": 1e3 * statistics.median(walls),
                             "parse_cpu_ms": _cpu_ms(lambda: decode_scale(raw), repeat),
                             "pydantic_parse_cpu_ms": _cpu_ms(lambda: ScaleRequest.model_validate_json(raw), repeat),
                             "decide_cpu_ms": _cpu_ms(lambda: pol.decide(obs), repeat),
                             "replicas": sum(r.json()["targets"].values()), "scaler": scaler,
                             "body": "columns" if columns else "groups",
                             "load_avg": os.getloadavg()[0], "cpus": os.cpu_count()})
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def render(rows: list[dict]) -> str:
    lines = [f"POST /v1/scale, scaler {rows[0]['scaler']}, groups as {rows[0]['body']} (median of runs; CPU ms: "
             f"this process's CPU time; "
             f"load average {rows[-1]['load_avg']:.1f} on {rows[-1]['cpus']} CPUs)",
             "| groups | body MB | request ms (wall) | parse + validate ms (CPU; pydantic) | decision ms (CPU) |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['groups']:,} | {r['body_mb']:.2f} | {r['request_ms']:.1f} | {r['parse_cpu_ms']:.1f} "
                     f"({r['pydantic_parse_cpu_ms']:.1f}) | {r['decide_cpu_ms']:.1f} |")
    return "\n".join(lines)
