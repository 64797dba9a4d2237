"""``fleetwise serve`` in a subprocess on a free loopback port, for the service benchmarks (serve_*.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Iterator

TOKEN = "a-long-enough-token-0123"


@contextlib.contextmanager
def serving(serve_args: list[str]) -> Iterator[subprocess.Popen]:
    """The ``fleetwise`` beside this Python, serving with ``TOKEN`` and ``serve_args`` until the block ends;
    yields the process, its port as ``proc.port``, once it accepts connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = os.path.join(os.path.dirname(sys.executable), "fleetwise")
    p = subprocess.Popen([exe, "serve", "--port", str(port), *serve_args],
                         env={**os.environ, "FLEETWISE_SERVE_TOKEN": TOKEN},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p.port = port  # type: ignore[attr-defined]
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield p
    finally:
        p.terminate()
        p.wait(10)
