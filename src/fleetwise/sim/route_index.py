"""Indexes that answer a load-aware router's question without scanning the fleet.

``min(candidates, key=outstanding_tokens)`` costs O(replicas) per request; at 10,000 replicas that is most of
a run. ``LoadIndex`` answers the same question, with the same answer (the smallest value, ties to the lowest
replica index), in O(log replicas) per change:

* one heap per model of ``(value, replica, version)`` entries, the value exact as of the last time the replica
  was refreshed; an entry whose version is not the replica's current one is stale and dropped when it surfaces
  (lazy deletion; the heap is rebuilt when stale entries outnumber live ones);
* the simulator *touches* a replica whenever something its value depends on changes (a request routed,
  completed or moved, an iteration started or finished, a preemption, a failure, a replica joining or leaving
  its model's candidates); touched replicas are refreshed before the next answer;
* outstanding tokens also fall *between* events, while a decode run is in flight (each completed step of the run
  takes ``run_B`` tokens off, ``Replica.outstanding_tokens``). Those step boundaries are known in closed form,
  so each lane in a decode run has an entry at its next step boundary in an expiry heap; before an answer the
  boundaries passed are counted (``Lane.ix_steps``) and the replica's value lowered by ``run_B`` per step. The
  work per request is the number of decode steps that completed in the fleet since the last request, which at a
  given load per replica does not grow with the number of replicas.

Steps are counted with the same arithmetic as ``Lane.steps_done`` (the largest j with ``run_elapsed(j) <= now -
run_o``); an entry is taken a microsecond early and re-queued when its step has not completed yet, so floating-point
rounding of step times can only cost an extra look, never a stale value.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.sim.simulator import Simulator

INF = float("inf")
EARLY_S = 1e-6  # refresh this much before a computed step boundary (rounding of float step times)


class LoadIndex:
    """Argmin of a replica load over one model's candidates: ``tokens`` (outstanding tokens, time-dependent) or
    requests (outstanding requests)."""

    __slots__ = ("sim", "tokens", "heaps", "expiry", "ver", "val", "dirty")

    def __init__(self, sim: "Simulator", tokens: bool):
        self.sim = sim
        self.tokens = tokens
        self.heaps: list[list] = []  # per model: (value, replica, version)
        self.expiry: list = []  # (time of a lane's next step boundary, replica, lane, lane's ix_ver)
        self.ver: list[int] = []  # current version per replica
        self.val: list[int] = []  # current value per replica
        self.dirty: set[int] = set(range(len(sim.replicas)))

    def _refresh(self, i: int, now: float, later: list) -> None:
        """Re-read replica ``i`` whole (it was touched)."""
        rep = self.sim.replicas[i]
        ver = self.ver
        while i >= len(ver):
            ver.append(0)
            self.val.append(0)
        m = rep.model_index
        heaps = self.heaps
        while m >= len(heaps):
            heaps.append([])
        v = ver[i] + 1
        ver[i] = v
        if self.tokens:
            val = rep.pending_tokens
            for lane in rep.lanes:
                lane.ix_ver += 1
                k = lane.run_k
                if lane.busy and k:
                    j = lane.steps_done(now)
                    lane.ix_steps = j
                    val -= j * lane.run_B
                    if j < k:  # its next step boundary
                        later.append((lane.run_o + lane.run_elapsed(j + 1) - EARLY_S, i, lane.index, lane.ix_ver))
        else:
            val = rep.outstanding
        self.val[i] = val
        if rep.routable:  # among its model's candidates (otherwise no entry until it is again)
            heapq.heappush(heaps[m], (val, i, v))

    def argmin(self, model: int, now: float) -> int:
        """The candidate of ``model`` with the smallest value at ``now`` (ties: lowest index); -1 if none."""
        later: list = []
        if self.dirty:
            for i in self.dirty:
                self._refresh(i, now, later)
            self.dirty.clear()
        exp = self.expiry
        ver = self.ver
        if exp and exp[0][0] <= now:
            reps = self.sim.replicas
            val = self.val
            heaps = self.heaps
            pop, push = heapq.heappop, heapq.heappush
            while exp and exp[0][0] <= now:
                _, i, li, lv = pop(exp)
                rep = reps[i]
                lane = rep.lanes[li]
                if lv != lane.ix_ver:
                    continue
                # steps of the run completed by now: the largest j with run_elapsed(j) <= now - run_o, the same
                # arithmetic as Lane.steps_done
                dt = now - lane.run_o
                j0 = j = lane.ix_steps
                k, a, c, w = lane.run_k, lane.run_a, lane.run_c1B, lane.run_w
                while j < k and (j + 1) * a + c * ((j + 1) * j / 2.0) + (w if j else 0.0) <= dt:
                    j += 1
                if j != j0:
                    lane.ix_steps = j
                    x = val[i] - (j - j0) * lane.run_B
                    val[i] = x
                    v = ver[i] + 1
                    ver[i] = v
                    if rep.routable:
                        push(heaps[rep.model_index], (x, i, v))
                if j < k:
                    later.append((lane.run_o + ((j + 1) * a + c * ((j + 1) * j / 2.0) + (w if j else 0.0)) - EARLY_S,
                                  i, li, lv))
        for x in later:
            heapq.heappush(exp, x)
        if model >= len(self.heaps):
            return -1
        h = self.heaps[model]
        while h and h[0][2] != ver[h[0][1]]:
            heapq.heappop(h)
        n = len(ver)
        if len(h) > 64 and len(h) > 4 * n:  # mostly stale entries: rebuild
            h[:] = [x for x in h if x[2] == ver[x[1]]]
            heapq.heapify(h)
        if len(exp) > 64 and len(exp) > 8 * n:
            reps = self.sim.replicas
            exp[:] = [x for x in exp if x[3] == reps[x[1]].lanes[x[2]].ix_ver]
            heapq.heapify(exp)
        return h[0][1] if h else -1


class PrefixIndex:
    """Replicas whose prefix cache holds a block: block id -> {replica: None}, kept by the simulator on every
    insert and eviction. A request can hit only at replicas holding its first block."""

    __slots__ = ("holders",)

    def __init__(self):
        self.holders: dict[int, dict[int, None]] = {}

    def add(self, block: int, replica: int) -> None:
        d = self.holders.get(block)
        if d is None:
            self.holders[block] = {replica: None}
        else:
            d[replica] = None

    def remove(self, block: int, replica: int) -> None:
        d = self.holders.get(block)
        if d is not None:
            d.pop(replica, None)
            if not d:
                del self.holders[block]
