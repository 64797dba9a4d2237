"""Slow sockets against the decision service (docs/security.md, "Known limits"): ``--sockets`` connections that
each send a request head one line a second, never finishing it (with ``--body``: a whole head announcing a
1,000-byte body, then one byte of it a second), and reconnect when the server closes them, against
``fleetwise serve`` (default limits, a token, on loopback); meanwhile one client calls ``GET /healthz`` every 0.1 s.
Prints the share of those calls answered 200, their median and worst time, and the reconnects.

    python benchmarks/serve_slowloris.py [--sockets 600] [--seconds 15] [--body] [extra serve options...]

Run it with the environment's Python (``.venv/bin/python``): the ``fleetwise`` beside it is started.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request

from _serve_proc import TOKEN, serving


def _attack(port: int, n: int, stop: threading.Event, counts: dict, body: bool) -> None:
    socks: list = []
    head = b"POST /v1/route HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if body:
        head += (b"Content-Type: application/json\r\nAuthorization: Bearer %s\r\nContent-Length: 1000\r\n\r\n"
                 % TOKEN.encode())

    def connect() -> socket.socket | None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(head)
            s.setblocking(False)
            return s
        except OSError:
            return None

    for _ in range(n):
        s = connect()
        if s is not None:
            socks.append(s)
    k = 0
    while not stop.is_set():
        for i, s in enumerate(socks):
            try:
                if s is None:
                    raise OSError
                try:
                    if s.recv(4096) == b"":
                        raise OSError  # closed by the server
                except BlockingIOError:
                    pass
                s.send(b" " if body else b"X-Slow-%d: 1\r\n" % k)
            except OSError:
                if s is not None:
                    s.close()
                socks[i] = connect()
                counts["reconnects"] += 1
        k += 1
        stop.wait(1.0)
    for s in socks:
        if s is not None:
            s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sockets", type=int, default=600)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--body", action="store_true", help="slow bodies after whole heads")
    args, serve_args = ap.parse_known_args()
    stop = threading.Event()
    counts = {"reconnects": 0}
    with serving(serve_args) as p:
        port = p.port
        t = threading.Thread(target=_attack, args=(port, args.sockets, stop, counts, args.body), daemon=True)
        t.start()
        time.sleep(2.0)  # every slow socket connected
        ok, times, n = 0, [], 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    ok += r.status == 200
            except (urllib.error.URLError, OSError):
                pass
            n += 1
            times.append(time.monotonic() - t0)
            time.sleep(0.1)
        print(f"{args.sockets} slow {'bodies' if args.body else 'heads'}, {args.seconds:g} s: /healthz answered 200 {ok} of {n} "
              f"({100.0 * ok / max(n, 1):.0f}%), median {1000 * statistics.median(times):.1f} ms, worst "
              f"{1000 * max(times):.0f} ms; {counts['reconnects']} reconnects")
        stop.set()


if __name__ == "__main__":
    main()
