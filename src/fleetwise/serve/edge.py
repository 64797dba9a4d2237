"""The HTTP edge that the decision service and the gateway share (docs/security.md).

- ``Guard``: who may call what, one implementation for both. With a token, every path but the open ones
  (``/healthz``, ``/readyz``) needs ``Authorization: Bearer <token>``, compared in constant time. Without a token
  (allowed on loopback only): loopback clients only, a loopback ``Host`` (and ``Origin``, when a browser sends one),
  so a web page that rebinds its DNS name to 127.0.0.1 is refused; and no admin path unless ``insecure_admin``.
- ``Edge``: a pure ASGI front (no Starlette middleware stack on the hot path): the guard, then the request body
  read once with one size limit for every path (a larger ``Content-Length`` is refused with 413 before a byte of
  the body is read; a chunked body at the first byte past the limit) and a read timeout (408), then the app with
  the body replayed, or a fast handler that takes the body bytes directly. Requests receiving their body are at
  most half the concurrency limit (beyond it the one receiving longest gets a 408). The bodies held in memory at
  once, all requests together, are bounded too (``max_buffered_bytes``: a body that would pass it, while others
  are held, is a 503 with ``Retry-After``), so that many concurrent large bodies cannot take the host's memory.
- ``server_config`` / ``run`` / ``ThreadedServer``: uvicorn with a header timeout (a connection that has not sent
  a whole request head within ``header_timeout_s`` is closed), a bound on the request head's size (431), the
  keep-alive timeout, a concurrency limit (503 beyond it; connections waiting for a head are at most half of it,
  the oldest closed beyond that, so slow sockets cannot hold every slot) and coalesced writes.
- ``check_token``: no token on a non-loopback address, or one shorter than ``MIN_TOKEN_CHARS``, is refused at start.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import os
import time
from dataclasses import dataclass, fields
from typing import Any, Awaitable, Callable

from fleetwise.errors import InputError

TOKEN_ENV = "FLEETWISE_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
ADMIN_PREFIX = "/v1/admin/"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one server (service or gateway); docs/security.md lists the defaults."""

    max_body_bytes: int = 8 << 20  # every request body, every path
    body_timeout_s: float = 30.0  # to receive the whole body once the head is in
    header_timeout_s: float = 5.0  # to receive a whole request head (new or kept-alive connection)
    max_header_bytes: int = 64 << 10  # request line + headers
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this
    max_concurrency: int = 500  # connections + requests in progress; beyond: 503
    # request bodies held in memory at once, all requests together (being read or being answered); beyond: 503.
    # A body is always admitted when no other is held, so one body of max_body_bytes always fits.
    max_buffered_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InputError(f"limit {f.name} {v!r}: expected a finite number > 0")
            if v > LIMIT_MAX[f.name]:  # (a limit set past these is no limit: one body could take the memory)
                raise InputError(f"limit {f.name} {v!r}: at most {LIMIT_MAX[f.name]:,} (docs/security.md)")


# the largest value an operator may give each limit (docs/security.md)
LIMIT_MAX = {"max_body_bytes": 1 << 30, "body_timeout_s": 3600.0, "header_timeout_s": 3600.0,
             "max_header_bytes": 1 << 20, "keep_alive_s": 3600.0, "max_concurrency": 100_000,
             "max_buffered_bytes": 1 << 36}


# --------------------------------------------------------------------------------------------- tokens
def is_loopback(host: str) -> bool:
    """An address or name that only this machine reaches: localhost, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_header_is_loopback(value: str) -> bool:
    """A ``Host`` (or ``Origin`` authority) value naming a loopback host, with or without a port:
    ``localhost``, ``localhost:8000``, ``127.0.0.1:8000``, ``[::1]:8000``, ``::1``."""
    v = value.strip()
    if v.startswith("["):
        end = v.find("]")
        if end < 0 or (v[end + 1:] and not (v[end + 1] == ":" and v[end + 2:].isascii() and v[end + 2:].isdigit())):
            return False
        return is_loopback(v[1:end])
    if v.count(":") == 1:
        v, _, port = v.partition(":")
        if not (port.isascii() and port.isdigit()):  # (isdigit alone takes "²")
            return False
    return bool(v) and is_loopback(v)


def resolve_token(token_file: str | None = None) -> str | None:
    """The bearer token: the file's first line (``--token-file``), else ``$FLEETWISE_SERVE_TOKEN``, else None."""
    if token_file is not None:
        from fleetwise.yamlio import read_text

        try:  # (opened without waiting: a FIFO hung the start)
            tok = read_text(token_file, "token").strip()
        except InputError as e:
            raise InputError(f"--token-file: {e}") from None
        if not tok or any(c.isspace() for c in tok) or not tok.isprintable():  # (a NUL no client can send)
            raise InputError(f"--token-file {token_file}: expected one token (no spaces or control characters) on "
                             "one line")
        return tok
    tok = os.environ.get(TOKEN_ENV, "").strip()
    return tok or None


def check_token(host: str, token: str | None, what: str = "serve") -> None:
    """No token: refuse a non-loopback address (InputError, exit 2). A token shorter than ``MIN_TOKEN_CHARS`` on a
    non-loopback address: refused too (guessable)."""
    if is_loopback(host):
        return
    if token is None:
        raise InputError(f"refusing to {what} on {host} without a token: set {TOKEN_ENV} or --token-file "
                         "(or bind 127.0.0.1)")
    if len(token) < MIN_TOKEN_CHARS:
        raise InputError(f"refusing to {what} on {host} with a token of {len(token)} characters: use at least "
                         f"{MIN_TOKEN_CHARS} (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")


# --------------------------------------------------------------------------------------------- the guard
@dataclass(frozen=True)
class Denial:
    status: int
    message: str
    kind: str  # "authentication" (401) or "permission" (403)
    headers: tuple[tuple[bytes, bytes], ...] = ()


def _headers(scope: dict, name: bytes) -> list[bytes]:
    return [v for k, v in scope["headers"] if k == name]


class Guard:
    """Bearer auth and the no-token rules of the module docstring; ``check(scope)`` -> ``Denial`` or None."""

    def __init__(self, token: str | None, open_paths: frozenset[str] = OPEN_PATHS,
                 admin_prefix: str | None = ADMIN_PREFIX, insecure_admin: bool = False):
        self.token = token.encode() if token else None
        self.open_paths = open_paths
        self.admin_prefix = admin_prefix
        self.insecure_admin = insecure_admin

    def check(self, scope: dict) -> Denial | None:
        if self.token is not None:
            return None if scope["path"] in self.open_paths else self._bearer(scope)
        return self._local(scope)

    def _bearer(self, scope: dict) -> Denial | None:
        given = _headers(scope, b"authorization")
        if given:
            scheme, _, cred = given[0].partition(b" ")
            if len(given) == 1 and scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), self.token):
                return None
            return Denial(401, "invalid bearer token", "authentication",
                          ((b"www-authenticate", b'Bearer realm="fleetwise", error="invalid_token"'),))
        return Denial(401, "missing bearer token (Authorization: Bearer <token>)", "authentication",
                      ((b"www-authenticate", b'Bearer realm="fleetwise"'),))

    def _local(self, scope: dict) -> Denial | None:
        client = (scope.get("client") or ("",))[0]
        if not (is_loopback(client) or client == "testclient"):  # testclient: Starlette's in-process client
            return Denial(403, "this server runs without a token and serves loopback clients only", "permission")
        hosts = _headers(scope, b"host")
        host = hosts[0].decode("latin-1") if len(hosts) == 1 else ""
        if not host_header_is_loopback(host):
            return Denial(403, f"Host {host[:100]!r} is not a loopback name (localhost, 127.0.0.1, [::1]); without a "
                               "token only those are served", "permission")
        for origin in _headers(scope, b"origin"):
            o = origin.decode("latin-1")
            authority = o.split("://", 1)[1] if "://" in o else ""
            if not host_header_is_loopback(authority):
                return Denial(403, f"Origin {o[:100]!r} is not a loopback origin; without a token only those are "
                                   "served", "permission")
        if self.admin_prefix and scope["path"].startswith(self.admin_prefix) and not self.insecure_admin:
            return Denial(403, "admin endpoints need a token (FLEETWISE_SERVE_TOKEN or --token-file), even on "
                               "loopback; or start with --insecure-admin", "permission")
        return None


# --------------------------------------------------------------------------------------------- bodies
class BodyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Disconnected(Exception):
    pass


def _busy_bodies(limits: Limits) -> BodyError:
    return BodyError(503, f"server busy: request bodies in memory would exceed {limits.max_buffered_bytes} bytes "
                          "(max_buffered_bytes); retry later")


async def read_body(scope: dict, receive: Any, limits: Limits,
                    admit: Callable[[int], bool] | None = None) -> bytes:
    """The whole request body: 413 (``BodyError``) when ``Content-Length`` or the bytes received exceed
    ``max_body_bytes`` (nothing more is read), 408 when it takes longer than ``body_timeout_s``. ``admit(n)``
    reserves ``n`` more bytes of the server's body memory (``Content-Length`` before a byte is read, else each
    chunk as it arrives): False is a 503."""
    limit = limits.max_body_bytes
    cl = _headers(scope, b"content-length")
    declared = False
    if cl:
        if len(cl) > 1 or not (cl[0].strip().isascii() and cl[0].strip().isdigit()):
            raise BodyError(400, "Content-Length: expected one non-negative integer")
        if int(cl[0]) > limit:
            raise BodyError(413, f"body: {int(cl[0])} bytes, more than the limit of {limit}")
        if admit is not None and not admit(int(cl[0])):
            raise _busy_bodies(limits)
        declared = True
    chunks: list[bytes] = []
    n = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise _Disconnected
                b = msg.get("body", b"")
                if b:
                    n += len(b)
                    if n > limit:
                        raise BodyError(413, f"body: more than the limit of {limit} bytes")
                    if admit is not None and not declared and not admit(len(b)):
                        raise _busy_bodies(limits)
                    chunks.append(b)
                if not msg.get("more_body", False):
                    break
    except TimeoutError:
        raise BodyError(408, f"body: not received within {limits.body_timeout_s:g} s") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` once, then waits on the real one (for the disconnect)."""
    sent = False

    async def again() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def respond(send: Any, status: int, body: bytes, headers: tuple = (), close: bool = False) -> None:
    h = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *headers]
    if close:
        h.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": h})
    await send({"type": "http.response.body", "body": body})


def detail_body(status: int, message: str, kind: str) -> bytes:
    """The decision service's error body: ``{"detail": one line}``."""
    return json.dumps({"detail": message.replace("\n", " ")}).encode()


Render = Callable[[int, str, str], bytes]  # (status, message, kind) -> response body
Fast = Callable[[dict, bytes], Awaitable[tuple[int, bytes]]]


class Edge:
    """The ASGI front of the module docstring. ``render`` formats error bodies (service: ``{"detail"}``, gateway:
    OpenAI's ``{"error": {...}}``); ``observe(path, status, seconds)`` sees every response; ``fast`` maps
    ``(method, path)`` to a handler ``(scope, body) -> (status, json bytes)`` that skips the framework. A refused call
is observed with ``seconds`` None."""

    def __init__(self, app: Any, guard: Guard, limits: Limits, render: Render = detail_body,
                 observe: Callable[[str, int, float | None], None] | None = None,
                 fast: dict[tuple[str, str], Fast] | None = None):
        self.app, self.guard, self.limits, self.render = app, guard, limits, render
        self.observe = observe
        self.fast = fast or {}
        self.held = 0  # bytes of request bodies held now, all requests together (limits.max_buffered_bytes)
        self.reading: dict[int, list] = {}  # requests receiving their body, oldest first: number -> [task, evicted]
        self._n = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        d = self.guard.check(scope)
        if d is not None:
            await respond(send, d.status, self.render(d.status, d.message, d.kind), d.headers)
            if self.observe is not None:
                self.observe(scope["path"], d.status, None)  # refused: counted, not timed
            return
        t0 = time.perf_counter()
        status = await self._handle(scope, receive, send)
        if self.observe is not None:
            self.observe(scope["path"], status, time.perf_counter() - t0)

    async def _handle(self, scope: dict, receive: Any, send: Any) -> int:
        mine = 0  # bytes this request holds (released when it is answered)

        def admit(n: int) -> bool:
            nonlocal mine
            if self.held + n > self.limits.max_buffered_bytes and self.held > mine:  # others hold bodies too
                return False
            self.held += n
            mine += n
            return True

        try:
            return await self._answer(scope, receive, send, admit)
        finally:
            self.held -= mine

    async def _read(self, scope: dict, receive: Any, admit: Callable[[int], bool]) -> bytes:
        """``read_body``, as one of the requests receiving their body: those are at most half the concurrency
        limit, and beyond it the one receiving longest gets a 408 (so that slow bodies cannot hold every slot)."""
        self._n = n = self._n + 1
        me = [asyncio.current_task(), False]
        reading = self.reading
        reading[n] = me
        cap = max(1, self.limits.max_concurrency // 2)
        while len(reading) > cap:
            k, oldest = next(iter(reading.items()))
            if oldest is me:
                break
            del reading[k]
            oldest[1] = True
            oldest[0].cancel()
        try:
            return await read_body(scope, receive, self.limits, admit)
        except asyncio.CancelledError:
            if not me[1]:
                raise
            me[0].uncancel()
            raise BodyError(408, f"body: not received while newer requests waited (more than {cap} requests "
                                 "were receiving their bodies)") from None
        finally:
            reading.pop(n, None)

    async def _answer(self, scope: dict, receive: Any, send: Any, admit: Callable[[int], bool]) -> int:
        try:
            body = await self._read(scope, receive, admit)
        except BodyError as e:
            kind, headers = ("server_busy", ((b"retry-after", b"1"),)) if e.status == 503 else ("invalid_request", ())
            await respond(send, e.status, self.render(e.status, str(e), kind), headers, close=True)
            return e.status
        except _Disconnected:
            return 499
        fast = self.fast.get((scope["method"], scope["path"])) if self.fast else None
        if fast is not None:
            status, out = await fast(scope, body)
            await respond(send, status, out)
            return status
        status = 500

        async def send_status(msg: dict) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        await self.app(scope, _replay(body, receive), send_status)
        return status


def fronted(app_cls: type) -> type:
    """``app_cls`` (FastAPI) whose HTTP requests go through its ``edge`` attribute (an ``Edge`` around the plain
    app), so that the object stays the FastAPI app (state, routes, TestClient)."""

    class Fronted(app_cls):
        edge: Edge | None = None

        async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
            edge = self.edge
            if edge is not None and scope["type"] == "http":
                await edge(scope, receive, send)
            else:
                await super().__call__(scope, receive, send)

    Fronted.__name__ = Fronted.__qualname__ = f"Fronted{app_cls.__name__}"
    return Fronted


# --------------------------------------------------------------------------------------------- the server
class _CoalescingTransport:
    """A transport whose writes within one event-loop iteration go out as one ``send``: uvicorn writes a
    response's status line + headers and its body separately, which on loopback is two segments, two wake-ups of
    the client and (measured) most of a route call's time in the service. Everything else is the real transport."""

    __slots__ = ("_t", "_buf", "_loop")

    def __init__(self, transport: Any, loop: Any):
        self._t = transport
        self._buf: list[bytes] = []
        self._loop = loop

    def write(self, data: bytes) -> None:
        if not self._buf:
            self._loop.call_soon(self._flush)
        self._buf.append(data)

    def _flush(self) -> None:
        if self._buf:
            data = b"".join(self._buf) if len(self._buf) > 1 else self._buf[0]
            self._buf.clear()
            if not self._t.is_closing():
                self._t.write(data)

    def writelines(self, chunks: Any) -> None:
        for c in chunks:
            self.write(c)

    def close(self) -> None:
        self._flush()
        self._t.close()

    def write_eof(self) -> None:
        self._flush()
        self._t.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


_HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                   b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
# after a 431, the bytes of the rest of the head read and dropped before the connection closes (a staged close,
# RFC 9112 section 9.6): closed at once with unread bytes, the kernel resets the connection and a client still
# sending its head (measured: a 4 MB head sent in one call) saw "connection reset" instead of the 431
LINGER_BYTES = 16 << 20


def http_protocol(limits: Limits | None = None, render: Render = detail_body) -> type:
    """uvicorn's HTTP/1.1 protocol (httptools, else h11) with coalesced writes and the request-head rules: closed
    when a whole head has not arrived ``header_timeout_s`` after the connection opened or after bytes of a new
    request began (an idle kept-alive connection: uvicorn's ``timeout_keep_alive``); 431 when a head grows past
    ``max_header_bytes``, then a staged close: the write side shut, what the client still sends read and dropped
    (up to ``LINGER_BYTES``, within the head's timeout), then closed. The answers uvicorn gives itself, 400 to a
    request it cannot parse and 503 beyond the concurrency limit, are JSON bodies by ``render`` (the server's own
    error format) instead of its plain text. Connections waiting for a head, new or kept alive, are at most half
    the concurrency limit: beyond it the one waiting longest is closed."""
    lim = limits or Limits()
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    from uvicorn.protocols.http.flow_control import service_unavailable

    busy = render(503, f"server busy: more than {lim.max_concurrency} connections or requests in progress; retry "
                       "later", "server_busy")

    async def unavailable(scope: dict, receive: Any, send: Any) -> None:
        await respond(send, 503, busy, ((b"retry-after", b"1"),), close=True)

    # connections waiting for a request head (new, or kept alive between requests), oldest first: beyond half the
    # concurrency limit the oldest is closed, so that slow or idle sockets cannot hold every slot (a client sends
    # its head within milliseconds of connecting, a slowloris socket one line at a time)
    pending: dict[Any, None] = {}
    cap = max(1, lim.max_concurrency // 2)

    def waiting(proto: Any) -> None:
        pending.pop(proto, None)
        pending[proto] = None
        while len(pending) > cap:
            oldest = next(iter(pending))
            if oldest is proto:
                break
            del pending[oldest]
            if not oldest.transport.is_closing():
                oldest.transport.close()

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        def _start_asgi_task(self, cycle: Any, app: Any) -> None:  # uvicorn's 503 app -> a JSON 503
            super()._start_asgi_task(cycle, unavailable if app is service_unavailable else app)

        def send_400_response(self, msg: str) -> None:  # a request uvicorn cannot parse -> a JSON 400
            body = render(400, f"malformed HTTP request: {msg}", "invalid_request")
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            self._fw_timer: Any = None
            self._fw_head = 0
            self._fw_tail = b""  # the last 3 bytes of the head so far (its blank line may span two reads)
            self._fw_linger = -1  # after a 431: bytes the client may still send before the close (-1: not yet)
            super().connection_made(_CoalescingTransport(transport, asyncio.get_running_loop()))
            self._fw_arm()
            waiting(self)

        def _fw_waiting(self) -> bool:  # between requests (or before the first): waiting for a head
            return self.cycle is None or self.cycle.response_complete

        def _fw_arm(self) -> None:
            if self._fw_timer is None:
                self._fw_timer = self.loop.call_later(lim.header_timeout_s, self._fw_expire)

        def _fw_disarm(self) -> None:
            if self._fw_timer is not None:
                self._fw_timer.cancel()
                self._fw_timer = None

        def _fw_expire(self) -> None:
            self._fw_timer = None
            if (self._fw_linger >= 0 or self._fw_waiting()) and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._fw_linger >= 0:  # a 431 went out: drop the rest of the head, close when it is over-long
                self._fw_linger -= len(data)
                if self._fw_linger < 0 and not self.transport.is_closing():
                    self.transport.close()
                return
            before = self.cycle
            waiting = self._fw_waiting()
            if waiting:
                # the head's length: up to its blank line when it ends in this read (a head that arrived whole in
                # one read of up to 2 x the limit was passed on), else all bytes so far
                buf = self._fw_tail + data
                end = buf.find(b"\r\n\r\n")
                head = self._fw_head + (len(data) if end < 0 else end + 4 - len(self._fw_tail))
                if head > lim.max_header_bytes:
                    if not self.transport.is_closing():
                        body = json.dumps({"detail": f"request head larger than {lim.max_header_bytes} bytes"})
                        self.transport.write(_HEAD_TOO_LARGE % (len(body), body.encode()))
                        try:  # half-close: the 431 and then EOF go out; the head timer (armed) ends the linger
                            self.transport.write_eof()
                            self._fw_linger = LINGER_BYTES
                            self._fw_arm()
                        except (NotImplementedError, OSError, RuntimeError):
                            self.transport.close()
                    return
                self._fw_head += len(data)
                self._fw_tail = buf[-3:]
                self._fw_arm()
            super().data_received(data)
            if self.cycle is not before:  # a whole head arrived: a new request cycle began
                self._fw_disarm()
                self._fw_head = 0
                self._fw_tail = b""
                pending.pop(self, None)

        def on_response_complete(self) -> None:  # kept alive: waiting for the next head (the newest such)
            super().on_response_complete()
            if not self.transport.is_closing() and self._fw_waiting():
                waiting(self)

        def connection_lost(self, exc: Exception | None) -> None:
            self._fw_disarm()
            pending.pop(self, None)
            super().connection_lost(exc)

    return GuardedProtocol


def server_options(limits: Limits | None = None, log_level: str = "warning", access_log: bool = False,
                   lifespan: str = "on", render: Render = detail_body) -> dict[str, Any]:
    """uvicorn's settings for ``limits``: the guarded protocol (its own errors by ``render``), the concurrency
    limit, the keep-alive timeout."""
    lim = limits or Limits()
    return {"log_level": log_level, "access_log": access_log, "http": http_protocol(lim, render), "ws": "none",
            "lifespan": lifespan, "limit_concurrency": lim.max_concurrency, "timeout_keep_alive": lim.keep_alive_s,
            "h11_max_incomplete_event_size": lim.max_header_bytes,
            "proxy_headers": False, "server_header": False}  # no proxy headers: client addresses are the real ones


def _apply(app: Any, limits: Limits | None) -> None:
    edge = getattr(app, "edge", None)
    if limits is not None and isinstance(edge, Edge):  # one set of limits for the served app: the body's too
        edge.limits = limits


def _render_of(app: Any) -> Render:
    edge = getattr(app, "edge", None)
    return edge.render if isinstance(edge, Edge) else detail_body


def server_config(app: Any, host: str = "127.0.0.1", port: int = 8000, limits: Limits | None = None,
                  log_level: str = "warning", access_log: bool = False, lifespan: str = "on") -> Any:
    """uvicorn's config for ``app`` with ``limits`` (given: also the body limit of the app's ``Edge``)."""
    import uvicorn

    _apply(app, limits)
    return uvicorn.Config(app, host=host, port=port,
                          **server_options(limits, log_level, access_log, lifespan, _render_of(app)))


def run(app: Any, host: str, port: int, limits: Limits | None = None, log_level: str = "warning",
        access_log: bool = False) -> None:
    """Serve ``app`` with ``limits`` until interrupted (``uvicorn.run``: its exit on a failed start included)."""
    import uvicorn

    _apply(app, limits)
    uvicorn.run(app, host=host, port=port, **server_options(limits, log_level, access_log, render=_render_of(app)))


class ThreadedServer:
    """An ASGI app under uvicorn (with ``limits``) on 127.0.0.1 in a background thread (tests, benchmarks).

    ``with ThreadedServer(app) as srv: httpx.get(srv.url + "/healthz")``"""

    def __init__(self, app: Any, port: int | None = None, log_level: str = "warning", limits: Limits | None = None):
        import uvicorn

        from fleetwise.serve.localbackends import free_port

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(server_config(app, "127.0.0.1", self.port, limits, log_level))
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


def url_host(host: str) -> str:
    """A host as it stands in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
