"""Gateway overhead (``fleetwise bench gateway``): the same requests sent straight to the backends and through
the gateway, interleaved one by one, and the latency of each path.

Without ``backends`` it starts ``servers`` local llama.cpp servers serving the tiny random model
(``fleetwise.serve.tinymodel``, the ``backend`` extra). The gateway runs in its own process (uvicorn, as in
production); the load comes from ``concurrency`` client threads with keep-alive connections. Direct requests go
round robin over the backends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import numpy as np


def _pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean()), "n": int(a.size)}


def _start_gateway(backends: list[str], policy: str, port: int, log: Path) -> subprocess.Popen:
    code = ("import sys, json; from fleetwise.serve.gateway import serve_gateway; "
            f"serve_gateway(json.loads(sys.argv[1]), port={port}, route_policy={policy!r})")
    fh = open(log, "wb")
    p = subprocess.Popen([sys.executable, "-c", code, json.dumps(backends)], stdout=fh, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if p.poll() is not None:
            raise RuntimeError(f"the gateway exited at start:\n{log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                if r.status == 200:
                    return p
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            p.kill()
            raise TimeoutError("the gateway was not ready after 60 s")
        time.sleep(0.1)


def gateway_overhead(backends: list[str] | None = None, servers: int = 3, requests: int = 200,
                     concurrency: int = 1, max_tokens: int = 8, stream_modes: tuple[bool, ...] = (False, True),
                     policy: str = "least_outstanding_tokens", warmup: int = 10) -> dict:
    """Latency (whole response) of ``requests`` completions straight to the backends and through the gateway,
    for each streaming mode; median, P99 and their differences in milliseconds."""
    import httpx

    from fleetwise.serve.localbackends import free_port, start_llama_servers
    from fleetwise.serve.tinymodel import write_tiny_gguf

    res: dict = {"requests": requests, "concurrency": concurrency, "max_tokens": max_tokens, "policy": policy}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleetwise-bench-gw-")))
        if not backends:
            model = write_tiny_gguf(tmp / "tiny.gguf", seed=0)
            procs = start_llama_servers(model, servers, n_ctx=512, log_dir=tmp)
            stack.callback(lambda: [s.stop() for s in procs])
            backends = [s.url for s in procs]
            res["backend"] = f"{servers} x llama-cpp-python server, tiny random Llama GGUF (1 thread each)"
        else:
            res["backend"] = ", ".join(backends)
            for b in backends:  # each must answer now (an unreachable one waited 60 s for a gateway that could
                # never be ready, then raised a TimeoutError)
                try:
                    httpx.get(f"{b.rstrip('/')}/v1/models", timeout=5.0)
                except httpx.HTTPError as e:
                    from fleetwise.errors import InputError

                    raise InputError(f"--backend {b}: does not answer ({type(e).__name__}: {e})") from None
        gw_port = free_port()
        gw = _start_gateway(backends, policy, gw_port, tmp / "gateway.log")
        stack.callback(lambda: (gw.terminate(), gw.wait(10)))
        gw_url = f"http://127.0.0.1:{gw_port}"

        def call(c: httpx.Client, base: str, i: int, stream: bool) -> float:
            body = {"prompt": f"request {i}: route the fleet", "max_tokens": max_tokens, "temperature": 0,
                    "stream": stream}
            t0 = time.perf_counter()
            if stream:
                with c.stream("POST", f"{base}/v1/completions", json=body) as r:
                    data = r.read()
                    ok = r.status_code == 200 and b"[DONE]" in data
            else:
                r = c.post(f"{base}/v1/completions", json=body)
                ok = r.status_code == 200
            dt = time.perf_counter() - t0
            if not ok:
                raise RuntimeError(f"{base}: HTTP {r.status_code}")
            return dt

        for stream in stream_modes:
            lat: dict[str, list[float]] = {"direct": [], "gateway": []}
            lock = threading.Lock()
            nxt = iter(range(-warmup * concurrency, requests))
            errors: list[str] = []

            def worker() -> None:
                with httpx.Client(timeout=120, trust_env=False) as c:
                    while True:
                        with lock:
                            i = next(nxt, None)
                        if i is None:
                            return
                        try:
                            d = call(c, backends[i % len(backends)], i, stream)
                            g = call(c, gw_url, i, stream)
                        except Exception as e:  # reported, not hidden
                            with lock:
                                errors.append(f"{type(e).__name__}: {e}")
                            continue
                        if i >= 0:
                            with lock:
                                lat["direct"].append(d)
                                lat["gateway"].append(g)

            threads = [threading.Thread(target=worker) for _ in range(concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise RuntimeError(f"{len(errors)} request(s) failed, e.g. {errors[0]}")
            d, g = _pct(lat["direct"]), _pct(lat["gateway"])
            res["stream" if stream else "plain"] = {
                "direct": d, "gateway": g,
                "overhead_p50_ms": g["p50_ms"] - d["p50_ms"], "overhead_p99_ms": g["p99_ms"] - d["p99_ms"]}
    return res


def render(res: dict) -> str:
    lines = [f"gateway overhead: {res['requests']} completions per mode, max_tokens {res['max_tokens']}, "
             f"concurrency {res['concurrency']}, policy {res['policy']}; backends: {res['backend']}"]
    lines.append(f"{'mode':<10}{'path':<10}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for mode in ("plain", "stream"):
        if mode not in res:
            continue
        r = res[mode]
        for path in ("direct", "gateway"):
            p = r[path]
            lines.append(f"{mode:<10}{path:<10}{p['p50_ms']:>10.2f}{p['p99_ms']:>10.2f}{p['mean_ms']:>10.2f}")
        lines.append(f"{mode:<10}{'overhead':<10}{r['overhead_p50_ms']:>+10.2f}{r['overhead_p99_ms']:>+10.2f}")
    return "\n".join(lines)
