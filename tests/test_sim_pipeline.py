"""Pipeline parallelism: the lanes of a replica share its pp stages (a flow shop, first come first served)."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import LinearPerf
from fleetwise.policies import make_controller
from fleetwise.sim.build import make_replica
from fleetwise.sim.simulator import SimOptions, Simulator
from fleetwise.workload.request import Workload
from test_sim import poisson_workload, run


def _sim(w, pp, force=False, **perf):
    rep = make_replica(0, LinearPerf(kv_tokens=200_000, pp=pp, **perf), block_tokens=16)
    return Simulator([rep], w, options=SimOptions(force_single_step=force, check_invariants=True))


def _decode_and_prefill(with_prefill: bool) -> Workload:
    """Request 0 decodes 200 tokens from t=0; request 1 (a 4,000-token prompt, 8 chunks of 512) arrives at 0.1 s."""
    n = 2 if with_prefill else 1
    return Workload(arrival_s=np.array([0.0, 0.1][:n]), prompt_tokens=np.array([1, 4000][:n]),
                    output_tokens=np.array([200, 2][:n]))


@pytest.mark.parametrize("force", [False, True])
def test_decode_lane_is_paced_by_a_neighbours_prefill(force):
    perf = dict(base=0.01, per_prefill=1e-4, per_seq=1e-4, per_kv=0.0)
    alone = _sim(_decode_and_prefill(False), pp=2, force=force, **perf)
    r_alone = alone.run(make_controller("round_robin", "sarathi"))
    both = _sim(_decode_and_prefill(True), pp=2, force=force, **perf)
    r_both = both.run(make_controller("round_robin", "sarathi"))
    assert r_both.completed.all() and r_alone.completed.all()
    assert both.replicas[0].lanes[0].steps > 0 and both.replicas[0].lanes[1].prefilling == {}
    step = 0.01 + 1e-4  # request 0's decode step alone: its own time, back to back
    assert r_alone.completion_s[0] == pytest.approx(r_alone.first_token_s[0] + 199 * step)
    # with the neighbour's 8 prefill iterations (0.01 + 512e-4 = 0.0612 s each, 0.0306 s per stage) in the pipeline,
    # each of request 0's steps waits for stage 0 behind a chunk: the pair goes at the chunk's pace, so about 8 of
    # its steps take 0.0612 s instead of 0.0101 s
    chunk = 0.01 + 512e-4
    delay = r_both.completion_s[0] - r_alone.completion_s[0]
    assert delay == pytest.approx(8 * (chunk - step), rel=0.1)
    # the old model (lanes independent) would not delay it at all; a decode step never exceeds the chunk's pace
    tpot_both = (r_both.completion_s[0] - r_both.first_token_s[0]) / 199
    assert step < tpot_both < step + 8 * chunk / 199


def test_fast_forward_equals_single_step_with_three_stages():
    w = poisson_workload(300, rate=12.0, seed=3)
    fast, sf = run(w, pp=3, kv=9000)
    slow, ss = run(w, pp=3, kv=9000, force=True)
    assert fast.equals(slow)
    assert sf.events < ss.events


@pytest.mark.parametrize("pp", [2, 3])
def test_stages_are_exclusive_and_at_most_pp_micro_batches_in_flight(pp):
    """Per-iteration stepping: every micro-batch enters the pipeline through _pipe_submit; rebuild each one's
    stage intervals from the stage state it found and check that no two overlap on any stage, that each passes
    the stages in order, and that at most pp are in flight at once."""
    w = poisson_workload(250, rate=15.0, seed=4)
    sim = _sim(w, pp=pp, force=True)
    rep = sim.replicas[0]
    seen = []
    orig = sim._pipe_submit

    def spy(lane, decode_run):
        before = list(rep.stage_free)
        t_end = orig(lane, decode_run)
        x = (lane.run_a if decode_run else lane.run_time_s) / pp
        t, stages = sim.now, []
        for i in range(pp):
            s = max(t, before[i])
            stages.append((s, s + x))
            t = s + x
        assert t == pytest.approx(t_end)
        seen.append((sim.now, t_end, stages))
        return t_end

    sim._pipe_submit = spy
    rec = sim.run(make_controller("round_robin", "sarathi"))
    assert rec.completed.all() and len(seen) > 500
    waited = 0
    for i in range(pp):
        iv = sorted(st[i] for _, _, st in seen)
        assert all(b[0] >= a[1] - 1e-12 for a, b in zip(iv, iv[1:]))  # stage i holds one micro-batch at a time
    for sub, end, st in seen:
        assert st[0][0] >= sub and all(st[i + 1][0] >= st[i][1] for i in range(pp - 1))
        waited += st[0][0] > sub + 1e-12
    assert waited > 0  # micro-batches did queue for stage 0
    events = sorted([(s, 1) for s, _, _ in seen] + [(e, -1) for _, e, _ in seen])
    assert max(np.cumsum([d for _, d in events])) <= pp


def test_pp1_has_no_pipeline_state():
    w = poisson_workload(100, rate=8.0, seed=5)
    rec, sim = run(w, pp=1)
    assert rec.completed.all()
    for r in sim.replicas:
        assert r.stage_free == [0.0] and all(l.pipe == 0 and l.run_o == l.t0 for l in r.lanes)


def test_coupled_decode_runs_stay_coalesced_with_two_stages():
    """With pp == 2 both lanes decode most of the time; leader and follower runs keep that to a fraction of the
    per-iteration events, with the same records."""
    w = poisson_workload(400, rate=6.0, seed=7)
    fast, sf = run(w, pp=2, kv=20000, replicas=1)
    slow, ss = run(w, pp=2, kv=20000, replicas=1, force=True)
    assert fast.equals(slow) and fast.completed.all()
    assert sf.events < 0.6 * ss.events


def test_a_rescheduled_lane_event_keeps_one_heap_entry_in_the_same_order():
    """A lane's end event moved later keeps its heap entry (Simulator._schedule): the same records, replica totals
    and final clock as one push per change, with fewer events."""
    import dataclasses
    import heapq

    from fleetwise.sim.simulator import LANE_DONE

    class OnePushPerChange(Simulator):
        def _schedule(self, lane):
            self._seq += 1
            lane.ev_seq = self._seq
            lane.version += 1
            lane.ev_t = lane.t_end
            heapq.heappush(self._heap, (lane.t_end, LANE_DONE, self._seq, lane, lane.version))

    w = poisson_workload(400, rate=9.0, seed=3)  # (a replaced event sets the final clock here)
    out = []
    for cls in (Simulator, OnePushPerChange):
        reps = [make_replica(i, LinearPerf(kv_tokens=20000, pp=2), block_tokens=16) for i in range(2)]
        sim = cls(reps, w, options=SimOptions(check_invariants=True))
        out.append((sim.run(make_controller("round_robin", "sarathi")), sim))
    (ra, a), (rb, b) = out
    for f in dataclasses.fields(ra):
        assert np.array_equal(getattr(ra, f.name), getattr(rb, f.name), equal_nan=getattr(ra, f.name).dtype.kind == "f")
    assert a.now == b.now
    assert [(r.busy_s, r.kv_token_s, r.flops) for r in a.replicas] == [(r.busy_s, r.kv_token_s, r.flops) for r in b.replicas]
    assert a.events < 0.9 * b.events


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding_tokens"])
def test_compacting_the_event_heap_changes_nothing(router, monkeypatch):
    """Lane end events that a cut run left behind are dropped from the heap once it outgrows twice its last size
    (checked at each arrival, not at each lane event): a large fleet's heap stays near its live events, and the
    run is the same event for event (here compacted far more often than a real run is)."""
    w = poisson_workload(1500, rate=60.0, seed=4)
    ref, s_ref = run(w, replicas=12, pp=2, kv=9000, router=router)
    calls = []
    orig = Simulator._compact

    def counted(self):
        calls.append(len(self._heap))
        orig(self)

    monkeypatch.setattr(Simulator, "COMPACT_MIN", 6)
    monkeypatch.setattr(Simulator, "_compact", counted)
    got, s_got = run(w, replicas=12, pp=2, kv=9000, router=router)
    assert len(calls) > 10
    assert got.equals(ref) and s_got.now == s_ref.now
    assert s_got.events < s_ref.events  # the dropped entries are never popped
