"""The gateway's state and picking: the backends, the live signals it keeps on each, and the choice of backend for a
request by a fleetwise router (docs/gateway.md). Forwarding is ``fleetwise.serve.gateway_forward``.

Per backend (``BackendState``): in-flight requests and tokens (counted from routing to the end of the response);
health (a connection failure marks it not ready at once, ``fail_threshold`` consecutive 5xx, timeouts or bad bodies
do too; a probe every ``health_interval_s`` (``GET /health``: 200, or 404/405 from a server without that route,
means up) marks it ready again, with exponential backoff while it stays down); its queue and KV-cache use from
Prometheus ``/metrics`` where it exposes them (vLLM, SGLang, llama.cpp ``--metrics``), every
``metrics_interval_s``; its model list.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetwise.errors import InputError
from fleetwise.serve.policy import RoutePolicy
from fleetwise.serve.schemas import MAX_COUNT as _BIG
from fleetwise.serve.schemas import ReplicaSnapshot, RouteRequest

# Prometheus series read from backends' /metrics: summed over label sets (kv: the largest)
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred", "tgi_queue_size")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
_KV = ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio")


def _utf8(obj: Any) -> bool:
    """Whether ``obj`` can be answered as UTF-8 JSON (JSON text may escape lone surrogates, UTF-8 cannot hold them)."""
    import json

    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, TypeError, RecursionError):
        return False
    return True


@dataclass
class GatewayConfig:
    """Knobs of the gateway (defaults suit a handful of local or same-zone backends)."""

    max_attempts: int = 3  # distinct backends tried per request
    retry_backoff_s: float = 0.05  # sleep before retry k: retry_backoff_s * 2**(k-1)
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0  # longest silence from a backend (a long generation, not streamed)
    # the whole of an attempt that is not streamed, and a streamed one's wait for its first bytes (a backend that
    # dripped a byte a second never hit the read timeout, and the client waited as long as it dripped)
    attempt_timeout_s: float = 600.0
    max_response_bytes: int = 64 << 20  # a backend's whole answer (not streamed), and one SSE event of a stream
    health_interval_s: float = 2.0  # probe period of a ready backend; first backoff of a down one
    health_max_backoff_s: float = 30.0
    metrics_interval_s: float = 1.0  # scrape period of backends' /metrics (0: never)
    fail_threshold: int = 3  # consecutive 5xx / timeouts / bad bodies that mark a backend not ready
    default_max_tokens: int = 128  # output-token estimate when a request sets no max_tokens
    chars_per_token: float = 4.0  # prompt-token estimate from text length
    max_connections: int = 1000

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InputError(f"gateway max_attempts {self.max_attempts}: expected at least 1")
        for k in ("retry_backoff_s", "connect_timeout_s", "read_timeout_s", "attempt_timeout_s", "health_interval_s",
                  "health_max_backoff_s", "metrics_interval_s", "chars_per_token"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"gateway {k} {v!r}: expected a finite number >= 0")
        if (self.connect_timeout_s <= 0 or self.read_timeout_s <= 0 or self.attempt_timeout_s <= 0
                or self.chars_per_token <= 0):
            raise InputError("gateway timeouts and chars_per_token must be > 0")
        if not (isinstance(self.max_response_bytes, int) and 1024 <= self.max_response_bytes <= 1 << 32):
            raise InputError(f"gateway max_response_bytes {self.max_response_bytes!r}: expected 1 KiB to 4 GiB")


@dataclass
class BackendState:
    """What the gateway knows of one backend, live."""

    id: str
    url: str
    in_flight: int = 0
    in_flight_tokens: int = 0
    ready: bool = True
    failures: int = 0  # consecutive failed requests or probes
    down_probes: int = 0  # consecutive failed probes while not ready (backoff exponent)
    next_probe_s: float = 0.0
    probe_rtt_s: float | None = None
    models: set[str] = field(default_factory=set)
    model_objs: dict[str, dict] = field(default_factory=dict)
    models_fetched: bool = False
    next_models_s: float = 0.0
    metrics: str = "unknown"  # unknown | yes | absent
    next_metrics_s: float = 0.0
    waiting: int = 0
    running: int | None = None
    kv_used_fraction: float = 0.0
    served: int = 0
    errors: int = 0
    last_error: str | None = None

    def snapshot(self) -> ReplicaSnapshot:
        outstanding = self.in_flight
        if self.metrics == "yes" and self.running is not None:
            outstanding = min(_BIG, max(outstanding, self.running + self.waiting))
        return ReplicaSnapshot(id=self.id, outstanding_requests=outstanding,
                               outstanding_tokens=self.in_flight_tokens, kv_used_fraction=self.kv_used_fraction,
                               waiting=min(self.waiting, _BIG), ready=self.ready, rtt_s=min(self.probe_rtt_s or 0.0, 3600.0))

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "url": self.url, "ready": self.ready, "in_flight": self.in_flight,
                "in_flight_tokens": self.in_flight_tokens, "consecutive_failures": self.failures,
                "served": self.served, "errors": self.errors, "last_error": self.last_error,
                "models": sorted(self.models), "metrics": self.metrics, "waiting": self.waiting,
                "running": self.running, "kv_used_fraction": self.kv_used_fraction, "probe_rtt_s": self.probe_rtt_s}


def normalise_backend_url(url: str) -> str:
    """``http://host:port`` (no trailing slash, no trailing ``/v1``); InputError if it is not an http(s) URL."""
    u = url.strip().rstrip("/")
    if u.endswith("/v1"):
        u = u[:-3]
    bad = f"backend {url!r}: expected an http(s) URL such as http://127.0.0.1:8001"
    try:
        parts = urlsplit(u)
        port = parts.port  # (urllib checks the port's range and an IPv6 host's brackets only when asked)
    except ValueError as e:
        raise InputError(f"{bad} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or not parts.hostname:
        raise InputError(bad)
    if any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7F for c in u) or not u.isascii():
        raise InputError(f"{bad} (a space, a control or a non-ASCII character)")  # ('http://a b' started)
    if port == 0:
        raise InputError(f"{bad} (port 0)")
    return u


class GatewayMetrics:
    """The gateway's Prometheus series."""

    def __init__(self, ids: list[str]) -> None:
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("fleetwise_gateway_requests", "Attempts and final outcomes by backend "
                                "(outcome: ok, client_error, upstream_error, stream_error; backend none: "
                                "unavailable, bad_request)", ["backend", "outcome"], registry=reg)
        self.retries = Counter("fleetwise_gateway_retries", "Requests sent to another backend after a failure",
                               registry=reg)
        self.latency = Histogram("fleetwise_gateway_upstream_latency_seconds",
                                 "Upstream latency: whole response (not streamed) or first chunk (streamed)",
                                 ["backend"], registry=reg,
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
        self.in_flight = Gauge("fleetwise_gateway_in_flight", "Requests in flight per backend", ["backend"],
                               registry=reg)
        self.ready = Gauge("fleetwise_gateway_backend_ready", "1 if the backend is taking requests", ["backend"],
                           registry=reg)
        for i in ids:
            self.ready.labels(i).set(1)
            self.in_flight.labels(i).set(0)


class Pool:
    """The backends and their live signals; ``pick`` asks the router, ``acquire`` counts a request in flight.
    ``client`` (an ``httpx.AsyncClient``) is set while the app runs (its lifespan)."""

    def __init__(self, urls: list[str], policy: RoutePolicy, cfg: GatewayConfig, up_headers: dict[str, str]):
        self.states = [BackendState(id=u, url=u) for u in urls]
        self.by_id = {s.id: s for s in self.states}
        self.policy, self.cfg, self.up_headers = policy, cfg, up_headers
        self.metrics = GatewayMetrics(urls)
        self.client: Any = None

    # ------------------------------------------------------------------------------------------- health
    def set_ready(self, s: BackendState, ready: bool) -> None:
        if s.ready != ready:
            s.ready = ready
            self.metrics.ready.labels(s.id).set(1 if ready else 0)
            if not ready:
                s.down_probes = 0
                s.next_probe_s = time.monotonic() + self.cfg.health_interval_s / 4

    def note_failure(self, s: BackendState, reason: str, hard: bool, outcome: str = "upstream_error") -> None:
        """An attempt failed (``hard``: the backend is gone, e.g. connection refused)."""
        s.failures += 1
        s.errors += 1
        s.last_error = reason
        self.metrics.requests.labels(s.id, outcome).inc()
        if hard or s.failures >= self.cfg.fail_threshold:
            self.set_ready(s, False)

    def note_success(self, s: BackendState, outcome: str = "ok") -> None:
        s.failures = 0
        s.served += 1
        self.metrics.requests.labels(s.id, outcome).inc()
        self.set_ready(s, True)

    async def probe(self, s: BackendState) -> None:
        """GET /health: 200 (or 404/405 from a server without that route, e.g. llama-cpp-python, whose
        /v1/models waits behind the running generation) means up; a connection error or 5xx means down; a
        timeout while the gateway has requests in flight there means busy (no change)."""
        import httpx

        cfg = self.cfg
        t0 = time.perf_counter()
        busy = False
        try:
            r = await self.client.get(f"{s.url}/health", headers=self.up_headers,
                                      timeout=httpx.Timeout(max(cfg.connect_timeout_s, 2.0)))
            ok = r.status_code in (200, 404, 405)
            if not ok:
                s.last_error = f"health probe: HTTP {r.status_code}"
        except httpx.HTTPError as e:
            ok = False
            busy = isinstance(e, httpx.ReadTimeout) and s.in_flight > 0
            s.last_error = f"health probe: {type(e).__name__}: {e}".rstrip(": ")
        now = time.monotonic()
        if busy:
            s.next_probe_s = now + cfg.health_interval_s
        elif ok:
            rtt = time.perf_counter() - t0
            s.probe_rtt_s = rtt if s.probe_rtt_s is None else 0.8 * s.probe_rtt_s + 0.2 * rtt
            s.down_probes = 0
            if not s.ready:
                s.failures = 0
                s.models_fetched = False  # it may have come back with another model
            self.set_ready(s, True)
            s.next_probe_s = now + cfg.health_interval_s
        else:
            self.set_ready(s, False)
            s.down_probes += 1
            s.next_probe_s = now + min(cfg.health_max_backoff_s,
                                       cfg.health_interval_s / 4 * 2 ** min(s.down_probes, 30))

    async def fetch_models(self, s: BackendState) -> bool:
        """The backend's model list (GET /v1/models), cached; False if it did not answer."""
        import httpx

        try:
            r = await self.client.get(f"{s.url}/v1/models", headers=self.up_headers, timeout=httpx.Timeout(30.0))
            r.raise_for_status()
            from fleetwise.yamlio import loads_strict

            # strict JSON: a NaN in a model object made /v1/models a 500 when the gateway wrote it back out
            objs = {str(m["id"]): m for m in loads_strict(r.content).get("data", []) if isinstance(m, dict)
                    and "id" in m and _utf8(m)}  # (a lone surrogate in an id made /v1/models a 500 too)
        except (httpx.HTTPError, ValueError, AttributeError, KeyError, RecursionError) as e:
            s.last_error = f"/v1/models: {type(e).__name__}: {e}".rstrip(": ")
            return False
        s.model_objs = objs
        s.models = set(objs)
        s.models_fetched = True
        return True

    async def scrape(self, s: BackendState) -> None:
        """Queue and KV-cache use from the backend's Prometheus ``/metrics`` (absent: looked at again in 60 s)."""
        import httpx

        now = time.monotonic()
        try:
            r = await self.client.get(f"{s.url}/metrics", headers=self.up_headers, timeout=httpx.Timeout(2.0))
        except httpx.HTTPError:
            s.next_metrics_s = now + self.cfg.metrics_interval_s
            return
        sums = None if r.status_code != 200 or "json" in r.headers.get("content-type", "") else _parse(r.text)
        if sums is None:
            s.metrics = "absent"
            s.next_metrics_s = now + 60.0  # look again now and then (a restarted server may have them)
            return
        waiting, running, kv = sums
        s.next_metrics_s = now + self.cfg.metrics_interval_s
        s.metrics = "yes"
        # a backend's numbers are clipped into what a snapshot holds (vllm:num_requests_waiting 1e300 made every
        # later request a 500, as the snapshot refused it)
        s.waiting = min(_BIG, max(0, int(waiting))) if math.isfinite(waiting) else 0
        s.running = min(_BIG, max(0, int(running))) if math.isfinite(running) else 0
        if kv is not None and math.isfinite(kv):
            s.kv_used_fraction = min(1.0, max(0.0, kv))

    async def monitor(self) -> None:
        """Forever: probes, scrapes and model lists when they are due."""
        cfg = self.cfg
        tick = max(0.05, min(0.25, cfg.health_interval_s / 4))
        fetching: dict[str, asyncio.Task] = {}
        while True:
            now = time.monotonic()
            jobs = [self.probe(s) for s in self.states if now >= s.next_probe_s]
            if cfg.metrics_interval_s > 0:
                jobs += [self.scrape(s) for s in self.states if s.ready and now >= s.next_metrics_s]
            for s in self.states:  # model lists in the background: a busy llama.cpp answers after its generation
                if s.ready and not s.models_fetched and s.id not in fetching and now >= s.next_models_s:
                    s.next_models_s = now + 5 * cfg.health_interval_s
                    t = asyncio.create_task(self.fetch_models(s))
                    fetching[s.id] = t
                    t.add_done_callback(lambda _t, i=s.id: fetching.pop(i, None))
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
            await asyncio.sleep(tick)

    # ------------------------------------------------------------------------------------------ picking
    def pick(self, tried: set[str], model: str | None, prompt_tokens: int, output_tokens: int) -> BackendState | None:
        """The router's choice among the backends not tried yet (those serving ``model``, if any do)."""
        cands = [s for s in self.states if s.id not in tried]
        if not cands:
            return None
        if model:
            serving = [s for s in cands if model in s.models]
            if serving:
                cands = serving
        req = RouteRequest(prompt_tokens=max(1, prompt_tokens), output_tokens=max(1, output_tokens),
                           model=model[:256] if model else None, replicas=[s.snapshot() for s in cands])
        return cands[self.policy.route(req)]

    def acquire(self, s: BackendState, tokens: int) -> Callable[[], None]:
        """Count a request in flight at ``s``; the returned function (idempotent) releases it."""
        s.in_flight += 1
        s.in_flight_tokens += tokens
        self.metrics.in_flight.labels(s.id).set(s.in_flight)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                s.in_flight -= 1
                s.in_flight_tokens -= tokens
                self.metrics.in_flight.labels(s.id).set(s.in_flight)

        return release


def _parse(text: str) -> tuple[float, float, float | None] | None:
    """(waiting, running, kv fraction) summed from Prometheus text; None when none of the series is there."""
    from prometheus_client.parser import text_string_to_metric_families

    waiting = running = 0.0
    kv: float | None = None
    seen = False
    try:
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name in _WAITING:
                    waiting += smp.value
                    seen = True
                elif smp.name in _RUNNING:
                    running += smp.value
                    seen = True
                elif smp.name in _KV:
                    kv = max(kv or 0.0, smp.value)
                    seen = True
    except (ValueError, TypeError):
        return None
    return (waiting, running, kv) if seen else None
