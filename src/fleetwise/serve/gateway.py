"""Gateway mode: an OpenAI-compatible proxy in front of real inference servers, routed by a fleetwise policy.
docs/gateway.md, docs/security.md.

``create_gateway_app(backends, route_policy)`` is a FastAPI app (the ``serve`` extra) that forwards
``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed and not) and answers ``GET /v1/models``
for a list of OpenAI-compatible backends (vLLM, llama.cpp, SGLang, ...). Each request goes to the backend the
loaded router picks (``fleetwise.serve.policy``) from live signals the gateway collects itself.

Three parts: the backends' state and the picking (``fleetwise.serve.gateway_pool``), the forwarding with its
failure semantics and SSE framing (``fleetwise.serve.gateway_forward``), and here the request check and the app.
A request is checked before anything is forwarded: a JSON object whose fields the gateway reads have their OpenAI
types and bounds (``fleetwise.serve.schemas.CompletionRequest`` / ``ChatRequest``: ``messages`` a list of
messages, ``max_tokens`` at most 2^24, ``n`` at most 128, nesting within pydantic's recursion limit); otherwise 400
with one line. The raw body is forwarded unchanged.

Also: ``GET /metrics`` (Prometheus: requests by backend and outcome, retries, upstream latency, in-flight,
readiness), ``GET /healthz``, ``GET /readyz`` (503 while no backend is ready), ``GET /v1/gateway/backends``
(the live signals as JSON). The edge (``fleetwise.serve.edge``) is the decision service's: with a token, every
path but ``/healthz`` and ``/readyz`` needs ``Authorization: Bearer TOKEN``; without one, only loopback clients
and Host names; one body-size limit on every path.
"""

import asyncio
import contextlib
import json
import math
import sys
from contextlib import asynccontextmanager
from typing import Any

from fleetwise.errors import InputError
from fleetwise.serve.edge import (  # noqa: F401
    Edge,
    Guard,
    Limits,
    ThreadedServer,  # noqa: F401  (public here since the gateway's first version)
    check_token,
    fronted,
    is_loopback,
    resolve_token,
)
from fleetwise.serve.gateway_pool import BackendState, GatewayConfig, Pool, normalise_backend_url
from fleetwise.serve.policy import load_route_policy

__all__ = ["create_gateway_app", "GatewayConfig", "BackendState", "normalise_backend_url", "ThreadedServer",
           "serve_gateway"]

_ERROR_TYPES = {"authentication": "authentication_error", "permission": "permission_error",
                "invalid_request": "invalid_request_error"}


def _render(status: int, message: str, kind: str) -> bytes:
    """The edge's refusals in OpenAI's error shape."""
    from fleetwise.serve.gateway_forward import error_body

    return json.dumps(error_body(message, _ERROR_TYPES.get(kind, kind), status)).encode()


# --------------------------------------------------------------------------------------------- requests
def _estimate_prompt_tokens(req: Any, chars_per_token: float) -> int:
    """Prompt tokens from the checked request: text length / ``chars_per_token``, or the count of token ids."""
    def text(x: Any) -> int:
        if isinstance(x, str):
            return math.ceil(len(x) / chars_per_token)
        if isinstance(x, list):
            if x and all(isinstance(t, int) for t in x):  # token ids
                return len(x)
            return sum(text(t) for t in x)
        return 0

    # (a chat body's messages; a completion body may carry an extra "messages" field, passed through as raw JSON)
    messages = req.messages if "messages" in type(req).model_fields else None
    if messages is not None:
        total = 2
        for m in messages:
            c = m.content
            total += 4 + (text(c) if isinstance(c, str) else sum(text(p.text or "") for p in c or ()))
        return total
    return text(req.prompt)


def _no_duplicate_keys(pairs: list) -> dict:
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"key {k[:60]!r} given twice in one object")
        seen.add(k)
    return dict(pairs)


def parse_request(raw: bytes, path: str, cfg: GatewayConfig) -> tuple[Any, int, int]:
    """(checked request, prompt-token estimate, output-token estimate) of a completion or chat body; ValueError
    with one line when it is not a valid request."""
    from pydantic import ValidationError

    from fleetwise.serve.schemas import ChatRequest, CompletionRequest, validation_detail

    model = ChatRequest if path.endswith("/chat/completions") else CompletionRequest
    try:
        req = model.model_validate_json(raw)
    except ValidationError as e:  # (lists fail fast: a prompt of 600,000 bad ids is one error, schemas._Fast)
        errs = e.errors(include_url=False, include_input=False)
        if errs and errs[0].get("type") in ("json_invalid", "model_type") and not errs[0].get("loc"):
            raise ValueError("request body is not a JSON object: " + validation_detail(errs)) from None
        raise ValueError("invalid request: " + validation_detail(errs)) from None
    import json

    try:  # the body is forwarded as sent: a key given twice is refused ({"max_tokens": 99999999999, "max_tokens": 4}
        json.loads(raw, object_pairs_hook=_no_duplicate_keys)  # was checked as 4 and forwarded; a backend whose
    except ValueError as e:  # parser keeps the first value saw another request)
        raise ValueError(f"invalid request: {e}") from None
    from fleetwise.yamlio import non_finite

    extra = req.model_extra or {}
    bad = next((k for k, v in extra.items() if non_finite(v)), None)
    if bad is not None:  # (the fields passed through unchecked: NaN and 1e999 reached the backend)
        raise ValueError(f"invalid request: {bad}: NaN, Infinity or a number beyond a double is not JSON")
    n = req.n or 1
    out = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
    out_tokens = (out if out else cfg.default_max_tokens) * n
    return req, _estimate_prompt_tokens(req, cfg.chars_per_token), out_tokens


# --------------------------------------------------------------------------------------------- endpoints
async def _client_gone(request: Any) -> None:
    """Returns when the client has disconnected (the body was read before: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Any, pool: Pool, forwarding: Any) -> Any:
    """``forwarding``'s response, or, when the client disconnects first, the attempt cancelled (its backend's
    in-flight count released at once, the upstream connection closed) and a 499 that nobody reads. A client that
    left kept its backend counted as busy until the backend answered (up to ``attempt_timeout_s``). Once a stream
    is relayed, its response watches for the disconnect itself."""
    from fastapi.responses import Response

    from fleetwise.serve.gateway_forward import ReleasingStream

    fwd = asyncio.ensure_future(forwarding)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait((fwd, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler cancelled: so is the attempt
        fwd.cancel()
        raise
    finally:
        gone.cancel()
    if fwd in done:
        return fwd.result()
    fwd.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        late = await fwd  # (it may have finished meanwhile: a stream opened for nobody is closed)
        if isinstance(late, ReleasingStream):
            await late.discard()
    pool.metrics.requests.labels("none", "client_gone").inc()
    return Response(status_code=499)


def _router():
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from fleetwise.serve.gateway_forward import error_body, forward

    api = APIRouter()

    async def proxy(request: Request, path: str) -> Response:
        pool: Pool = request.app.state.pool
        raw = await request.body()  # read by the edge, within the body limit
        try:
            req, in_tokens, out_tokens = parse_request(raw, path, pool.cfg)
        except ValueError as e:
            pool.metrics.requests.labels("none", "bad_request").inc()
            return JSONResponse(error_body(str(e).replace("\n", " "), "invalid_request_error", 400), status_code=400)
        return await _unless_client_leaves(request, pool, forward(pool, path, raw, req.stream is True, req.model,
                                                                  in_tokens, out_tokens))

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy(request, "/v1/completions")

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy(request, "/v1/chat/completions")

    @api.get("/v1/models")
    async def models(request: Request) -> Response:
        pool: Pool = request.app.state.pool
        live = [s for s in pool.states if s.ready] or pool.states
        missing = [s for s in live if not s.models_fetched]
        if missing:
            await asyncio.gather(*(pool.fetch_models(s) for s in missing))
        seen: dict[str, dict] = {}
        for s in live:
            for k, m in s.model_objs.items():
                seen.setdefault(k, m)
        if not seen:
            return JSONResponse(error_body("no backend answered /v1/models", "upstream_unavailable", 503,
                                           attempts=[f"{s.id}: {s.last_error}" for s in live]), status_code=503)
        return JSONResponse({"object": "list", "data": list(seen.values())})

    @api.get("/v1/gateway/backends")
    async def backends_status(request: Request) -> Response:
        pool: Pool = request.app.state.pool
        return JSONResponse({"policy": pool.policy.spec, "backends": [s.as_dict() for s in pool.states]})

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/readyz")
    async def readyz(request: Request) -> Response:
        n = sum(s.ready for s in request.app.state.pool.states)
        return JSONResponse({"ready": n > 0, "backends_ready": n, "backends": len(request.app.state.pool.states)},
                            status_code=200 if n else 503)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(request.app.state.pool.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return api


# --------------------------------------------------------------------------------------------- the app
def _config(config: GatewayConfig | None, options: dict[str, Any]) -> GatewayConfig:
    if config is None:
        try:
            return GatewayConfig(**options)
        except TypeError as e:
            raise InputError(f"gateway options: {e}") from None
    if options:
        raise InputError("give either config or GatewayConfig fields as keywords, not both")
    return config


def backend_urls(backends: list[str]) -> list[str]:
    """The backends' base URLs, normalised (``normalise_backend_url``); InputError for none, a bad one or one given
    twice."""
    if not backends:
        raise InputError("gateway: give at least one backend URL")
    urls = [normalise_backend_url(b) for b in backends]
    dup = {u for u in urls if urls.count(u) > 1}
    if dup:
        raise InputError(f"gateway: backend {sorted(dup)[0]!r} is listed more than once")
    return urls


def create_gateway_app(backends: list[str], route_policy: str = "least_outstanding_tokens",
                       token: str | None = None, *, config: GatewayConfig | None = None,
                       backend_api_key: str | None = None, seed: int = 0, limits: Limits | None = None,
                       force: bool = False, **options: Any):
    """The gateway as a FastAPI app. ``backends``: base URLs (``http://host:port``, with or without ``/v1``).
    ``route_policy``: a registered router (``fleetwise policies``), optionally ``name?param=value``.
    ``token``: bearer token for ``/v1/*`` and ``/metrics`` (None: loopback clients only). ``options``:
    ``GatewayConfig`` fields, e.g. ``max_attempts=2``. ``backend_api_key``: sent upstream as ``Authorization:
    Bearer``. ``limits``: the edge's body limit and read timeout (the rest apply in ``serve_gateway``).
    ``force``: serve a learned router whose checkpoint did not pass its deployment gate."""
    try:
        import httpx
        from fastapi import FastAPI
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise InputError(f"the gateway needs the serve extra (missing module {e.name!r}): "
                         "pip install -c constraints.txt 'fleetwise[serve]'") from None

    cfg = _config(config, options)
    up_headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if backend_api_key:
        up_headers["authorization"] = f"Bearer {backend_api_key}"
    pool = Pool(backend_urls(backends), load_route_policy(route_policy, seed=seed, force=force), cfg, up_headers)

    @asynccontextmanager
    async def lifespan(app):
        conns = httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=cfg.max_connections)
        timeout = httpx.Timeout(connect=cfg.connect_timeout_s, read=cfg.read_timeout_s, write=30.0, pool=60.0)
        async with httpx.AsyncClient(limits=conns, timeout=timeout, trust_env=False) as client:
            pool.client = client
            task = asyncio.create_task(pool.monitor())
            try:
                yield
            finally:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass

    app = fronted(FastAPI)(title="fleetwise gateway", lifespan=lifespan, docs_url=None, redoc_url=None,
                           openapi_url=None)
    app.include_router(_router())
    app.state.pool = pool
    app.state.backends = pool.states
    app.state.by_id = pool.by_id
    app.state.policy = pool.policy
    app.state.config = cfg
    app.edge = Edge(lambda scope, receive, send: FastAPI.__call__(app, scope, receive, send),
                    Guard(token, admin_prefix=None), limits or Limits(), render=_render)
    return app


def serve_gateway(backends: list[str], host: str = "127.0.0.1", port: int = 8080,
                  route_policy: str = "least_outstanding_tokens", token_file: str | None = None,
                  log_level: str = "warning", seed: int = 0, limits: Limits | None = None, **options: Any) -> None:
    """``fleetwise serve --gateway``: the token rule of the decision service (``--token-file`` or
    ``$FLEETWISE_SERVE_TOKEN``; none: loopback only; at least 16 characters off loopback), then the gateway
    under uvicorn with ``limits`` until interrupted."""
    from fleetwise.serve.edge import run

    token = resolve_token(token_file)
    check_token(host, token)
    app = create_gateway_app(backends, route_policy=route_policy, token=token, seed=seed, limits=limits, **options)
    if token is None:
        print(f"warning: no token (FLEETWISE_SERVE_TOKEN or --token-file): gateway on {host}:{port} serves "
              "loopback clients only, without authentication", file=sys.stderr, flush=True)
    from fleetwise.serve.edge import url_host

    print(f"gateway on http://{url_host(host)}:{port} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    run(app, host, port, limits, log_level=log_level)
