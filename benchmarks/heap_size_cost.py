"""What a larger event heap costs per event (docs/benchmarks.md, fleet scale): a loop that pops the earliest entry,
makes the next one and pushes it, on heaps of the simulator's entry shape ``(t, kind, seq, object, version)``.

    python benchmarks/heap_size_cost.py [SIZES] [LOOPS]      # default 10,1000,22000,45000 and 300000

The simulator's heap holds one entry per busy lane: about 10 at 4 replicas of vidur-parity, about 22,000 on
average at 10,000 (after compaction). Prints nanoseconds per loop (pop + new entry + push) for each size, and for
bare floats as a reference; the difference between sizes is the heap's share (the loop's own work is the same).
"""

from __future__ import annotations

import heapq
import random
import sys
import time


class _Obj:
    __slots__ = ()


def per_loop_ns(size: int, loops: int, tuples: bool) -> float:
    rnd = random.Random(0)
    objs = [_Obj() for _ in range(size)]
    if tuples:
        h = [(rnd.random() * 10, 0, i, objs[i], 0) for i in range(size)]
    else:
        h = [rnd.random() * 10 for _ in range(size)]
    heapq.heapify(h)
    pop, push, r = heapq.heappop, heapq.heappush, rnd.random
    t0 = time.perf_counter()
    if tuples:
        for i in range(loops):
            e = pop(h)
            push(h, (e[0] + r(), 0, i, e[3], 0))
    else:
        for _ in range(loops):
            push(h, pop(h) + r())
    return (time.perf_counter() - t0) / loops * 1e9


def main(argv: list[str]) -> None:
    sizes = [int(x) for x in (argv[0] if argv else "10,1000,22000,45000").split(",")]
    loops = int(argv[1]) if len(argv) > 1 else 300_000
    print(f"{'heap size':>10} {'tuple entries, ns/loop':>23} {'float entries, ns/loop':>23}")
    for s in sizes:
        print(f"{s:>10,} {per_loop_ns(s, loops, True):>23.0f} {per_loop_ns(s, loops, False):>23.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
