"""The decision service: the project's policies behind HTTP (FastAPI + uvicorn). docs/serve.md, docs/security.md.

Endpoints: ``POST /v1/route`` (which replica serves a request), ``POST /v1/scale`` (target replicas per scaling
group), ``POST /v1/plan`` (an origins x regions transport plan of demand), ``POST /v1/admin/reload`` (swap
policies while serving), ``GET /healthz``, ``GET /readyz``, ``GET /metrics`` (Prometheus), ``GET /openapi.json``.

The service is three layers: the wire schemas (``fleetwise.serve.schemas``), the policy adapters
(``fleetwise.serve.policy`` for routers, ``fleetwise.serve.adapters`` for scalers, planners and checkpoints) and
the ASGI edge (``fleetwise.serve.edge``: auth, body limit, server limits), assembled here. With a token, every path
but ``/healthz`` and ``/readyz`` needs ``Authorization: Bearer <token>``; without one, loopback clients and Host
names only, and no admin path unless ``insecure_admin``. Bad bodies get 422 with a one-line ``detail`` naming the
field; a policy that cannot decide gets 4xx with its message, never 5xx. A reload builds the new policies first and
swaps them in one assignment under a lock: calls in flight finish on the policies they started with; a failed load
answers 400 and changes nothing.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleetwise.errors import InputError
from fleetwise.serve.adapters import (  # noqa: F401  (load_*, PlanPolicy, ScalePolicy: public API of this module)
    DEFAULT_PLANNER,
    DEFAULT_ROUTER,
    CheckpointFiles,
    PlanPolicy,
    Policies,
    PolicyFailed,
    ScalePolicy,
    load_plan_policy,
    load_scale_policy,
)
from fleetwise.serve.edge import (  # noqa: F401  (is_loopback, check_token, resolve_token, http_protocol: public)
    OPEN_PATHS,
    TOKEN_ENV,
    Edge,
    Guard,
    Limits,
    check_token,
    fronted,
    http_protocol,
    is_loopback,
    resolve_token,
    url_host,
)
from fleetwise.serve.edge import run as run_server
from fleetwise.serve.policy import RoutePolicy, RouteRequest, load_route_policy
from fleetwise.serve.scale_wire import decode_scale, encode_targets
from fleetwise.serve.schemas import (  # noqa: F401  (the examples: public, used by tests and docs)
    MAX_ERRORS_SHOWN,
    PLAN_EXAMPLE,
    SCALE_EXAMPLE,
    ErrorBody,
    PlanRequest,
    PlanResponse,
    ReloadRequest,
    ReloadResponse,
    RouteResponse,
    ScaleRequest,
    ScaleResponse,
    ValidationErrorBody,
    error_bytes,
    validation_bytes,
    validation_detail,
)

log = logging.getLogger("fleetwise.serve")

LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 2.0)
ENDPOINTS = {"/v1/route": "route", "/v1/scale": "scale", "/v1/plan": "plan", "/v1/admin/reload": "reload",
             "/metrics": "metrics", "/healthz": "healthz", "/readyz": "readyz", "/openapi.json": "openapi"}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter("fleetwise_decisions", "Decisions made, by endpoint and policy",
                                 ["endpoint", "policy"], registry=self.registry)
        self.latency = Histogram("fleetwise_decision_latency_seconds",
                                 "Server-side time of a decision call (body parsing to response), by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter("fleetwise_errors", "Responses with status >= 400, by endpoint and status",
                              ["endpoint", "status"], registry=self.registry)
        self.reloads = Counter("fleetwise_reloads", "Policy reloads, by result", ["result"], registry=self.registry)
        self._dec: dict[tuple[str, str], Any] = {}
        self._lat = {ep: self.latency.labels(ep) for ep in ("route", "scale", "plan")}

    def decided(self, endpoint: str, policy: str) -> None:
        c = self._dec.get((endpoint, policy))
        if c is None:
            c = self._dec[(endpoint, policy)] = self.decisions.labels(endpoint, policy)
        c.inc()

    def observe(self, path: str, status: int, seconds: float | None) -> None:
        """Every response (the edge calls this): latency of the decision endpoints (None: refused, not timed),
        errors of all."""
        ep = ENDPOINTS.get(path, "other")
        lat = self._lat.get(ep)
        if lat is not None and seconds is not None:
            lat.observe(seconds)
        if status >= 400:
            self.errors.labels(ep, str(status)).inc()


NO_SCALER = "no scaler loaded: start with --scaler NAME or POST /v1/admin/reload {\"scaler\": NAME}"


def _err(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail.replace("\n", " ")}, status_code=status)


def _json_content(scope: dict) -> bool:
    """False when the request names a Content-Type that is not JSON: a media type other than application/json or
    application/*+json, as FastAPI reads it (none named: JSON). ``text/jsonish`` was taken for JSON."""
    for k, v in scope["headers"]:
        if k == b"content-type":
            mtype, _, sub = v.partition(b";")[0].strip().lower().partition(b"/")
            if mtype != b"application" or not (sub == b"json" or sub.endswith(b"+json")):
                return False
    return True


def _parse_fast(model: Any, scope: dict, body: bytes) -> Any:
    """``model`` validated from the JSON bytes, or the (422, body) answer the FastAPI endpoint would give."""
    if not _json_content(scope):
        return 422, error_bytes("body: expected Content-Type: application/json")
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        n = e.error_count()
        errs = [{**err, "loc": ("body", *err.get("loc", ()))}
                for err in e.errors(include_url=False, include_input=False)[:MAX_ERRORS_SHOWN]]
        return 422, validation_bytes(errs, n)


class _NoCollection:
    """No cyclic garbage collection while a ``/v1/scale`` body is decoded and decided (nested across threads:
    the collector is back on when the last one leaves, as it was). Such a call allocates tens of thousands of
    objects that all live until it answers, and freed by reference counting then; the collections they trigger
    meanwhile would scan them again and again (a third of the CPU time at 10,000 groups). Cycles made meanwhile,
    if any, are collected at the next collection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._inside += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0 and self._was_enabled:
                gc.enable()


_NO_COLLECTION = _NoCollection()


# --------------------------------------------------------------------------------------------- the state
@dataclass
class Service:
    """What the endpoints share: the policies in use (one object, swapped whole by a reload), the metrics, and
    which checkpoint files a reload may name; ``force``: load checkpoints that did not pass the deployment gate."""

    policies: Policies
    metrics: Metrics
    files: CheckpointFiles
    seed: int = 0
    force: bool = False
    ready: bool = True
    reloads: int = 0
    reload_lock: threading.Lock = field(default_factory=threading.Lock)

    def decide_route(self, req: RouteRequest) -> tuple[int, bytes]:
        pol = self.policies.route  # one reference for the whole call: a reload does not affect it
        try:
            i = pol.route(req)
        except InputError as e:
            return 422, error_bytes(str(e))
        except Exception as e:  # noqa: BLE001 - a policy failing on valid input is the caller's 4xx, with why
            log.exception("router %s failed", pol.name)
            return 422, error_bytes(f"router {pol.name!r} failed on this request: {type(e).__name__}: {e}")
        self.metrics.decided("route", pol.name)
        return 200, (b'{"replica_index":%d,"replica_id":%s,"policy":%s}'
                     % (i, json.dumps(req.replicas[i].id).encode(), json.dumps(pol.name).encode()))

    async def route_fast(self, scope: dict, body: bytes) -> tuple[int, bytes]:
        """POST /v1/route without FastAPI's routing, dependency solving and double JSON pass (a few times cheaper):
        the body (read by the edge) goes straight to pydantic-core's JSON validator; answers as the endpoint."""
        req = _parse_fast(RouteRequest, scope, body)
        return req if isinstance(req, tuple) else self.decide_route(req)

    async def scale_fast(self, scope: dict, body: bytes) -> tuple[int, bytes]:
        """POST /v1/scale the same way: its bodies reach 10,000 groups (MBs), where FastAPI's generic JSON and
        response passes cost more than the decision. Parsing and deciding run in the thread pool, as FastAPI runs
        a plain ``def`` endpoint: the event loop keeps serving other calls meanwhile. Answers as the endpoint."""
        return await run_in_threadpool(self._scale_fast, scope, body)

    def _scale_fast(self, scope: dict, body: bytes) -> tuple[int, bytes]:
        with _NO_COLLECTION:
            return self._scale_answer(scope, body)

    def _scale_answer(self, scope: dict, body: bytes) -> tuple[int, bytes]:
        obs = decode_scale(body) if _json_content(scope) else None  # msgspec: the fast path (serve/scale_wire.py)
        req = _parse_fast(ScaleRequest, scope, body) if obs is None else None  # pydantic: the answer otherwise
        if isinstance(req, tuple):
            return req
        pol = self.policies.scale
        if pol is None:
            return 409, error_bytes(NO_SCALER)
        call = (lambda: pol.scale(req)) if obs is None else (lambda: pol.decide(obs))
        res = self.decide("scale", "scaler", pol, "observation", call)
        if isinstance(res, JSONResponse):
            return res.status_code, bytes(res.body)
        return 200, encode_targets(res, pol.name)

    def decide(self, kind: str, role: str, pol: Any, on: str, call: Any) -> Any:
        """One /v1/scale or /v1/plan decision: a policy failing on valid input is a 422 that names it and why."""
        try:
            res = call()
        except (InputError, PolicyFailed) as e:
            return _err(422, str(e))
        except Exception as e:  # noqa: BLE001
            log.exception("%s %s failed", role, pol.name)
            return _err(422, f"{role} {pol.name!r} failed on this {on}: {type(e).__name__}: {e}")
        self.metrics.decided(kind, pol.name)
        return res

    def reload(self, req: ReloadRequest) -> Any:
        """Load the new policies (all given ones, or none), then swap them in with one assignment."""
        with self.reload_lock:  # one reload at a time; decisions never wait for it
            old = self.policies
            files = self.files.for_clients()
            try:
                seed = self.seed if req.seed is None else req.seed
                route = load_route_policy(req.router, seed, files=files, force=self.force) \
                    if req.router is not None else old.route
                scale = load_scale_policy(req.scaler, files, self.force) if req.scaler is not None else old.scale
                plan, plan_err = old.plan, old.plan_error
                if req.planner is not None or req.checkpoint is not None:
                    ckpt = None if req.checkpoint is None else str(files.resolve(req.checkpoint))
                    plan, plan_err = load_plan_policy(req.planner, ckpt, self.force), None
            except Exception as e:  # noqa: BLE001 - every failed load is the caller's 400, old policies kept
                self.metrics.reloads.labels("failed").inc()
                msg = str(e) if isinstance(e, InputError) else f"{type(e).__name__}: {e}"
                return _err(400, f"reload failed, policies unchanged: {msg}")
            self.policies = Policies(route, scale, plan, plan_err)  # one assignment: the atomic swap
            self.reloads += 1
            self.metrics.reloads.labels("ok").inc()
            return {"router": route.spec, "scaler": scale.name if scale else None,
                    "planner": plan.name if plan else None, "reloads": self.reloads}


# --------------------------------------------------------------------------------------------- endpoints
_E4 = {401: {"model": ErrorBody, "description": "missing or invalid bearer token"},
       422: {"model": ValidationErrorBody, "description": "invalid body, or the policy cannot decide on it"}}
_E409 = {409: {"model": ErrorBody, "description": "no policy of this kind loaded"}}
router = APIRouter()


def _svc(request: Request) -> Service:
    return request.app.state.service


@router.post("/v1/route", response_model=RouteResponse, responses=_E4, tags=["decisions"])
async def route_request(req: RouteRequest, request: Request) -> Response:
    """Which replica serves this request: index into ``replicas`` and its id."""
    status, body = _svc(request).decide_route(req)
    return Response(body, status_code=status, media_type="application/json")


@router.post("/v1/scale", response_model=ScaleResponse, responses={**_E4, **_E409}, tags=["decisions"])
def scale_request(req: ScaleRequest, request: Request) -> Any:  # type: ignore[valid-type]
    """Target replicas per scaling group for the coming epoch (the loaded scaler, registry level 'scaler')."""
    svc = _svc(request)
    pol = svc.policies.scale
    if pol is None:
        return _err(409, NO_SCALER)
    return svc.decide("scale", "scaler", pol, "observation", lambda: {"targets": pol.scale(req), "policy": pol.name})


@router.post("/v1/plan", response_model=PlanResponse, responses={**_E4, **_E409}, tags=["decisions"])
def plan_request(req: PlanRequest, request: Request) -> Any:
    """Regional distribution for the coming slot: an origins x regions transport plan of the demand."""
    svc = _svc(request)
    pols = svc.policies
    pol = pols.plan
    if pol is None:
        return _err(409, f"no planner loaded: {pols.plan_error or 'start with --planner or --checkpoint'}")
    return svc.decide("plan", "planner", pol, "slot", lambda: pol.plan(req))


@router.post("/v1/admin/reload", response_model=ReloadResponse, tags=["admin"],
             responses={**_E4, 400: {"model": ErrorBody, "description": "the new policy did not load; the old one "
                                                                       "stays"},
                        403: {"model": ErrorBody, "description": "no token and no --insecure-admin"}})
def reload(req: ReloadRequest, request: Request) -> Any:
    """Load new policies (all given ones, or none) and swap them in; calls in flight finish on the old ones.
    A checkpoint must lie inside the service's ``--checkpoint-dir``."""
    return _svc(request).reload(req)


@router.get("/healthz", tags=["ops"])
async def healthz() -> dict:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["ops"], responses={503: {"model": ErrorBody, "description": "not ready"}})
async def readyz(request: Request) -> Any:
    """Readiness: policies loaded and not shutting down."""
    svc = _svc(request)
    pols = svc.policies
    if not svc.ready:
        return _err(503, "shutting down")
    return {"status": "ready", "router": pols.route.spec, "scaler": pols.scale.name if pols.scale else None,
            "planner": pols.plan.name if pols.plan else None}


@router.get("/metrics", tags=["ops"], response_class=Response, responses={
    200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}, 401: _E4[401]})
async def metrics_text(request: Request) -> Response:
    """Prometheus metrics: decisions, decision latency, errors, reloads."""
    return Response(generate_latest(_svc(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _invalid(request: Request, exc: RequestValidationError) -> Response:
    errs = exc.errors()
    return Response(validation_bytes(list(errs[:MAX_ERRORS_SHOWN]), len(errs)), status_code=422,
                    media_type="application/json")


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # e.g. not UTF-8
        return Response(validation_bytes([{"loc": ("body",), "msg": "not valid JSON (expected a UTF-8 JSON object)",
                                           "type": "json_invalid"}]), status_code=422, media_type="application/json")
    return await http_exception_handler(request, exc)


def _openapi(app: FastAPI) -> dict:
    """The schema, with bearer auth declared on every path but the open ones."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearerAuth"] = {
            "type": "http", "scheme": "bearer"}
        for path, ops in schema.get("paths", {}).items():
            if path not in OPEN_PATHS:
                for op in ops.values():
                    op["security"] = [{"bearerAuth": []}]
        app.openapi_schema = schema
    return app.openapi_schema


# --------------------------------------------------------------------------------------------- the app
ServiceApp = fronted(FastAPI)


def _initial_policies(route_policy: str | RoutePolicy, scaler: str | ScalePolicy | None,
                      planner: str | PlanPolicy | None, checkpoint: str | None, seed: int,
                      files: CheckpointFiles, force: bool = False) -> Policies:
    route = route_policy if isinstance(route_policy, RoutePolicy) else \
        load_route_policy(route_policy, seed, files=files, force=force)
    scale = scaler if isinstance(scaler, ScalePolicy) or scaler is None else load_scale_policy(scaler, files, force)
    if isinstance(planner, PlanPolicy):
        return Policies(route, scale, planner)
    if planner is None and checkpoint is None:
        try:
            return Policies(route, scale, load_plan_policy(DEFAULT_PLANNER))
        except InputError as e:  # the default planner needs the rl extra (POT); the rest of the service does not
            return Policies(route, scale, None, str(e))
    ckpt = None if checkpoint is None else str(files.resolve(checkpoint))
    return Policies(route, scale, load_plan_policy(planner, ckpt, force))


def create_app(route_policy: str | RoutePolicy = DEFAULT_ROUTER, scaler: str | ScalePolicy | None = None,
               planner: str | PlanPolicy | None = None, checkpoint: str | None = None, token: str | None = None,
               seed: int = 0, fast_route: bool = True, *, checkpoint_dir: str | None = None,
               insecure_admin: bool = False, limits: Limits | None = None, force: bool = False) -> FastAPI:
    """The decision service as an ASGI app. ``token`` None: no authentication (the CLI allows that on loopback
    only): loopback clients and Host names only, and the admin paths refused unless ``insecure_admin``.
    ``checkpoint_dir``: the folder checkpoints load from (a reload may name files inside it only; none: reloading a
    checkpoint is refused). ``planner`` None and no ``checkpoint``: ``ot_capacity`` if the rl extra is installed,
    else /v1/plan answers 409. ``limits``: body size and read timeout here, the rest in ``edge.run``. Bad policy
    names or files raise ``InputError``. A checkpoint (at start or on reload) whose model card does not say it
    passed the deployment gate is refused unless ``force`` (``fleetwise serve --force``)."""
    files = CheckpointFiles(checkpoint_dir, trusted=True)
    svc = Service(_initial_policies(route_policy, scaler, planner, checkpoint, seed, files, force), Metrics(), files,
                  seed, force=force)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        svc.ready = False

    app = ServiceApp(title="fleetwise decision service", version=_version(), docs_url=None, redoc_url=None,
                     lifespan=lifespan,
                     description="Routing, scaling and regional planning decisions from fleetwise policies. "
                                 "All paths but /healthz and /readyz need `Authorization: Bearer <token>`.")
    app.include_router(router)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.state.service = svc
    app.state.metrics = svc.metrics
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.edge = Edge(lambda scope, receive, send: FastAPI.__call__(app, scope, receive, send),
                    Guard(token, insecure_admin=insecure_admin), limits or Limits(), observe=svc.metrics.observe,
                    fast={("POST", "/v1/route"): svc.route_fast, ("POST", "/v1/scale"): svc.scale_fast}
                    if fast_route else None)
    return app


def _version() -> str:
    from fleetwise import __version__

    return __version__


# --------------------------------------------------------------------------------------------- the command

def main(host: str = "127.0.0.1", port: int = 8000, router: str = DEFAULT_ROUTER, scaler: str | None = None,
         planner: str | None = None, checkpoint: str | None = None, token_file: str | None = None, seed: int = 0,
         log_level: str = "warning", access_log: bool = False, checkpoint_dir: str | None = None,
         insecure_admin: bool = False, limits: Limits | None = None, force: bool = False) -> None:
    """``fleetwise serve``: check the token rule, build the app (bad policies: InputError), run uvicorn."""
    token = resolve_token(token_file)
    check_token(host, token)
    if checkpoint_dir is not None and not os.path.isdir(checkpoint_dir):
        raise InputError(f"--checkpoint-dir {checkpoint_dir}: not a directory")
    if insecure_admin and token is not None:
        raise InputError("--insecure-admin applies only without a token (with one, admin calls need it)")
    for backend in ("PYTORCH", "JAX", "CUPY", "TENSORFLOW"):  # POT (the planner's Sinkhorn) works on numpy here:
        os.environ.setdefault(f"POT_BACKEND_DISABLE_{backend}", "1")  # skip importing torch & co (seconds, 100s MB)
    app = create_app(router, scaler=scaler, planner=planner, checkpoint=checkpoint, token=token, seed=seed,
                     checkpoint_dir=checkpoint_dir, insecure_admin=insecure_admin, limits=limits, force=force)
    # (after the policies are checked: a refused one is the only line)
    if token is None:
        print(f"warning: no token ({TOKEN_ENV} or --token-file): serving {host}:{port} without authentication, "
              "loopback only" + ("; admin endpoints open (--insecure-admin)" if insecure_admin else
                                 "; admin endpoints refused"), file=sys.stderr, flush=True)
    if force:
        print("warning: --force: checkpoints that did not pass the deployment gate are served", file=sys.stderr,
              flush=True)
    gc.collect()
    gc.freeze()  # the ~250k objects of the imports never move again: full collections stop scanning them (ms)
    print(f"serving on http://{url_host(host)}:{port} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    run_server(app, host, port, limits, log_level=log_level, access_log=access_log)
