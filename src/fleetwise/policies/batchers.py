"""Heuristic batchers: what an engine lane runs next (vLLM prefill-first, Sarathi chunked prefill,
decode-first, static request-level batching).

All are ``stationary``: with an unchanged queue and running set they choose the same decode step again, so the
simulator may advance their decode runs in one event. Admission is first-come first-served with
head-of-line blocking (as vLLM's FCFS scheduler): when the request at the head of the queue does not fit, nothing
behind it is admitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from fleetwise.control.protocols import DECODE, WAIT, BatchPlan
from fleetwise.control.registry import register_batcher
from fleetwise.control.views import LaneView


def admit_fcfs(view: LaneView, token_budget: int, max_seqs: int, chunked: bool, reserve_blocks: int,
               queue: Iterable[int] | None = None) -> list[tuple[int, int]]:
    """Waiting requests (FCFS, or in ``queue`` order) that fit this lane now: KV blocks for their whole context,
    at most ``max_seqs`` sequences in the lane, prompt tokens within ``token_budget`` (a chunk of one when
    ``chunked``)."""
    out: list[tuple[int, int]] = []
    free = view.free_blocks - reserve_blocks
    seqs = len(view.running) + len(view.prefilling)
    bs = view.block_tokens
    for rid in view.waiting if queue is None else queue:
        if token_budget <= 0 or seqs >= max_seqs:
            break
        need = -(-view.context(rid) // bs)
        if need > free:
            break
        left = view.prefill_left(rid)
        if not chunked and left > token_budget and out:
            break  # whole prompts only; a prompt longer than the budget runs alone
        chunk = min(left, token_budget) if chunked else left
        out.append((rid, chunk))
        free -= need
        seqs += 1
        token_budget -= chunk
    return out


@register_batcher("sarathi")
class Sarathi:
    """Sarathi-Serve chunked prefill: every iteration decodes all running sequences and fills the rest of a
    ``chunk_tokens`` token budget with prefill chunks (unfinished prefills first, then new requests)."""

    stationary = True

    def __init__(self, chunk_tokens: int = 512, max_num_seqs: int = 128):
        if chunk_tokens < 1 or max_num_seqs < 1:
            raise ValueError("chunk_tokens and max_num_seqs must be >= 1")
        self.chunk_tokens = chunk_tokens
        self.max_num_seqs = max_num_seqs

    def plan_queue(self, view: LaneView, queue: list[int] | None = None) -> BatchPlan:
        """The plan with the waiting queue taken in ``queue`` order (None: the replica's order)."""
        running = view.running
        budget = self.chunk_tokens - len(running)
        prefill: list[tuple[int, int]] = []
        for rid in view.prefilling:
            if budget <= 0:
                break
            c = min(view.prefill_left(rid), budget)
            prefill.append((rid, c))
            budget -= c
        if budget > 0 and view.waiting:
            prefill += admit_fcfs(view, budget, self.max_num_seqs, True, view.new_blocks(1), queue)
        if not prefill:
            return DECODE if running else WAIT
        return BatchPlan(decode=bool(running), prefill=tuple(prefill))

    plan = plan_queue  # (plan(view): the replica's order, without a second call per iteration)


@register_batcher("vllm")
class PrefillFirst:
    """vLLM (v0) default: whenever waiting requests fit, run a prefill-only batch of whole prompts (up to
    ``max_num_batched_tokens``); otherwise one decode step for all running sequences."""

    stationary = True

    def __init__(self, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256):
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs (max_batch) must be >= 1")
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs

    def _prefill(self, view: LaneView) -> BatchPlan | None:
        if not view.waiting:
            return None
        adm = admit_fcfs(view, self.max_num_batched_tokens, self.max_num_seqs, False, 0)
        return BatchPlan(prefill=tuple(adm)) if adm else None

    def plan(self, view: LaneView) -> BatchPlan:
        p = self._prefill(view)
        if p is not None:
            return p
        return DECODE if view.running else WAIT


@register_batcher("decode_first")
class DecodeFirst(PrefillFirst):
    """Decode-prioritized: decode while any sequence is decoding; prefill new requests (whole prompts) only
    when the decode batch is empty. Lowest time per output token, at the price of queueing delay."""

    def plan(self, view: LaneView) -> BatchPlan:
        if view.running:
            return DECODE
        return self._prefill(view) or WAIT


@register_batcher("static")
class Static(PrefillFirst):
    """Request-level (static) batching, as in FasterTransformer-era servers: prefill a batch of up to
    ``max_batch`` requests together, decode until every one has finished, then take the next batch."""

    def __init__(self, max_batch: int = 16, max_num_batched_tokens: int = 65536):
        super().__init__(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_batch)

    def plan(self, view: LaneView) -> BatchPlan:
        if view.running or view.prefilling:
            return DECODE if view.running else WAIT
        return self._prefill(view) or WAIT


@register_batcher("priority")
class Priority(Sarathi):
    """Sarathi chunked prefill with priorities (SLO classes): waiting requests are admitted highest priority
    first (first come, first served within a priority), and when the most important waiting request does not
    fit the KV cache, running sequences of strictly lower priority are preempted (lowest priority, newest
    first) to make room — vLLM's ``--scheduling-policy priority``, whose waiting queue is a priority queue: the
    plan keeps the replica's queue in that order (``BatchPlan.queue``). With one priority it is exactly Sarathi."""

    def plan(self, view: LaneView) -> BatchPlan:
        w = view.waiting
        if not view.has_priorities or not w:
            return super().plan(view)
        prio = view.priority
        # the waiting queue in priority order (a stable sort keeps arrival order within a priority)
        order = sorted(w, key=lambda r: -prio(r))
        queue = tuple(order) if list(w) != order else None
        head = order[0]
        bs = view.block_tokens
        need = -(-view.context(head) // bs) + view.new_blocks(1)
        free = view.free_blocks
        preempt: list[int] = []
        if need > free:
            running = list(view.running)  # admission order
            victims = sorted((k for k, r in enumerate(running) if prio(r) < prio(head)),
                             key=lambda k: (prio(running[k]), -k))  # lowest priority first, newest first within
            victims = [running[k] for k in victims]
            for r in victims:
                if need <= free:
                    break
                free += -(-view.kv_tokens(r) // bs)
                preempt.append(r)
            if need > free:
                preempt = []  # preempting would not make room: do not waste their work
        if not preempt:
            plan = self.plan_queue(view, order)
            return plan if queue is None else replace(plan, queue=queue)
        # evict, then admit the head in the same iteration (the simulator preempts before it admits)
        rest = len(view.running) - len(preempt)
        chunk = min(view.prefill_left(head), max(1, self.chunk_tokens - rest))
        return BatchPlan(decode=rest > 0, preempt=tuple(preempt), prefill=((head, chunk),), queue=queue)
