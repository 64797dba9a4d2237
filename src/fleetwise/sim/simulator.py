"""The discrete-event simulator of a fleet of LLM inference replicas.

Events are ordered by ``(time, priority, seq)``; arrivals are read from the workload's sorted columns rather
than pushed into the heap, so memory stays flat in the number of requests. All randomness comes from one
``numpy.random.Generator`` made from the seed.

Step API (used by the RL environments)::

    sim = Simulator(replicas, workload, ...)
    dp = sim.advance()            # next decision point, or None when every request has ended
    sim.apply(action)             # replica index for "route", a BatchPlan for "batch"

``run(controller)`` is that loop with a Controller answering every decision point: heuristic and learned
policies take the same path.
"""

from __future__ import annotations

import functools
import gc
import heapq
import math
import operator
from array import array
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from fleetwise.errors import InputError
from fleetwise.sim.actions import BatchPlan, DecisionPoint
from fleetwise.sim.engine import Lane, Replica
from fleetwise.sim.route_index import GroupedIndex, KVIndex, LoadIndex, PrefixIndex
from fleetwise.sim.records import COMPLETED, PENDING, REJECT_REASONS, REJECTED, Records
from fleetwise.sim.views import SimLaneView, SimRouteView

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.workload.request import Workload

# event kinds, and their priority at equal times (lower first)
LANE_DONE, READY, ENQUEUE, RETRY, TIMER = 0, 1, 2, 3, 4
INF = float("inf")



@dataclass(slots=True)
class SimOptions:
    force_single_step: bool = False  # advance decode one iteration per event (for tests; same records)
    max_waiting: int | None = None  # per replica; beyond it a request is rejected ("queue_full")
    prefix_caching: bool = True
    check_invariants: bool = False  # assert KV usage <= capacity after every event (tests)
    timeline_bucket_s: float | None = None  # record each replica's GPU-busy time per bucket (utilisation over time)
    max_time_s: float | None = None  # stop here; requests not finished by then end as rejected ("horizon")
    hold_unroutable: bool = False  # no replica of the model can take it now: hold it (cold start) instead of
    # rejecting it ("no_replica"); held requests are routed when a replica of their model becomes ready
    retry_backoff_s: float = 0.5  # first retry after a failed attempt (replica died); doubles up to the cap
    retry_backoff_max_s: float = 30.0
    kv_offload: bool = False  # a preempted sequence swaps its KV to host memory over PCIe (out and back in)
    # instead of recomputing it; it rejoins the head of the queue when the copy is back
    pause_gc: bool = True  # run_until pauses Python's cyclic garbage collector while it runs and restores it after:
    # the simulator makes no cyclic garbage (tests/test_sim.py), and at 10,000 replicas the collector's passes over
    # the heap's young entries read the lanes they point to out of cache (docs/benchmarks.md, fleet scale). A
    # controller that makes reference cycles on every decision may set it False

    def __post_init__(self) -> None:
        """Values a run can take, or a ValueError naming the option (a negative ``timeline_bucket_s`` hung the
        run, NaN failed mid-run, a negative ``max_time_s`` rejected every request; found by fuzzing the Python
        API, 2026-12-06). The scenario's ``options:`` bound them tighter; these are for code that sets them."""
        from fleetwise.limits import MAX_SPAN_S, MIN_TIMELINE_BUCKET_S

        def positive(name: str, lo: float, hi: float = MAX_SPAN_S) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"{name} {v!r}: expected a number from {lo:g} to {hi:g}")

        if self.timeline_bucket_s is not None:
            positive("timeline_bucket_s", MIN_TIMELINE_BUCKET_S)
        if self.max_time_s is not None:
            positive("max_time_s", 1e-9)
        positive("retry_backoff_s", 1e-3)
        positive("retry_backoff_max_s", 1e-3)
        mw = self.max_waiting
        if mw is not None and (isinstance(mw, bool) or not isinstance(mw, int) or mw < 0):
            raise ValueError(f"max_waiting {mw!r}: expected an integer >= 0 or None")


def _latency_group(sim: "Simulator", r) -> tuple:
    """``least_latency``'s grouping key of replica ``r``: model, region, prefill throughput."""
    return (r.model_index, r.region, sim.prefill_tps(r.index))


def event(fn: Callable, *args) -> Callable:
    """A callback for ``Simulator.at`` that calls ``fn(*args)`` (the simulator it is given is not passed): a
    partial, not a lambda, so that a simulator holding it pickles (environments are copied by gymnasium's and
    SB3's tools)."""
    return functools.partial(_call_without_sim, fn, *args)


def _call_without_sim(fn: Callable, *args_then_sim) -> None:
    fn(*args_then_sim[:-1])


class Simulator:
    """The event loop of a fleet of replicas over a workload (the module docstring: ``run(controller)``, or the
    step API ``advance()`` / ``apply(action)``). Build one from a scenario with ``fleetwise.scenario.build``."""

    # the event heap is compacted (``_compact``) when it outgrows twice its size after the last compaction, and
    # never below this size (a small fleet's heap stays small and is never compacted); checked at each arrival and
    # each push of another kind, not at each lane event (_schedule: a few per request)
    COMPACT_MIN = 4096

    def __init__(self, replicas: Sequence[Replica], workload: "Workload", *, rtt_s: np.ndarray | None = None,
                 bandwidth_gbps: np.ndarray | None = None,
                 model_index: Sequence[int] | None = None, max_context: Sequence[int] | None = None,
                 seed: int = 0, options: SimOptions | None = None):
        self.replicas = list(replicas)
        # every replica's perf model lets the accounting read its coefficients (PerfModel.inline_accounting)
        self._inline_acct = all(getattr(r.perf, "inline_accounting", False) for r in self.replicas)
        self.workload = workload
        self.options = options or SimOptions()
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        n = len(workload)
        self.n = n
        self.arrival = array("d", workload.arrival_s.astype(np.float64).tobytes())
        self.prompt = array("q", workload.prompt_tokens.astype(np.int64).tobytes())
        self.output = array("q", workload.output_tokens.astype(np.int64).tobytes())
        self.origin = array("q", workload.origin.astype(np.int64).tobytes())
        # model of each request as an index into the distinct deployment models
        mi = np.zeros(n, np.int64) if model_index is None else np.asarray(model_index, dtype=np.int64)
        self.model_of = array("q", mi.tobytes())
        nmodels = int(mi.max(initial=0)) + 1
        self.candidates: list[list[int]] = [[] for _ in range(max(nmodels, 1))]
        for r in self.replicas:
            mi = r.model_index
            while mi >= len(self.candidates):
                self.candidates.append([])
            self.candidates[mi].append(r.index)
        self.max_context = list(max_context) if max_context is not None else [1 << 60] * len(self.candidates)
        nreg = 1 + max([r.region for r in self.replicas] + [int(workload.origin.max(initial=0))])
        self.rtt_s = rtt_s if rtt_s is not None else np.zeros((nreg, nreg))
        self._rtt = self.rtt_s.tolist()
        self._bw = np.asarray(bandwidth_gbps, dtype=float).tolist() if bandwidth_gbps is not None else None
        # per-request mutable state: lists where the hot loop reads, typed arrays (8 bytes or less per entry,
        # no Python objects) where it mostly writes, so a million requests stay well under a few hundred MB
        self.ctx = array("q", self.prompt)  # tokens the current attempt must prefill
        self.pf = array("q", bytes(8 * n))  # prefilled tokens of the current attempt
        self.gen = array("q", bytes(8 * n))  # output tokens generated (materialized when not running)
        self.join_step = array("q", bytes(8 * n))
        self.gen_join = array("q", bytes(8 * n))  # generated tokens when the sequence joined its lane's decode batch
        self.epoch = array("l", bytes(array("l").itemsize * n))
        self.lane_of: list[Lane | None] = [None] * n
        # records
        nan = array("d", [math.nan]) * n
        self.first_token_s = array("d", nan)
        self.completion_s = array("d", nan)
        self.enqueue_s = array("d", nan)
        self.sched_s = nan
        self.replica_of = array("i", [-1]) * n
        self.status = array("b", bytes(n))
        self.reason = array("b", bytes(n))
        self.hit_tokens = array("q", bytes(8 * n))
        self.preempts = array("i", bytes(4 * n))
        self.net_s = array("d", bytes(8 * n))
        self.hops = array("b", bytes(n))  # times offloaded
        self.retries = array("i", bytes(4 * n))  # attempts that failed (replica died) and were retried
        self.moved_from = array("i", [-1]) * n  # retry: replica whose region the request leaves from
        self.kv_moved = array("b", bytes(n))  # retry carries its KV cache (migration): no prefill again
        self.swapped = array("b", bytes(n))  # preempted with its KV swapped to host memory (kv_offload)
        self.swapped_bytes = 0.0
        self.held: list[deque] = [deque() for _ in range(len(self.candidates))]  # waiting for a replica
        self.arrived = [0] * len(self.candidates)  # arrivals per model so far (scalers' demand signal)
        self.admission: Callable[[int], str] | None = None  # extra admission control: rid -> reject reason or ""
        self.completions: list[int] | None = None  # set to [] to log request ids as they end (RL rewards)
        self.migrated_bytes = 0.0  # KV bytes moved between replicas (spot preemption with migration)
        # event machinery
        self.now = 0.0
        self._heap: list = []
        self._compact_at = self.COMPACT_MIN  # heap size at which stale lane events are dropped (_compact)
        self._seq = 0
        self._ghost_t = -INF  # the latest lane event scheduled without a push of its own (_schedule)
        self._next = 0  # next arrival
        # decisions due now, last first: DecisionPoints, or a Lane whose batch decision run_until answers without
        # one (``_fast_plan``; advance makes it a DecisionPoint for any other caller)
        self._pending: list = []
        self._fast_plan = None
        # run_until's router, which routes arrivals inside advance without a DecisionPoint (``_fast_route``), up to
        # request ``_fast_route_until`` (run_until's progress callback runs between such stretches)
        self._fast_route = None
        self._fast_route_until = 0
        self._dp: DecisionPoint | None = None
        self.batcher_stationary = True
        self.events = 0
        self.ended = 0
        self.prefix_block_tokens = workload.block_tokens
        self._bucket = self.options.timeline_bucket_s
        self.prefix_enabled = workload.has_prefix and self.options.prefix_caching  # prefix block ids known, cache on
        pr = workload.priority
        # per-request priority, or None when every request has the same one
        self.priorities = pr.tolist() if pr is not None and n and int(pr.min()) != int(pr.max()) else None
        if self.prefix_enabled:
            self._pofs = workload.prefix_offsets.tolist()
            self._pblk = workload.prefix_blocks
        self._tps: dict[int, float] = {}
        self._pause_t = INF  # the time of the pause timer run_until set last
        self._rview = SimRouteView(self)
        # load indexes of the load-aware routers (fleetwise.sim.route_index), made when a router first asks
        self._tok_index: LoadIndex | None = None
        self._req_index: LoadIndex | None = None
        self._near_index: GroupedIndex | None = None  # outstanding requests per model and region
        self._lat_index: GroupedIndex | None = None  # outstanding tokens per model, region and prefill throughput
        self._kv_index: KVIndex | None = None  # (KV fraction in use, waiting) per model
        self._stalled: set[int] = set()  # replicas that may be candidates before they serve (a start-up, ``stall``)
        self._dirty: list[set[int]] = []  # their ``dirty`` sets (empty: no index, nothing to mark; ``_touch``)
        self._prefix_index: PrefixIndex | None = None
        for r in self.replicas:
            if r.ready_s > 0:
                self._push(r.ready_s, READY, r.index, 0)
                self._stalled.add(r.index)  # (a candidate from the start that serves later: least_latency)

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, x, y) -> None:
        self._seq += 1
        heap = self._heap
        heapq.heappush(heap, (t, kind, self._seq, x, y))
        if len(heap) > self._compact_at:
            self._compact()

    def _compact(self) -> None:
        """Drop the lane events that a replaced run or wait left behind (their version is not the lane's): a cut
        run leaves its old end event in the heap, and in a large fleet those would be half of it. The order of
        the others is unchanged (it is total: time, kind, sequence number)."""
        heap = self._heap
        keep = [e for e in heap if e[1] != LANE_DONE or e[4] == e[3].version]
        if len(keep) < len(heap):  # a dropped event would have set the clock when popped (``_ghost_t``)
            t = max(e[0] for e in heap if e[1] == LANE_DONE and e[4] != e[3].version)
            if t > self._ghost_t:
                self._ghost_t = t
        heap[:] = keep
        heapq.heapify(heap)
        self._compact_at = max(self.COMPACT_MIN, 2 * len(heap))

    def _schedule(self, lane: Lane) -> None:
        """(Re)schedule ``lane``'s end event at ``lane.t_end``, replacing the one scheduled before.

        The event is ordered as a fresh push would be (its sequence number is taken now), but when the lane's
        entry in the heap is earlier than ``t_end`` (a run retimed later, or cut back to a step boundary after
        it), that entry is kept: when it surfaces, ``advance`` pushes it again at ``t_end`` with the event's
        sequence number. So a run retimed many times costs one heap entry, not one per retime, with the same
        event order. As a replaced event would have been popped (and set the clock) when it came due, the clock
        ends at the latest event not pushed if that is later (``_ghost_t``, ``advance``)."""
        self._seq = s = self._seq + 1
        t = lane.t_end
        lane.ev_seq = s
        if lane.ev_t < t:
            if t > self._ghost_t:
                self._ghost_t = t
        else:
            lane.version = v = lane.version + 1
            lane.ev_t = t
            heap = self._heap
            heapq.heappush(heap, (t, LANE_DONE, s, lane, v))  # (its size is checked at each arrival, advance)

    def _unschedule(self, lane: Lane) -> None:
        """Cancel ``lane``'s end event (if any)."""
        lane.version += 1
        lane.ev_t = INF

    def _touch(self, rep: Replica) -> None:
        """Something a load index reads of ``rep`` changed (its counters, a lane's run, its candidacy). The hot
        paths test ``self._dirty`` first (no index: no call)."""
        for d in self._dirty:
            d.add(rep.index)

    def least_loaded(self, model: int, tokens: bool) -> int:
        """The candidate of ``model`` with the fewest outstanding tokens as of now (``tokens``) or outstanding
        requests; ties to the lowest index; -1 when it has none. Same answer as a scan, from an index."""
        if tokens:
            ix = self._tok_index
            if ix is None:
                ix = self._tok_index = LoadIndex(self, True)
                self._dirty.append(ix.dirty)
        else:
            ix = self._req_index
            if ix is None:
                ix = self._req_index = LoadIndex(self, False)
                self._dirty.append(ix.dirty)
        return ix.argmin(model, self.now)

    def nearest_least_outstanding(self, model: int, origin: int) -> int:
        """The candidate of ``model`` with the smallest (round trip from region ``origin``, outstanding requests),
        ties to the lowest index; -1 when it has none. Same answer as a scan: the least-loaded candidate of each
        region (an index per model and region) stands for its region."""
        gx = self._near_index
        if gx is None:
            gx = self._near_index = GroupedIndex(self, False, key=operator.attrgetter("model_index", "region"))
            self._dirty.append(gx.index.dirty)
        row = self._rtt[origin]
        reps = self.replicas
        best = None
        for (_, region), i in gx.bests(model, self.now):
            k = (row[region], reps[i].outstanding, i)
            if best is None or k < best:
                best = k
        return -1 if best is None else best[2]

    def least_latency(self, model: int, origin: int) -> int:
        """The candidate of ``model`` with the smallest round trip from ``origin`` + outstanding tokens / prefill
        throughput + wait until it serves (``latency_aware``'s estimate), ties to the lowest index; -1 when it
        has none, or -2 when one of its candidates is not serving yet (a start-up, a stall: the caller scans). Same answer as a scan: within
        a group of one region and one throughput the key grows with the outstanding tokens (distinct token counts
        give distinct keys), so the group's least-loaded candidate stands for it."""
        now = self.now
        reps = self.replicas
        if self._stalled:
            self._stalled = {i for i in self._stalled if reps[i].ready_s > now}
            if any(reps[i].model_index == model and reps[i].routable for i in self._stalled):
                return -2
        gx = self._lat_index
        if gx is None:
            gx = self._lat_index = GroupedIndex(self, True, key=functools.partial(_latency_group, self))
            self._dirty.append(gx.index.dirty)
        row = self._rtt[origin]
        best = None
        for (_, region, tps), i in gx.bests(model, now):
            rep = reps[i]
            k = (row[region] + rep.outstanding_tokens(now) / tps + max(0.0, rep.ready_s - now), i)
            if best is None or k < best:
                best = k
        return -1 if best is None else best[1]

    def least_kv(self, model: int) -> int:
        """The candidate of ``model`` with the smallest (fraction of KV blocks in use, waiting requests) as of now
        (``least_kv_load``), ties to the lowest index; -1 when it has none. Same answer as a scan, from an index."""
        ix = self._kv_index
        if ix is None:
            ix = self._kv_index = KVIndex(self)
            self._dirty.append(ix.dirty)
        return ix.argmin(model, self.now)

    def prefix_holders(self, block: int):
        """Replicas whose prefix cache holds ``block`` (any model, routable or not), in no particular order."""
        px = self._prefix_index
        if px is None:
            px = self._prefix_index = PrefixIndex()
            for r in self.replicas:
                if r.prefix_cache:
                    for b in r.prefix_cache:
                        px.add(b, r.index)
        d = px.holders.get(block)
        return d.keys() if d else ()

    def advance(self) -> DecisionPoint | None:
        """Process events until a policy must decide; return that decision point (None: all requests ended)."""
        heap = self._heap
        arrival = self.arrival
        n = self.n
        check = self.options.check_invariants
        # the next arrival, and the horizon: read again after whatever may change them (an arrival, a timer:
        # the platform layer sets max_time_s after construction)
        t_arr = arrival[self._next] if self._next < n else INF
        horizon = self.options.max_time_s
        while True:
            if self._pending:
                dp = self._pending.pop()
                if dp.__class__ is Lane:
                    fast = self._fast_plan
                    if fast is not None:  # run_until's batcher, answered here (what apply would do)
                        self._start(dp, fast(dp.view))
                        continue
                    dp = DecisionPoint("batch", self.now, lane=dp, view=dp.view)
                self._dp = dp
                if dp.kind == "route":
                    self._rview.at(dp.request, self.now)
                return dp
            if horizon is not None and min(t_arr, heap[0][0] if heap else INF) > horizon:
                self._stop_at_horizon()
                return None
            if heap and heap[0][0] <= t_arr:
                t, kind, s, x, y = heapq.heappop(heap)
                self.now = t
                self.events += 1
                if kind == LANE_DONE:
                    if y == x.version:
                        if s != x.ev_seq:  # an early entry of an event rescheduled later (_schedule)
                            x.ev_t = t = x.t_end
                            heapq.heappush(heap, (t, LANE_DONE, x.ev_seq, x, y))
                            continue
                        x.ev_t = INF
                        if x.idle_wait:
                            x.idle_wait = False
                        else:
                            self._finish(x)
                        # _ask(x), inline; with run_until's batcher its plan is started here (what popping x
                        # from _pending would do next: x is the top of that stack)
                        x.busy = False
                        if not x.awaiting:
                            if t < x.replica.ready_s or not x.running and not x.prefilling \
                                    and not x.replica.waiting:
                                if x.pipe:
                                    self._drop_followers(x)
                            elif self._fast_plan is not None and not check:
                                if x.view is None:
                                    x.view = SimLaneView(self, x)
                                self._start(x, self._fast_plan(x.view))
                            else:
                                x.awaiting = True
                                if x.view is None:
                                    x.view = SimLaneView(self, x)
                                self._pending.append(x)
                elif kind == ENQUEUE:
                    self._enqueue(x, y, front=bool(self.swapped[y]))
                elif kind == READY:
                    r = self.replicas[x]
                    if r.stop_s is None:
                        if not r.routable and not r.draining and not r.failed and t >= r.ready_s:
                            self._make_routable(r)
                        for lane in r.lanes:
                            self._wake(lane)
                elif kind == RETRY:
                    dp = self._dispatch(x)
                    if dp is not None:
                        self._dp = dp
                        self._rview.at(x, t)
                        return dp
                else:  # TIMER: a platform callback; it may return a decision point
                    dp = x(self)
                    if dp.__class__ is DecisionPoint:
                        self._dp = dp
                        return dp
                    t_arr = arrival[self._next] if self._next < n else INF
                    horizon = self.options.max_time_s
                if check:
                    self._check()
                continue
            if t_arr == INF:
                if self._ghost_t > self.now:  # (the clock ends at the latest event, _schedule)
                    self.now = self._ghost_t
                self._dp = None
                return None
            rid = self._next
            self._next = i = rid + 1
            self.now = t = t_arr
            t_arr = arrival[i] if i < n else INF
            self.events += 1
            if len(heap) > self._compact_at:  # (the lane events pushed since the last arrival, _schedule)
                self._compact()
            m = self.model_of[rid]
            if m < len(self.arrived):
                self.arrived[m] += 1
            why = self._admissible(rid)
            if not why and self.admission is not None:
                why = self.admission(rid)
            if why:
                if why == "no_replica" and self.options.hold_unroutable and m < len(self.held):
                    self.held[m].append(rid)
                    continue
                self._reject(rid, why)
                continue
            fast = self._fast_route
            if fast is not None and rid < self._fast_route_until:  # run_until's router, answered here (as apply)
                self._route(rid, int(fast(self._rview.at(rid, t))))
                continue
            self._dp = dp = DecisionPoint("route", t, request=rid, view=self._rview.at(rid, t))
            return dp

    def apply(self, action) -> None:
        """Answer the pending decision point (from ``advance``): a replica index for ``route``, a ``BatchPlan`` for
        ``batch``, the level's answer for the others. A refused answer raises ``InputError`` and the decision stays
        pending."""
        dp = self._dp
        if dp is None:
            raise RuntimeError("apply() called with no decision pending; call advance() first")
        self._dp = None
        if dp.kind == "route":
            self._route(dp.request, int(action))
        elif dp.kind == "batch":
            self._start(dp.lane, action)
        else:
            try:
                dp.handler(action)
            except InputError:  # (a refused answer, checked before anything changed: the decision stays pending)
                self._dp = dp
                raise

    def run(self, controller: Any, progress=None) -> Records:
        """Run to the end with ``controller`` answering every decision; return the per-request records."""
        self.run_until(INF, controller, progress=progress)
        return self.records()

    def run_until(self, t: float, controller: Any, *, stop: tuple[str, ...] = (),
                  progress=None) -> DecisionPoint | None:
        """Answer decision points with ``controller`` until simulated time ``t``; return the decision point where
        it stopped: a "pause" point at ``t`` (every event before ``t`` processed, nothing after it), or the first
        decision point of a kind in ``stop`` (e.g. "scale" for an environment whose agent scales; returned
        unanswered: ``apply`` an action to it, or the next ``run_until`` answers it first with its controller);
        None when every request has ended. This is the one loop every run path uses (simulate, compare, sweep,
        the platform layer, every environment); ``run`` is ``run_until(inf)``."""
        self.batcher_stationary = bool(getattr(controller.batcher, "stationary", False))
        route = controller.router.route
        plan = getattr(controller.batcher, "plan", None)  # None: every batch decision is returned (``stop``)
        decide = controller.decide
        advance, apply, start = self.advance, self.apply, self._start
        if t < INF and self._pause_t != t:
            self._pause_t = t
            self.at(t, self._pause)
        last = self._next
        # batch decisions are answered inside advance (no DecisionPoint) unless they are to be returned
        self._fast_plan = plan if plan is not None and "batch" not in stop else None
        # and arrivals routed inside it too, in stretches of 2,000 requests when there is a progress callback
        self._fast_route = route if "route" not in stop else None
        self._fast_route_until = self._next + 2000 if progress is not None else self.n
        paused = self.options.pause_gc and gc.isenabled()
        if paused:
            gc.disable()
        try:
            dp = self._dp if self._dp is not None else advance()
            while dp is not None:
                k = dp.kind
                if k == "pause":
                    if dp.time_s >= t:
                        break
                    self._dp = None
                    dp = advance()  # the pause of an earlier target: nothing to do
                    continue
                if k in stop:
                    break
                if k == "batch":  # (apply, inlined)
                    self._dp = None
                    start(dp.lane, plan(dp.view))
                else:
                    apply(route(dp.view) if k == "route" else decide(dp))
                if progress is not None and self._next - last >= 2000:
                    progress(self._next - last)
                    last = self._next
                    self._fast_route_until = last + 2000
                dp = advance()
        finally:
            self._fast_plan = None
            self._fast_route = None
            if paused:
                gc.enable()
        if progress is not None:
            progress(self._next - last)
        return dp

    def _pause(self, sim: "Simulator") -> DecisionPoint:
        return DecisionPoint("pause", self.now)

    # ------------------------------------------------------------------ read-only facts (the views use them)
    def prefix_blocks(self, rid: int) -> list[int]:
        """Prefix-cache block ids of request ``rid``'s prompt (empty without prefix information)."""
        if not self.prefix_enabled:
            return []
        return self._pblk[self._pofs[rid]:self._pofs[rid + 1]].tolist()

    def prefill_tps(self, replica: int) -> float:
        """Prefill throughput of ``replica`` in tokens/s: a 512-token chunk on each of its lanes (performance model)."""
        tps = self._tps.get(replica)
        if tps is None:
            r = self.replicas[replica]
            tps = self._tps[replica] = 512.0 * len(r.lanes) / r.perf.iteration_time_s(512, 512.0 * 512, 0, 0)
        return tps

    def rtt_row(self, region: int) -> list[float]:
        """Round trips (s) from ``region`` to every region (read-only)."""
        return self._rtt[region]

    def link(self, a: int, b: int) -> tuple[float, float | None]:
        """(round trip s, bandwidth Gbps or None) of the link from region ``a`` to ``b``."""
        return self._rtt[a][b], (self._bw[a][b] if self._bw is not None else None)

    def set_link(self, a: int, b: int, rtt_s: float, bandwidth_gbps: float | None = None) -> None:
        """Change the link from region ``a`` to ``b`` from now on (e.g. a degraded link); both directions are
        separate links, so call it for (b, a) too for a symmetric change."""
        self._rtt[a][b] = float(rtt_s)
        if bandwidth_gbps is not None and self._bw is not None:
            self._bw[a][b] = float(bandwidth_gbps)

    def generated(self, rid: int) -> int:
        """Output tokens request ``rid`` has generated so far (its decode run in flight counted to the last
        completed step)."""
        lane = self.lane_of[rid]
        if lane is not None and rid in lane.running:
            return self.gen_join[rid] + lane.steps + lane.steps_done(self.now) - self.join_step[rid]
        return self.gen[rid]

    # ------------------------------------------------------------------ arrivals and routing
    def _admissible(self, rid: int) -> str:
        m = self.model_of[rid]
        if m >= len(self.candidates) or not self.candidates[m]:
            return "no_replica"
        total = self.prompt[rid] + self.output[rid]
        if total > self.max_context[m]:
            return "exceeds_context"
        cand = self.candidates[m]
        lane = self.replicas[cand[0]].lanes[0]  # (fits(rid, cand[0]) inline: the first candidate usually fits)
        if -(-total // lane.block_tokens) > lane.cap_blocks and not any(self.fits(rid, i) for i in cand):
            return "exceeds_kv_capacity"
        return ""

    def fits(self, rid: int, replica: int) -> bool:
        """Whether request ``rid`` (prompt + all its output) fits in one lane of ``replica``'s KV cache."""
        lane = self.replicas[replica].lanes[0]
        return -(-(self.prompt[rid] + self.output[rid]) // lane.block_tokens) <= lane.cap_blocks

    def _reject(self, rid: int, why: str) -> None:
        self.status[rid] = REJECTED
        self.reason[rid] = REJECT_REASONS.index(why)
        if self.completions is not None:
            self.completions.append(rid)
        self.ended += 1

    def _serves(self, ri: int, model: int) -> bool:
        """Whether replica ``ri`` is among ``model``'s candidates (O(1): a replica is in its model's candidate list
        exactly while it is routable)."""
        r = self.replicas[ri]
        return r.routable and r.model_index == model

    def _route(self, rid: int, ri: int) -> None:
        if not (0 <= ri < len(self.replicas)) or not self._serves(ri, self.model_of[rid]):
            raise ValueError(f"request {rid}: replica {ri} does not serve its model; candidates "
                             f"{self.candidates[self.model_of[rid]]}")
        rep = self.replicas[ri]
        self.replica_of[rid] = ri
        if rep.failed:  # died, not yet found out by the health checks: this attempt fails
            self._attempt_failed(rid)
            return
        if not self.fits(rid, ri):
            self._reject(rid, "exceeds_kv_capacity")
            return
        opts = self.options
        if opts.max_waiting is not None and len(rep.waiting) >= opts.max_waiting:
            self._reject(rid, "queue_full")
            return
        rtt = self._rtt[self.origin[rid]][rep.region]
        self.net_s[rid] = rtt
        rep.outstanding += 1
        rep.pending_tokens += self.ctx[rid] - self.pf[rid] + self.output[rid] - self.gen[rid]
        if self._dirty:
            self._touch(rep)
        src = self.moved_from[rid]
        if src >= 0:  # a retry or migration leaves from the replica it was at
            self.moved_from[rid] = -1
            sreg = self.replicas[src].region
            delay = self._rtt[sreg][rep.region] / 2.0
            if self.kv_moved[rid]:
                bw = self._bw[sreg][rep.region] if self._bw is not None else 0.0
                kv_bytes = self.ctx[rid] * self.replicas[src].perf.model.kv_bytes_per_token()
                delay += kv_bytes / (bw * 1e9 / 8.0) if bw > 0 else 0.0
                self.migrated_bytes += kv_bytes
            if delay > 0.0:
                self._push(self.now + delay, ENQUEUE, rep, rid)
            else:
                self._enqueue(rep, rid)
        elif rtt > 0.0:
            self._push(self.now + rtt / 2.0, ENQUEUE, rep, rid)
        else:
            self._enqueue(rep, rid)

    def _enqueue(self, rep: Replica, rid: int, front: bool = False, skip: Lane | None = None) -> None:
        if rep.failed:  # it died while the request was on its way (its counters were reset then)
            self._attempt_failed(rid)
            return
        self.enqueue_s[rid] = self.now if math.isnan(self.enqueue_s[rid]) else self.enqueue_s[rid]
        if front:
            rep.waiting.appendleft(rid)
        else:
            rep.waiting.append(rid)
        if self._dirty:  # (its queue grew: the KV index keys waiting requests)
            self._touch(rep)
        if self.now < rep.ready_s:
            return
        for lane in rep.lanes:
            if lane is not skip:
                self._wake(lane)

    def _wake(self, lane: Lane) -> None:
        """The lane's waiting queue changed: an idle lane replans now; a decode run stops at its next step."""
        if lane.awaiting or self.now < lane.replica.ready_s:
            return
        if lane.idle_wait:  # cut the wait short: the queue changed
            lane.idle_wait = False
            lane.busy = False
            self._unschedule(lane)
        if not lane.busy:
            self._ask(lane)
        elif lane.run_k > 1:
            self._cut_run(lane)

    def _cut_run(self, lane: Lane) -> None:
        """End the decode run in flight at its next step boundary (where per-iteration stepping would replan)."""
        if lane.cut:
            return
        lane.cut = True  # (from now on its last step is in flight: nothing retimes it, a cut changes nothing)
        j, t = lane.in_flight(self.now)  # smallest j with run_o + elapsed(j) > now, and that time
        if j < lane.run_k:
            if self._dirty:
                self._touch(lane.replica)
            lane.run_k = j
            lane.t_end = t
            self._schedule(lane)
            if lane.pipe == 1:  # its followers' later steps assumed its steps went on
                for o in lane.replica.lanes:
                    if o.pipe == 2 and o.lead is lane and o.busy and o.run_k > 1:
                        self._cut_run(o)

    def _ask(self, lane: Lane) -> None:
        lane.busy = False
        if lane.awaiting:
            return
        if self.now < lane.replica.ready_s or not lane.running and not lane.prefilling and not lane.replica.waiting:
            if lane.pipe:  # (not ready: loading weights, its READY event wakes the lane; or nothing to decide,
                self._drop_followers(lane)  # woken by the next enqueue)
            return
        lane.awaiting = True
        if lane.view is None:
            lane.view = SimLaneView(self, lane)
        self._pending.append(lane)  # (a "batch" decision point, made when advance pops it)

    # ------------------------------------------------------------------ one iteration or decode run
    def _start(self, lane: Lane, plan: BatchPlan) -> None:
        lane.awaiting = False
        rep = lane.replica
        if self._dirty:
            self._touch(rep)
        bs = lane.block_tokens
        if plan.queue is not None:
            if len(plan.queue) != len(rep.waiting) or set(plan.queue) != set(rep.waiting):
                raise ValueError(f"batch plan: queue must hold exactly the {len(rep.waiting)} requests waiting at "
                                 f"replica {rep.index}")
            rep.waiting.clear()
            rep.waiting.extend(plan.queue)
        if plan.offload:
            for rid, to in plan.offload:
                self._offload(rep, int(rid), int(to))
            if not plan.decode and not plan.prefill and not plan.wait_s:
                self._ask(lane)  # still free: decide again
                return
        preempted = False
        for rid in plan.preempt:
            if rid not in lane.running and rid not in lane.prefilling:
                raise ValueError(f"batch plan: cannot preempt request {rid}: not admitted to this lane")
            self._preempt(lane, int(rid))
        reserve = 0  # blocks the decode part of this iteration needs
        if plan.decode and lane.running:
            hist = lane.phase_hist
            reserve = hist[(-lane.steps) % bs]
            while reserve > lane.cap_blocks - lane.used_blocks and lane.running:
                self._preempt(lane, self._victim(lane))
                preempted = True
                reserve = hist[(-lane.steps) % bs] if lane.running else 0
        prefill = []
        admitted = False
        pf_tokens = 0
        attn = 0.0
        for rid, chunk in plan.prefill:
            if rid not in lane.prefilling:
                if preempted:
                    continue
                if self.lane_of[rid] is not None or rid not in rep.waiting:
                    raise ValueError(f"batch plan: request {rid} is neither waiting at replica {rep.index} "
                                     f"nor prefilling in this lane")
                if -(-self.ctx[rid] // bs) > lane.cap_blocks - lane.used_blocks - reserve:
                    continue  # does not fit now
                self._admit(lane, rid)
                admitted = True
            left = self.ctx[rid] - self.pf[rid]
            chunk = min(int(chunk), left)
            if chunk <= 0:
                raise ValueError(f"batch plan: request {rid} has no prefill left to run")
            before = self.pf[rid]
            prefill.append((rid, chunk))
            pf_tokens += chunk
            attn += chunk * (before + chunk)
        if admitted and rep.waiting and len(rep.lanes) > 1:
            # the queue's head changed: a lane that was blocked behind it may admit what is now first
            for other in rep.lanes:
                if other is not lane:
                    self._wake(other)
        B = len(lane.running) if plan.decode else 0
        lane.run_prefill = prefill
        lane.run_pf_tokens = pf_tokens
        lane.cut = False
        lane.run_B = B
        lane.t0 = lane.run_o = self.now
        lane.run_w = 0.0
        perf = rep.perf
        if B and not prefill:
            c0, c1 = perf.decode_coeffs(B)
            k = 1
            # (after a preemption the next iteration's plan need not be this one: the batcher planned before the
            # KV was freed, and an admission put off may go ahead; so such a run is one step. E.g. with
            # kv_offload the queue's head is not the request just preempted, still swapping out, and may fit)
            if self.batcher_stationary and not self.options.force_single_step and not (preempted or plan.preempt):
                fin = lane.finish_heap
                while fin and fin[0][2] != self.epoch[fin[0][1]]:
                    heapq.heappop(fin)
                k = fin[0][0] - lane.steps
                free = lane.cap_blocks - lane.used_blocks
                if (free // B) * bs < k:
                    lo, hi = 1, k  # largest k with new_blocks(k) <= free
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        if lane.new_blocks(mid) <= free:
                            lo = mid
                        else:
                            hi = mid - 1
                    k = lo
            lane.run_k = k
            lane.run_a = a = c0 + c1 * lane.dec_kv
            lane.run_c1B = c = c1 * B
            dt = k * a + c * (k * (k - 1) / 2.0)  # (run_elapsed(k), its wait run_w being 0)
        elif B or prefill:
            dt = perf.iteration_time_s(pf_tokens, attn, B, lane.dec_kv if B else 0)
            lane.run_k = 1 if B else 0
            lane.run_a = dt
            lane.run_c1B = 0.0
        else:
            lane.run_k = 0
            lane.run_B = 0
            lane.run_prefill = ()
            lane.run_pf_tokens = 0
            if lane.pipe:
                self._drop_followers(lane)
            if plan.wait_s > 0.0:
                lane.busy = True
                lane.idle_wait = True
                lane.t0 = self.now
                lane.t_end = self.now + plan.wait_s
                self._schedule(lane)
            else:
                lane.busy = False
            return
        lane.run_time_s = dt
        lane.busy = True
        lane.t_end = t = self.now + dt if len(rep.lanes) == 1 else self._pipe_submit(lane, B and not prefill)
        self._seq = s = self._seq + 1  # _schedule(lane), inline
        lane.ev_seq = s
        if lane.ev_t < t:
            if t > self._ghost_t:
                self._ghost_t = t
        else:
            lane.version = v = lane.version + 1
            lane.ev_t = t
            heapq.heappush(self._heap, (t, LANE_DONE, s, lane, v))

    # ------------------------------------------------------------------ pipeline parallelism: a flow shop
    def _pipe_submit(self, lane: Lane, decode_run: bool) -> float:
        """Submit ``lane``'s next micro-batch to its replica's pipeline (pp > 1) and return when its run ends.

        The ``pp`` stages are shared: a micro-batch spends ``1/pp`` of its iteration time on each (the layers split
        evenly; ``PerfModel.stage_time_s``, which charges every stage the per-iteration extras, is a few percent
        more) and enters stage i when it has left stage i - 1 and the
        micro-batch submitted before it has left stage i (first come first served at every stage, as vLLM's
        virtual engines feed the stage workers). So a lane waits for stages its neighbours hold, and a decode-only
        micro-batch is paced by a neighbour carrying a prefill chunk.

        A decode run of several steps keeps a closed form: a *leader*'s steps after its first go at their own pace
        (nothing submitted before them is in their way); with pp == 2 a *follower* sits right behind the
        leader's steps on both stages (its step ends the leader's aligned step end plus its own stage time: the
        steady state of two decode-only micro-batches, the larger one pacing both). Only what is submitted can be
        in a micro-batch's way, so each submission settles the one run whose later steps are provisional: a
        leader's next step that this micro-batch delays waits for it (``_retime``); a follower of this lane
        follows its new run (``_follow``) or stops at its step boundary, where its lane replans as per-iteration
        stepping would. Same records as per-iteration stepping (``force_single_step``)."""
        o = lane.peer
        if o is None:
            return self._pipe_submit_n(lane, decode_run)
        # pp == 2, the common case, without loops: one other lane, two stages; the same steps, comparisons and
        # arithmetic as the general form (_pipe_submit_n), so the same numbers
        rep = lane.replica
        sf = rep.stage_free
        lane.pipe = 0
        lane.lead = None
        # 1. the other lane's step in flight, if it is in a decode run of several steps
        prov = None
        prov_n = 0
        prov_T = 0.0
        if o.pipe and o.run_k != 1 and o.busy and not o.idle_wait:
            n, T = o.in_flight(self.now)
            k = o.run_k
            if n <= k:
                if n > 1:
                    if o.pipe == 1:
                        if n == 2 and o.run_w:
                            st = o.run_w_stages
                            if st[0] > sf[0]:
                                sf[0] = st[0]
                            if st[1] > sf[1]:
                                sf[1] = st[1]
                        else:
                            e = T - (o.own_a + o.own_c * (n - 1)) / 2
                            if e > sf[0]:
                                sf[0] = e
                            if T > sf[1]:
                                sf[1] = T
                    else:
                        e = T - (o.lead_a + o.lead_c * (o.lead_n + n - 1)) / 2
                        if e > sf[0]:
                            sf[0] = e
                        if T > sf[1]:
                            sf[1] = T
                if n < k:
                    if o.pipe == 1 or o.lead is lane:
                        prov, prov_n, prov_T = o, n, T
                    else:
                        self._cut_run(o)
        # 2. this micro-batch through the two stages
        x = (lane.run_a if decode_run else lane.run_time_s) / 2
        t = self.now
        e = sf[0]
        if e > t:
            t = e
        t += x
        sf[0] = t
        held = False
        e = sf[1]
        if e > t:
            held = abs(e - prov_T) <= 1e-9
            t = e
        t += x
        sf[1] = t
        # 3. a leader's next step it is in the way of waits for it
        if prov is not None and prov.pipe == 1:
            xn = (prov.own_a + prov.own_c * prov_n) / 2
            if sf[0] > prov_T or sf[1] > prov_T + xn:  # _retime(prov, prov_n, prov_T, xn) with two stages
                t2 = prov_T
                e = sf[0]
                if e > t2:
                    t2 = e
                t2 += xn
                s0 = t2
                e = sf[1]
                if e > t2:
                    t2 = e
                t2 += xn
                w = t2 - (prov_T + xn * 2)
                if prov_n > 1:
                    self._rebase(prov, prov_n - 1)
                prov.run_w = w
                prov.run_w_stages = [s0, t2]
                if self._dirty:
                    self._touch(rep)
                prov.t_end = prov.run_o + prov.run_elapsed(prov.run_k)
                self._schedule(prov)
                prov_n = 1
        if not decode_run:
            lane.run_o = t - lane.run_a
            if prov is not None and prov.pipe == 2:
                self._cut_run(prov)
            return t
        # 4. a decode run: follow the other lane's run, or lead
        a, c, k = lane.run_a, lane.run_c1B, lane.run_k
        lane.own_a, lane.own_c = a, c
        lane.pipe = 1
        if prov is not None and prov.pipe == 1:
            if k == 1:
                prov = None
            elif held:
                t_end = self._behind(lane, prov, prov_n, a, c, k)
                if t_end is not None:
                    return t_end
        lane.run_o = ro = t - a
        t_end = t if k == 1 else ro + (k * a + c * (k * (k - 1) / 2.0))  # (run_elapsed(k): run_w is 0 here)
        # 5. this lane leads: the other lane's provisional steps now follow it, or stop at their boundary
        if prov is not None:
            self._follow(prov, lane, prov_n, prov_T)
        return t_end

    def _pipe_submit_n(self, lane: Lane, decode_run: bool) -> float:
        """``_pipe_submit`` for any pp (``_pipe_submit`` runs pp == 2 without the loops)."""
        rep = lane.replica
        lanes = rep.lanes
        pp = len(lanes)
        sf = rep.stage_free
        now = self.now
        lane.pipe = 0
        lane.lead = None
        # 1. what the other lanes have in the pipeline: the step in flight of a decode run (its first step was
        # recorded at submission); a leader's later steps are provisional
        prov = None
        prov_n = 0
        prov_T = 0.0
        for o in lanes:
            if o is lane or not o.pipe or o.run_k == 1 or not o.busy or o.idle_wait:
                continue  # (a run of one step was recorded when submitted)
            n, T = o.in_flight(now)
            if n > o.run_k:
                continue  # its run has ended (its end event is due now)
            if n > 1:
                x = (o.own_a + o.own_c * (n - 1)) / pp
                if o.pipe == 1 and n == 2 and o.run_w:  # its second step waited (_retime recorded its stages)
                    for i, e in enumerate(o.run_w_stages):
                        if e > sf[i]:
                            sf[i] = e
                elif o.pipe == 1:  # a leader's step n holds each stage for x, back to back
                    for i in range(pp):
                        e = T - (pp - 1 - i) * x
                        if e > sf[i]:
                            sf[i] = e
                else:  # a follower (pp == 2): stage 0 right after the leader's aligned step, stage 1 right after
                    e = T - (o.lead_a + o.lead_c * (o.lead_n + n - 1)) / pp
                    if e > sf[0]:
                        sf[0] = e
                    if T > sf[1]:
                        sf[1] = T
            if n < o.run_k:
                if o.pipe == 1 or o.lead is lane:  # a leader, or this lane's follower (its steps assumed this
                    prov, prov_n, prov_T = o, n, T  # lane's run went on; settled in step 5)
                else:
                    self._cut_run(o)
        # 2. this micro-batch through the stages
        first = lane.run_a if decode_run else lane.run_time_s
        x = first / pp
        t = now
        held = False  # it waited on the last stage for the micro-batch before it
        for i in range(pp):
            if sf[i] > t:
                held = i == pp - 1 and abs(sf[i] - prov_T) <= 1e-9  # (prov's step n ends at prov_T, to rounding)
                t = sf[i]
            t += x
            sf[i] = t
        c1 = t  # when it leaves the last stage
        # 3. a leader's provisional run: if this micro-batch is in the way of its next step, that step waits
        if prov is not None and prov.pipe == 1:
            xn = (prov.own_a + prov.own_c * prov_n) / pp
            for i in range(pp):
                if sf[i] > prov_T + i * xn:
                    self._retime(prov, prov_n, prov_T, xn)
                    prov_n = 1  # (its completed steps are booked: the step in flight is its run's first)
                    break
        if not decode_run:
            lane.run_o = c1 - lane.run_a
            if prov is not None and prov.pipe == 2:
                self._cut_run(prov)  # this lane's follower: its later steps assumed decode steps here
            return c1
        # 4. a decode run: lead, follow the provisional run, or (pp > 2 behind one) take one step
        a, c, k = lane.run_a, lane.run_c1B, lane.run_k
        lane.own_a, lane.own_c = a, c
        lane.pipe = 1
        if prov is not None and prov.pipe == 1:
            if k == 1:
                prov = None  # (one step: prov keeps its run, retimed above if this step is in its way)
            elif pp == 2 and held:  # it waited for prov's step on the last stage: it can follow
                t_end = self._behind(lane, prov, prov_n, a, c, k)
                if t_end is not None:
                    return t_end
            elif pp > 2:
                lane.run_k = k = 1
                prov = None
        lane.run_o = c1 - a
        t_end = c1 if k == 1 else lane.run_o + lane.run_elapsed(k)
        # 5. (pp == 2) this lane leads: the other lane's provisional steps now follow it, or stop at their boundary
        if prov is not None:
            self._follow(prov, lane, prov_n, prov_T)
        return t_end

    def _behind(self, lane: Lane, prov: Lane, prov_n: int, a: float, c: float, k: int) -> float | None:
        """pp == 2: ``lane``'s decode run (first step ``a``, growth ``c``, ``k`` steps) waited for leader ``prov``'s
        step ``prov_n`` on the last stage; it follows prov's run while its steps are no longer than prov's aligned
        ones (own step j <= prov's step n + j - 1, j >= 2). Returns its run's end, or None: it cannot follow."""
        ay, cy = prov.own_a, prov.own_c
        g1 = ay + cy * (prov_n - 1) - a
        if g1 + (cy - c) < 0.0:
            return None
        kk = k
        if cy < c:
            kk = min(kk, 1 + int(g1 / (c - cy)))
        # prov's step prov_n - 1 + j ends at T0 + its closed form's quadratic part (a wait of prov's second step,
        # run_w, is in T0 when that step is behind, else also the follower's second step's)
        T0 = prov.run_o + prov.run_elapsed(prov_n - 1)
        if prov_n == 2:
            T0 += prov.run_w
        elif prov_n == 1:
            lane.run_w = prov.run_w
        lane.pipe = 2
        lane.lead, lane.lead_n, lane.lead_a, lane.lead_c = prov, prov_n - 1, ay, cy
        lane.run_k = kk
        lane.run_o = T0 + (a - c) / 2
        lane.run_a = ay + cy * (prov_n - 1) + c / 2
        lane.run_c1B = cy
        return lane.run_o + lane.run_elapsed(kk)

    def _follow(self, y: Lane, x: Lane, n: int, T: float) -> None:
        """pp == 2: ``x`` has just submitted the first step of a decode run it leads; ``y``'s decode run (step n in
        flight, ending at ``T``) goes on behind it when its next step queues right behind x's first on the last
        stage and its steps stay no longer than x's (so neither is in the other's way): y's step n + i then ends
        at the end of x's step i plus y's own stage time. Otherwise y's run stops at its step boundary."""
        sf = y.replica.stage_free  # x's first step: leaves stage 0 at sf[0], the last stage at sf[1]
        cy = y.own_c
        a1 = y.own_a + cy * (n - 1)  # y's own step n
        e0 = (T if T > sf[0] else sf[0]) + (a1 + cy) / 2.0  # y's step n + 1 leaves stage 0
        ax, cx = x.own_a, x.own_c
        h0 = ax - cx - a1  # own x step i - own y step n + i = h0 + i (cx - cy): >= 0 for i >= 2
        if e0 > sf[1] or a1 + cy > ax + cx:  # not behind x's first step, or its next step longer than x's second
            self._cut_run(y)
            return
        if n > 1:
            self._rebase(y, n - 1)  # y's step in flight is now its run's first
        k = y.run_k
        if h0 + 2.0 * (cx - cy) < 0.0:
            k = min(k, 2)
        elif cx < cy:
            k = min(k, 1 + int(h0 / (cy - cx)))
        y.pipe = 2
        y.lead, y.lead_n, y.lead_a, y.lead_c = x, -1, ax, cx
        y.run_k = k
        y.run_a = ax - cx + cy / 2.0
        y.run_c1B = cx
        y.run_o = T - y.run_a
        y.run_w = x.run_o - ax + cx + (a1 - cy) / 2.0 - y.run_o  # steps from the second on follow x's steps
        if self._dirty:
            self._touch(y.replica)
        y.t_end = y.run_o + y.run_elapsed(k)
        self._schedule(y)

    def _drop_followers(self, lane: Lane) -> None:
        """``lane`` submits nothing now: runs that followed it stop at their step boundary."""
        for o in lane.replica.lanes:
            if o.pipe == 2 and o.lead is lane and o.busy and o.run_k > 1:
                self._cut_run(o)

    def stall(self, replica: int, seconds: float) -> float:
        """Make ``replica`` load other weights for ``seconds`` (a model switch): from now until the reload ends
        it starts no iteration; a decode run in flight stops at its next step boundary, and the sequences it holds
        (KV kept) resume, with the queue, when the reload ends. Returns when it serves again."""
        rep = self.replicas[replica]
        t = max(rep.ready_s, self.now) + float(seconds)
        rep.ready_s = t
        self._stalled.add(rep.index)
        self._push(t, READY, rep.index, 0)
        for lane in rep.lanes:
            if lane.busy and not lane.idle_wait and lane.run_k > 1:
                self._cut_run(lane)
        return t

    def _retime(self, lane: Lane, n: int, T: float, x: float) -> None:
        """A micro-batch submitted now is in the way of step n + 1 of ``lane``'s decode run (a leader; step n, in
        flight, ends at ``T``; step n + 1 takes ``x`` per stage): that step waits for it, the later ones follow at
        their own pace. The completed steps are booked first (``_rebase``), so that the wait is always before the
        run's second step (``Lane.run_w``)."""
        sf = lane.replica.stage_free
        t = T
        stages = []
        for e in sf:
            if e > t:
                t = e
            t += x
            stages.append(t)
        w = t - (T + x * len(sf))
        if n > 1:
            self._rebase(lane, n - 1)
        lane.run_w = w  # (the whole wait of step n + 1: a wait set earlier for it is part of it)
        lane.run_w_stages = stages
        # (no run follows this one: runs follow only with pp == 2, and the other lane is the one submitting)
        if self._dirty:
            self._touch(lane.replica)
        lane.t_end = lane.run_o + lane.run_elapsed(lane.run_k)
        self._schedule(lane)

    def _rebase(self, lane: Lane, m: int) -> None:
        """Book the first ``m`` (completed) steps of ``lane``'s decode run as ``_finish`` would at its end, and let
        the run go on as a run of the remaining steps that started when step m ended (no sequence finishes within
        a run, so nothing completes here)."""
        rep = lane.replica
        perf = rep.perf
        pp = len(rep.lanes)
        B = lane.run_B
        a, c, w = lane.run_a, lane.run_c1B, lane.run_w
        tm = lane.run_o + lane.run_elapsed(m)
        tri = m * (m - 1) / 2.0
        busy = m * lane.own_a + lane.own_c * tri
        rep.busy_s += busy / pp
        if self._bucket:
            self._add_busy(rep, max(lane.t0, tm - busy), tm, 1.0 / pp)
        K0 = lane.dec_kv
        if self._inline_acct:  # (busy_power_w and iteration_flops inline: the same numbers)
            pw = perf.power_by_tokens.get(B)
            if pw is None:
                pw = perf.power_by_tokens[B] = perf.busy_power_w(0, B)
            fB = perf.flops_per_token * B
            af = perf.attn_flops_coef
            f0 = fB + af * K0
            f1 = (fB + af * (K0 + B)) - f0
        else:
            pw = perf.busy_power_w(0, B)
            f0 = perf.iteration_flops(0, 0.0, B, K0)
            f1 = perf.iteration_flops(0, 0.0, B, K0 + B) - f0
        rep.energy_busy_j += pw * busy / pp
        rep.flops += m * f0 + f1 * tri
        sq = (m - 1) * m * (2 * m - 1) / 6.0
        T0 = lane.kv_tokens
        rep.kv_token_s += (m * T0 * a + (T0 * c + B * a) * tri + c * B * sq + T0 * (lane.run_o - lane.t0)
                           + ((T0 + B) * w if m > 1 else 0.0))
        lane.used_blocks += lane.new_blocks(m)
        lane.kv_tokens += m * B
        lane.dec_kv += m * B
        lane.steps += m
        rep.pending_tokens -= m * B
        rep.tokens_out += m * B
        lane.t0 = tm
        lane.run_o = tm + w if m == 1 else tm  # (with m >= 2 the wait is among the booked steps)
        lane.run_w = 0.0
        lane.run_a = a + c * m
        lane.own_a += lane.own_c * m
        lane.lead_n += m
        lane.run_k -= m

    def _offload(self, rep: Replica, rid: int, to: int) -> None:
        """Move a waiting request to replica ``to``: it arrives there after half the round trip between the two
        regions plus its prompt's transfer time over their link."""
        if rid not in rep.waiting:
            raise ValueError(f"offload: request {rid} is not waiting at replica {rep.index}")
        if not (0 <= to < len(self.replicas)) or to == rep.index or not self._serves(to, self.model_of[rid]):
            raise ValueError(f"offload: replica {to} cannot serve request {rid}")
        if self.hops[rid]:
            raise ValueError(f"offload: request {rid} was offloaded already")
        if not self.fits(rid, to):
            raise ValueError(f"offload: request {rid} does not fit replica {to}'s KV cache")
        rep.waiting.remove(rid)
        rep.outstanding -= 1
        rep.pending_tokens -= self.ctx[rid] - self.pf[rid] + self.output[rid] - self.gen[rid]
        dst = self.replicas[to]
        self.hops[rid] += 1
        self.replica_of[rid] = to
        rtt = self._rtt[rep.region][dst.region]
        bw = self._bw[rep.region][dst.region] if self._bw is not None else 0.0
        delay = rtt / 2.0 + (self.prompt[rid] * 4.0 / (bw * 1e9 / 8.0) if bw > 0 else 0.0)
        self.net_s[rid] = self._rtt[self.origin[rid]][dst.region]
        dst.outstanding += 1
        dst.pending_tokens += self.ctx[rid] - self.pf[rid] + self.output[rid] - self.gen[rid]
        self._touch(dst)
        self.enqueue_s[rid] = math.nan
        if delay > 0.0:
            self._push(self.now + delay, ENQUEUE, dst, rid)
        else:
            self._enqueue(dst, rid)

    def _admit(self, lane: Lane, rid: int) -> None:
        rep = lane.replica
        w = rep.waiting
        if w[0] == rid:
            w.popleft()
        else:
            w.remove(rid)
        ctx = self.ctx[rid]
        lane.used_blocks += -(-ctx // lane.block_tokens)
        lane.kv_tokens += ctx
        lane.prefilling[rid] = None
        self.lane_of[rid] = lane
        if math.isnan(self.sched_s[rid]):
            self.sched_s[rid] = self.now
        if self.prefix_enabled and rep.prefix_cache is not None:
            blocks = self._pblk[self._pofs[rid]:self._pofs[rid + 1]]
            hit = rep.prefix_hit_blocks(blocks.tolist()) * self.prefix_block_tokens
            hit = min(hit, ctx - 1)
            if hit > 0:
                self.pf[rid] = hit
                rep.pending_tokens -= hit
                self.hit_tokens[rid] += hit
        if self.kv_moved[rid] or self.swapped[rid]:  # its KV came back (migration, swap-in): no recompute
            self.kv_moved[rid] = 0
            self.swapped[rid] = 0
            if ctx - 1 > self.pf[rid]:
                rep.pending_tokens -= ctx - 1 - self.pf[rid]
                self.pf[rid] = ctx - 1

    def _finish(self, lane: Lane) -> None:
        rep = lane.replica
        if self._dirty:
            self._touch(rep)
        now = self.now
        dt = now - lane.t0
        pp = len(rep.lanes)
        perf = rep.perf
        k, B = lane.run_k, lane.run_B
        pf_tokens = lane.run_pf_tokens
        run_prefill = lane.run_prefill
        if pp == 1:
            busy = dt
            rep.busy_s += dt
            if self._bucket:
                self._add_busy(rep, lane.t0, now, 1.0)
        else:  # stage occupancy: its own compute, not the time it waited for stages other lanes held
            busy = (k * lane.own_a + lane.own_c * (k * (k - 1) / 2.0)) if B and not run_prefill \
                else lane.run_time_s
            rep.busy_s += busy / pp
            if self._bucket:
                self._add_busy(rep, max(lane.t0, now - busy), now, 1.0 / pp)
        inline = self._inline_acct  # (busy_power_w and iteration_flops inline: the same numbers)
        if inline:
            pw = perf.power_by_tokens.get(pf_tokens + B)  # (busy power depends on the batch's token count only)
            if pw is None:
                pw = perf.power_by_tokens[pf_tokens + B] = perf.busy_power_w(pf_tokens, B)
        else:
            pw = perf.busy_power_w(pf_tokens, B)
        rep.energy_busy_j += pw * busy / pp
        if B:
            K0 = lane.dec_kv
            if run_prefill:
                rep.flops += (perf.flops_per_token * (pf_tokens + B) + perf.attn_flops_coef * K0 if inline
                              else perf.iteration_flops(pf_tokens, 0.0, B, K0))
                rep.kv_token_s += lane.kv_tokens * dt
            else:
                if inline:
                    fB = perf.flops_per_token * B
                    af = perf.attn_flops_coef
                    f0 = fB + af * K0
                    f1 = (fB + af * (K0 + B)) - f0
                else:
                    f0 = perf.iteration_flops(0, 0.0, B, K0)
                    f1 = perf.iteration_flops(0, 0.0, B, K0 + B) - f0
                tri = k * (k - 1) / 2.0
                rep.flops += k * f0 + f1 * tri
                a, c = lane.run_a, lane.run_c1B
                sq = (k - 1) * k * (2 * k - 1) / 6.0
                T0 = lane.kv_tokens
                rep.kv_token_s += k * T0 * a + (T0 * c + B * a) * tri + c * B * sq
                if lane.run_o != lane.t0:  # pp > 1: its first step also waited from t0 to the closed form's origin
                    rep.kv_token_s += T0 * (lane.run_o - lane.t0)
                if lane.run_w and k > 1:  # pp > 1: and its second step
                    rep.kv_token_s += (T0 + B) * lane.run_w
            steps = lane.steps
            # (new_blocks(1) inline: the sequences whose next token starts a block)
            lane.used_blocks += lane.phase_hist[(-steps) % lane.block_tokens] if k == 1 else lane.new_blocks(k)
            kB = k * B
            lane.kv_tokens += kB
            lane.dec_kv += kB
            lane.steps = steps = steps + k
            rep.pending_tokens -= kB
            rep.tokens_out += kB
            fin = lane.finish_heap
            epoch = self.epoch
            while fin and fin[0][0] <= steps:
                _, rid, ep = heapq.heappop(fin)
                if ep == epoch[rid]:
                    self.gen[rid] = self.output[rid]
                    self._complete(lane, rid, running=True)
        else:
            rep.flops += (perf.flops_per_token * pf_tokens + perf.attn_flops_coef * 0.0 if inline
                          else perf.iteration_flops(pf_tokens, 0.0, 0, 0))
            rep.kv_token_s += lane.kv_tokens * dt
        if run_prefill:
            rep.prefill_tokens += pf_tokens
            rep.pending_tokens -= pf_tokens
            pf = self.pf
            for rid, c in run_prefill:
                pf[rid] += c
                if pf[rid] >= self.ctx[rid]:
                    self._prefill_done(lane, rid)
        lane.run_prefill = ()
        lane.run_k = 0
        lane.run_B = 0

    def _prefill_done(self, lane: Lane, rid: int) -> None:
        rep = lane.replica
        g = self.gen[rid] + 1
        self.gen[rid] = g
        rep.pending_tokens -= 1
        rep.tokens_out += 1
        if math.isnan(self.first_token_s[rid]):
            self.first_token_s[rid] = self.now
        if self.prefix_enabled and rep.prefix_cache is not None:
            cache = rep.prefix_cache
            px = self._prefix_index
            holders = px.holders if px is not None else None
            ri = rep.index
            for b in self._pblk[self._pofs[rid]:self._pofs[rid + 1]].tolist():
                if holders is not None and b not in cache:  # PrefixIndex.add, inline (a block per call)
                    d = holders.get(b)
                    if d is None:
                        holders[b] = {ri: None}
                    else:
                        d[ri] = None
                cache[b] = None
                cache.move_to_end(b)
            while len(cache) > rep.prefix_cap_blocks:
                b, _ = cache.popitem(last=False)
                if px is not None:
                    px.remove(b, rep.index)
        if g >= self.output[rid]:
            self._complete(lane, rid, running=False)
            return
        del lane.prefilling[rid]
        lane.running[rid] = None
        bs = lane.block_tokens
        seq = self.prompt[rid] + g
        self.join_step[rid] = lane.steps
        self.gen_join[rid] = g
        lane.phase_hist[(seq - 1 - lane.steps) % bs] += 1
        lane.dec_kv += seq
        heapq.heappush(lane.finish_heap, (lane.steps + self.output[rid] - g, rid, self.epoch[rid]))

    def _complete(self, lane: Lane, rid: int, running: bool) -> None:
        rep = lane.replica
        seq = self.prompt[rid] + self.output[rid]
        if running:
            del lane.running[rid]
            lane.phase_hist[(self.prompt[rid] + self.gen_join[rid] - self.join_step[rid] - 1) % lane.block_tokens] -= 1
            lane.dec_kv -= seq  # its contribution prompt + generated, now prompt + output
        else:
            del lane.prefilling[rid]
        lane.used_blocks -= -(-(seq - 1) // lane.block_tokens)
        lane.kv_tokens -= seq - 1
        self.lane_of[rid] = None
        self.completion_s[rid] = self.now
        self.status[rid] = COMPLETED
        if self.completions is not None:
            self.completions.append(rid)
        rep.outstanding -= 1
        rep.served += 1
        if self._dirty:
            self._touch(rep)
        self.ended += 1
        if rep.draining and rep.outstanding == 0 and not rep.failed:
            self._stop(rep)

    def _victim(self, lane: Lane) -> int:
        """The running sequence to preempt under KV pressure: the lowest priority, newest first (vLLM's rule
        when all priorities are equal)."""
        prio = self.priorities
        if prio is None:
            return next(reversed(lane.running))
        best, bp = -1, None
        for rid in reversed(lane.running):
            p = prio[rid]
            if bp is None or p < bp:
                best, bp = rid, p
        return best

    def _preempt(self, lane: Lane, rid: int) -> None:
        """Recompute preemption (vLLM): free the sequence's KV and send it back to the head of the queue."""
        rep = lane.replica
        bs = lane.block_tokens
        was_running = rid in lane.running
        if was_running:
            g = self.gen_join[rid] + lane.steps - self.join_step[rid]
            seq = self.prompt[rid] + g
            del lane.running[rid]
            lane.phase_hist[(self.prompt[rid] + self.gen_join[rid] - self.join_step[rid] - 1) % bs] -= 1
            lane.dec_kv -= seq
            held = seq - 1
            self.gen[rid] = g
            rep.pending_tokens += self.prompt[rid] + g  # the whole context is prefilled again
        else:
            del lane.prefilling[rid]
            held = self.ctx[rid]
            rep.pending_tokens += self.pf[rid]  # its prefill progress is lost
        lane.used_blocks -= -(-held // bs)
        lane.kv_tokens -= held
        self._touch(rep)
        self.epoch[rid] += 1
        self.ctx[rid] = self.prompt[rid] + self.gen[rid]
        self.pf[rid] = 0
        self.lane_of[rid] = None
        self.preempts[rid] += 1
        rep.preemptions += 1
        if self.options.kv_offload and was_running:
            # swap out now and back in before it runs again: 2 x KV bytes over the replica's PCIe links
            nbytes = held * rep.perf.model.kv_bytes_per_token()
            self.swapped[rid] = 1
            self.swapped_bytes += nbytes
            self._push(self.now + 2.0 * nbytes / (rep.perf.gpu.pcie_gbps * 1e9 * rep.num_gpus), ENQUEUE, rep, rid)
            return
        self._enqueue(rep, rid, front=True, skip=lane)

    # ------------------------------------------------------------------ platform: timers, lifecycle, failures
    def at(self, t: float, fn: Callable[["Simulator"], DecisionPoint | None]) -> None:
        """Call ``fn(sim)`` at simulated time ``t`` (after the other events of that instant). A platform layer
        uses it for scaling epochs, faults and preemptions; ``fn`` may return a decision point (e.g. kind
        "scale" with a ``handler``), which ``advance`` then returns."""
        self._push(max(float(t), self.now), TIMER, fn, None)

    def add_replica(self, rep: Replica) -> int:
        """Add a replica at run time (scale-up). It is billed from ``rep.start_s`` and joins its model's candidates
        at ``rep.ready_s`` (node provisioning + weight loading). Returns its index."""
        rep.index = len(self.replicas)
        self.replicas.append(rep)
        if not getattr(rep.perf, "inline_accounting", False):
            self._inline_acct = False
        m = rep.model_index
        while m >= len(self.candidates):
            self.candidates.append([])
            self.held.append(deque())
            self.arrived.append(0)
            self.max_context.append(1 << 60)
        rep.routable = False
        self._touch(rep)
        self._push(max(rep.ready_s, self.now), READY, rep.index, 0)
        return rep.index

    def _make_routable(self, rep: Replica) -> None:
        cands = self.candidates[rep.model_index]
        if rep.index not in cands:
            cands.append(rep.index)
            cands.sort()
        rep.routable = True
        self._touch(rep)
        held = self.held[rep.model_index]
        if held:  # requests held for a replica of this model: route them now, in arrival order
            for rid in reversed(held):
                self._pending.append(DecisionPoint("route", self.now, request=rid, view=self._rview))
            held.clear()

    def _unroutable(self, rep: Replica) -> None:
        cands = self.candidates[rep.model_index]
        if rep.index in cands:
            cands.remove(rep.index)
        rep.routable = False
        self._touch(rep)

    def drain(self, replica: int) -> None:
        """Scale-down: the replica takes no new requests, finishes those it has (none is dropped), then stops
        (billing ends). A replica still starting with nothing routed to it stops at once."""
        rep = self.replicas[replica]
        if rep.stop_s is not None or rep.draining:
            return
        self._unroutable(rep)
        rep.draining = True
        if rep.outstanding == 0:
            self._stop(rep)

    def _stop(self, rep: Replica) -> None:
        rep.stop_s = self.now
        rep.routable = False
        self._touch(rep)
        for lane in rep.lanes:
            self._unschedule(lane)
            lane.busy = lane.awaiting = lane.idle_wait = False
        self._drop_pending(rep)

    def _drop_pending(self, rep: Replica) -> None:
        """Forget the batch decisions pending for ``rep``'s lanes (it stopped or failed)."""
        keep = []
        for d in self._pending:
            lane = d if d.__class__ is Lane else d.lane
            if lane is None or lane.replica is not rep:
                keep.append(d)
        self._pending = keep

    def preemption_notice(self, replica: int, notice_s: float, migrate: bool = True) -> float:
        """Spot interruption: the replica stops taking requests now; its queued (not admitted) requests go back
        to the router at once; what is still running when ``notice_s`` is over is migrated with its KV cache
        (``migrate``; transfer time = KV bytes / link bandwidth) or recomputed elsewhere. Returns the kill time."""
        rep = self.replicas[replica]
        if rep.stop_s is not None:
            return self.now
        self._unroutable(rep)
        rep.draining = True
        self._touch(rep)
        while rep.waiting:
            rid = rep.waiting.popleft()
            rep.outstanding -= 1
            rep.pending_tokens -= self.ctx[rid] - self.pf[rid] + self.output[rid] - self.gen[rid]
            self.moved_from[rid] = rep.index
            self._push(self.now, RETRY, rid, 0)
        if rep.outstanding == 0:
            self._stop(rep)
            return self.now
        t = self.now + max(0.0, float(notice_s))
        self.at(t, functools.partial(Simulator.fail, replica=replica, migrate=migrate))
        return t

    def _unroutable_at(self, index: int) -> None:
        """(A scheduled event: the health checks notice replica ``index`` is gone. Scheduled callbacks are
        partials of methods, not lambdas, so that a simulator, and an environment over it, pickles.)"""
        self._unroutable(self.replicas[index])

    def fail(self, replica: int, detect_s: float = 0.0, migrate: bool = False) -> int:
        """The replica dies now (GPU, node, zone or region fault; the end of a spot notice). Every request at it —
        queued, prefilling, decoding, or on its way there — is retried on another replica (with exponential
        backoff), keeping the tokens it has generated; with ``migrate`` running sequences keep their KV cache.
        Routers may still pick it until the health checks notice, ``detect_s`` later; those attempts fail and are
        retried too. No request is lost. Returns the number of requests it held."""
        rep = self.replicas[replica]
        if rep.failed or (rep.stop_s is not None and not rep.draining):
            return 0
        if rep.stop_s is not None:  # drained to the end already
            return 0
        rep.failed = True
        rep.stop_s = self.now
        self._touch(rep)
        if detect_s > 0.0:
            self.at(self.now + detect_s, functools.partial(Simulator._unroutable_at, index=rep.index))
        else:
            self._unroutable(rep)
        victims: list[tuple[int, bool]] = [(rid, False) for rid in rep.waiting]
        pp = len(rep.lanes)
        for lane in rep.lanes:
            j = lane.steps_done(self.now) if lane.busy and lane.run_k and not lane.idle_wait else 0
            if lane.busy and not lane.idle_wait:  # the iteration in flight is lost, its GPU time is not
                rep.busy_s += (self.now - lane.t0 if pp == 1 else min(self.now - lane.t0, lane.run_time_s)) / pp
            for rid in lane.running:
                g = min(self.gen_join[rid] + lane.steps + j - self.join_step[rid], self.output[rid] - 1)
                self.gen[rid] = g
                victims.append((rid, migrate))
            for rid in lane.prefilling:
                victims.append((rid, False))
            lane.running.clear()
            lane.prefilling.clear()
            lane.finish_heap.clear()
            lane.phase_hist = [0] * lane.block_tokens
            lane.used_blocks = lane.kv_tokens = lane.dec_kv = 0
            lane.run_prefill = ()
            lane.run_k = lane.run_B = lane.run_pf_tokens = lane.pipe = 0
            lane.lead = None
            self._unschedule(lane)
            lane.busy = lane.awaiting = lane.idle_wait = False
        rep.waiting.clear()
        rep.outstanding = 0
        rep.pending_tokens = 0
        self._drop_pending(rep)
        for rid, keep_kv in victims:
            self.epoch[rid] += 1
            self.ctx[rid] = self.prompt[rid] + self.gen[rid]
            self.pf[rid] = 0
            self.lane_of[rid] = None
            self.moved_from[rid] = rep.index
            if keep_kv:
                self.kv_moved[rid] = 1
                self._push(self.now, RETRY, rid, 0)  # migration: no backoff, the KV is on its way
            else:
                self._attempt_failed(rid)
        return len(victims)

    def _attempt_failed(self, rid: int) -> None:
        """An attempt to serve ``rid`` failed (its replica died): try again after an exponential backoff."""
        k = self.retries[rid]
        self.retries[rid] = k + 1
        o = self.options
        self.kv_moved[rid] = 0
        # (2.0 ** k overflows past k = 1023: a 1 ms backoff retried a dead replica that often before its health check)
        self._push(self.now + min(o.retry_backoff_s * (2.0 ** min(k, 1000)), o.retry_backoff_max_s), RETRY, rid, 0)

    def _dispatch(self, rid: int) -> DecisionPoint | None:
        """Route ``rid`` again (a retry or migration); held until a replica is ready when its model has none."""
        m = self.model_of[rid]
        if not self.candidates[m]:
            self.moved_from[rid] = -1
            self.kv_moved[rid] = 0
            self.held[m].append(rid)
            return None
        return DecisionPoint("route", self.now, request=rid, view=self._rview)

    def _stop_at_horizon(self) -> None:
        """End of the simulated horizon: whatever has not finished ends as rejected with reason "horizon"."""
        self.now = self.options.max_time_s
        self._heap.clear()
        self._ghost_t = -INF
        self._next = self.n
        for h in self.held:
            h.clear()
        for rep in self.replicas:
            self._touch(rep)
        for rid in range(self.n):
            if self.status[rid] == PENDING:
                self._reject(rid, "horizon")
        for rep in self.replicas:
            rep.waiting.clear()
            for lane in rep.lanes:
                lane.busy = lane.awaiting = lane.idle_wait = False
        self._pending.clear()

    def _add_busy(self, rep: Replica, t0: float, t1: float, scale: float) -> None:
        w = self._bucket
        tl = rep.timeline
        b = int(t0 / w)
        while t0 < t1:
            end = min(t1, (b + 1) * w)
            if b >= len(tl):
                tl.extend([0.0] * (b + 1 - len(tl)))
            tl[b] += (end - t0) * scale
            t0 = end
            b += 1

    def utilisation_timeline(self) -> tuple[float, np.ndarray]:
        """(bucket width s, array replicas x buckets of GPU-busy fractions); needs ``timeline_bucket_s``."""
        if not self._bucket:
            raise ValueError("run with SimOptions(timeline_bucket_s=...) to record utilisation over time")
        nb = max((len(r.timeline) for r in self.replicas), default=0)
        out = np.zeros((len(self.replicas), nb))
        for i, r in enumerate(self.replicas):
            out[i, : len(r.timeline)] = r.timeline
        return self._bucket, out / self._bucket

    # ------------------------------------------------------------------ results
    def _check(self) -> None:
        for rep in self.replicas:
            for lane in rep.lanes:
                assert 0 <= lane.used_blocks <= lane.cap_blocks, (lane.used_blocks, lane.cap_blocks)

    def client_completion_s(self, rid: int) -> float:
        """When request ``rid`` completed as its client sees it (half the network round trip after the replica
        finished); NaN when it has not completed."""
        if self.status[rid] != COMPLETED:
            return math.nan
        return self.completion_s[rid] + self.net_s[rid] / 2.0

    @property
    def arrivals_processed(self) -> int:
        """Requests whose arrival the simulator has processed so far (routed, held or rejected)."""
        return self._next

    def records(self) -> Records:
        """Per-request records of every request (index = request id)."""
        return self.request_outcomes(None)

    def request_outcomes(self, ids=None) -> Records:
        """Records of the requests ``ids`` (a sequence of request ids, in that order; None: all)."""
        ix = slice(None) if ids is None else np.asarray(ids, dtype=np.int64)
        net = np.frombuffer(self.net_s, dtype=np.float64)[ix]
        half = net / 2.0
        replica = np.frombuffer(self.replica_of, dtype=np.int32)[ix].copy()
        region_of = np.array([r.region for r in self.replicas] + [-1], dtype=np.int16)
        w = self.workload
        return Records(
            arrival_s=w.arrival_s[ix].copy(),
            first_token_s=np.frombuffer(self.first_token_s, dtype=np.float64)[ix] + half,
            completion_s=np.frombuffer(self.completion_s, dtype=np.float64)[ix] + half,
            queue_delay_s=np.frombuffer(self.sched_s, dtype=np.float64)[ix] - np.frombuffer(self.enqueue_s, dtype=np.float64)[ix],
            replica=replica,
            region=region_of[replica],
            prefix_hit_tokens=np.frombuffer(self.hit_tokens, dtype=np.int64)[ix].copy(),
            preemptions=np.frombuffer(self.preempts, dtype=np.int32)[ix].copy(),
            status=np.frombuffer(self.status, dtype=np.int8)[ix].copy(),
            reason=np.frombuffer(self.reason, dtype=np.int8)[ix].copy(),
            prompt_tokens=w.prompt_tokens[ix].copy(),
            output_tokens=w.output_tokens[ix].copy(),
            slo_class=w.slo_class[ix].copy(),
            network_s=net.copy(),
        )
