"""The simulator's routing indexes (fleetwise.sim.route_index) give the scan's answer, decision for decision."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fakes import LinearPerf
from fleetwise.control.controller import Controller
from fleetwise.policies import make
from fleetwise.scenario import Scenario, build, load_scenario
from fleetwise.sim.build import make_replica
from fleetwise.sim.simulator import SimOptions, Simulator
from fleetwise.workload.request import Workload


class Scan:
    """The router rules written as scans over ``candidates()`` (what the routers did before the indexes);
    counts the decisions where the indexed router's own answer (asked on the same view) differs."""

    def __init__(self, name: str):
        self.name = name
        self.indexed = make("router", name)
        self.decisions = self.mismatches = 0

    def route(self, view) -> int:
        c = view.candidates()
        if self.name == "least_outstanding_requests":
            i = min(c, key=view.outstanding)
        elif self.name == "least_kv_load":
            i = min(c, key=lambda r: (view.kv_used_fraction(r), view.waiting(r)))
        elif self.name == "nearest_region":
            i = min(c, key=lambda r: (view.rtt_s(r), view.outstanding(r)))
        elif self.name == "latency_aware":
            i = min(c, key=lambda r: view.rtt_s(r) + view.outstanding_tokens(r) / view.prefill_tps(r)
                    + view.ready_in_s(r))
        elif self.name == "least_outstanding_tokens" or not view.has_prefix():
            i = min(c, key=view.outstanding_tokens)
        else:
            i = min(c, key=lambda r: view.outstanding_tokens(r) - view.prefix_hit_tokens(r))
        self.decisions += 1
        self.mismatches += self.indexed.route(view) != i
        return i


def fields(rec):
    return {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)
            if isinstance(getattr(rec, f.name), np.ndarray)}


def same_records(a, b):
    fa, fb = fields(a), fields(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def scaled(name: str, replicas: int) -> Scenario:
    d = load_scenario(name).model_dump()
    n0 = d["deployments"][0]["replicas"]
    d["deployments"][0]["replicas"] = replicas
    w = d["workload"]
    if "rate_rps" in w:
        w["rate_rps"] = w["rate_rps"] * replicas / n0
    else:
        w["time_scale"] = w.get("time_scale", 1.0) * n0 / replicas
    return Scenario.model_validate(d)


def run_both(make_sim, name):
    scan = Scan(name)
    sim_a = make_sim()
    rec_a = sim_a.run(Controller(router=scan, batcher=make("batcher", "sarathi")))
    sim_b = make_sim()
    rec_b = sim_b.run(Controller(router=make("router", name), batcher=make("batcher", "sarathi")))
    return scan, rec_a, rec_b


@pytest.mark.parametrize("name", ["least_outstanding_tokens", "least_outstanding_requests", "least_kv_load"])
def test_indexed_router_decides_as_the_scan_on_a_32_replica_fleet(name):
    sc = scaled("vidur-parity", 32)
    scan, a, b = run_both(lambda: build(sc, 1, num_requests=1500).sim, name)
    assert scan.decisions >= 1500 and scan.mismatches == 0
    same_records(a, b)
    assert len(np.unique(b.replica)) == 32


def test_prefix_aware_decides_as_the_scan_with_prefix_hits():
    sc = scaled("prefix-cache", 12)
    scan, a, b = run_both(lambda: build(sc, 0, num_requests=800).sim, "prefix_aware")
    assert scan.mismatches == 0
    same_records(a, b)
    assert b.prefix_hit_tokens.sum() > 0


@pytest.mark.parametrize("name", ["least_outstanding_tokens", "least_outstanding_requests", "prefix_aware",
                                  "least_kv_load"])
def test_index_follows_failures_drains_notices_and_new_replicas(name):
    rng = np.random.default_rng(4)
    n = 1200
    w = Workload(arrival_s=np.cumsum(rng.exponential(1 / 60.0, n)), prompt_tokens=rng.integers(1, 900, n),
                 output_tokens=rng.integers(1, 300, n))

    def make_sim():
        reps = [make_replica(i, LinearPerf(kv_tokens=6000)) for i in range(8)]
        sim = Simulator(reps, w, options=SimOptions(check_invariants=True))
        sim.at(3.0, lambda s: s.fail(2, detect_s=1.0) and None)
        sim.at(5.0, lambda s: s.drain(5))
        sim.at(7.0, lambda s: s.preemption_notice(0, 0.5) and None)
        sim.at(8.0, lambda s: s.add_replica(make_replica(0, LinearPerf(kv_tokens=6000), start_s=s.now,
                                                         ready_s=s.now + 2.0)) and None)
        sim.at(9.0, lambda s: s.stall(7, 1.5) and None)
        return sim

    scan, a, b = run_both(make_sim, name)
    assert scan.mismatches == 0
    same_records(a, b)
    assert (b.replica == 8).any()  # the replica added at run time got requests


def multi_region_sim(w, n=18, late=()):
    """``n`` replicas over 3 regions (round trips 5-180 ms) and 3 speeds; the replicas in ``late`` start serving
    at 4 s (candidates from the start, as a cold start is)."""
    rtt = np.array([[0.005, 0.09, 0.18], [0.09, 0.005, 0.15], [0.18, 0.15, 0.005]])
    speeds = [LinearPerf(kv_tokens=6000), LinearPerf(base=0.02, per_prefill=2e-4, kv_tokens=6000),
              LinearPerf(base=0.005, per_prefill=5e-5, kv_tokens=6000)]
    reps = [make_replica(i, speeds[(i // 3) % 3], region=i % 3, ready_s=4.0 if i in late else 0.0)
            for i in range(n)]
    return Simulator(reps, w, rtt_s=rtt, options=SimOptions(check_invariants=True))


def region_workload(seed: int, n: int, rate: float) -> Workload:
    """``n`` Poisson requests at ``rate`` per second from the three regions of ``multi_region_sim``."""
    rng = np.random.default_rng(seed)
    return Workload(arrival_s=np.cumsum(rng.exponential(1 / rate, n)), prompt_tokens=rng.integers(1, 900, n),
                    output_tokens=rng.integers(1, 300, n), origin=rng.integers(0, 3, n))


@pytest.mark.parametrize("name", ["nearest_region", "latency_aware"])
def test_region_routers_decide_as_the_scan_on_a_multi_region_fleet(name):
    # nearest_region and latency_aware compare the least-loaded replica of each region (and prefill throughput)
    # (Simulator.nearest_least_outstanding, least_latency) instead of scanning the fleet: the same decisions
    n = 2000
    w = region_workload(7, n, 90.0)
    scan, a, b = run_both(lambda: multi_region_sim(w, late={4, 9}), name)
    assert scan.decisions >= n and scan.mismatches == 0
    same_records(a, b)
    assert len(np.unique(b.replica)) == 18


@pytest.mark.parametrize("name", ["nearest_region", "latency_aware"])
def test_region_routers_follow_failures_drains_stalls_and_new_replicas(name):
    w = region_workload(8, 1500, 70.0)

    def make_sim():
        sim = multi_region_sim(w, n=9)
        sim.at(3.0, lambda s: s.fail(2, detect_s=1.0) and None)
        sim.at(5.0, lambda s: s.drain(5))
        sim.at(7.0, lambda s: s.preemption_notice(0, 0.5) and None)
        sim.at(8.0, lambda s: s.add_replica(make_replica(0, LinearPerf(kv_tokens=6000), region=1, start_s=s.now,
                                                         ready_s=s.now + 2.0)) and None)
        sim.at(9.0, lambda s: s.stall(7, 1.5) and None)
        sim.at(12.0, lambda s: s.set_link(1, 2, 0.01))  # round trips are read at each decision
        return sim

    scan, a, b = run_both(make_sim, name)
    assert scan.mismatches == 0
    same_records(a, b)
    assert (b.replica == 9).any()  # the replica added at run time got requests


def test_a_replica_is_a_candidate_exactly_while_routable():
    # the simulator checks a routing answer with ``routable`` (O(1)) instead of searching the candidate list
    rng = np.random.default_rng(5)
    w = Workload(arrival_s=np.cumsum(rng.exponential(1 / 40.0, 600)), prompt_tokens=rng.integers(1, 900, 600),
                 output_tokens=rng.integers(1, 300, 600))
    sim = Simulator([make_replica(i, LinearPerf(kv_tokens=6000)) for i in range(6)], w)
    seen = []

    def check(s):
        for r in s.replicas:
            seen.append((r.index in s.candidates[r.model_index]) == r.routable)
    for t, act in [(2.0, lambda s: s.fail(1, detect_s=1.0)), (4.0, lambda s: s.drain(3)),
                   (5.0, lambda s: s.preemption_notice(4, 0.5)),
                   (6.0, lambda s: s.add_replica(make_replica(0, LinearPerf(kv_tokens=6000), start_s=s.now,
                                                              ready_s=s.now + 1.0)))]:
        sim.at(t, lambda s, act=act: (act(s), check(s)) and None)
        sim.at(t + 1.5, lambda s: check(s))
    sim.run(Controller(router=make("router", "least_outstanding_requests"), batcher=make("batcher", "sarathi")))
    check(sim)
    assert len(seen) > 20 and all(seen)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lower_bound_search_is_exact_on_random_fleets(seed):
    # the tokens index keys replicas by lower bounds over a horizon of decode steps and searches the heap
    # (fleetwise.sim.route_index.LoadIndex): on random fleets of 60-160 replicas of mixed speeds and pipeline
    # depths, two models, long decode runs, every decision is the scan's
    rng = np.random.default_rng(seed)
    nrep = int(rng.integers(60, 160))
    n = 2500
    w = Workload(arrival_s=np.cumsum(rng.exponential(1 / (nrep * 1.5), n)), prompt_tokens=rng.integers(1, 600, n),
                 output_tokens=rng.integers(1, 900, n))
    models = rng.integers(0, 2, n)
    perfs = [LinearPerf(base=float(rng.uniform(0.005, 0.03)), per_kv=float(rng.uniform(0, 2e-6)),
                        kv_tokens=int(rng.integers(8000, 30000)), pp=int(rng.integers(1, 3))) for _ in range(nrep)]

    def make_sim():
        reps = [make_replica(i, perfs[i], model_index=i % 2) for i in range(nrep)]
        return Simulator(reps, w, model_index=models)

    for name in ("least_outstanding_tokens", "prefix_aware", "least_kv_load"):  # (KV keys: lower bounds too)
        scan, a, b = run_both(make_sim, name)
        assert scan.decisions == n and scan.mismatches == 0
        same_records(a, b)
        assert len(np.unique(b.replica)) == nrep
