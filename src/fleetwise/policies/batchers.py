"""Heuristic batchers: what an engine lane runs next (vLLM prefill-first, Sarathi chunked prefill,
decode-first, static request-level batching).

All are ``stationary``: with an unchanged queue and running set they choose the same decode step again, so the
simulator may advance their decode runs in one event. Admission is first-come first-served with
head-of-line blocking (as vLLM's FCFS scheduler): when the request at the head of the queue does not fit, nothing
behind it is admitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetwise.control.protocols import DECODE, WAIT, BatchPlan
from fleetwise.control.registry import register_batcher

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.sim.engine import Lane
    from fleetwise.sim.simulator import Simulator


def admit_fcfs(lane: "Lane", sim: "Simulator", token_budget: int, max_seqs: int, chunked: bool,
               reserve_blocks: int) -> list[tuple[int, int]]:
    """Waiting requests (FCFS) that fit this lane now: KV blocks for their whole context, at most ``max_seqs``
    sequences in the lane, prompt tokens within ``token_budget`` (a chunk of one when ``chunked``)."""
    out: list[tuple[int, int]] = []
    free = lane.free_blocks - reserve_blocks
    seqs = lane.num_seqs
    bs = lane.block_tokens
    ctx, pf = sim.ctx, sim.pf
    for rid in lane.replica.waiting:
        if token_budget <= 0 or seqs >= max_seqs:
            break
        need = -(-ctx[rid] // bs)
        if need > free:
            break
        left = ctx[rid] - pf[rid]
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

    def plan(self, lane: "Lane", sim: "Simulator") -> BatchPlan:
        budget = self.chunk_tokens - len(lane.running)
        prefill: list[tuple[int, int]] = []
        ctx, pf = sim.ctx, sim.pf
        for rid in lane.prefilling:
            if budget <= 0:
                break
            c = min(ctx[rid] - pf[rid], budget)
            prefill.append((rid, c))
            budget -= c
        if budget > 0 and lane.replica.waiting:
            prefill += admit_fcfs(lane, sim, budget, self.max_num_seqs, True, lane.new_blocks(1))
        if not prefill:
            return DECODE if lane.running else WAIT
        return BatchPlan(decode=bool(lane.running), prefill=tuple(prefill))


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

    def _prefill(self, lane: "Lane", sim: "Simulator") -> BatchPlan | None:
        if not lane.replica.waiting:
            return None
        adm = admit_fcfs(lane, sim, self.max_num_batched_tokens, self.max_num_seqs, False, 0)
        return BatchPlan(prefill=tuple(adm)) if adm else None

    def plan(self, lane: "Lane", sim: "Simulator") -> BatchPlan:
        p = self._prefill(lane, sim)
        if p is not None:
            return p
        return DECODE if lane.running else WAIT


@register_batcher("decode_first")
class DecodeFirst(PrefillFirst):
    """Decode-prioritized: decode while any sequence is decoding; prefill new requests (whole prompts) only
    when the decode batch is empty. Lowest time per output token, at the price of queueing delay."""

    def plan(self, lane: "Lane", sim: "Simulator") -> BatchPlan:
        if lane.running:
            return DECODE
        return self._prefill(lane, sim) or WAIT


@register_batcher("static")
class Static(PrefillFirst):
    """Request-level (static) batching, as in FasterTransformer-era servers: prefill a batch of up to
    ``max_batch`` requests together, decode until every one has finished, then take the next batch."""

    def __init__(self, max_batch: int = 16, max_num_batched_tokens: int = 65536):
        super().__init__(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_batch)

    def plan(self, lane: "Lane", sim: "Simulator") -> BatchPlan:
        if lane.running or lane.prefilling:
            return DECODE if lane.running else WAIT
        return self._prefill(lane, sim) or WAIT


@register_batcher("priority")
class Priority(Sarathi):
    """Sarathi chunked prefill with priorities (SLO classes): waiting requests are admitted highest priority
    first (first come, first served within a priority), and when the most important waiting request does not
    fit the KV cache, running sequences of strictly lower priority are preempted (lowest priority, newest
    first) to make room — vLLM's ``--scheduling-policy priority``. With one priority it is exactly Sarathi."""

    def plan(self, lane: "Lane", sim: "Simulator") -> BatchPlan:
        prio = sim._prio
        w = lane.replica.waiting
        if prio is None or not w:
            return super().plan(lane, sim)
        # the waiting queue in priority order (a stable sort keeps arrival order within a priority)
        order = sorted(w, key=lambda r: -prio[r])
        if list(w) != order:
            w.clear()
            w.extend(order)
        head = w[0]
        bs = lane.block_tokens
        need = -(-sim.ctx[head] // bs) + lane.new_blocks(1)
        free = lane.free_blocks
        preempt: list[int] = []
        if need > free:
            running = list(lane.running)  # admission order
            victims = sorted((k for k, r in enumerate(running) if prio[r] < prio[head]),
                             key=lambda k: (prio[running[k]], -k))  # lowest priority first, newest first within
            victims = [running[k] for k in victims]
            held = sim.prompt
            for r in victims:
                if need <= free:
                    break
                g = sim.gen_join[r] + lane.steps - sim.join_step[r]
                free += -(-(held[r] + g - 1) // bs)
                preempt.append(r)
            if need > free:
                preempt = []  # preempting would not make room: do not waste their work
        if not preempt:
            return super().plan(lane, sim)
        # evict, then admit the head in the same iteration (the simulator preempts before it admits)
        rest = len(lane.running) - len(preempt)
        chunk = min(sim.ctx[head] - sim.pf[head], max(1, self.chunk_tokens - rest))
        return BatchPlan(decode=rest > 0, preempt=tuple(preempt), prefill=((head, chunk),))
