"""Gateway mode: an OpenAI-compatible proxy in front of real inference servers, routed by a fleetwise policy.

``create_gateway_app(backends, route_policy)`` is a FastAPI app (the ``serve`` extra) that forwards
``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed and not) and answers ``GET /v1/models``
for a list of OpenAI-compatible backends (vLLM, llama.cpp, SGLang, ...). Each request goes to the backend the
loaded router picks (``fleetwise.serve.policy``) from live signals the gateway collects itself:

- in-flight requests and in-flight tokens per backend (prompt estimate from the text length, ~4 characters a
  token, plus ``max_tokens`` x ``n``), counted from routing to the end of the response;
- health: a connection failure marks a backend not ready at once, ``fail_threshold`` consecutive 5xx or
  timeouts do too; a background probe every ``health_interval_s`` (``GET /health``: 200, or 404 from a server
  without that route, means up) marks it ready again, with exponential backoff while it stays down;
- where a backend exposes Prometheus ``/metrics`` (vLLM ``vllm:num_requests_running/waiting``,
  ``vllm:gpu_cache_usage_perc``; SGLang; llama.cpp's ``llama-server --metrics``), its queue and KV-cache use,
  scraped every ``metrics_interval_s``.

Failure semantics (the client always gets a response or a clear error, never a silent loss):

- connection error, timeout, 5xx or 429 before any byte went to the client: retried on another backend
  (at most ``max_attempts`` distinct backends, backoff ``retry_backoff_s`` x 2^k between attempts); a streamed
  request is only committed to a backend once its first chunk has arrived;
- every attempt failed: HTTP 503 with a JSON error listing each attempt;
- other 4xx from a backend: passed through unchanged (status and body), no retry;
- a stream that breaks after bytes went to the client (backend killed, or it closed without ``data: [DONE]``):
  the client gets whole SSE events only, then ``data: {"error": {...}}`` and the end of the response; never a
  truncated event and never a ``[DONE]`` the backend did not send.

Also: ``GET /metrics`` (Prometheus: requests by backend and outcome, retries, upstream latency, in-flight,
readiness), ``GET /healthz``, ``GET /readyz`` (503 while no backend is ready), ``GET /v1/gateway/backends``
(the live signals as JSON). With a token, every path but ``/healthz`` and ``/readyz`` needs
``Authorization: Bearer TOKEN``; without one, only loopback clients are served.
"""

import asyncio
import hmac
import json
import math
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable
from urllib.parse import urlsplit

from fleetwise.errors import InputError
from fleetwise.serve.app import is_loopback
from fleetwise.serve.policy import ReplicaSnapshot, RouteRequest, load_route_policy

__all__ = ["create_gateway_app", "GatewayConfig", "BackendState", "normalise_backend_url", "ThreadedServer",
           "serve_gateway"]



# Prometheus series read from backends' /metrics: summed over label sets (kv: the largest)
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred", "tgi_queue_size")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
_KV = ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio")

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_DONE_LINE = re.compile(rb"^data:\s?\[DONE\]\s*$", re.MULTILINE)
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade", "content-length", "content-encoding"}


@dataclass
class GatewayConfig:
    """Knobs of the gateway (defaults suit a handful of local or same-zone backends)."""

    max_attempts: int = 3  # distinct backends tried per request
    retry_backoff_s: float = 0.05  # sleep before retry k: retry_backoff_s * 2**(k-1)
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0  # longest silence from a backend (a long generation, not streamed)
    health_interval_s: float = 2.0  # probe period of a ready backend; first backoff of a down one
    health_max_backoff_s: float = 30.0
    metrics_interval_s: float = 1.0  # scrape period of backends' /metrics (0: never)
    fail_threshold: int = 3  # consecutive 5xx / timeouts that mark a backend not ready
    default_max_tokens: int = 128  # output-token estimate when a request sets no max_tokens
    chars_per_token: float = 4.0  # prompt-token estimate from text length
    max_connections: int = 1000

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InputError(f"gateway max_attempts {self.max_attempts}: expected at least 1")
        for k in ("retry_backoff_s", "connect_timeout_s", "read_timeout_s", "health_interval_s",
                  "health_max_backoff_s", "metrics_interval_s", "chars_per_token"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"gateway {k} {v!r}: expected a finite number >= 0")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0 or self.chars_per_token <= 0:
            raise InputError("gateway timeouts and chars_per_token must be > 0")


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
            outstanding = max(outstanding, self.running + self.waiting)
        return ReplicaSnapshot(id=self.id, outstanding_requests=outstanding,
                               outstanding_tokens=self.in_flight_tokens, kv_used_fraction=self.kv_used_fraction,
                               waiting=self.waiting, ready=self.ready, rtt_s=min(self.probe_rtt_s or 0.0, 3600.0))

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
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"backend {url!r}: expected an http(s) URL such as http://127.0.0.1:8001")
    return u


def _error_body(message: str, type_: str, code: int | str | None = None, **extra: Any) -> dict[str, Any]:
    err = {"message": message, "type": type_, "param": None, "code": code}
    err.update(extra)
    return {"error": err}


class _Retry(Exception):
    """This attempt failed before anything went to the client: try another backend."""


class _SSEFramer:
    """Cuts a byte stream into whole SSE events and notes whether ``data: [DONE]`` went by."""

    def __init__(self) -> None:
        self.buf = b""
        self.done = False

    def feed(self, chunk: bytes) -> bytes:
        self.buf += chunk
        end = 0
        for m in _EVENT_END.finditer(self.buf):
            end = m.end()
        if not end:
            return b""
        out, self.buf = self.buf[:end], self.buf[end:]
        if not self.done and _DONE_LINE.search(out):
            self.done = True
        return out


def _estimate_prompt_tokens(body: dict[str, Any], chars_per_token: float) -> int:
    def text_tokens(x: Any) -> int:
        if isinstance(x, str):
            return math.ceil(len(x) / chars_per_token)
        if isinstance(x, list):
            if x and all(isinstance(t, int) for t in x):  # token ids
                return len(x)
            return sum(text_tokens(t) for t in x)
        if isinstance(x, dict):  # a content part: {"type": "text", "text": ...}
            return text_tokens(x.get("text", ""))
        return 0

    if "messages" in body:
        msgs = body.get("messages") or []
        return sum(4 + text_tokens(m.get("content", "")) for m in msgs if isinstance(m, dict)) + 2
    return text_tokens(body.get("prompt", ""))


def _int_or(v: Any, default: int) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def create_gateway_app(backends: list[str], route_policy: str = "least_outstanding_tokens",
                       token: str | None = None, *, config: GatewayConfig | None = None,
                       backend_api_key: str | None = None, seed: int = 0, **options: Any):
    """The gateway as a FastAPI app. ``backends``: base URLs (``http://host:port``, with or without ``/v1``).
    ``route_policy``: a registered router (``fleetwise policies``), optionally ``name?param=value``.
    ``token``: bearer token for ``/v1/*`` (None: loopback clients only). ``options``: ``GatewayConfig``
    fields, e.g. ``max_attempts=2``. ``backend_api_key``: sent upstream as ``Authorization: Bearer``."""
    try:
        import httpx
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, Response, StreamingResponse
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise InputError(f"the gateway needs the serve extra (missing module {e.name!r}): "
                         "pip install -c constraints.txt 'fleetwise[serve]'") from None

    if config is None:
        try:
            config = GatewayConfig(**options)
        except TypeError as e:
            raise InputError(f"gateway options: {e}") from None
    elif options:
        raise InputError("give either config or GatewayConfig fields as keywords, not both")
    cfg = config
    if not backends:
        raise InputError("gateway: give at least one backend URL")
    urls = [normalise_backend_url(b) for b in backends]
    dup = {u for u in urls if urls.count(u) > 1}
    if dup:
        raise InputError(f"gateway: backend {sorted(dup)[0]!r} is listed more than once")
    policy = load_route_policy(route_policy, seed=seed)
    states = [BackendState(id=u, url=u) for u in urls]
    by_id = {s.id: s for s in states}

    reg = CollectorRegistry()
    m_requests = Counter("fleetwise_gateway_requests", "Attempts and final outcomes by backend "
                         "(outcome: ok, client_error, upstream_error, stream_error; backend none: "
                         "unavailable, bad_request)", ["backend", "outcome"], registry=reg)
    m_retries = Counter("fleetwise_gateway_retries", "Requests sent to another backend after a failure",
                        registry=reg)
    m_latency = Histogram("fleetwise_gateway_upstream_latency_seconds",
                          "Upstream latency: whole response (not streamed) or first chunk (streamed)",
                          ["backend"], registry=reg,
                          buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
    m_in_flight = Gauge("fleetwise_gateway_in_flight", "Requests in flight per backend", ["backend"], registry=reg)
    m_ready = Gauge("fleetwise_gateway_backend_ready", "1 if the backend is taking requests", ["backend"],
                    registry=reg)
    for s in states:
        m_ready.labels(s.id).set(1)
        m_in_flight.labels(s.id).set(0)

    up_headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if backend_api_key:
        up_headers["authorization"] = f"Bearer {backend_api_key}"
    ctx: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------- health
    def set_ready(s: BackendState, ready: bool) -> None:
        if s.ready != ready:
            s.ready = ready
            m_ready.labels(s.id).set(1 if ready else 0)
            if not ready:
                s.down_probes = 0
                s.next_probe_s = time.monotonic() + cfg.health_interval_s / 4

    def note_failure(s: BackendState, reason: str, hard: bool) -> None:
        s.failures += 1
        s.errors += 1
        s.last_error = reason
        if hard or s.failures >= cfg.fail_threshold:
            set_ready(s, False)

    def note_success(s: BackendState) -> None:
        s.failures = 0
        s.served += 1
        set_ready(s, True)

    async def probe(s: BackendState) -> None:
        """GET /health: 200 (or 404/405 from a server without that route, e.g. llama-cpp-python, whose
        /v1/models waits behind the running generation) means up; a connection error or 5xx means down; a
        timeout while the gateway has requests in flight there means busy (no change)."""
        client: httpx.AsyncClient = ctx["client"]
        t0 = time.perf_counter()
        busy = False
        try:
            r = await client.get(f"{s.url}/health", headers=up_headers,
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
            set_ready(s, True)
            s.next_probe_s = now + cfg.health_interval_s
        else:
            set_ready(s, False)
            s.down_probes += 1
            s.next_probe_s = now + min(cfg.health_max_backoff_s,
                                       cfg.health_interval_s / 4 * 2 ** min(s.down_probes, 30))

    async def fetch_models(s: BackendState) -> bool:
        """The backend's model list (GET /v1/models), cached; False if it did not answer."""
        client: httpx.AsyncClient = ctx["client"]
        try:
            r = await client.get(f"{s.url}/v1/models", headers=up_headers, timeout=httpx.Timeout(30.0))
            r.raise_for_status()
            objs = {str(m["id"]): m for m in r.json().get("data", []) if isinstance(m, dict) and "id" in m}
        except (httpx.HTTPError, ValueError, AttributeError, KeyError) as e:
            s.last_error = f"/v1/models: {type(e).__name__}: {e}".rstrip(": ")
            return False
        s.model_objs = objs
        s.models = set(objs)
        s.models_fetched = True
        return True

    async def scrape(s: BackendState) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        client: httpx.AsyncClient = ctx["client"]
        now = time.monotonic()
        try:
            r = await client.get(f"{s.url}/metrics", headers=up_headers, timeout=httpx.Timeout(2.0))
        except httpx.HTTPError:
            s.next_metrics_s = now + cfg.metrics_interval_s
            return
        if r.status_code != 200 or "json" in r.headers.get("content-type", ""):
            s.metrics = "absent"
            s.next_metrics_s = now + 60.0  # look again now and then (a restarted server may have them)
            return
        waiting = running = 0.0
        kv: float | None = None
        seen = False
        try:
            for fam in text_string_to_metric_families(r.text):
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
            seen = False
        s.next_metrics_s = now + cfg.metrics_interval_s
        if not seen:
            s.metrics = "absent"
            s.next_metrics_s = now + 60.0
            return
        s.metrics = "yes"
        s.waiting = max(0, int(waiting)) if math.isfinite(waiting) else 0
        s.running = max(0, int(running)) if math.isfinite(running) else 0
        if kv is not None and math.isfinite(kv):
            s.kv_used_fraction = min(1.0, max(0.0, kv))

    async def monitor() -> None:
        tick = max(0.05, min(0.25, cfg.health_interval_s / 4))
        fetching: dict[str, asyncio.Task] = {}
        while True:
            now = time.monotonic()
            jobs = [probe(s) for s in states if now >= s.next_probe_s]
            if cfg.metrics_interval_s > 0:
                jobs += [scrape(s) for s in states if s.ready and now >= s.next_metrics_s]
            for s in states:  # model lists in the background: a busy llama.cpp answers after its generation
                if s.ready and not s.models_fetched and s.id not in fetching and now >= s.next_models_s:
                    s.next_models_s = now + 5 * cfg.health_interval_s
                    t = asyncio.create_task(fetch_models(s))
                    fetching[s.id] = t
                    t.add_done_callback(lambda _t, i=s.id: fetching.pop(i, None))
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
            await asyncio.sleep(tick)

    @asynccontextmanager
    async def lifespan(app):
        limits = httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=cfg.max_connections)
        timeout = httpx.Timeout(connect=cfg.connect_timeout_s, read=cfg.read_timeout_s, write=30.0, pool=60.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
            ctx["client"] = client
            task = asyncio.create_task(monitor())
            try:
                yield
            finally:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass

    app = FastAPI(title="fleetwise gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backends = states
    app.state.policy = policy
    app.state.config = cfg

    # --------------------------------------------------------------------------------------------- auth
    def auth_error(request: Request) -> Response | None:
        if token is None:
            host = request.client.host if request.client else ""
            if not is_loopback(host) and host != "testclient":
                return JSONResponse(_error_body("this gateway runs without a token and serves loopback "
                                                "clients only", "permission_error", 403), status_code=403)
            return None
        got = request.headers.get("authorization", "")
        scheme, _, cred = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(cred.strip().encode(), token.encode()):
            return JSONResponse(_error_body("missing or wrong bearer token (Authorization: Bearer TOKEN)",
                                            "authentication_error", 401), status_code=401,
                                headers={"www-authenticate": "Bearer"})
        return None

    # ------------------------------------------------------------------------------------------ routing
    def pick(tried: set[str], body: dict[str, Any], prompt_tokens: int, output_tokens: int) -> BackendState | None:
        cands = [s for s in states if s.id not in tried]
        if not cands:
            return None
        model = body.get("model") if isinstance(body.get("model"), str) else None
        if model:
            serving = [s for s in cands if model in s.models]
            if serving:
                cands = serving
        req = RouteRequest(prompt_tokens=max(1, prompt_tokens), output_tokens=max(1, output_tokens),
                           model=model[:256] if model else None, replicas=[s.snapshot() for s in cands])
        return cands[policy.route(req)]

    def acquire(s: BackendState, tokens: int) -> Callable[[], None]:
        s.in_flight += 1
        s.in_flight_tokens += tokens
        m_in_flight.labels(s.id).set(s.in_flight)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                s.in_flight -= 1
                s.in_flight_tokens -= tokens
                m_in_flight.labels(s.id).set(s.in_flight)

        return release

    def passthrough_headers(h: Any, s: BackendState, attempts: int) -> dict[str, str]:
        out = {k: v for k, v in h.items() if k.lower() not in _HOP_BY_HOP and not k.lower().startswith("x-fleetwise")
               and k.lower() not in ("server", "date")}
        out["x-fleetwise-backend"] = s.id
        out["x-fleetwise-attempts"] = str(attempts)
        return out

    async def attempt_plain(s: BackendState, path: str, raw: bytes, attempts: int) -> Response:
        client: httpx.AsyncClient = ctx["client"]
        t0 = time.perf_counter()
        try:
            r = await client.post(f"{s.url}{path}", content=raw, headers=up_headers)
        except httpx.RequestError as e:
            reason = f"{s.id}: {type(e).__name__}: {e}".rstrip(": ")
            note_failure(s, reason, hard=not isinstance(e, httpx.TimeoutException))
            m_requests.labels(s.id, "upstream_error").inc()
            raise _Retry(reason) from None
        m_latency.labels(s.id).observe(time.perf_counter() - t0)
        if r.status_code >= 500 or r.status_code == 429:
            reason = f"{s.id}: HTTP {r.status_code}: {r.text[:300]}"
            note_failure(s, reason, hard=False)
            m_requests.labels(s.id, "upstream_error").inc()
            raise _Retry(reason)
        note_success(s)
        m_requests.labels(s.id, "ok" if r.status_code < 400 else "client_error").inc()
        return Response(content=r.content, status_code=r.status_code,
                        headers=passthrough_headers(r.headers, s, attempts))

    async def attempt_stream(s: BackendState, path: str, raw: bytes, attempts: int,
                             release: Callable[[], None]) -> Response:
        client: httpx.AsyncClient = ctx["client"]
        t0 = time.perf_counter()
        resp = None
        try:
            resp = await client.send(client.build_request("POST", f"{s.url}{path}", content=raw,
                                                          headers=up_headers), stream=True)
            if resp.status_code >= 500 or resp.status_code == 429:
                text = (await resp.aread())[:300].decode("utf-8", "replace")
                await resp.aclose()
                reason = f"{s.id}: HTTP {resp.status_code}: {text}"
                note_failure(s, reason, hard=False)
                m_requests.labels(s.id, "upstream_error").inc()
                raise _Retry(reason)
            if resp.status_code >= 400:
                data = await resp.aread()
                await resp.aclose()
                note_success(s)
                m_requests.labels(s.id, "client_error").inc()
                return Response(content=data, status_code=resp.status_code,
                                headers=passthrough_headers(resp.headers, s, attempts))
            it = resp.aiter_bytes()
            first = b""
            while not first:  # commit to this backend only once its first bytes are here
                first = await it.__anext__()
        except StopAsyncIteration:
            await resp.aclose()
            reason = f"{s.id}: empty streamed response"
            note_failure(s, reason, hard=False)
            m_requests.labels(s.id, "upstream_error").inc()
            raise _Retry(reason) from None
        except httpx.RequestError as e:
            if resp is not None:
                await resp.aclose()
            reason = f"{s.id}: {type(e).__name__}: {e}".rstrip(": ")
            note_failure(s, reason, hard=not isinstance(e, httpx.TimeoutException))
            m_requests.labels(s.id, "upstream_error").inc()
            raise _Retry(reason) from None
        except BaseException:  # cancelled (the client left) or a bug: free the upstream connection
            if resp is not None:
                await resp.aclose()
            raise
        m_latency.labels(s.id).observe(time.perf_counter() - t0)
        is_sse = "text/event-stream" in resp.headers.get("content-type", "")

        async def body() -> AsyncIterator[bytes]:
            framer = _SSEFramer()
            broken: str | None = None
            try:
                out = framer.feed(first) if is_sse else first
                if out:
                    yield out
                async for chunk in it:
                    out = framer.feed(chunk) if is_sse else chunk
                    if out:
                        yield out
                if is_sse and not framer.done:
                    broken = "the backend closed the stream without data: [DONE]"
            except httpx.RequestError as e:
                if not (is_sse and framer.done):
                    broken = f"{type(e).__name__}: {e}".rstrip(": ")
            finally:
                await resp.aclose()
            if is_sse and framer.done and framer.buf.strip():
                yield framer.buf
            if broken is None:
                note_success(s)
                m_requests.labels(s.id, "ok").inc()
                return
            reason = f"{s.id}: stream broken after it started: {broken}"
            note_failure(s, reason, hard=True)
            m_requests.labels(s.id, "stream_error").inc()
            err = _error_body(f"upstream backend failed mid-stream ({broken}); the response is incomplete",
                              "upstream_stream_error", 502, backend=s.id)
            yield b"data: " + json.dumps(err).encode() + b"\n\n"

        return _ReleasingStream(body(), release, status_code=resp.status_code,
                                headers=passthrough_headers(resp.headers, s, attempts))

    class _ReleasingStream(StreamingResponse):
        """Releases the backend's in-flight count however the response ends (done, broken, client gone)."""

        def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], **kw: Any):
            super().__init__(content, **kw)
            self._release = release

        async def __call__(self, scope, receive, send) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                self._release()
                await self.body_iterator.aclose()

    async def proxy(request: Request, path: str) -> Response:
        denied = auth_error(request)
        if denied is not None:
            return denied
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            m_requests.labels("none", "bad_request").inc()
            return JSONResponse(_error_body(f"request body is not valid JSON: {e}", "invalid_request_error", 400),
                                status_code=400)
        if not isinstance(body, dict):
            m_requests.labels("none", "bad_request").inc()
            return JSONResponse(_error_body("request body must be a JSON object", "invalid_request_error", 400),
                                status_code=400)
        stream = body.get("stream") is True
        n = _int_or(body.get("n"), 1)
        out_tokens = _int_or(body.get("max_tokens", body.get("max_completion_tokens")), cfg.default_max_tokens) * n
        in_tokens = _estimate_prompt_tokens(body, cfg.chars_per_token)
        tried: set[str] = set()
        failures: list[str] = []
        for attempt in range(cfg.max_attempts):
            s = pick(tried, body, in_tokens, out_tokens)
            if s is None:
                break
            if attempt:
                m_retries.inc()
                await asyncio.sleep(cfg.retry_backoff_s * 2 ** (attempt - 1))
            tried.add(s.id)
            release = acquire(s, in_tokens + out_tokens)
            try:
                if stream:
                    resp = await attempt_stream(s, path, raw, attempt + 1, release)
                    if not isinstance(resp, _ReleasingStream):
                        release()
                    return resp
                try:
                    return await attempt_plain(s, path, raw, attempt + 1)
                finally:
                    release()
            except _Retry as e:
                release()
                failures.append(str(e))
            except BaseException:
                release()
                raise
        m_requests.labels("none", "unavailable").inc()
        msg = (f"no backend could serve the request after {len(failures)} attempt(s)" if failures
               else "no backend to try")
        return JSONResponse(_error_body(msg, "upstream_unavailable", 503, attempts=failures), status_code=503,
                            headers={"retry-after": "1"})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        denied = auth_error(request)
        if denied is not None:
            return denied
        live = [s for s in states if s.ready] or states
        missing = [s for s in live if not s.models_fetched]
        if missing:
            await asyncio.gather(*(fetch_models(s) for s in missing))
        seen: dict[str, dict] = {}
        for s in live:
            for k, m in s.model_objs.items():
                seen.setdefault(k, m)
        if not seen:
            return JSONResponse(_error_body("no backend answered /v1/models", "upstream_unavailable", 503,
                                            attempts=[f"{s.id}: {s.last_error}" for s in live]), status_code=503)
        return JSONResponse({"object": "list", "data": list(seen.values())})

    @app.get("/v1/gateway/backends")
    async def backends_status(request: Request) -> Response:
        denied = auth_error(request)
        if denied is not None:
            return denied
        return JSONResponse({"policy": policy.spec, "backends": [s.as_dict() for s in states]})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        n = sum(s.ready for s in states)
        return JSONResponse({"ready": n > 0, "backends_ready": n, "backends": len(states)},
                            status_code=200 if n else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        denied = auth_error(request)
        if denied is not None:
            return denied
        return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)

    app.state.by_id = by_id
    return app


class ThreadedServer:
    """An ASGI app under uvicorn on 127.0.0.1 in a background thread (tests, benchmarks, notebooks).

    ``with ThreadedServer(app) as srv: httpx.get(srv.url + "/healthz")``"""

    def __init__(self, app: Any, port: int | None = None, log_level: str = "warning"):
        import uvicorn

        from fleetwise.serve.localbackends import free_port

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level=log_level,
                                                    lifespan="on", access_log=False))
        self._thread: Any = None

    def start(self, timeout_s: float = 30.0) -> "ThreadedServer":
        import threading

        self._thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on {self.url} failed to start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {self.url} not started after {timeout_s:.0f} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self.server.should_exit = True
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> "ThreadedServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_gateway(backends: list[str], host: str = "127.0.0.1", port: int = 8080,
                  route_policy: str = "least_outstanding_tokens", token_file: str | None = None,
                  log_level: str = "warning", seed: int = 0, **options: Any) -> None:
    """``fleetwise serve --gateway``: the token rule of the decision service (``--token-file`` or
    ``$FLEETWISE_SERVE_TOKEN``; none: loopback only), then the gateway under uvicorn until interrupted."""
    import uvicorn

    from fleetwise.serve.app import check_token, resolve_token

    token = resolve_token(token_file)
    check_token(host, token)
    app = create_gateway_app(backends, route_policy=route_policy, token=token, seed=seed, **options)
    if token is None:
        print(f"warning: no token (FLEETWISE_SERVE_TOKEN or --token-file): gateway on {host}:{port} serves "
              "loopback clients only, without authentication", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
