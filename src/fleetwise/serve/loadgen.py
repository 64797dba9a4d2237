"""Load test of the decision service on loopback (``fleetwise bench serve``; numbers in docs/serve.md).

Starts ``fleetwise serve`` (uvicorn) on 127.0.0.1 in a subprocess, then sends a bounded count of
``POST /v1/route`` calls (``rate x duration``) open loop: call k is due at ``k / rate`` seconds, whatever the
answers to earlier calls, over ``connections`` keep-alive HTTP/1.1 connections (plain asyncio streams, requests
pre-encoded; the bodies are ``bodies`` different snapshots of ``replicas`` replicas each).

Latency of a call: from the moment the pacer dispatches it (it is due, and the pacer woke up) to the last byte
of the answer, including any wait for a free connection. The pacer's own lateness (event-loop timer
granularity) is reported apart, as ``lag``. The service and the generator share the machine's cores; with
``pin`` the service runs on CPU 0 and the generator on CPU 1.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import math
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def route_bodies(n: int, replicas: int, seed: int = 0) -> list[bytes]:
    """``n`` JSON bodies of POST /v1/route: random but plausible snapshots of ``replicas`` replicas."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        reps = [{"id": f"r{i}", "region": f"region-{i % 3}", "outstanding_requests": rng.randint(0, 64),
                 "outstanding_tokens": rng.randint(0, 200_000), "kv_used_fraction": round(rng.random(), 4),
                 "waiting": rng.randint(0, 16), "rtt_s": round(rng.uniform(0.001, 0.15), 4),
                 "prefix_hit_tokens": rng.choice([0, 0, 256, 1024]), "tokens_per_s": rng.choice([8000.0, 16000.0])}
                for i in range(replicas)]
        body = {"prompt_tokens": rng.randint(16, 4096), "output_tokens": rng.randint(16, 1024), "model": "llama-3-8b",
                "origin": "region-0", "replicas": reps}
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


def _request(path: str, body: bytes, token: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the generator: callbacks only, no task per call."""

    def __init__(self, gen: "_Generator"):
        self.gen = gen
        self.buf = bytearray()
        self.need = -1  # bytes of the answer in flight (-1: head not complete yet)
        self.status = 0
        self.k = -1
        self.t = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, k: int, t_dispatch: float) -> None:
        self.k, self.t = k, t_dispatch
        self.transport.write(self.gen.requests[k % len(self.gen.requests)])

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.need < 0:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = bytes(buf[:i])
            self.status = int(head[9:12])
            n = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    n = int(line[15:])
                    break
            self.need = i + 4 + n
        if len(buf) >= self.need:
            del buf[: self.need]
            self.need = -1
            self.gen.done(self, self.k, self.t, self.status)

    def connection_lost(self, exc) -> None:
        if self.need == -2:  # closed by the generator at the end
            return
        if self.k >= 0:
            self.gen.done(self, self.k, self.t, -1, lost=True)
        self.gen.replace(self)  # e.g. the server closed an idle keep-alive connection: open another, as clients do


class _Generator:
    """Open loop: call k is due at t0 + k / rate; it goes out on a free connection at once, else waits (FIFO) for
    the first connection that frees; its latency counts from when the pacer dispatched it."""

    def __init__(self, requests: list[bytes], count: int):
        self.requests = requests
        self.count = count
        self.lat = [0.0] * count
        self.lag = [0.0] * count
        self.status = [0] * count
        self.free: list[_Conn] = []
        self.pending: collections.deque = collections.deque()
        self.finished = 0
        self.all_done: asyncio.Future | None = None
        self.port = 0
        self.conns: list[_Conn] = []
        self.reconnects = 0

    def replace(self, conn: _Conn) -> None:
        """A connection closed under us: drop it and open a new one (which then takes waiting calls)."""
        if conn in self.free:
            self.free.remove(conn)
        if conn in self.conns:
            self.conns.remove(conn)
        self.reconnects += 1
        asyncio.get_running_loop().create_task(self.connect())

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, c = await loop.create_connection(lambda: _Conn(self), "127.0.0.1", self.port)
        self.conns.append(c)
        if self.pending:
            c.send(*self.pending.popleft())
        else:
            self.free.append(c)

    def dispatch(self, k: int, t: float) -> None:
        while self.free:
            c = self.free.pop()
            if not c.transport.is_closing():
                c.send(k, t)
                return
        self.pending.append((k, t))

    def done(self, conn: _Conn, k: int, t: float, status: int, lost: bool = False) -> None:
        self.lat[k] = time.perf_counter() - t
        self.status[k] = status
        conn.k = -1
        self.finished += 1
        if not lost and not conn.transport.is_closing():
            if self.pending:
                conn.send(*self.pending.popleft())
            else:
                self.free.append(conn)
        if self.finished == self.count and self.all_done is not None and not self.all_done.done():
            self.all_done.set_result(None)


async def _drive(port: int, requests: list[bytes], rate: float, count: int, connections: int) -> dict:
    loop = asyncio.get_running_loop()
    gen = _Generator(requests, count)
    gen.all_done = loop.create_future()
    gen.port = port
    for _ in range(connections):
        await gen.connect()
    pc = time.perf_counter
    lag = gen.lag
    t0 = pc() + 0.01
    for k in range(count):
        due = t0 + k / rate
        now = pc()
        if due > now:
            await asyncio.sleep(due - now)
            now = pc()
        lag[k] = now - due
        gen.dispatch(k, now)
    try:
        await asyncio.wait_for(gen.all_done, timeout=60.0)
    except asyncio.TimeoutError:
        raise RuntimeError(f"{count - gen.finished} of {count} calls got no answer within 60 s") from None
    wall = pc() - t0
    for c in gen.conns:
        c.need = -2
        c.transport.close()
    return {"lat": gen.lat, "lag": lag, "status": gen.status, "wall_s": wall, "reconnects": gen.reconnects}


def _pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100.0 * len(s)) - 1))] if s else float("nan")


def _cpu_s(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _machine_busy_s() -> float:
    """CPU-seconds all processes on the machine have spent busy (from /proc/stat)."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        return float("nan")


def _wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with status {proc.returncode}:\n{proc.stderr.read()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the service did not become ready on port {port} in {timeout_s:.0f} s")


def _server_histogram(port: int, token: str) -> dict:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(req, timeout=5).read().decode()
    out: dict = {"buckets": {}}
    for line in text.splitlines():
        if line.startswith('fleetwise_decision_latency_seconds_sum{endpoint="route"}'):
            out["sum"] = float(line.split()[-1])
        elif line.startswith('fleetwise_decision_latency_seconds_count{endpoint="route"}'):
            out["count"] = float(line.split()[-1])
        elif line.startswith("fleetwise_decision_latency_seconds_bucket{") and 'endpoint="route"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out["buckets"][float(le)] = float(line.split()[-1])
    return out


def _bucket_quantile(before: dict, after: dict, q: float) -> float:
    """Upper bound (seconds) of the histogram bucket holding the q-quantile of the calls between two scrapes."""
    b0, b1 = before.get("buckets", {}), after.get("buckets", {})
    les = sorted(b1)
    if not les:
        return float("nan")
    n = b1[les[-1]] - b0.get(les[-1], 0.0)
    for le in les:
        if b1[le] - b0.get(le, 0.0) >= q * n:
            return le
    return float("inf")


def run(rate: float = 1000.0, duration_s: float = 10.0, connections: int = 8, replicas: int = 8,
        router: str = "least_outstanding_tokens", warmup: int = 2000, pin: bool = False, bodies: int = 256,
        seed: int = 0, floor: bool = False) -> dict:
    """Start the service, warm it up, drive ``rate x duration_s`` route calls, stop it; the numbers.
    ``floor``: the same against a trivial app (answers ``{}`` without reading the body) on the same uvicorn
    settings: what HTTP on loopback, uvicorn and the generator cost without the service."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        uvloop = None
    count = int(round(rate * duration_s))
    if count < 1:
        raise ValueError("rate x duration must be at least one call")
    port = free_port()
    token = secrets.token_urlsafe(24)
    env = {**os.environ, "FLEETWISE_SERVE_TOKEN": token, "OMP_NUM_THREADS": "1"}
    ncpu = len(os.sched_getaffinity(0))
    pinned = pin and ncpu >= 2
    cpus = sorted(os.sched_getaffinity(0))
    pre = (lambda: os.sched_setaffinity(0, {cpus[0]})) if pinned else None
    cmd = ([sys.executable, "-m", "fleetwise.serve.loadgen", "--floor-server", str(port)] if floor else
           [sys.executable, "-m", "fleetwise", "serve", "--host", "127.0.0.1", "--port", str(port), "--router", router,
            # room for every connection of the generator: at the default 500, 1,000 connections waited 60 s
            "--max-concurrency", str(max(500, 2 * connections + 64))])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pre)
    old_aff = os.sched_getaffinity(0)
    try:
        _wait_ready(port, proc)
        if pinned:
            os.sched_setaffinity(0, {cpus[1]})
        reqs = [_request("/v1/route", b, token) for b in route_bodies(bodies, replicas, seed)]
        runner = getattr(uvloop, "run", None) or asyncio.run
        if warmup:
            runner(_drive(port, reqs, max(rate, 2000.0), warmup, connections))
        gc.collect()
        gc.freeze()  # no long collections in the generator either
        before = {} if floor else _server_histogram(port, token)
        load0 = os.getloadavg()[0]
        cpu0, busy0 = _cpu_s(proc.pid), _machine_busy_s()
        ru0 = os.times()
        res = runner(_drive(port, reqs, rate, count, connections))
        ru1 = os.times()
        cpu1, busy1 = _cpu_s(proc.pid), _machine_busy_s()
        after = {} if floor else _server_histogram(port, token)
    finally:
        if pinned:
            os.sched_setaffinity(0, old_aff)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    ok = [x for x, s in zip(res["lat"], res["status"]) if s == 200]
    wall = res["wall_s"]
    n_srv = after.get("count", 0.0) - before.get("count", 0.0)
    ms = 1e3
    return {
        "calls": count, "ok": len(ok), "errors": count - len(ok), "target_rate": rate,
        "achieved_rate": len(ok) / wall if wall > 0 else float("nan"), "wall_s": wall,
        "p50_ms": _pct(ok, 50) * ms, "p90_ms": _pct(ok, 90) * ms, "p99_ms": _pct(ok, 99) * ms,
        "p999_ms": _pct(ok, 99.9) * ms, "max_ms": max(ok) * ms if ok else float("nan"),
        "lag_p99_ms": _pct(res["lag"], 99) * ms, "lag_max_ms": max(res["lag"]) * ms, "reconnects": res["reconnects"],
        "server_mean_ms": (after.get("sum", 0.0) - before.get("sum", 0.0)) / n_srv * ms if n_srv else float("nan"),
        "server_p50_le_ms": _bucket_quantile(before, after, 0.50) * ms,
        "server_p99_le_ms": _bucket_quantile(before, after, 0.99) * ms,
        "server_cpu": (cpu1 - cpu0) / wall, "client_cpu": ((ru1.user - ru0.user) + (ru1.system - ru0.system)) / wall,
        "others_cpu": max(0.0, (busy1 - busy0) - (cpu1 - cpu0) - ((ru1.user - ru0.user) + (ru1.system - ru0.system)))
        / wall, "load_avg_1m": load0,
        "connections": connections, "replicas": replicas, "router": "floor (trivial app)" if floor else router,
        "pinned": pinned, "cpus": ncpu,
        "event_loop": "uvloop" if uvloop is not None else "asyncio", "python": sys.version.split()[0],
    }


def render(r: dict) -> str:
    pin = "service on CPU 0, generator on CPU 1" if r["pinned"] else f"service and generator share {r['cpus']} CPUs"
    return (f"POST /v1/route, {r['router']}, {r['replicas']} replicas per snapshot: {r['calls']} calls at "
            f"{r['target_rate']:.0f}/s open loop over {r['connections']} keep-alive connections ({pin}; "
            f"{r['event_loop']}, Python {r['python']})\n"
            f"  latency ms: p50 {r['p50_ms']:.3f}  p90 {r['p90_ms']:.3f}  p99 {r['p99_ms']:.3f}  "
            f"p99.9 {r['p999_ms']:.3f}  max {r['max_ms']:.3f}\n"
            f"  throughput {r['achieved_rate']:.0f}/s ({r['ok']} ok, {r['errors']} errors in {r['wall_s']:.2f} s); "
            f"pacer lag p99 {r['lag_p99_ms']:.3f} ms"
            + (f"; {r['reconnects']} connections closed by the server and reopened" if r.get("reconnects") else "")
            + "\n"
            + (f"  server-side (in the app): mean {r['server_mean_ms']:.3f} ms, p50 <= {r['server_p50_le_ms']:g} ms, "
               f"p99 <= {r['server_p99_le_ms']:g} ms; " if r["server_mean_ms"] == r["server_mean_ms"] else "  ")
            + f"CPU: service {r['server_cpu']:.0%}, "
            f"generator {r['client_cpu']:.0%}, other processes {r['others_cpu']:.0%} of one core "
            f"(load average {r['load_avg_1m']:.2f} at the start)")


def summarize(runs: list[dict], target_p99_ms: float = 2.0) -> dict:
    """Several runs of :func:`run`: the median and range of each latency figure, and how many runs met the
    P99 target. The machine's other load varies between runs, so each run keeps its own CPU figures."""
    def stat(key: str) -> dict:
        xs = sorted(r[key] for r in runs)
        return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1]}
    return {"runs": len(runs), **{k: stat(k) for k in ("p50_ms", "p99_ms", "p999_ms", "achieved_rate",
                                                          "others_cpu")},
            "target_p99_ms": target_p99_ms, "runs_meeting_target": sum(r["p99_ms"] < target_p99_ms for r in runs),
            "errors": sum(r["errors"] for r in runs)}


def render_summary(runs: list[dict], s: dict) -> str:
    lines = [f"{s['runs']} runs (each as above: {runs[0]['calls']} calls at {runs[0]['target_rate']:.0f}/s, "
             f"{runs[0]['router']})", "  run   p50 ms   p99 ms  p99.9 ms  calls/s  errors  CPU others"]
    for i, r in enumerate(runs, 1):
        lines.append(f"  {i:>3}  {r['p50_ms']:7.3f}  {r['p99_ms']:7.3f}  {r['p999_ms']:8.3f}  {r['achieved_rate']:7.0f}"
                     f"  {r['errors']:>6}  {r['others_cpu']:>9.0%}")
    lines.append(f"  median p50 {s['p50_ms']['median']:.3f} ms, p99 {s['p99_ms']['median']:.3f} ms "
                 f"[{s['p99_ms']['min']:.3f}, {s['p99_ms']['max']:.3f}]; P99 under {s['target_p99_ms']:g} ms in "
                 f"{s['runs_meeting_target']} of {s['runs']} runs; {s['errors']} errors")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- the floor
async def _floor_app(scope: dict, receive, send) -> None:
    """The cheapest answer an ASGI app can give (for ``run(floor=True)``)."""
    if scope["type"] == "lifespan":
        await receive()  # startup
        await send({"type": "lifespan.startup.complete"})
        await receive()  # shutdown
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def _serve_floor(port: int) -> None:
    import uvicorn

    from fleetwise.serve.app import http_protocol

    gc.collect()
    gc.freeze()
    uvicorn.run(_floor_app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http=http_protocol(),
                proxy_headers=False, server_header=False)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--floor-server":
        _serve_floor(int(sys.argv[2]))
