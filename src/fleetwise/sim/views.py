"""The simulator's implementations of the decision views (``fleetwise.control.views``).

One ``SimRouteView`` per simulator is positioned on each request before a router sees it; one ``SimLaneView``
per engine lane is created once and reads the lane's state live. Neither copies state: they cost a few
attribute reads per question, and nothing when a question is not asked. The fleet-wide questions
(``least_outstanding_tokens``, ``least_outstanding``, ``prefix_candidates``) are answered from the simulator's
indexes (``fleetwise.sim.route_index``), not by scanning the replicas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.sim.engine import Lane
    from fleetwise.sim.simulator import Simulator


class SimRouteView:
    """``RouteView`` of one request in a running simulator (see ``fleetwise.control.views.RouteView``)."""

    __slots__ = ("sim", "replicas", "rng", "time_s", "request", "model", "origin", "prompt_tokens", "_blocks",
                 "_rtt_row")

    def __init__(self, sim: "Simulator"):
        self.sim = sim
        self.replicas = sim.replicas
        self.rng = sim.rng
        self.time_s = 0.0
        self.request = -1
        self.model = 0
        self.origin = 0
        self.prompt_tokens = 0
        self._blocks: list[int] | None = None
        self._rtt_row: list[float] | None = None

    def at(self, rid: int, now: float) -> "SimRouteView":
        """Position the view on request ``rid`` at time ``now``."""
        sim = self.sim
        self.time_s = now
        self.request = rid
        self.model = sim.model_of[rid]
        self.origin = sim.origin[rid]
        self.prompt_tokens = sim.prompt[rid]
        self._blocks = None
        self._rtt_row = None
        return self

    def candidates(self):
        return self.sim.candidates[self.model]

    def outstanding(self, replica: int) -> int:
        return self.replicas[replica].outstanding

    def outstanding_tokens(self, replica: int) -> int:
        return self.replicas[replica].outstanding_tokens(self.time_s)

    def least_outstanding(self) -> int:
        i = self.sim.least_loaded(self.model, False)
        return i if i >= 0 else min(self.candidates(), key=self.outstanding)

    def least_outstanding_tokens(self) -> int:
        i = self.sim.least_loaded(self.model, True)
        return i if i >= 0 else min(self.candidates(), key=self.outstanding_tokens)

    def least_kv_load(self) -> int:
        i = self.sim.least_kv(self.model)
        return i if i >= 0 else min(self.candidates(), key=lambda r: (self.kv_used_fraction(r), self.waiting(r)))

    def nearest_least_outstanding(self) -> int:
        i = self.sim.nearest_least_outstanding(self.model, self.origin)
        return i if i >= 0 else min(self.candidates(), key=lambda r: (self.rtt_s(r), self.outstanding(r)))

    def least_latency(self) -> int:
        i = self.sim.least_latency(self.model, self.origin)
        if i >= 0:
            return i
        return min(self.candidates(),  # (no candidate, or one that serves later: the scan)
                   key=lambda r: self.rtt_s(r) + self.outstanding_tokens(r) / self.prefill_tps(r) + self.ready_in_s(r))

    def prefix_candidates(self):
        sim = self.sim
        if not sim.prefix_enabled:
            return ()
        if self._blocks is None:
            self._blocks = sim.prefix_blocks(self.request)
        if not self._blocks:
            return ()
        reps, m = self.replicas, self.model
        return sorted(i for i in sim.prefix_holders(self._blocks[0])
                      if reps[i].routable and reps[i].model_index == m)

    def kv_used_fraction(self, replica: int) -> float:
        return self.replicas[replica].kv_used_fraction(self.time_s)

    def waiting(self, replica: int) -> int:
        return len(self.replicas[replica].waiting)

    def has_prefix(self) -> bool:
        return self.sim.prefix_enabled

    def prefix_hit_tokens(self, replica: int) -> int:
        sim = self.sim
        if not sim.prefix_enabled:
            return 0
        if self._blocks is None:
            self._blocks = sim.prefix_blocks(self.request)
        return sim.prefix_block_tokens * self.replicas[replica].prefix_hit_blocks(self._blocks)

    def prefill_tps(self, replica: int) -> float:
        return self.sim.prefill_tps(replica)

    def rtt_s(self, replica: int) -> float:
        row = self._rtt_row
        if row is None:
            row = self._rtt_row = self.sim.rtt_row(self.origin)
        return row[self.replicas[replica].region]

    def ready_in_s(self, replica: int) -> float:
        return max(0.0, self.replicas[replica].ready_s - self.time_s)


class SimLaneView:
    """``LaneView`` of one engine lane, read live (see ``fleetwise.control.views.LaneView``)."""

    __slots__ = ("sim", "_lane", "replica", "lane", "lanes", "block_tokens", "cap_blocks", "running", "prefilling",
                 "waiting", "new_blocks")

    def __init__(self, sim: "Simulator", lane: "Lane"):
        self.sim = sim
        self._lane = lane
        self.replica = lane.replica.index
        self.lane = lane.index
        self.lanes = len(lane.replica.lanes)
        self.block_tokens = lane.block_tokens
        self.cap_blocks = lane.cap_blocks
        # live, read-only: the lane's running and prefilling request ids (views of its dicts, which the lane keeps
        # for its lifetime) and its replica's waiting queue
        self.running = lane.running.keys()
        self.prefilling = lane.prefilling.keys()
        self.waiting = lane.replica.waiting
        # new_blocks(steps): KV blocks the running sequences need for their next ``steps`` decode steps (the lane's
        # own method, bound: a call less per batch decision)
        self.new_blocks = lane.new_blocks

    # pickled and deep-copied without the dict views (which cannot be): they are bound again from the lane on
    # first use, once the copy is whole (a deep copy may reach this view before its lane's fields are set), so a
    # simulator, and an environment over it, can be copied (gymnasium's and SB3's tools copy environments)
    _STATE = ("sim", "_lane", "replica", "lane", "lanes", "block_tokens", "cap_blocks", "waiting")

    def __getstate__(self):
        return {k: getattr(self, k) for k in self._STATE}

    def __setstate__(self, state):
        for k, v in state.items():
            setattr(self, k, v)

    def __getattr__(self, name):  # (only for a slot not set: the views, after a copy)
        if name in ("running", "prefilling", "new_blocks"):
            lane = self._lane
            self.running, self.prefilling, self.new_blocks = lane.running.keys(), lane.prefilling.keys(), \
                lane.new_blocks
            return getattr(self, name)
        raise AttributeError(name)

    @property
    def time_s(self) -> float:
        return self.sim.now

    @property
    def free_blocks(self) -> int:
        return self._lane.cap_blocks - self._lane.used_blocks

    @property
    def has_priorities(self) -> bool:
        return self.sim.priorities is not None

    def context(self, rid: int) -> int:
        return self.sim.ctx[rid]

    def prefill_left(self, rid: int) -> int:
        sim = self.sim
        return sim.ctx[rid] - sim.pf[rid]

    def generated(self, rid: int) -> int:
        return self.sim.generated(rid)

    def kv_tokens(self, rid: int) -> int:
        sim = self.sim
        if rid in self._lane.running:
            return sim.prompt[rid] + sim.generated(rid) - 1
        return sim.ctx[rid] if rid in self._lane.prefilling else 0

    def priority(self, rid: int) -> int:
        p = self.sim.priorities
        return 0 if p is None else p[rid]

    def offloaded(self, rid: int) -> bool:
        return self.sim.hops[rid] > 0
