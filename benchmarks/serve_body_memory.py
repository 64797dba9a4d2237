"""Memory of request bodies held at once: N connections each announce an 8 MiB ``/v1/route`` body and send all of it
but its last byte, against ``fleetwise serve`` (default limits, a token, on loopback). Prints how many were
answered 503 and the service's peak RSS (``VmHWM``), docs/security.md ("Known limits").

    python benchmarks/serve_body_memory.py [--connections 200] [--body-mib 8] [extra serve options...]

Run it with the environment's Python (``.venv/bin/python``): the ``fleetwise`` beside it is started.
"""

from __future__ import annotations

import argparse
import socket
import time

from _serve_proc import TOKEN, serving


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--body-mib", type=int, default=8)
    args, serve_args = ap.parse_known_args()
    with serving(serve_args) as p:
        port = p.port
        body = b" " * (args.body_mib << 20)
        head = (b"POST /v1/route HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (TOKEN.encode(), len(body)))
        t0 = time.time()
        socks = []
        for _ in range(args.connections):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(head)
            s.setblocking(False)
            socks.append([s, 0])
        busy = True  # every body but its last byte (a refused connection stops taking bytes: skip it)
        while busy and time.time() - t0 < 300:
            busy = False
            for e in socks:
                s, sent = e
                if sent < len(body) - 1:
                    try:
                        e[1] += s.send(body[sent:len(body) - 1][:1 << 20])
                        busy = True
                    except BlockingIOError:
                        busy = True
                    except OSError:
                        e[1] = len(body)
            time.sleep(0.001)
        time.sleep(2)
        refused = 0
        for s, _ in socks:
            try:
                refused += b" 503 " in s.recv(200)[:20]
            except OSError:
                pass
        status = {k: int(v.split()[0]) // 1024 for k, v in
                  (line.split(":", 1) for line in open(f"/proc/{p.pid}/status") if line.startswith(("VmHWM",)))}
        print(f"{args.connections} connections x {args.body_mib} MiB bodies (all but the last byte): {refused} "
              f"answered 503; service peak RSS {status['VmHWM']} MiB ({time.time() - t0:.1f} s)")
        for s, _ in socks:
            s.close()


if __name__ == "__main__":
    main()
