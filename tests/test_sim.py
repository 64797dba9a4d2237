"""Simulator core: conservation, KV capacity, determinism, coalesced == per-iteration stepping, queueing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes import LinearPerf
from fleetwise.policies import make_controller, names
from fleetwise.sim.build import make_replica
from fleetwise.sim.records import Records
from fleetwise.sim.simulator import SimOptions, Simulator
from fleetwise.workload.request import Workload

BATCHERS = ["sarathi", "vllm", "decode_first", "static"]


def poisson_workload(n, rate, seed=0, pmax=1500, omax=400, prefix=False, docs=5):
    rng = np.random.default_rng(seed)
    w = Workload(arrival_s=np.cumsum(rng.exponential(1 / rate, n)), prompt_tokens=rng.integers(1, pmax, n),
                 output_tokens=rng.integers(1, omax, n))
    if prefix:  # requests share prefixes drawn from a few "documents"
        lens = -(-w.prompt_tokens // 512)
        docs = rng.integers(0, docs, n)
        w.prefix_offsets = np.concatenate([[0], np.cumsum(lens)])
        w.prefix_blocks = np.concatenate([docs[i] * 1000 + np.arange(lens[i]) for i in range(n)]).astype(np.int64)
    return w


def run(w, *, replicas=2, kv=20000, pp=1, block=16, batcher="sarathi", router="round_robin", force=False,
        check=True, seed=0, perf=None, bparams=None):
    reps = [make_replica(i, perf or LinearPerf(kv_tokens=kv, pp=pp), block_tokens=block) for i in range(replicas)]
    sim = Simulator(reps, w, seed=seed, options=SimOptions(force_single_step=force, check_invariants=check))
    rec = sim.run(make_controller(router, batcher, batcher_params=bparams))
    return rec, sim


@pytest.mark.parametrize("batcher", BATCHERS)
def test_coalesced_equals_single_step(batcher):
    w = poisson_workload(600, rate=8.0, seed=1)
    fast, sf = run(w, batcher=batcher, kv=6000)  # small KV: preemptions happen
    slow, ss = run(w, batcher=batcher, kv=6000, force=True)
    assert fast.equals(slow)
    assert sf.events < ss.events / 3  # and the fast path is much cheaper
    assert fast.completed.all()


def test_coalesced_equals_single_step_pipeline_and_prefix():
    w = poisson_workload(400, rate=10.0, seed=2, prefix=True)
    fast, _ = run(w, pp=2, kv=8000, router="prefix_aware")
    slow, _ = run(w, pp=2, kv=8000, router="prefix_aware", force=True)
    assert fast.equals(slow)
    assert fast.prefix_hit_tokens.sum() > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 60), rate=st.floats(0.5, 200), kv=st.integers(64, 3000), block=st.sampled_from([1, 4, 16]),
       pp=st.sampled_from([1, 2]), replicas=st.integers(1, 3), batcher=st.sampled_from(BATCHERS),
       router=st.sampled_from(["random", "round_robin", "least_outstanding_tokens", "power_of_two", "least_kv_load"]),
       seed=st.integers(0, 2**16))
def test_conservation_and_kv_capacity(n, rate, kv, block, pp, replicas, batcher, router, seed):
    w = poisson_workload(n, rate, seed=seed, pmax=800, omax=300)
    rec, sim = run(w, replicas=replicas, kv=kv, pp=pp, block=block, batcher=batcher, router=router, seed=seed)
    # every arrived request ends completed or rejected with a reason; none vanishes
    assert np.all((rec.status == 1) | (rec.status == 2))
    assert np.all(rec.reason[rec.status == 2] > 0)
    assert sim.ended == n
    done = rec.completed
    assert np.all(rec.first_token_s[done] >= rec.arrival_s[done])
    assert np.all(rec.completion_s[done] >= rec.first_token_s[done])
    # rejected only when the request can never fit one lane's KV share
    lane_tokens = sim.replicas[0].lanes[0].cap_blocks * block
    assert np.all((rec.prompt_tokens + rec.output_tokens)[rec.status == 2] > lane_tokens)
    for r in sim.replicas:  # everything released at the end
        for lane in r.lanes:
            assert lane.used_blocks == 0 and lane.kv_tokens == 0 and lane.dec_kv == 0
            assert not lane.running and not lane.prefilling
        assert r.outstanding == 0 and r.pending_tokens == 0
    slow, _ = run(w, replicas=replicas, kv=kv, pp=pp, block=block, batcher=batcher, router=router, seed=seed,
                  force=True)
    assert rec.equals(slow)


def test_same_seed_same_records_across_many_resets():
    from fleetwise import load_scenario, simulate

    sc = load_scenario("default")
    first, s0 = simulate(sc, seed=7, router="power_of_two", num_requests=300)
    for _ in range(20):
        again, s1 = simulate(sc, seed=7, router="power_of_two", num_requests=300)
        assert again.equals(first, rtol=0)
        assert s1 == s0
    other, _ = simulate(sc, seed=8, router="power_of_two", num_requests=300)
    assert not np.allclose(other.arrival_s, first.arrival_s)


def test_mg1_mean_wait_matches_pollaczek_khinchine():
    """One replica serving one request at a time (static batching, batch 1) is an M/G/1 queue:
    the mean wait must match Pollaczek-Khinchine, W = lambda E[S^2] / (2 (1 - rho))."""
    rng = np.random.default_rng(3)
    n = 60000
    perf = LinearPerf(base=0.002, per_prefill=1e-5, per_seq=0.0, per_kv=0.0, kv_tokens=10**7)
    prompt = rng.integers(1, 1000, n)
    output = rng.geometric(1 / 20, n)
    service = (perf.base + perf.per_prefill * prompt) + (output - 1) * perf.base
    lam = 0.7 / service.mean()
    w = Workload(arrival_s=np.cumsum(rng.exponential(1 / lam, n)), prompt_tokens=prompt, output_tokens=output)
    rec, _ = run(w, replicas=1, perf=perf, batcher="static", bparams={"max_batch": 1}, check=False)
    rho = lam * service.mean()
    expected = lam * (service ** 2).mean() / (2 * (1 - rho))
    measured = rec.queue_delay_s[1000:].mean()
    assert measured == pytest.approx(expected, rel=0.08)
    # and the service itself is exactly the performance model's
    e2e = rec.e2e_s - rec.queue_delay_s
    assert np.allclose(e2e, service)


def test_prefix_aware_router_gets_more_cache_hits():
    w = poisson_workload(800, rate=5.0, seed=5, prefix=True, docs=40)  # 40 prefixes: more than one cache holds
    rr, _ = run(w, replicas=4, router="round_robin", check=False)
    pa, _ = run(w, replicas=4, router="prefix_aware", check=False)
    assert pa.prefix_hit_tokens.sum() > 1.5 * rr.prefix_hit_tokens.sum()
    assert np.nanmedian(pa.ttft_s) < np.nanmedian(rr.ttft_s)


def test_least_outstanding_beats_random_on_tail_ttft():
    w = poisson_workload(3000, rate=30.0, seed=6)
    rnd, _ = run(w, replicas=4, router="random", check=False)
    lor, _ = run(w, replicas=4, router="least_outstanding_requests", check=False)
    assert np.nanpercentile(lor.ttft_s, 99) < np.nanpercentile(rnd.ttft_s, 99)


def test_cold_start_delays_service_until_model_loaded():
    w = poisson_workload(50, rate=5.0, seed=1)
    reps = [make_replica(0, LinearPerf(), ready_s=30.0)]
    rec = Simulator(reps, w).run(make_controller())
    assert np.all(rec.first_token_s >= 30.0)
    assert rec.completed.all()


def test_oversized_requests_rejected_with_reason():
    w = Workload(arrival_s=np.array([0.0, 1.0]), prompt_tokens=np.array([100, 5000]), output_tokens=np.array([10, 10]))
    rec, _ = run(w, replicas=1, kv=1000)
    assert rec.status.tolist() == [1, 2]
    assert rec.reject_reasons() == {"exceeds_kv_capacity": 1}


def test_step_api_advance_apply():
    w = poisson_workload(30, rate=5.0)
    reps = [make_replica(i, LinearPerf()) for i in range(2)]
    sim = Simulator(reps, w)
    ctl = make_controller("least_outstanding_requests", "sarathi")
    sim.batcher_stationary = True
    kinds = set()
    while (dp := sim.advance()) is not None:
        kinds.add(dp.kind)
        sim.apply(ctl.decide(dp))
    assert kinds == {"route", "batch"}
    assert isinstance(sim.records(), Records) and sim.records().completed.all()
    with pytest.raises(RuntimeError):
        sim.apply(0)


def test_every_registered_policy_runs():
    w = poisson_workload(100, rate=10.0, prefix=True)
    for r in names("router"):
        for b in names("batcher"):
            rec, _ = run(w, router=r, batcher=b, check=False)
            assert rec.completed.all(), (r, b)


def test_horizon_ends_every_request():
    w = poisson_workload(400, rate=50.0, seed=2)  # far more than 2 replicas serve in 5 s
    reps = [make_replica(i, LinearPerf()) for i in range(2)]
    sim = Simulator(reps, w, options=SimOptions(max_time_s=5.0))
    rec = sim.run(make_controller())
    assert np.all(rec.status > 0)
    assert rec.reject_reasons().get("horizon", 0) > 0
    assert np.all(rec.completion_s[rec.completed] <= 5.0 + 1e-9)


def test_stall_delays_service_on_that_replica():
    w = Workload(arrival_s=np.array([0.0, 0.0]), prompt_tokens=np.array([100, 100]), output_tokens=np.array([5, 5]))
    reps = [make_replica(i, LinearPerf()) for i in range(2)]
    sim = Simulator(reps, w)
    sim.stall(0, 7.0)
    rec = sim.run(make_controller("round_robin", "sarathi"))
    assert rec.replica.tolist() == [0, 1]
    assert rec.first_token_s[0] >= 7.0 and rec.first_token_s[1] < 1.0


def test_offload_moves_a_waiting_request_over_the_link():
    from fleetwise.control.protocols import BatchPlan

    w = Workload(arrival_s=np.array([0.0]), prompt_tokens=np.array([100]), output_tokens=np.array([3]))
    reps = [make_replica(i, LinearPerf(), region=i) for i in range(2)]
    sim = Simulator(reps, w, rtt_s=np.array([[0.0, 0.2], [0.2, 0.0]]))
    dp = sim.advance()
    sim.apply(0)  # route to replica 0
    dp = sim.advance()
    assert dp.kind == "batch" and dp.lane.replica.index == 0
    sim.apply(BatchPlan(offload=((0, 1),)))
    sim.batcher_stationary = True
    ctl = make_controller("round_robin", "sarathi")
    while (dp := sim.advance()) is not None:
        sim.apply(ctl.decide(dp))
    rec = sim.records()
    assert rec.replica[0] == 1 and rec.completed[0]
    assert rec.first_token_s[0] >= 0.1  # half the round trip to get there


@pytest.mark.parametrize("case", [
    dict(seed=1199, n=30, rate=30.0, kv=3000, block=16, replicas=3, batcher="vllm", router="round_robin"),
    dict(seed=148814, n=299, rate=2.0, kv=3000, block=32, replicas=1, batcher="vllm", router="round_robin"),
    dict(seed=39065, n=245, rate=2.0, kv=1500, block=16, replicas=2, batcher="sarathi", router="round_robin"),
    dict(seed=749129, n=108, rate=30.0, kv=3000, block=32, replicas=1, batcher="sarathi",
         router="least_outstanding_tokens")])
def test_coalesced_equals_single_step_with_kv_offload(case):
    """After a preemption the next iteration is planned anew (a decode run of one step): with kv_offload the
    queue's head is not the request just preempted (it is swapping out) and may be admitted then. (These cases
    preempted differently on the two paths before.)"""
    c = dict(case)
    w = poisson_workload(c.pop("n"), rate=c.pop("rate"), seed=c["seed"], pmax=1500, omax=400)

    def go(force):
        reps = [make_replica(i, LinearPerf(kv_tokens=c["kv"]), block_tokens=c["block"]) for i in range(c["replicas"])]
        sim = Simulator(reps, w, seed=c["seed"], options=SimOptions(force_single_step=force, check_invariants=True,
                                                                    kv_offload=True))
        return sim.run(make_controller(c["router"], c["batcher"])), sim

    (fast, sf), (slow, ss) = go(False), go(True)
    assert fast.preemptions.sum() > 0 and sf.swapped_bytes > 0
    assert fast.equals(slow) and np.array_equal(fast.preemptions, slow.preemptions)
    assert sf.events < ss.events


@pytest.mark.parametrize("scenario", ["vidur-parity", "default"])
def test_inline_accounting_equals_the_perf_models_calls(scenario):
    """The simulator reads PerfModel's flops and power coefficients instead of calling iteration_flops and
    busy_power_w per iteration (PerfModel.inline_accounting): the same energy, flops, busy and KV-token integrals
    to the last bit as with the calls (what a perf model without the coefficients gets)."""
    from fleetwise.scenario import build, load_scenario

    sc = load_scenario(scenario)
    out = []
    for inline in (True, False):
        b = build(sc, sc.seed, num_requests=400)
        assert b.sim._inline_acct
        b.sim._inline_acct = inline
        rec = b.sim.run(b.controller("round_robin"))
        out.append((rec, [(r.busy_s, r.energy_busy_j, r.flops, r.kv_token_s, r.tokens_out) for r in b.sim.replicas]))
    assert out[0][0].equals(out[1][0])
    assert out[0][1] == out[1][1]
    assert all(e > 0 and f > 0 for _, e, f, _, _ in out[0][1])


def test_routing_inside_the_event_loop_keeps_records_and_progress():
    """run_until routes arrivals inside advance (no DecisionPoint) in stretches of 2,000 requests when it has a
    progress callback: the same records with and without one, with a caller that steps advance() itself, and the
    callback still sees every request."""
    from fleetwise.scenario import build, load_scenario

    sc = load_scenario("default")
    runs, seen = [], []
    for progress in (None, seen.append):
        b = build(sc, sc.seed, num_requests=5000)
        runs.append(b.sim.run(b.controller("least_outstanding_tokens"), progress=progress))
    b = build(sc, sc.seed, num_requests=5000)
    ctl = b.controller("least_outstanding_tokens")
    dp = b.sim.advance()
    kinds = set()
    while dp is not None:  # the environments' way: every decision handed out
        kinds.add(dp.kind)
        b.sim.apply(ctl.router.route(dp.view) if dp.kind == "route" else ctl.batcher.plan(dp.view))
        dp = b.sim.advance()
    assert kinds == {"route", "batch"}
    assert runs[0].equals(runs[1]) and runs[0].equals(b.sim.records())
    assert sum(seen) == 5000 and len(seen) >= 3


def test_batch_plan_keeps_the_frozen_dataclass_behaviour():
    """BatchPlan's faster __init__ (sim/actions.py) builds what the dataclass's own would: same fields and defaults,
    positional and keyword arguments, equality, hashing, replace, and instances that cannot be changed."""
    import dataclasses
    import inspect

    from fleetwise.control.protocols import DECODE, WAIT, BatchPlan

    names_ = [f.name for f in dataclasses.fields(BatchPlan)]
    assert list(inspect.signature(BatchPlan).parameters) == names_
    p = BatchPlan(True, ((3, 64),), (), ((4, 1),), 0.5, (4, 3))
    assert [getattr(p, n) for n in names_] == [True, ((3, 64),), (), ((4, 1),), 0.5, (4, 3)]
    assert p == BatchPlan(decode=True, prefill=((3, 64),), offload=((4, 1),), wait_s=0.5, queue=(4, 3))
    assert hash(p) == hash(dataclasses.replace(p))
    assert dataclasses.replace(p, queue=None).queue is None and p.queue == (4, 3)
    assert WAIT == BatchPlan() and WAIT.empty and DECODE == BatchPlan(decode=True) and not DECODE.empty
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.decode = False
    with pytest.raises(TypeError):
        BatchPlan(prefil=())


def test_run_until_pauses_the_collector_and_leaves_no_cyclic_garbage():
    """run_until pauses the cyclic garbage collector (SimOptions.pause_gc) and restores the caller's setting, also when
    the controller raises; the run itself makes no reference cycles for the collector to find afterwards."""
    import gc

    from fleetwise.scenario import build, load_scenario

    sc = load_scenario("prefix-cache")
    seen = []

    class Spy:
        def __init__(self, router):
            self.router = router

        def route(self, view):
            seen.append(gc.isenabled())
            return self.router.route(view)

    assert gc.isenabled()
    b = build(sc, sc.seed, num_requests=3000)
    ctl = b.controller("prefix_aware")
    ctl.router = Spy(ctl.router)
    gc.collect()
    rec = b.sim.run(ctl)
    assert gc.isenabled() and seen and not any(seen)
    assert gc.collect() < 100  # (a cycle made per event would leave thousands)
    b = build(sc, sc.seed, num_requests=3000)
    ctl = b.controller("prefix_aware")
    assert b.sim.run(ctl).equals(rec)
    gc.disable()  # a caller that paused the collector itself keeps it paused
    try:
        b = build(sc, sc.seed, num_requests=200)
        b.sim.run(b.controller("prefix_aware"))
        assert not gc.isenabled()
    finally:
        gc.enable()
    b = build(sc, sc.seed, num_requests=200)
    b.sim.options.pause_gc = False  # and with the option off the collector stays on
    seen.clear()
    ctl = b.controller("prefix_aware")
    ctl.router = Spy(ctl.router)
    b.sim.run(ctl)
    assert seen and all(seen)

    class Boom:
        def route(self, view):
            raise RuntimeError("boom")

    b = build(sc, sc.seed, num_requests=200)
    ctl = b.controller("prefix_aware")
    ctl.router = Boom()
    with pytest.raises(RuntimeError):
        b.sim.run(ctl)
    assert gc.isenabled()
