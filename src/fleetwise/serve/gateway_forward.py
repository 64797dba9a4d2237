"""The gateway's forwarding: one request to one backend, plain or streamed, with SSE framing; and the loop that tries
the next backend when one fails (docs/gateway.md). The backends and the picking are ``fleetwise.serve.gateway_pool``.

Failure semantics (the client always gets a whole response or a clear error, never a silent loss or garbage):

- connection error, timeout, 5xx or 429 before any byte went to the client: retried on another backend (at most
  ``max_attempts`` distinct backends, backoff ``retry_backoff_s`` x 2^k between attempts);
- a response that is not streamed is returned only once it is complete and valid JSON (a JSON object when the
  status is 2xx): a body cut short (a close-delimited body whose connection died), a 200 that is not JSON or is
  empty counts as a failed attempt and the next backend is tried;
- every attempt failed: HTTP 503 with a JSON error listing each attempt;
- other 4xx from a backend, with a JSON body: passed through unchanged (status and body), no retry;
- a redirect (3xx; the gateway follows none), a body the gateway did not ask to be compressed, a body over
  ``max_response_bytes``, an answer that takes longer than ``attempt_timeout_s`` (a streamed one: until its first
  bytes) and a streamed 2xx that is not ``text/event-stream``: failed attempts (they were passed on as they came:
  HTML as a 200, a 64 MB body, a gzip bomb decoded to 200 MB, a 302 to another host);
- a streamed request is committed to a backend once its first chunk has arrived; a stream that breaks after bytes
  went to the client (backend killed, or it closed without ``data: [DONE]``) ends with whole SSE events only, then
  ``data: {"error": {...}}``; never a truncated event and never a ``[DONE]`` the backend did not send.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any, AsyncIterator, Callable

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fleetwise.serve.gateway_pool import BackendState, Pool

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_DONE_LINE = re.compile(rb"^data:\s?\[DONE\]\s*$", re.MULTILINE)
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade", "content-length", "content-encoding"}


def error_body(message: str, type_: str, code: int | str | None = None, **extra: Any) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code", ...}}``."""
    err = {"message": message, "type": type_, "param": None, "code": code}
    err.update(extra)
    return {"error": err}


class Retry(Exception):
    """This attempt failed before anything went to the client: try another backend."""


class EventTooLarge(Exception):
    """An SSE event longer than the gateway takes (``max_response_bytes``)."""


class SSEFramer:
    """Cuts a byte stream into whole SSE events and notes whether ``data: [DONE]`` went by. Each byte is scanned
    once (an event of 32 MB in 64 KB chunks was rescanned from its start at every chunk: 90 s of CPU), and an
    event may not outgrow ``max_event_bytes``."""

    def __init__(self, max_event_bytes: int = 64 << 20) -> None:
        self.buf = b""
        self.done = False
        self.max_event_bytes = max_event_bytes
        self._scanned = 0  # bytes of buf already searched for an event's end (less the 3 an end may span)

    def feed(self, chunk: bytes) -> bytes:
        self.buf += chunk
        end = 0
        for m in _EVENT_END.finditer(self.buf, max(0, self._scanned - 3)):
            end = m.end()
        if not end:
            self._scanned = len(self.buf)
            if len(self.buf) > self.max_event_bytes:
                raise EventTooLarge(f"an SSE event longer than {self.max_event_bytes} bytes")
            return b""
        out, self.buf = self.buf[:end], self.buf[end:]
        self._scanned = len(self.buf)
        if not self.done and _DONE_LINE.search(out):
            self.done = True
        return out


def passthrough_headers(h: Any, s: BackendState, attempts: int) -> dict[str, str]:
    out = {k: v for k, v in h.items() if k.lower() not in _HOP_BY_HOP and not k.lower().startswith("x-fleetwise")
           and k.lower() not in ("server", "date")}
    out["x-fleetwise-backend"] = s.id
    out["x-fleetwise-attempts"] = str(attempts)
    return out


def body_problem(content: bytes, status: int) -> str | None:
    """None when ``content`` is one whole JSON value (an object for a 2xx status); else what is wrong."""
    if not content.strip():
        return "an empty body"
    from fleetwise.yamlio import loads_strict

    try:  # (strict: a NaN or Infinity, which Python's parser takes, went back to the client as a 200)
        value = loads_strict(content)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return f"a body that is not complete JSON ({len(content)} bytes)"
    if status < 300 and not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    return None


def _failed(pool: Pool, s: BackendState, e: httpx.RequestError) -> Retry:
    reason = f"{s.id}: {type(e).__name__}: {e}".rstrip(": ")
    pool.note_failure(s, reason, hard=not isinstance(e, httpx.TimeoutException))
    return Retry(reason)


def _refused(resp: Any) -> str | None:
    """Why a backend's response head is a failed attempt whatever its body: a redirect, or a compression the
    gateway did not ask for (it asks for ``identity``; httpx would decode a gzip bomb)."""
    if 300 <= resp.status_code < 400:
        return f"HTTP {resp.status_code}: a redirect (the gateway follows none)"
    enc = resp.headers.get("content-encoding", "identity").strip().lower()
    if enc not in ("", "identity"):
        return f"a body in content-encoding {enc[:40]!r}, not asked for"
    return None


async def _read_capped(pool: Pool, resp: Any) -> bytes:
    """The response's body, raw (no decoding), up to ``max_response_bytes``; beyond: ``ValueError``."""
    cap = pool.cfg.max_response_bytes
    parts, n = [], 0
    async for chunk in resp.aiter_raw():
        n += len(chunk)
        if n > cap:
            raise ValueError(f"a body larger than {cap} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def attempt_plain(pool: Pool, s: BackendState, path: str, raw: bytes, attempts: int) -> Response:
    """One backend, not streamed: its whole response, checked (module docstring), or ``Retry``."""
    t0 = time.perf_counter()
    client = pool.client
    resp = None
    try:
        async with asyncio.timeout(pool.cfg.attempt_timeout_s):
            resp = await client.send(client.build_request("POST", f"{s.url}{path}", content=raw,
                                                          headers=pool.up_headers), stream=True)
            refused = _refused(resp)
            content = b"" if refused else await _read_capped(pool, resp)
    except httpx.RequestError as e:
        raise _failed(pool, s, e) from None
    except (TimeoutError, ValueError) as e:
        reason = f"{s.id}: " + (f"no whole answer within {pool.cfg.attempt_timeout_s:g} s"
                                if isinstance(e, TimeoutError) else str(e))
        pool.note_failure(s, reason, hard=False)
        raise Retry(reason) from None
    finally:
        if resp is not None:
            await resp.aclose()
    pool.metrics.latency.labels(s.id).observe(time.perf_counter() - t0)
    status = resp.status_code
    problem = refused or (None if status >= 500 or status == 429 else body_problem(content, status))
    if status >= 500 or status == 429 or problem is not None:
        text = content[:300].decode("utf-8", "replace")
        reason = f"{s.id}: HTTP {status}" + (f" with {problem}" if problem else f": {text}")
        pool.note_failure(s, reason, hard=False)
        raise Retry(reason)
    pool.note_success(s, "ok" if status < 400 else "client_error")
    return Response(content=content, status_code=status, headers=passthrough_headers(resp.headers, s, attempts))


async def _open_stream(pool: Pool, s: BackendState, path: str, raw: bytes) -> tuple[Any, Any, bytes]:
    """(response, byte iterator, first non-empty chunk) of a streamed attempt, or ``Retry``; a 4xx is returned
    with its whole body as the first chunk and no iterator."""
    client = pool.client
    resp = None
    try:
        async with asyncio.timeout(pool.cfg.attempt_timeout_s):
            resp = await client.send(client.build_request("POST", f"{s.url}{path}", content=raw,
                                                          headers=pool.up_headers), stream=True)
            refused = _refused(resp)
            if refused is None and resp.status_code < 400 and \
                    "text/event-stream" not in resp.headers.get("content-type", "").lower():
                refused = (f"HTTP {resp.status_code} that is not an event stream (content-type "
                           f"{resp.headers.get('content-type', 'none')[:60]!r})")
            if refused is not None:
                await resp.aclose()
                pool.note_failure(s, f"{s.id}: {refused}", hard=False)
                raise Retry(f"{s.id}: {refused}")
            if resp.status_code >= 400:
                data = await _read_capped(pool, resp)
                await resp.aclose()
                problem = None if resp.status_code >= 500 or resp.status_code == 429 else body_problem(
                    data, resp.status_code)
                if resp.status_code >= 500 or resp.status_code == 429 or problem is not None:
                    reason = f"{s.id}: HTTP {resp.status_code}: " + (problem or data[:300].decode("utf-8", "replace"))
                    pool.note_failure(s, reason, hard=False)
                    raise Retry(reason)
                return resp, None, data
            it = resp.aiter_raw()
            first = b""
            while not first:  # commit to this backend only once its first bytes are here
                first = await it.__anext__()
            return resp, it, first
    except (TimeoutError, ValueError) as e:
        if resp is not None:
            await resp.aclose()
        reason = f"{s.id}: " + (f"no first bytes within {pool.cfg.attempt_timeout_s:g} s"
                                if isinstance(e, TimeoutError) else str(e))
        pool.note_failure(s, reason, hard=False)
        raise Retry(reason) from None
    except StopAsyncIteration:
        await resp.aclose()
        reason = f"{s.id}: empty streamed response"
        pool.note_failure(s, reason, hard=False)
        raise Retry(reason) from None
    except httpx.RequestError as e:
        if resp is not None:
            await resp.aclose()
        raise _failed(pool, s, e) from None
    except BaseException:  # cancelled (the client left) or a bug: free the upstream connection
        if resp is not None:
            await resp.aclose()
        raise


async def _relay(pool: Pool, s: BackendState, resp: Any, it: Any, first: bytes) -> AsyncIterator[bytes]:
    """The backend's stream to the client: whole SSE events only; a break ends with an SSE error event."""
    is_sse = "text/event-stream" in resp.headers.get("content-type", "").lower()  # (always: _open_stream)
    framer = SSEFramer(pool.cfg.max_response_bytes)
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
    except EventTooLarge as e:
        framer.buf = b""
        broken = str(e)
    except httpx.RequestError as e:
        if not (is_sse and framer.done):
            broken = f"{type(e).__name__}: {e}".rstrip(": ")
    finally:
        await resp.aclose()
    if is_sse and framer.done and framer.buf.strip():
        yield framer.buf
    if broken is None:
        pool.note_success(s)
        return
    pool.note_failure(s, f"{s.id}: stream broken after it started: {broken}", hard=True, outcome="stream_error")
    err = error_body(f"upstream backend failed mid-stream ({broken}); the response is incomplete",
                     "upstream_stream_error", 502, backend=s.id)
    yield b"data: " + json.dumps(err).encode() + b"\n\n"


class ReleasingStream(StreamingResponse):
    """Releases the backend's in-flight count however the response ends (done, broken, client gone)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], upstream: Any = None, **kw: Any):
        super().__init__(content, **kw)
        self._release = release
        self._upstream = upstream  # the backend's response: closed here too (a relay never started closes nothing)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.discard()

    async def discard(self) -> None:
        """The backend released and its stream closed (also for a response that is never sent)."""
        self._release()
        await self.body_iterator.aclose()
        if self._upstream is not None:
            await self._upstream.aclose()


async def attempt_stream(pool: Pool, s: BackendState, path: str, raw: bytes, attempts: int,
                         release: Callable[[], None]) -> Response:
    """One backend, streamed: a response that relays its stream (releasing ``release`` at the end), its 4xx, or
    ``Retry``."""
    t0 = time.perf_counter()
    resp, it, first = await _open_stream(pool, s, path, raw)
    headers = passthrough_headers(resp.headers, s, attempts)
    if it is None:  # a 4xx with a JSON body: passed through
        pool.note_success(s, "client_error")
        return Response(content=first, status_code=resp.status_code, headers=headers)
    pool.metrics.latency.labels(s.id).observe(time.perf_counter() - t0)
    return ReleasingStream(_relay(pool, s, resp, it, first), release, resp, status_code=resp.status_code,
                           headers=headers)


async def forward(pool: Pool, path: str, raw: bytes, stream: bool, model: str | None, in_tokens: int,
                  out_tokens: int) -> Response:
    """The request to the backend the router picks; on a failed attempt the next pick among the others."""
    cfg = pool.cfg
    tried: set[str] = set()
    failures: list[str] = []
    for attempt in range(cfg.max_attempts):
        s = pool.pick(tried, model, in_tokens, out_tokens)
        if s is None:
            break
        if attempt:
            pool.metrics.retries.inc()
            await asyncio.sleep(cfg.retry_backoff_s * 2 ** (attempt - 1))
        tried.add(s.id)
        release = pool.acquire(s, in_tokens + out_tokens)
        try:
            if stream:
                resp = await attempt_stream(pool, s, path, raw, attempt + 1, release)
                if not isinstance(resp, ReleasingStream):
                    release()
                return resp
            try:
                return await attempt_plain(pool, s, path, raw, attempt + 1)
            finally:
                release()
        except Retry as e:
            release()
            failures.append(str(e))
        except BaseException:
            release()
            raise
    pool.metrics.requests.labels("none", "unavailable").inc()
    msg = f"no backend could serve the request after {len(failures)} attempt(s)" if failures else "no backend to try"
    return JSONResponse(error_body(msg, "upstream_unavailable", 503, attempts=failures), status_code=503,
                        headers={"retry-after": "1"})
