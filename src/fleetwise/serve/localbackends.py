"""Real OpenAI-compatible inference servers on loopback: llama.cpp (``llama-cpp-python[server]``, the
``backend`` extra) serving a GGUF model, e.g. the tiny random one of ``fleetwise.serve.tinymodel``.

Used by the gateway tests and ``fleetwise bench gateway``. Each server runs one generation at a time
(``--interrupt_requests False``: a second request waits instead of silently cutting the running stream short),
so start several for parallel load.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

__all__ = ["LlamaServer", "free_port", "start_llama_server", "start_llama_servers", "llama_servers",
           "llama_cpp_available"]


def llama_cpp_available() -> bool:
    """True when ``llama_cpp.server`` can be imported (the ``backend`` extra is installed)."""
    import importlib.util

    try:
        return importlib.util.find_spec("llama_cpp") is not None and \
            importlib.util.find_spec("llama_cpp.server") is not None
    except (ImportError, ValueError):
        return False


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    """One ``python -m llama_cpp.server`` process on 127.0.0.1."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    model_path: Path
    _log: object = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: the server dies mid-whatever, like a crashed replica)."""
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        else:
            self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def _spawn(model_path: Path, port: int, n_ctx: int, n_threads: int, log_dir: Path,
           extra_args: Sequence[str]) -> LlamaServer:
    log_path = log_dir / f"llama-server-{port}.log"
    log = open(log_path, "wb")
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(n_threads),
           "--n_threads_batch", str(n_threads), "--interrupt_requests", "False", "--verbose", "False",
           *extra_args]
    env = dict(os.environ, OMP_NUM_THREADS=str(n_threads))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return LlamaServer(proc=proc, port=port, log_path=log_path, model_path=model_path, _log=log)


def _wait_ready(servers: list[LlamaServer], timeout_s: float) -> list[LlamaServer]:
    """The servers that failed to start (exited); raises TimeoutError if one is still not answering."""
    pending = list(servers)
    failed = []
    deadline = time.monotonic() + timeout_s
    while pending:
        for s in list(pending):
            if not s.alive():
                pending.remove(s)
                failed.append(s)
                continue
            try:
                with urllib.request.urlopen(f"{s.url}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        pending.remove(s)
            except (urllib.error.URLError, OSError):
                pass
        if pending and time.monotonic() > deadline:
            tails = "\n".join(f"--- {s.url}\n{s.log_tail(800)}" for s in pending)
            raise TimeoutError(f"llama.cpp server(s) not ready after {timeout_s:.0f} s:\n{tails}")
        if pending:
            time.sleep(0.1)
    return failed


def start_llama_servers(model_path: str | os.PathLike[str], n: int, *, n_ctx: int = 512, n_threads: int = 1,
                        log_dir: str | os.PathLike[str] | None = None, ready_timeout_s: float = 90.0,
                        extra_args: Sequence[str] = ()) -> list[LlamaServer]:
    """Start ``n`` servers on free loopback ports at once and wait until each answers ``GET /v1/models``.
    A server that exits at start (e.g. its port was taken meanwhile) is started again on another port, twice
    at most; then RuntimeError with its log."""
    model_path = Path(model_path)
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="fleetwise-llama-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    up: list[LlamaServer] = []
    todo = n
    try:
        for _ in range(3):
            batch = [_spawn(model_path, free_port(), n_ctx, n_threads, log_dir, extra_args) for _ in range(todo)]
            failed = _wait_ready(batch, ready_timeout_s)
            up += [s for s in batch if s not in failed]
            for s in failed:
                s.stop()
            todo = len(failed)
            if not todo:
                return up
        raise RuntimeError(f"llama.cpp server failed to start:\n{failed[0].log_tail()}")
    except BaseException:
        for s in up:
            s.stop()
        raise


def start_llama_server(model_path: str | os.PathLike[str], **kw) -> LlamaServer:
    return start_llama_servers(model_path, 1, **kw)[0]


@contextmanager
def llama_servers(model_path: str | os.PathLike[str], n: int, **kw) -> Iterator[list[LlamaServer]]:
    """``start_llama_servers`` as a context manager: every server is stopped on exit."""
    servers = start_llama_servers(model_path, n, **kw)
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()
