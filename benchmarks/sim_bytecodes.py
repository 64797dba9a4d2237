"""Python bytecodes the simulator executes per simulated request: a count, not a timing, so it is the same on a busy
machine and an idle one (docs/benchmarks.md: single-fleet speed and fleet scale).

    PYTHONPATH=src python benchmarks/sim_bytecodes.py [REQUESTS] [REPLICAS] [ROUTER] [SCENARIO] [TOP]
    PYTHONPATH=src python benchmarks/sim_bytecodes.py 5000                       # vidur-parity, round robin
    PYTHONPATH=src python benchmarks/sim_bytecodes.py 10000 1024 power_of_two    # scaled to 1,024 replicas

Runs one simulation under ``sys.settrace`` with opcode events (about 20x slower than a plain run) and prints the
bytecodes per request, the events, and the functions that executed the most, with their calls per request.
REPLICAS (default: the scenario's own) scales the scenario's one deployment and its arrival rate alike
(``bench.scaled_scenario``, as ``fleetwise bench sim-speed --replicas``). Only the simulation is counted, not the
build. Builtins and C code (heapq, dict and list methods) are one bytecode each: the count is the Python work, the
rest of a run's time is the machine's (caches) and C.
"""

from __future__ import annotations

import collections
import sys


def count(requests: int, replicas: int | None, router: str, scenario: str) -> tuple[dict, int, collections.Counter,
                                                                                   collections.Counter]:
    from fleetwise.scenario import build, load_scenario

    if replicas:
        from fleetwise.bench import scaled_scenario

        sc = scaled_scenario(scenario, replicas)
    else:
        sc = load_scenario(scenario)
    b = build(sc, sc.seed, num_requests=requests)
    ctl = b.controller(router)
    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        code = frame.f_code
        key = f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
        calls[key] += 1

        def local(frame, event, arg):
            if event == "opcode":
                ops[key] += 1
            return local
        return local

    sys.settrace(tracer)
    try:
        b.sim.run(ctl)
    finally:
        sys.settrace(None)
    return {"requests": len(b.workload), "replicas": len(b.sim.replicas)}, b.sim.events, ops, calls


def main(argv: list[str]) -> None:
    requests = int(argv[0]) if argv else 5000
    replicas = int(argv[1]) if len(argv) > 1 and argv[1] not in ("", "0") else None
    router = argv[2] if len(argv) > 2 else "round_robin"
    scenario = argv[3] if len(argv) > 3 else "vidur-parity"
    top = int(argv[4]) if len(argv) > 4 else 15
    info, events, ops, calls = count(requests, replicas, router, scenario)
    n = info["requests"]
    total = sum(ops.values())
    print(f"{scenario}, {info['replicas']} replicas, {router}, {n} requests: "
          f"{total / n:,.0f} bytecodes per request, {events:,} events")
    print(f"{'bytecodes/request':>18} {'calls/request':>14}  function")
    for key, v in ops.most_common(top):
        print(f"{v / n:18,.0f} {calls[key] / n:14.2f}  {key}")


if __name__ == "__main__":
    main(sys.argv[1:])
