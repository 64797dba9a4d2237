"""The plain actions a policy returns to the simulator, and the decision points it answers.

Defined here, beside the simulator that consumes them, so that ``fleetwise.sim`` imports nothing from the layers
above it; ``fleetwise.control`` re-exports them for policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What one engine lane runs next.

    ``decode``: include one decode token for every running (decoding) sequence of the lane.
    ``prefill``: (request id, chunk tokens) pairs; a request still waiting is admitted (KV allocated for its prompt).
    ``offload``: waiting requests sent to another replica's queue (over the network between their regions);
    each request may be offloaded once. After an offload-only plan the lane is asked again at once.
    An empty plan (no decode, no prefill) means: wait until something changes (an arrival or a completion), or
    for ``wait_s`` seconds when that is > 0.
    """

    decode: bool = False
    prefill: tuple[tuple[int, int], ...] = ()
    preempt: tuple[int, ...] = ()  # admitted requests of this lane to evict first (recompute), e.g. low priority
    offload: tuple[tuple[int, int], ...] = ()  # (request id, replica index): move a waiting request elsewhere
    wait_s: float = 0.0  # with nothing to run: idle this long (or until the queue changes), then decide again
    queue: tuple[int, ...] | None = None  # reorder the replica's waiting queue first (see above)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


def _fast_init() -> None:
    """Give ``BatchPlan`` an ``__init__`` that sets its slots through their descriptors: the same signature, fields
    and frozen instances as the dataclass's own, at about half its cost (a frozen dataclass's ``__init__`` calls
    ``object.__setattr__`` by name once per field; a lane builds about three plans per simulated request)."""
    import inspect

    d = BatchPlan.__dict__
    sd, sp, spr, so, sw, sq = (d[f].__set__ for f in ("decode", "prefill", "preempt", "offload", "wait_s", "queue"))

    def __init__(self, decode: bool = False, prefill: tuple[tuple[int, int], ...] = (), preempt: tuple[int, ...] = (),
                 offload: tuple[tuple[int, int], ...] = (), wait_s: float = 0.0,
                 queue: tuple[int, ...] | None = None) -> None:
        sd(self, decode)
        sp(self, prefill)
        spr(self, preempt)
        so(self, offload)
        sw(self, wait_s)
        sq(self, queue)

    old = BatchPlan.__init__

    def params(f) -> list:
        return [(q.name, q.kind, q.default) for q in inspect.signature(f).parameters.values()]

    if params(__init__) != params(old):  # (the dataclass's fields, in order, with their defaults)
        raise TypeError("BatchPlan's fast __init__ does not match its fields")
    __init__.__qualname__ = old.__qualname__
    __init__.__doc__ = old.__doc__
    BatchPlan.__init__ = __init__


_fast_init()

WAIT = BatchPlan()
DECODE = BatchPlan(decode=True)


@dataclass(slots=True)
class DecisionPoint:
    """Something a policy must decide. ``kind`` is "route" (which replica serves request ``request``; ``view``
    is its ``RouteView``), "batch" (what engine lane ``lane`` runs next; ``view`` is its ``LaneView``) or one a
    platform layer adds with ``Simulator.at`` (e.g. "scale", with the observation as ``payload``).

    Policies read ``view`` (or ``payload``) only. ``lane`` is the simulator's own lane object, for the
    environments that drive the simulator through its public API."""

    kind: str
    time_s: float
    request: int = -1
    lane: Any = None
    view: Any = None  # RouteView | LaneView
    payload: Any = None  # other kinds (e.g. "scale"): the observation; ``handler(action)`` applies the answer
    handler: Any = None
