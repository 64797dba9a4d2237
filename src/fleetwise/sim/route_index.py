"""Indexes that answer a load-aware router's question without scanning the fleet.

``min(candidates, key=outstanding_tokens)`` costs O(replicas) per request; at 10,000 replicas that is most of
a run. ``LoadIndex`` answers the same question, with the same answer (the smallest value, ties to the lowest
replica index):

* one heap per model with an entry per candidate whose *key is a lower bound* of the replica's value until the
  entry expires; an entry whose version is not the replica's current one is stale and dropped when it surfaces
  (the heap is rebuilt when stale entries are two thirds of it);
* the simulator *touches* a replica whenever something its value depends on changes (a request routed,
  completed or moved, an iteration started or finished, a preemption, a failure, a replica joining or leaving
  its model's candidates); touched replicas get a new entry before the next answer;
* outstanding tokens also fall *between* events, while a decode run is in flight (each completed step takes
  ``run_B`` tokens off, ``Replica.outstanding_tokens``). Rather than follow every step, an entry's key is the
  replica's value after ``H`` more steps of each lane in a run (closed form), a lower bound until one of them
  completes step ``H + 1``, when the entry expires (an expiry heap) and is made again. ``H`` is chosen from the
  replica's distance ``d`` to its model's *level* (the last answer's value): a quarter of the way down
  (``d // (4 * B)`` steps), 0 within four steps of it (the key is then the exact value until the next step
  boundary), or, when the level is 0 (an idle candidate), all the way to just above it. A replica far above the
  level is re-read a few times on its way down instead of at every step;
* the answer: pop entries in key order while ``(key, replica)`` is at or below the best ``(exact value,
  replica)`` found so far (exact values from ``Replica.outstanding_tokens``' arithmetic at the time of the
  question); no entry left can beat it. The live entries popped are entered again with horizons from the new
  level. The work per request is the number of replicas touched since the previous one (the fleet's events),
  plus the few re-read on their way down or popped: about 8 at 10,000 replicas on ``vidur-parity``.

Expiry times are computed a microsecond early (``EARLY_S``), so floating-point rounding of step times can only
cost an extra re-read, never a key above the value. A heap entry is one int, ``(key << 64) | (replica << 32) |
version``: it orders as ``(key, replica)``, compares faster than a tuple, and is not tracked by the garbage
collector.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable, Hashable

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.sim.simulator import Simulator

INF = float("inf")
EARLY_S = 1e-6  # refresh this much before a computed step boundary (rounding of float step times)
MASK = (1 << 32) - 1  # replica and version fields of a heap entry


class LoadIndex:
    """Argmin of a replica load over one model's candidates: ``tokens`` (outstanding tokens, time-dependent, keys
    are lower bounds) or requests (outstanding requests, keys are the values). With ``group``, over one group's
    candidates instead: ``group(rep)`` is the heap a replica is in (``GroupedIndex``)."""

    __slots__ = ("sim", "tokens", "heaps", "expiry", "ver", "ref", "dirty", "refreshes", "exams", "group")

    def __init__(self, sim: "Simulator", tokens: bool, group: Callable | None = None):
        self.sim = sim
        self.tokens = tokens
        self.group = group  # rep -> its heap's number (None: its model's index)
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
                j = lane.steps_done(now) if now > lane.run_o else 0  # (a run not begun: none done)
                val -= j * lane.run_B
                if j < lane.run_k:
                    if runs is None:
                        runs = [(lane, j)]
                    else:
                        runs.append((lane, j))
        return val, runs

    def _enter(self, i: int, rep, val: int, runs, later: list) -> None:
        """Give replica ``i`` a new entry: its value after H more decode steps of each lane in a run, a lower
        bound until one of them completes step H + 1 (then the entry expires and is made again); H from the
        replica's distance to its model's level (module docstring)."""
        self.refreshes += 1
        v = (self.ver[i] + 1) & MASK
        self.ver[i] = v
        if not rep.routable:  # not among its model's candidates: no entry until it is again (it is touched then)
            return
        m = rep.model_index if self.group is None else self.group(rep)
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
                    t = lane.run_o + lane.run_elapsed(j + h + 1) - EARLY_S
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
        m = rep.model_index if self.group is None else self.group(rep)
        if i >= len(ver) or m >= len(self.heaps):  # a replica, model or group not seen yet
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


class GroupedIndex:
    """A ``LoadIndex`` per group of replicas that share what a router adds to their load: a router whose key is
    (the round trip to a replica's region, its outstanding requests) needs only the least-loaded replica of each
    region (``key`` = model and region), and one whose key is the round trip plus outstanding tokens over the
    replica's prefill throughput needs the least-loaded of each region and throughput. Such a router compares one
    replica per group instead of scanning the fleet: its cost grows with the groups (regions, GPU types), not
    with the replicas. ``key(rep)`` is the group's key; its first element is the replica's model."""

    __slots__ = ("sim", "key", "ids", "keys", "by_model", "index")

    def __init__(self, sim: "Simulator", tokens: bool, key: Callable[..., tuple]):
        self.sim = sim
        self.key = key
        self.ids: dict[Hashable, int] = {}
        self.keys: list[tuple] = []
        self.by_model: list[list[int]] = []  # model -> its groups' numbers
        self.index = LoadIndex(sim, tokens, group=self.gid)

    def gid(self, rep) -> int:
        k = self.key(rep)
        g = self.ids.get(k)
        if g is None:
            g = self.ids[k] = len(self.keys)
            self.keys.append(k)
            m = rep.model_index
            while m >= len(self.by_model):
                self.by_model.append([])
            self.by_model[m].append(g)
        return g

    def bests(self, model: int, now: float) -> list[tuple[tuple, int]]:
        """(group key, the group's least-loaded candidate) for each group of ``model`` that has a candidate."""
        reps = self.sim.replicas
        for i in self.index.dirty:  # (replicas not seen yet may open a group)
            self.gid(reps[i])
        out = []
        if model < len(self.by_model):
            for g in self.by_model[model]:
                i = self.index.argmin(g, now)
                if i >= 0:
                    out.append((self.keys[g], i))
        return out


class KVIndex:
    """``least_kv_load``'s argmin per model: the candidate with the smallest (fraction of KV blocks in use, waiting
    requests), ties to the lowest index. Between two touches of a replica its queue does not change and its KV in
    use only grows (decode steps in flight fill blocks), so the value read when it was touched is a lower bound
    until it is touched again. The search pops entries in key order, reads each replica's exact value, and stops
    when the next key is at or above the best ``(value, replica)`` found; the replicas it read are entered again
    with their values. The work per request is the replicas touched since the previous one plus those whose KV
    grew past the level of the answer."""

    __slots__ = ("sim", "heaps", "ver", "dirty")

    def __init__(self, sim: "Simulator"):
        self.sim = sim
        self.heaps: list[list[tuple]] = []  # per model: (KV fraction, waiting, replica, version), keys lower bounds
        self.ver: list[int] = []
        self.dirty: set[int] = set(range(len(sim.replicas)))

    def _enter(self, i: int, now: float) -> None:
        ver = self.ver
        while i >= len(ver):
            ver.append(0)
        v = ver[i] = ver[i] + 1
        rep = self.sim.replicas[i]
        if not rep.routable:  # (an entry again when it is: it is touched then)
            return
        m = rep.model_index
        while m >= len(self.heaps):
            self.heaps.append([])
        heapq.heappush(self.heaps[m], (rep.kv_used_fraction(now), len(rep.waiting), i, v))

    def argmin(self, model: int, now: float) -> int:
        """The candidate of ``model`` with the smallest (KV fraction, waiting) at ``now`` (ties: lowest index); -1
        if none."""
        if self.dirty:
            for i in self.dirty:
                self._enter(i, now)
            self.dirty.clear()
        if model >= len(self.heaps):
            return -1
        h = self.heaps[model]
        reps, ver = self.sim.replicas, self.ver
        best = None
        seen = []
        while h and (best is None or h[0][:3] < best):
            _, _, i, v = heapq.heappop(h)
            if v != ver[i]:
                continue
            rep = reps[i]
            k = (rep.kv_used_fraction(now), len(rep.waiting), i)
            seen.append(i)
            if best is None or k < best:
                best = k
        for i in seen:
            self._enter(i, now)
        if len(h) > 64 and len(h) > 3 * len(ver):  # mostly stale entries: rebuild
            h[:] = [e for e in h if e[3] == ver[e[2]]]
            heapq.heapify(h)
        return -1 if best is None else best[2]


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
