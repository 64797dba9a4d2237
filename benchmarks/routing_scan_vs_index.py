"""Routing by scan vs by the simulator's index, same process, same fleets (docs/benchmarks.md, fleet scale).

    PYTHONPATH=src python benchmarks/routing_scan_vs_index.py 4,1024 10000

For each fleet size (vidur-parity scaled, 1 req/s per replica as in the scenario) it runs
least_outstanding_tokens twice: as the registered router (indexed) and as the plain scan
``min(candidates(), key=outstanding_tokens)``; prints simulated requests per CPU second of each (CPU time: steadier
than wall time on a shared machine) and checks that both placed every request on the same replica.
"""

import sys
import time

import numpy as np

from fleetwise.bench import scaled_scenario
from fleetwise.scenario import build


class ScanLOT:
    def route(self, view):
        return min(view.candidates(), key=view.outstanding_tokens)


def main(sizes: str, n: str) -> None:
    for N in [int(x) for x in sizes.split(",")]:
        placed = {}
        for how in ("index", "scan"):
            sc = scaled_scenario("vidur-parity", N)
            b = build(sc, sc.seed, num_requests=int(n))
            ctl = b.controller("least_outstanding_tokens")
            if how == "scan":
                ctl.router = ScanLOT()
            c0 = time.process_time()
            rec = b.sim.run(ctl)
            cpu = time.process_time() - c0
            placed[how] = rec.replica
            print(f"replicas {N:>6}  {how:5}  {int(n) / cpu:8.0f} requests per CPU second", flush=True)
        print(f"replicas {N:>6}  same placement: {bool(np.array_equal(placed['index'], placed['scan']))}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
