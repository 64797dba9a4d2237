"""Python memory a fleet's simulation holds, built and after a run, and where it was allocated (``tracemalloc``):
how large the state that every event of a large fleet reads is (docs/benchmarks.md, fleet scale).

    PYTHONPATH=src python benchmarks/fleet_memory.py [REPLICAS] [REQUESTS] [ROUTER] [SCENARIO] [TOP]
    PYTHONPATH=src python benchmarks/fleet_memory.py 10000 20000 power_of_two

The scenario is scaled to REPLICAS at its own load per replica (``bench.scaled_scenario``, as ``fleetwise bench
sim-speed --replicas``). Prints the traced total after the build and after the run, per replica, and the TOP source
lines that allocated the most after the run.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc


def main(argv: list[str]) -> None:
    replicas = int(argv[0]) if argv else 10000
    requests = int(argv[1]) if len(argv) > 1 else 20000
    router = argv[2] if len(argv) > 2 else "power_of_two"
    scenario = argv[3] if len(argv) > 3 else "vidur-parity"
    top = int(argv[4]) if len(argv) > 4 else 10
    from fleetwise.bench import scaled_scenario
    from fleetwise.scenario import build

    sc = scaled_scenario(scenario, replicas)
    gc.collect()
    tracemalloc.start()
    b = build(sc, sc.seed, num_requests=requests)
    ctl = b.controller(router)
    built = tracemalloc.take_snapshot()
    b.sim.run(ctl)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    print(f"{scenario}, {replicas} replicas, {router}, {requests} requests")
    for name, snap in (("built", built), ("after the run", after)):
        total = sum(x.size for x in snap.statistics("filename"))
        print(f"{name}: {total / 1e6:,.1f} MB traced, {total / replicas / 1e3:,.2f} KB per replica")
    print(f"{'KB':>10} {'blocks':>8}  allocated at (after the run)")
    for x in after.statistics("lineno")[:top]:
        print(f"{x.size / 1024:10,.0f} {x.count:8,}  {x.traceback[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
