"""Spot capacity from the real traces (fleetwise.platform.spot)."""

import json
import math
from itertools import pairwise

import numpy as np
import pytest

from fleetwise.errors import InputError
from fleetwise.platform import spot as sp

needs_data = pytest.mark.skipif(not sp.data_available(), reason=f"real dataset {sp.DATASET} not found")


def _synthetic(counts, max_count, gap_s=10.0, cloud="aws") -> sp.SpotTrace:
    c = np.asarray(counts, dtype=np.int64)
    return sp.SpotTrace(name="test/zone-1a_x", zone="zone-1a", cloud=cloud, kind="availability", instance="x",
                        gap_s=gap_s, counts=c, max_count=max_count)


def _raw(root, rel):
    """(gap, counts) straight from the JSON file, without the module."""
    d = json.loads((root / sp.DATASET / rel).read_text())
    return d["metadata"]["gap_seconds"], d["data"]


# ---------------------------------------------------------------------------------------------------------------
# Without data: scaling, looping, step changes, defaults
# ---------------------------------------------------------------------------------------------------------------
def test_available_scales_counts_to_capacity():
    t = _synthetic([0, 1, 2, 3, 4, 4, 2], max_count=4)
    assert list(t.scaled(4)) == [0, 1, 2, 3, 4, 4, 2]
    assert list(t.scaled(2)) == [0, 1, 1, 2, 2, 2, 1]  # 0.5 and 1.5 round half up
    assert list(t.scaled(3)) == [0, 1, 2, 2, 3, 3, 2]
    assert list(t.scaled(0)) == [0] * 7
    assert t.available(0.0, 8) == 0 and t.available(25.0, 8) == 4 and t.available(49.999, 8) == 8 and t.available(65.0, 8) == 4
    binary = _synthetic([1, 0, 1], max_count=1)
    assert {binary.available(x, 5) for x in (0, 15, 25)} == {0, 5}
    with pytest.raises(InputError, match="capacity"):
        t.scaled(-1)


def test_offset_loop_and_clamp():
    t = _synthetic([0, 1, 2, 3, 4], max_count=4)  # period 50 s
    assert t.available(0.0, 4, offset_s=20.0) == 2
    assert t.available(55.0, 4) == t.available(5.0, 4) == 0  # loops
    assert t.available(-5.0, 4) == 4  # a negative time wraps to the last tick
    assert t.available(55.0, 4, loop=False) == 4  # holds the last tick
    assert t.available(-5.0, 4, loop=False) == 0  # and the first before the start
    assert t.available(1000.0, 4, offset_s=20.0, loop=False) == 4


def test_changes_agree_with_available():
    rng = np.random.default_rng(3)
    t = _synthetic(rng.integers(0, 5, size=37), max_count=4, gap_s=7.0)
    for cap, off, start, end in [(4, 0.0, 0.0, 500.0), (3, 200.0, -30.0, 700.0), (1, 12.5, 3.0, 40.0)]:
        ch = t.changes(start, end, cap, offset_s=off)
        assert all(start < x <= end for x, _ in ch) and [x for x, _ in ch] == sorted(x for x, _ in ch)
        prev = t.available(start, cap, off)
        for x, v in ch:
            assert v != prev and t.available(x, cap, off) == v
            assert t.available(x - 1e-6, cap, off) == prev
            prev = v
        # nothing missed: probing every 0.5 s shows exactly the steps listed
        grid = np.arange(start + 0.25, end, 0.5)
        vals = [t.available(g, cap, off) for g in grid]
        steps = sum(1 for a, b in pairwise(vals) if a != b) + (vals[0] != t.available(start, cap, off))
        assert steps == len([x for x, _ in ch if x < grid[-1]])


def test_changes_wrap_and_no_loop():
    t = _synthetic([1, 1, 0, 0], max_count=1, gap_s=10.0)  # 40 s period, 1 -> 0 at 20, 0 -> 1 at 40
    assert t.changes(0.0, 100.0, 2) == [(20.0, 0), (40.0, 2), (60.0, 0), (80.0, 2), (100.0, 0)]
    assert t.changes(0.0, 100.0, 2, loop=False) == [(20.0, 0)]
    assert t.changes(0.0, 100.0, 2, offset_s=15.0) == [(5.0, 0), (25.0, 2), (45.0, 0), (65.0, 2), (85.0, 0)]
    assert t.changes(50.0, 50.0, 2) == [] and t.changes(0.0, 100.0, 0) == []
    assert _synthetic([3, 3, 3], max_count=4).changes(0.0, 1e6, 4) == []


def test_notice_constants():
    assert sp.AWS_INTERRUPTION_NOTICE_S == 120.0
    assert sp.GCP_PREEMPTION_NOTICE_S == 30.0 and sp.AZURE_EVICTION_NOTICE_S == 30.0
    assert _synthetic([1], 1, cloud="gcp").notice_s == 30.0 and _synthetic([1], 1).notice_s == 120.0


def test_default_trace_for_zone_needs_no_data():
    assert sp.spot_trace_for_zone("us-east-1a") == "aws-02-15-2023/us-east-1a_v100_1"
    assert sp.spot_trace_for_zone("us-west-2b") == "aws-02-15-2023/us-west-2b_v100_1"
    assert sp.spot_trace_for_zone("us-central1-a") == "spothedge-gcp1/us-central1-a_a100_40gb_8"
    assert sp.spot_trace_for_zone("us-central1-c") == "gcp-04-30-2023/us-central1-c_c3-88"  # only trace there
    assert sp.spot_trace_for_zone("us-east-1b") == "aws-04-19-2023/us-east-1b_intel_64"
    assert sp.spot_trace_for_zone("US-WEST-2").startswith("aws-02-15-2023/us-west-2")  # a region: one of its zones
    assert sp.spot_trace_for_zone("europe-west4") == "spothedge-gcp1/europe-west4-a_a100_40gb_8"
    assert sp.spot_trace_for_zone("eastus") is None and sp.spot_trace_for_zone("mars-1a") is None
    assert sp.region_of_zone("us-east-1a") == "us-east-1" and sp.region_of_zone("asia-northeast1-a") == "asia-northeast1"
    assert len(sp.SPOT_TRACES) == 40


def test_missing_dataset_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETWISE_DATA", str(tmp_path))
    with pytest.raises(InputError, match="spot-availability-multiregion: file not found"):
        sp.load_spot_trace("aws-02-15-2023/us-east-1a_v100_1")
    with pytest.raises(InputError, match="expected '<date folder>/<zone>_<instance>'"):
        sp.load_spot_trace("us-east-1a")


def test_bad_file_names_the_file(tmp_path, monkeypatch):
    d = tmp_path / sp.DATASET / sp.SPOTHEDGE_DIR
    d.mkdir(parents=True)
    (d / "zz-east1-a_a100_40gb_8.json").write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, -2]}))
    (d / "zz-east1-b_a100_40gb_8.json").write_text("{not json")
    monkeypatch.setenv("FLEETWISE_DATA", str(tmp_path))
    with pytest.raises(InputError, match=r"zz-east1-a_a100_40gb_8.json: data\[1\] = -2"):
        sp.load_spot_trace("spothedge-gcp1/zz-east1-a_a100_40gb_8")
    with pytest.raises(InputError, match="zz-east1-b_a100_40gb_8.json: not JSON"):
        sp.load_spot_trace("spothedge-gcp1/zz-east1-b_a100_40gb_8")


# ---------------------------------------------------------------------------------------------------------------
# Real data
# ---------------------------------------------------------------------------------------------------------------
@needs_data
def test_constants_match_data():
    assert sp.spot_traces_from_data() == sp.SPOT_TRACES
    root = sp.dataset_dir()
    listed = [ln.split()[-1] for ln in (root / "SHA256SUMS").read_text().splitlines() if ln.strip()]
    assert len([p for p in listed if p.endswith(".json")]) == len(sp.list_spot_traces()) == 40


@needs_data
def test_list_and_load():
    infos = {i.name: i for i in sp.list_spot_traces()}
    i = infos["aws-02-15-2023/us-east-1a_v100_1"]
    assert (i.zone, i.cloud, i.kind, i.nodes, i.gap_s, i.ticks) == ("us-east-1a", "aws", "availability", 1, 195, 20158)
    g = infos["spothedge-gcp1/us-central1-a_a100_40gb_8"]
    assert (g.cloud, g.kind, g.nodes, g.gap_s, g.ticks, g.region) == ("gcp", "availability", 4, 150, 770, "us-central1")
    assert infos["aws-08-03-2023/us-west-2c_v100_1"].kind == "preemption"
    assert {i.nodes for i in infos.values()} == {1, 4, 16}
    t = sp.load_spot_trace("aws-08-27-2023/us-west-2c_v100_1.json")
    assert t.max_count == 16 and t.times_s[1] == 300.0 and len(t.times_s) == len(t.counts) == 4736
    with pytest.raises(InputError, match="did you mean aws-02-15-2023/us-east-1a_v100_1"):
        sp.load_spot_trace("aws-02-15-2023/us-east-1a_v100")


@needs_data
def test_stats_against_independent_computation(data_dir):
    avail = "skypilot-spot-traces/availability/1-node/aws-02-15-2023"
    for zone, provenance_mean in [("us-east-1a", 0.17), ("us-west-2b", 0.91)]:
        gap, counts = _raw(data_dir, f"{avail}/{zone}_v100_1.json")
        mean = sum(counts) / len(counts)
        drops = sum(1 for a, b in pairwise(counts) if b < a)
        st = sp.preemption_stats(sp.load_spot_trace(f"aws-02-15-2023/{zone}_v100_1"))
        assert abs(mean - provenance_mean) < 0.006
        assert st.mean_availability == pytest.approx(mean, abs=1e-12)
        assert st.preemption_events == st.preempted_nodes == drops
        hours = len(counts) * gap / 3600
        assert st.preemptions_per_hour == pytest.approx(drops / hours)
        assert st.mean_time_between_preemptions_h == pytest.approx(hours / drops)
        assert st.preemptions_per_node_hour == pytest.approx(drops / (sum(counts) * gap / 3600))
    # 4-node preemption trace: several nodes can go at once
    gap, counts = _raw(data_dir, "skypilot-spot-traces/preemption/4-node/aws-08-03-2023/us-west-2c_v100_1.json")
    st = sp.preemption_stats(sp.load_spot_trace("aws-08-03-2023/us-west-2c_v100_1"))
    assert st.preempted_nodes == sum(a - b for a, b in pairwise(counts) if b < a) > st.preemption_events
    # SpotHedge GCP1 (PROVENANCE: us-east1-b always 0, europe-west4-a mean 3.95 of 4)
    e = sp.preemption_stats(sp.load_spot_trace("spothedge-gcp1/us-east1-b_a100_40gb_8"))
    assert e.mean_availability == 0.0 and e.preemption_events == 0 and math.isinf(e.mean_time_between_preemptions_h)
    _, counts = _raw(data_dir, "spothedge-gcp1/europe-west4-a_a100_40gb_8.json")
    w = sp.preemption_stats(sp.load_spot_trace("spothedge-gcp1/europe-west4-a_a100_40gb_8"))
    assert round(sum(counts) / len(counts), 2) == 3.95 and w.mean_availability == pytest.approx(3.95 / 4, abs=0.005)


@needs_data
def test_real_trace_available_and_changes():
    t = sp.load_spot_trace("aws-02-15-2023/us-east-1a_v100_1")
    k = int(np.flatnonzero(t.counts)[0])  # first available tick
    assert t.available(k * 195.0 + 1.0, 6) == 6 and t.available(k * 195.0 - 1.0, 6) == 0
    day = t.changes(0.0, 86400.0, 6, offset_s=k * 195.0 - 3600.0)
    assert day and day[0] == (3600.0, 6) and all(v in (0, 6) for _, v in day)
    assert all(a[1] != b[1] for a, b in pairwise(day))  # strictly alternating steps
    # a window across the end of the trace wraps to its start
    end = t.duration_s
    wrap = t.changes(end - 10.0, end + 10.0, 1)
    assert (t.counts[0] != t.counts[-1]) == (wrap == [(end, int(t.counts[0]))])
    multi = sp.load_spot_trace("aws-08-27-2023/us-east-2b_v100_1")
    j = int(np.argmax(multi.counts == 8))
    assert multi.available(j * 300.0, 4) == 2 and multi.available(j * 300.0, 16) == 8
