"""What a policy may see: typed, read-only views, one per decision level.

A policy is typed against a view (``def route(self, view: RouteView) -> int``) and never against the simulator.
The simulator implements these views over its state (``fleetwise.sim.views``); the decision service implements
the same ``RouteView`` from a caller's snapshot (``fleetwise.serve``); TORTA's world implements ``PlanView``.
A policy that needs a new fact gets a new member here, never an attribute of somebody else's object.

This module imports nothing from ``fleetwise.sim``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class RouteView(Protocol):
    """One request to route, and what a router may read of the replicas that can serve it.

    Replica arguments are replica indices, as ``candidates()`` returns them; a router answers one of them.
    Token counts are estimates as of ``time_s``.
    """

    time_s: float
    request: int  # request id (in the simulator: its index in the workload)
    model: int  # index of the request's model among the fleet's models (round robin cycles per model)
    prompt_tokens: int
    rng: np.random.Generator  # the run's seeded generator (random routers)

    def candidates(self) -> Sequence[int]:
        """Replicas that serve the request's model and take requests now, in index order."""
        ...

    def outstanding(self, replica: int) -> int:
        """Requests routed to ``replica`` and not finished (running + waiting)."""
        ...

    def outstanding_tokens(self, replica: int) -> int:
        """Prefill + decode tokens still to compute for the requests at ``replica``."""
        ...

    def least_outstanding(self) -> int:
        """The candidate with the fewest ``outstanding`` requests, ties to the lowest index: exactly
        ``min(candidates(), key=outstanding)``, which ``RouteScans`` computes; the simulator answers it from an
        index, so that its cost does not grow with the fleet."""
        ...

    def least_outstanding_tokens(self) -> int:
        """The candidate with the fewest ``outstanding_tokens``, ties to the lowest index (as
        ``least_outstanding``)."""
        ...

    def prefix_candidates(self) -> Sequence[int]:
        """Candidates where ``prefix_hit_tokens`` may be above 0 (a superset is allowed, e.g. all of them),
        in index order; every other candidate has no hit."""
        ...

    def least_kv_load(self) -> int:
        """The candidate with the smallest (``kv_used_fraction``, ``waiting``), ties to the lowest index
        (``least_kv_load``); the simulator answers it from an index."""
        ...

    def nearest_least_outstanding(self) -> int:
        """The candidate with the smallest (``rtt_s``, ``outstanding``), ties to the lowest index: exactly
        ``min(candidates(), key=lambda i: (rtt_s(i), outstanding(i)))`` (``nearest_region``); the simulator answers
        it from an index per region."""
        ...

    def least_latency(self) -> int:
        """The candidate with the smallest ``rtt_s + outstanding_tokens / prefill_tps + ready_in_s``, ties to the
        lowest index (``latency_aware``); the simulator answers it from an index per region and throughput."""
        ...

    def kv_used_fraction(self, replica: int) -> float:
        """Fraction of ``replica``'s KV-cache blocks in use."""
        ...

    def waiting(self, replica: int) -> int:
        """Requests queued at ``replica`` and not admitted to an engine yet."""
        ...

    def has_prefix(self) -> bool:
        """Whether prefix-cache hits are known for this request (prefix block ids, or a caller's report)."""
        ...

    def prefix_hit_tokens(self, replica: int) -> int:
        """Prompt tokens of this request already in ``replica``'s prefix cache (0 when unknown)."""
        ...

    def prefill_tps(self, replica: int) -> float:
        """Prefill throughput of ``replica``, tokens per second (a 512-token chunk, all pipeline lanes)."""
        ...

    def rtt_s(self, replica: int) -> float:
        """Network round trip from the request's origin to ``replica``'s region."""
        ...

    def ready_in_s(self, replica: int) -> float:
        """Seconds until ``replica`` serves (loading weights, a model switch); 0 when it serves now."""
        ...


class RouteScans:
    """The fleet-wide ``RouteView`` questions answered by scanning the candidates: a base for a view whose
    candidates are few (a caller's snapshot) or that keeps no index."""

    __slots__ = ()

    def least_outstanding(self) -> int:
        return min(self.candidates(), key=self.outstanding)

    def least_outstanding_tokens(self) -> int:
        return min(self.candidates(), key=self.outstanding_tokens)

    def prefix_candidates(self) -> Sequence[int]:
        return self.candidates()

    def least_kv_load(self) -> int:
        return min(self.candidates(), key=lambda i: (self.kv_used_fraction(i), self.waiting(i)))

    def nearest_least_outstanding(self) -> int:
        return min(self.candidates(), key=lambda i: (self.rtt_s(i), self.outstanding(i)))

    def least_latency(self) -> int:
        return min(self.candidates(),
                   key=lambda i: self.rtt_s(i) + self.outstanding_tokens(i) / self.prefill_tps(i) + self.ready_in_s(i))


@runtime_checkable
class LaneView(Protocol):
    """One free engine lane (a replica has one lane per pipeline stage group) and the requests it may run.

    Request arguments are request ids from ``running``, ``prefilling`` or ``waiting``.
    """

    time_s: float
    replica: int  # index of the lane's replica
    lane: int  # index of the lane within its replica
    lanes: int  # lanes of the replica (pipeline-parallel micro-batches in flight)
    block_tokens: int  # tokens per KV-cache block
    cap_blocks: int  # KV blocks this lane may hold
    free_blocks: int  # KV blocks free now
    running: Sequence[int]  # decoding sequences, in admission order
    prefilling: Sequence[int]  # admitted, prefill not finished, in admission order
    waiting: Sequence[int]  # the replica's queue (shared by its lanes), first come first
    has_priorities: bool  # False: every request has the same priority

    def new_blocks(self, steps: int) -> int:
        """KV blocks the running sequences need for their next ``steps`` decode steps."""
        ...

    def context(self, rid: int) -> int:
        """Tokens this attempt of ``rid`` must hold before decoding: its prompt plus the tokens it had generated
        when it was last preempted (recompute)."""
        ...

    def prefill_left(self, rid: int) -> int:
        """Prefill tokens of ``rid`` still to run (its context minus prefilled or cached tokens)."""
        ...

    def generated(self, rid: int) -> int:
        """Output tokens ``rid`` has generated so far."""
        ...

    def kv_tokens(self, rid: int) -> int:
        """Tokens of ``rid`` held in this lane's KV cache (what preempting it frees)."""
        ...

    def priority(self, rid: int) -> int:
        """Priority of ``rid``'s SLO class (higher is more important)."""
        ...

    def offloaded(self, rid: int) -> bool:
        """Whether ``rid`` was offloaded from another replica already (a request is offloaded at most once)."""
        ...


@runtime_checkable
class PlanView(Protocol):
    """What a region planner (per request: ``region(origin, view)``) and a micro allocator (``pick(region, rid,
    view)``) see of a multi-region fleet (TORTA): servers grouped by region, each holding one model type."""

    n: int  # regions
    server_region: np.ndarray  # region of each server
    server_speed_tps: np.ndarray  # tokens/s of each server (a mean mixed iteration)
    region_speed_tps: np.ndarray  # sum of the server speeds of each region
    servers_by_region: Sequence[np.ndarray]  # server indices of each region
    server_model: np.ndarray  # model type each server holds now
    model_shares: np.ndarray  # expected share of the demand of each model type (sums to 1)
    reload_s: float  # time a server needs to switch to another model type
    request: int  # the request being routed now (-1 outside a routing decision)

    def backlog_s(self) -> np.ndarray:
        """Outstanding service seconds per server (pending tokens / speed, plus the rest of a reload)."""
        ...

    def server_outstanding(self) -> np.ndarray:
        """Requests routed to each server and not finished."""
        ...

    def request_model(self, rid: int) -> int:
        """Model type of request ``rid``."""
        ...

    def request_tokens(self, rid: int) -> float:
        """Prompt + output tokens of request ``rid``."""
        ...

    def recent_arrivals(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(origin region, model type) of the last ``k`` requests that arrived."""
        ...


HOURS_PER_DAY = 24
LONG_TOKENS = 1500  # a request of more prompt + output tokens is "long" (SlotObs.long_share, TORTA's size-aware util)


@dataclass
class SlotObs:
    """What a region planner sees at the start of a planning slot (TORTA); arrays per region unless said."""

    slot: int
    hour_utc: float
    backlog_s: np.ndarray  # outstanding service seconds at the region's servers (mean per server)
    util: np.ndarray  # GPU-busy fraction over the last slot
    free_frac: np.ndarray  # fraction of servers with nothing outstanding
    demand: np.ndarray  # (history, n): requests that originated per region in the last slots (newest first)
    capacity_rps: np.ndarray  # service capacity per region (requests/s of a mean request)
    rtt_s: np.ndarray  # n x n
    egress_usd_per_gb: np.ndarray
    slot_s: float
    # the share of recent requests over LONG_TOKENS prompt + output tokens (TORTA's world: those routed in the last
    # two slots; None: unknown, or none routed). Not in ``vector``: what a trained planner's guard reads
    # (ResidualPlanner.long_share_max)
    long_share: float | None = None

    def vector(self, temporal: bool) -> np.ndarray:
        """The observation vector of TORTA's macro agent (``fleetwise/Torta-v0``)."""
        cap = self.capacity_rps * self.slot_s
        base = np.stack([np.clip(self.backlog_s / self.slot_s, 0, 5), self.util, self.free_frac], 1).ravel()
        if not temporal:
            return base.astype(np.float32)
        hist = np.clip(self.demand / cap[None, :], 0, 5).ravel()
        ang = 2 * math.pi * self.hour_utc / HOURS_PER_DAY
        return np.concatenate([base, hist, [math.sin(ang), math.cos(ang)]]).astype(np.float32)
