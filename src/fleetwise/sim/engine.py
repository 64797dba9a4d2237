"""Replica engine state: continuous batching over a paged KV cache.

State is data (slotted dataclasses); behaviour lives in the simulator's functions. A replica has ``pp`` lanes:
with pipeline parallelism several micro-batches are in flight, and each lane is one of them (vLLM's virtual
engine), with its own running batch and an equal share of the replica's KV blocks; all lanes take work from the
replica's one waiting queue. The lanes share the ``pp`` stages: a micro-batch passes stage i when it has left
stage i - 1 and the micro-batch submitted before it has left stage i (``Simulator._pipe_submit``). With pp == 1
there is one lane and the model is exact vLLM/Sarathi continuous batching.

Per-request decode progress is never updated token by token. A lane counts its decode steps (``steps``); a
sequence that joined decoding at lane step s0 with g0 tokens generated has ``g0 + steps - s0`` now. Completions
come from a heap of finishing steps, and KV blocks from a histogram of block phases, so advancing a decode run
of k iterations costs O(log B + block_tokens), not O(k * B).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.perf import PerfModel


@dataclass(slots=True)
class Lane:
    replica: "Replica"
    index: int
    cap_blocks: int  # KV blocks this lane may hold
    block_tokens: int
    used_blocks: int = 0
    running: dict = field(default_factory=dict)  # decoding request ids, in admission order (values unused)
    prefilling: dict = field(default_factory=dict)  # admitted, prefill not finished, in admission order
    finish_heap: list = field(default_factory=list)  # (finish_step, rid, epoch)
    phase_hist: list = field(default_factory=list)  # phase_hist[c]: running seqs whose block phase class is c
    steps: int = 0  # decode steps this lane has run
    dec_kv: int = 0  # sum over running of (prompt + generated): KV length attended by their next decode step
    kv_tokens: int = 0  # tokens held in this lane's KV cache
    busy: bool = False
    awaiting: bool = False  # a batch decision for this lane is pending
    idle_wait: bool = False  # idling for a plan's wait_s (a wake-up event is scheduled)
    version: int = 0  # bumps when the lane's entry in the event heap is replaced (Simulator._schedule)
    ev_t: float = math.inf  # time of that entry (inf: none); earlier than the event (t_end) when it was rescheduled
    ev_seq: int = 0  # the event's sequence number (the entry's, unless the entry is an earlier one)
    # the iteration or decode run in flight
    t0: float = 0.0
    t_end: float = 0.0
    run_k: int = 0  # decode steps in the run (0: the iteration has no decode part)
    run_B: int = 0
    run_o: float = 0.0  # origin of the run's closed form: step j ends at run_o + run_elapsed(j) (= t0 when pp == 1)
    run_a: float = 0.0  # time of the first decode step of the run
    run_c1B: float = 0.0  # growth of step time per step (c1 * B)
    run_w: float = 0.0  # pp > 1: steps from the second on end run_w later (a wait for a neighbour's micro-batch)
    run_w_stages: list | None = None  # with run_w: when the second step leaves each stage
    # pp > 1: the lane's place in the pipeline (Simulator._pipe_submit)
    pipe: int = 0  # 0: a single iteration (its stage occupancy recorded at submission); 1: a decode run that leads
    # (its steps after the first are not delayed by other lanes); 2: a decode run that follows ``lead``'s run
    own_a: float = 0.0  # the lane's own decode step time: own_a + own_c * (j - 1) for step j (compute, no waiting)
    own_c: float = 0.0
    lead: "Lane | None" = None  # a follower's leader; its step j sits behind the leader's step lead_n + j
    lead_n: int = 0
    lead_a: float = 0.0  # the leader's own step coefficients when the follower started
    lead_c: float = 0.0
    cut: bool = False  # the run's last step is in flight: a cut changes nothing until the next iteration starts
    run_prefill: list | tuple = ()  # (request id, chunk tokens) of the iteration in flight
    run_pf_tokens: int = 0
    run_time_s: float = 0.0
    view: object = None  # its LaneView (fleetwise.sim.views.SimLaneView), made when first asked
    peer: "Lane | None" = None  # pp == 2: the replica's other lane (Simulator._pipe_submit); else None

    @property
    def free_blocks(self) -> int:
        return self.cap_blocks - self.used_blocks

    @property
    def num_seqs(self) -> int:
        return len(self.running) + len(self.prefilling)

    # --- closed forms for a decode run (step j takes a + c1B * j) ---------------------------------------
    def run_elapsed(self, k: int) -> float:
        e = k * self.run_a + self.run_c1B * (k * (k - 1) / 2.0)
        return e + self.run_w if k > 1 else e

    def steps_done(self, now: float) -> int:
        """Decode steps of the current run that have completed by ``now``."""
        if not self.busy or self.run_k == 0:
            return 0
        dt = now - self.run_o
        if dt <= 0.0:
            return 0
        a, c = self.run_a, self.run_c1B
        if self.run_w and dt > a:
            dt -= self.run_w  # (steps from the second on start run_w later; the loops below use the exact form)
        if c <= 0.0:
            j = int(dt / a)
        else:  # solve c/2 j^2 + (a - c/2) j - dt = 0
            b = a - c / 2.0
            j = int((-b + math.sqrt(b * b + 2.0 * c * dt)) / c)
        j = max(0, min(j, self.run_k))
        dt = now - self.run_o
        while j > 0 and self.run_elapsed(j) > dt:
            j -= 1
        while j < self.run_k and self.run_elapsed(j + 1) <= dt:
            j += 1
        return j

    def in_flight(self, now: float) -> tuple[int, float]:
        """(n, T) for a busy lane's decode run: step n = ``steps_done(now) + 1`` is in flight at ``now`` and ends at
        T = ``run_o + run_elapsed(n)`` (n = run_k + 1 and T undefined when the run is over). The same numbers as
        those two calls, in one."""
        k = self.run_k
        o = self.run_o
        a, c, w = self.run_a, self.run_c1B, self.run_w
        dt = now - o
        if dt <= 0.0:
            return 1, o + (a + c * 0.0)
        if dt < a and k:  # (the first step: what the loops below give, without them)
            return 1, o + a
        if k >= 2:  # (the second step, the commonest after the first: the loops' j = 2 term, without them)
            e = 2 * a + c
            if w:
                e = e + w
            if e > dt:
                return 2, o + e
        d = dt - w if w and dt > a else dt
        if c <= 0.0:
            j = int(d / a)
        else:
            b = a - c / 2.0
            j = int((-b + math.sqrt(b * b + 2.0 * c * d)) / c)
        if j > k:
            j = k
        if j < 0:
            j = 0
        while j > 0:  # (run_elapsed inlined: j a + c j (j - 1) / 2, plus w from the second step on)
            e = j * a + c * (j * (j - 1) / 2.0)
            if j > 1:
                e = e + w
            if e <= dt:
                break
            j -= 1
        while j < k:
            j += 1
            e = j * a + c * (j * (j - 1) / 2.0)
            if j > 1:
                e = e + w
            if e > dt:
                return j, o + e
        return k + 1, 0.0

    def new_blocks(self, k: int) -> int:
        """KV blocks the running sequences need for their next k decode steps (exact)."""
        if k == 1:  # (the sequences whose next token starts a block; the loop below for one step)
            return self.phase_hist[(-self.steps) % self.block_tokens] if self.running else 0
        bs = self.block_tokens
        if k <= 0 or not self.running:
            return 0
        full, rem = divmod(k, bs)
        n = full * len(self.running)
        hist = self.phase_hist
        s = self.steps
        if rem <= 2:
            for j in range(rem):
                n += hist[(-(s + j)) % bs]
            return n
        i0 = (-s) % bs  # classes (-(s + j)) % bs for j < rem: i0, i0 - 1, ... (mod bs), a slice or two
        lo = i0 - rem + 1
        if lo >= 0:
            return n + sum(hist[lo:i0 + 1])
        return n + sum(hist[:i0 + 1]) + sum(hist[bs + lo:])


@dataclass(slots=True)
class Replica:
    index: int
    name: str
    model_name: str
    gpu_name: str
    region: int
    perf: "PerfModel"
    lanes: list[Lane]
    block_tokens: int
    num_gpus: int
    price_usd_per_gpu_hour: float
    electricity_usd_per_kwh: float
    start_s: float = 0.0  # provisioned (billing starts)
    ready_s: float = 0.0  # model loaded, serving
    stop_s: float | None = None
    model_index: int = 0  # index of the model among the scenario's deployments
    # platform lifecycle (issue 8): a replica added at run time joins its model's candidates when ready
    zone: str = ""
    pool: str = "on_demand"
    group: int = -1  # scaling group (platform), -1: none
    routable: bool = True  # in its model's candidate list (the routers may pick it)
    draining: bool = False  # takes no new requests; stops when its outstanding requests are done
    failed: bool = False  # died (fault or spot preemption); requests sent to it fail and are retried
    waiting: deque = field(default_factory=deque)
    stage_free: list = field(default_factory=list)  # pp > 1: when each stage is free of the micro-batches submitted
    # so far (a decode run's steps after its first are added when another lane submits)
    prefix_cache: OrderedDict | None = None  # block id -> None, LRU order
    prefix_cap_blocks: int = 0
    pending_tokens: int = 0  # prefill + decode tokens still to do for requests here (at last event)
    outstanding: int = 0  # requests routed here and not finished
    # accounting
    busy_s: float = 0.0  # GPU-busy time (stage occupancy summed over lanes / pp)
    energy_busy_j: float = 0.0
    flops: float = 0.0
    kv_token_s: float = 0.0  # integral of KV tokens held over time
    tokens_out: int = 0
    prefill_tokens: int = 0
    served: int = 0
    preemptions: int = 0
    timeline: list = field(default_factory=list)  # GPU-busy seconds per timeline bucket (when recorded)

    # --- cost: the one formula every summary, the platform and the environments bill with -----------------
    @property
    def gpu_usd_per_s(self) -> float:
        """Rental price of the replica's GPUs per second."""
        return self.num_gpus * self.price_usd_per_gpu_hour / 3600.0

    def active_s(self, until_s: float) -> float:
        """Seconds the replica was billed: from ``start_s`` to its stop, or to ``until_s`` if it runs on."""
        end = self.stop_s if self.stop_s is not None and self.stop_s < until_s else until_s
        return max(0.0, end - self.start_s)

    def gpu_cost_usd(self, active_s: float) -> float:
        """Rental cost of ``active_s`` seconds of the replica's GPUs."""
        return self.num_gpus * self.price_usd_per_gpu_hour * active_s / 3600.0

    def energy_j(self, active_s: float) -> float:
        """Energy over ``active_s`` billed seconds: busy energy plus idle power for the rest."""
        return self.energy_busy_j + self.perf.idle_power_w() * max(active_s - self.busy_s, 0.0)

    def cost_usd(self, active_s: float) -> float:
        """GPU rental plus electricity over ``active_s`` billed seconds."""
        return self.gpu_cost_usd(active_s) + self.energy_j(active_s) / 3.6e6 * self.electricity_usd_per_kwh

    def kv_capacity_tokens(self) -> int:
        return sum(l.cap_blocks for l in self.lanes) * self.block_tokens

    def kv_used_fraction(self, now: float) -> float:
        """Fraction of the replica's KV blocks in use at ``now`` (decode runs in flight included)."""
        cap = used = 0
        for l in self.lanes:
            cap += l.cap_blocks
            used += l.used_blocks
            if l.busy and l.run_k:
                used += l.new_blocks(l.steps_done(now))
        return used / cap if cap else 1.0

    def num_running(self) -> int:
        return sum(l.num_seqs for l in self.lanes)

    def outstanding_tokens(self, now: float) -> int:
        """Prefill + decode tokens still to compute for requests routed here, as of ``now``."""
        n = self.pending_tokens
        for l in self.lanes:
            if l.busy and l.run_k:
                n -= l.steps_done(now) * l.run_B
        return n

    def prefix_hit_blocks(self, blocks) -> int:
        """Length (in blocks) of the longest prefix of ``blocks`` held in this replica's prefix cache."""
        cache = self.prefix_cache
        if not cache:
            return 0
        n = 0
        for b in blocks:
            if b in cache:
                n += 1
            else:
                break
        return n


def make_lanes(replica: Replica, kv_capacity_tokens: int, pp: int, block_tokens: int) -> list[Lane]:
    per_lane = kv_capacity_tokens // block_tokens // pp
    replica.stage_free = [0.0] * pp
    lanes = [Lane(replica=replica, index=i, cap_blocks=per_lane, block_tokens=block_tokens,
                  phase_hist=[0] * block_tokens) for i in range(pp)]
    if pp == 2:
        lanes[0].peer, lanes[1].peer = lanes[1], lanes[0]
    return lanes
