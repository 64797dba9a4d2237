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
t0``); an entry is taken a microsecond early and re-queued when its step has not completed yet, so floating-point
rounding of step times can only cost an extra look, never a stale value.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.sim.simulator import Simulator

INF = float("inf")
EARLY_S = 1e-6  # refresh this much before a computed step boundary (rounding of float step times)
MASK = (1 << 32) - 1  # replica and version fields of a heap entry


class LoadIndex:
    """Argmin of a replica load over one model's candidates: ``tokens`` (outstanding tokens, time-dependent) or
    requests (outstanding requests).

    A heap entry is one int, ``(key << 64) | (replica << 32) | version``: ordered as ``(key, replica)``, cheaper to
    compare than a tuple, and not tracked by the garbage collector (a fleet's index makes millions of them)."""

    __slots__ = ("sim", "tokens", "heaps", "expiry", "ver", "ref", "dirty", "refreshes", "exams")

    def __init__(self, sim: "Simulator", tokens: bool):
        self.sim = sim
        self.tokens = tokens
        self.heaps: list[list[int]] = []  # per model: entries; a key is at most the value until its horizon
        self.expiry: list = []  # (time a replica's entry stops being a lower bound, (replica << 32) | version)
        self.ver: list[int] = []  # current version per replica
        self.ref: list[int] = []  # per model: the last answer's value (the level the horizons are measured from)
        self.dirty: set[int] = set(range(len(sim.replicas)))
        self.refreshes = 0  # entries made (a replica touched, a horizon passed, or examined by a search)
        self.exams = 0  # live entries the searches popped

    def _read(self, rep, now: float):
        """``rep``'s outstanding tokens at ``now`` (the arithmetic of ``Replica.outstanding_tokens``) and its
        lanes in a decode run with steps left, [(lane, steps done)] or None."""
        val = rep.pending_tokens
        runs = None
        for lane in rep.lanes:
            if lane.busy and lane.run_k:
                j = lane.steps_done(now) if now > lane.t0 else 0  # (a run that starts now: none done)
                val -= j * lane.run_B
                if j < lane.run_k:
                    if runs is None:
                        runs = [(lane, j)]
                    else:
                        runs.append((lane, j))
        return val, runs

    def _enter(self, i: int, rep, val: int, runs, later: list) -> None:
        """Give replica ``i`` a new entry. Its key is its value after H more decode steps of each lane in a run,
        a lower bound until one of them completes step H + 1 (then the entry expires and is made again); H takes
        it half way down to its model's reference level, and is 0 within two steps of it (the key is the exact
        value, until the next step boundary)."""
        self.refreshes += 1
        v = (self.ver[i] + 1) & MASK
        self.ver[i] = v
        if not rep.routable:  # not among its model's candidates: no entry until it is again (it is touched then)
            return
        m = rep.model_index
        key = val
        if runs is not None:
            bsum = 0
            for lane, _ in runs:
                bsum += lane.run_B
            ref = self.ref[m]
            d = val - ref
            if d <= 0:
                h = 0
            elif ref <= 0:  # the level is the floor (an idle candidate): stop just above it
                h = (d - 1) // bsum
            else:
                h = d // (4 * bsum)
            t_exp = INF
            for lane, j in runs:
                r = lane.run_k - j  # steps left in the run
                if h < r:
                    key -= h * lane.run_B
                    t = lane.t0 + lane.run_elapsed(j + h + 1) - EARLY_S
                    if t < t_exp:
                        t_exp = t
                else:  # the run ends first (and its end touches the replica)
                    key -= r * lane.run_B
            if t_exp < INF:
                later.append((t_exp, (i << 32) | v))
        heapq.heappush(self.heaps[m], (key << 64) | (i << 32) | v)

    def _refresh(self, i: int, now: float, later: list) -> None:
        """Re-read replica ``i`` (it was touched, or its entry's horizon passed)."""
        ver = self.ver
        rep = self.sim.replicas[i]
        m = rep.model_index
        if i >= len(ver) or m >= len(self.heaps):  # a replica or model not seen yet
            while i >= len(ver):
                ver.append(0)
            while m >= len(self.heaps):
                self.heaps.append([])
                self.ref.append(0)
        if self.tokens:
            val, runs = self._read(rep, now)
            self._enter(i, rep, val, runs, later)
        else:
            self.refreshes += 1
            v = (ver[i] + 1) & MASK
            ver[i] = v
            if rep.routable:
                heapq.heappush(self.heaps[m], (rep.outstanding << 64) | (i << 32) | v)

    def argmin(self, model: int, now: float) -> int:
        """The candidate of ``model`` with the smallest value at ``now`` (ties: lowest index); -1 if none."""
        later: list = []
        if self.dirty:
            for i in self.dirty:
                self._refresh(i, now, later)
            self.dirty.clear()
        exp = self.expiry
        ver = self.ver
        pop, push = heapq.heappop, heapq.heappush
        if exp and exp[0][0] <= now:
            while exp and exp[0][0] <= now:
                iv = pop(exp)[1]
                i = iv >> 32
                if iv & MASK == ver[i]:
                    self._refresh(i, now, later)
        bi = -1
        if model < len(self.heaps):
            h = self.heaps[model]
            if not self.tokens:  # keys are the values: drop stale entries from the top
                while h:
                    e = h[0]
                    i = (e >> 32) & MASK
                    if e & MASK == ver[i]:
                        bi = i
                        break
                    pop(h)
            else:
                # Pop entries in key order while (key, replica) is at or below the best (exact value, replica)
                # found: every key is at most its replica's value until its horizon, so no entry left can beat
                # the answer. Stale entries popped are gone for good; the live ones are entered again, with
                # horizons measured from the new level.
                reps = self.sim.replicas
                seen = []
                stop = INF  # entries from (best value, best replica + 1) on cannot win
                while h and h[0] < stop:
                    e = pop(h)
                    i = (e >> 32) & MASK
                    if e & MASK != ver[i]:
                        continue
                    rep = reps[i]
                    val, runs = self._read(rep, now)
                    seen.append((i, rep, val, runs))
                    if bi < 0 or val < best or (val == best and i < bi):
                        best, bi = val, i
                        stop = (val << 64) | ((i + 1) << 32)
                self.exams += len(seen)
                if bi >= 0:
                    self.ref[model] = best
                    # the answer is made again before the next search (a router sends the request there, which
                    # touches it anyway)
                    self.dirty.add(bi)
                for i, rep, val, runs in seen:
                    if i != bi:
                        self._enter(i, rep, val, runs, later)
            n = len(ver)
            if len(h) > 64 and len(h) > 3 * n:  # mostly stale entries: rebuild
                h[:] = [e for e in h if e & MASK == ver[(e >> 32) & MASK]]
                heapq.heapify(h)
        for x in later:
            push(exp, x)
        if len(exp) > 64 and len(exp) > 3 * len(ver):
            exp[:] = [x for x in exp if x[1] & MASK == ver[x[1] >> 32]]
            heapq.heapify(exp)
        return bi


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
