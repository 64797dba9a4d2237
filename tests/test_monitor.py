"""Monitoring time series: columns, Prometheus/OpenMetrics text, Parquet, plots (fleetwise.platform.monitor)."""

import math
import sys
from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest

from fleetwise.errors import InputError
from fleetwise.platform.monitor import (
    COLUMNS,
    Monitor,
    escape_label_value,
    pareto_front,
    plot_monitor,
    plot_pareto,
)

TRICKY = 'a"b\\c\nd'  # a quote, a backslash and a newline in one label value
FAMILIES = {
    "fleetwise_replicas": "gauge",
    "fleetwise_queue_requests": "gauge",
    "fleetwise_running_requests": "gauge",
    "fleetwise_kv_cache_usage_ratio": "gauge",
    "fleetwise_gpu_busy_ratio": "gauge",
    "fleetwise_arrivals_per_second": "gauge",
    "fleetwise_ttft_p90_seconds": "gauge",
    "fleetwise_spot_available_replicas": "gauge",
    "fleetwise_requests_completed_total": "counter",
    "fleetwise_requests_rejected_total": "counter",
    "fleetwise_cost_usd_total": "counter",
}


def _monitor(steps: int = 30) -> Monitor:
    mon = Monitor(interval_s=10.0)
    mon.register("8b-od", model="llama-8b", region="us-east-1", zone="us-east-1a", pool="on-demand")
    mon.register("8b-spot", model="llama-8b", region="us-east-1", zone="us-east-1a", pool="spot")
    rng = np.random.default_rng(0)
    cost = defaultdict(float)
    for k in range(steps):
        t = 10.0 * k
        for g in ("8b-od", "8b-spot"):
            spot = g.endswith("spot")
            cost[g] += 0.01 * (1 if spot else 3)
            mon.add(t, g, replicas_ready=2 if not spot or k < 15 else 0, replicas_starting=int(spot and k == 20),
                    waiting=int(rng.integers(0, 9)), running=4, kv_used=0.25 + 0.01 * k, busy=0.5,
                    arrivals_rps=1.5, completed=int(rng.integers(0, 4)), rejected=int(k == 16),
                    ttft_p90_s=math.nan if k == 0 else 0.2, cost_usd=cost[g], spot_available=(3 if k < 15 else 0)
                    if spot else -1)
        # a group with labels given per row, including the tricky one
        mon.add(t, "70b", model=TRICKY, region="us-west-2", zone="us-west-2b", pool="on-demand", replicas_ready=1,
                completed=1, cost_usd=0.05 * (k + 1))
    return mon


# ---------------------------------------------------------------------------------------------------------------
# columns
# ---------------------------------------------------------------------------------------------------------------
def test_table_columns_defaults_and_labels():
    mon = _monitor(5)
    tab = mon.table()
    assert list(tab) == list(COLUMNS) and len(mon) == 15 and all(len(v) == 15 for v in tab.values())
    assert tab["time_s"].dtype == np.float64 and tab["replicas_ready"].dtype == np.int64
    assert mon.groups() == ["8b-od", "8b-spot", "70b"]
    od = tab["group"] == "8b-od"
    assert set(tab["pool"][od]) == {"on-demand"} and set(tab["zone"][od]) == {"us-east-1a"}
    assert set(tab["spot_available"][od]) == {-1} and set(tab["spot_available"][tab["group"] == "8b-spot"]) == {3}
    assert set(tab["model"][tab["group"] == "70b"]) == {TRICKY}
    g70 = tab["group"] == "70b"
    assert np.isnan(tab["ttft_p90_s"][g70]).all() and set(tab["waiting"][g70]) == {0}  # defaults
    with pytest.raises(InputError, match="monitor column 'queue': unknown"):
        mon.add(0.0, "8b-od", queue=3)
    with pytest.raises(InputError, match="finite"):
        mon.add(math.nan, "8b-od")


def test_add_many_matches_add_and_grows():
    a, b = Monitor(capacity=16), Monitor(capacity=16)
    groups = [f"g{i}" for i in range(7)]
    for g in groups:
        a.register(g, model="m", pool="spot" if g > "g3" else "on-demand")
        b.register(g, model="m", pool="spot" if g > "g3" else "on-demand")
    for k in range(10):  # 70 rows: grows past the initial capacity
        vals = np.arange(7) + k
        a.add_many(k * 5.0, groups, replicas_ready=vals, busy=vals / 20, cost_usd=vals * 0.5, region="r1")
        for i, g in enumerate(groups):
            b.add(k * 5.0, g, replicas_ready=int(vals[i]), busy=vals[i] / 20, cost_usd=vals[i] * 0.5, region="r1")
    ta, tb = a.table(), b.table()
    for c in COLUMNS:
        np.testing.assert_array_equal(ta[c], tb[c])
    with pytest.raises(InputError, match="3 values for 7 groups"):
        a.add_many(60.0, groups, waiting=[1, 2, 3])


# ---------------------------------------------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------------------------------------------
def test_parquet_round_trip(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    mon = _monitor()
    path = mon.to_parquet(tmp_path / "sub" / "monitor.parquet")
    assert sorted(p.name for p in path.parent.iterdir()) == ["monitor.parquet"]  # no temporary file left
    back = pq.read_table(path)
    assert back.column_names == list(COLUMNS) and back.num_rows == len(mon)
    tab = mon.table()
    for c in COLUMNS:
        got = back.column(c).to_numpy(zero_copy_only=False)
        if tab[c].dtype == object:
            assert got.tolist() == tab[c].tolist()
        else:
            np.testing.assert_array_equal(got, tab[c])  # NaN == NaN here
            assert got.dtype == tab[c].dtype
    again = Monitor.read_parquet(path)
    assert again.interval_s == 10.0
    for c in COLUMNS:
        np.testing.assert_array_equal(again.table()[c], tab[c])


def test_parquet_without_pyarrow_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(InputError, match=r"needs pyarrow: pip install .*\[parquet\]"):
        _monitor(2).to_parquet(tmp_path / "m.parquet")


# ---------------------------------------------------------------------------------------------------------------
# Prometheus text
# ---------------------------------------------------------------------------------------------------------------
def test_label_escaping():
    assert escape_label_value(TRICKY) == 'a\\"b\\\\c\\nd'
    assert escape_label_value("plain") == "plain"


def test_prometheus_text_structure(tmp_path):
    mon = _monitor()
    text = mon.to_prometheus(tmp_path / "m.prom", epoch_s=1_700_000_000.0)
    assert (tmp_path / "m.prom").read_text() == text
    lines = text.splitlines()
    for fam, kind in FAMILIES.items():  # one HELP and one TYPE per family, TYPE right after HELP
        assert sum(ln.startswith(f"# HELP {fam} ") for ln in lines) == 1
        i = lines.index(f"# TYPE {fam} {kind}")
        assert lines[i - 1].startswith(f"# HELP {fam} ")
    assert 'model="a\\"b\\\\c\\nd"' in text and TRICKY not in text  # escaped; no raw newline inside a label
    samples = [ln for ln in lines if not ln.startswith("#")]
    # 3 groups x 30 steps: 3 replica states + 9 one-value families, spot only for the spot group
    assert len(samples) == 90 * 3 + 90 * 9 + 30
    stamps = {int(ln.rsplit(" ", 1)[1]) for ln in samples}
    assert min(stamps) == 1_700_000_000_000 and max(stamps) == 1_700_000_000_000 + 290_000
    assert 'fleetwise_replicas{group="8b-spot",model="llama-8b",region="us-east-1",zone="us-east-1a",pool="spot",' \
           'state="ready"} 2 1700000000000' in lines


def test_prometheus_parses_and_counters_are_monotone():
    parser = pytest.importorskip("prometheus_client.parser")
    mon = _monitor()
    fams = {f.name: f for f in parser.text_string_to_metric_families(mon.to_prometheus(epoch_s=100.0))}
    # the parser names counter families without "_total"
    assert set(fams) == {f.removesuffix("_total") if k == "counter" else f for f, k in FAMILIES.items()}
    assert {f.type for f in fams.values()} == {"gauge", "counter"}
    assert {s.labels["model"] for s in fams["fleetwise_replicas"].samples} == {"llama-8b", TRICKY}
    assert {s.labels["state"] for s in fams["fleetwise_replicas"].samples} == {"ready", "starting", "draining"}
    assert all(s.timestamp is not None for f in fams.values() for s in f.samples)
    for name in ("fleetwise_requests_completed", "fleetwise_requests_rejected", "fleetwise_cost_usd"):
        series = defaultdict(list)
        for s in fams[name].samples:
            assert s.name == name + "_total"
            series[s.labels["group"]].append((s.timestamp, s.value))
        assert set(series) == {"8b-od", "8b-spot", "70b"}
        for pts in series.values():
            pts.sort()
            assert all(b[1] >= a[1] for a, b in pairwise(pts))
    tab = mon.table()
    od = tab["group"] == "8b-od"
    last = max((s for s in fams["fleetwise_requests_completed"].samples if s.labels["group"] == "8b-od"),
               key=lambda s: s.timestamp)
    assert last.value == tab["completed"][od].sum() and float(last.timestamp) == pytest.approx(100.0 + 290.0)
    spot = fams["fleetwise_spot_available_replicas"].samples
    assert {s.labels["group"] for s in spot} == {"8b-spot"}
    ttft = [s.value for s in fams["fleetwise_ttft_p90_seconds"].samples]
    assert sum(math.isnan(v) for v in ttft) == 2 + 30  # first sample of the 8b groups, every 70b sample


def test_openmetrics_parses():
    parser = pytest.importorskip("prometheus_client.openmetrics.parser")
    text = _monitor(4).to_prometheus(epoch_s=5.0, openmetrics=True)
    assert text.endswith("# EOF\n") and "# TYPE fleetwise_cost_usd counter" in text
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert "fleetwise_cost_usd" in fams and len(fams) == len(FAMILIES)


def test_decreasing_counter_is_an_error():
    mon = Monitor()
    mon.add(0.0, "g", cost_usd=2.0)
    mon.add(10.0, "g", cost_usd=1.0)
    with pytest.raises(InputError, match="'cost_usd' of group 'g' decreases at t=10 s"):
        mon.to_prometheus()
    assert Monitor().to_prometheus() == ""


# ---------------------------------------------------------------------------------------------------------------
# plots and the Pareto front
# ---------------------------------------------------------------------------------------------------------------
def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 5000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_monitor_writes_png(tmp_path):
    mon = _monitor()
    p = plot_monitor(mon, tmp_path / "monitor.png", "Test fleet",
                     events=[(150.0, "spot preemption"), (200.0, "fault: replica crash"), (210.0, "spot preemption")])
    assert _is_png(p)
    assert _is_png(plot_monitor(Monitor(), tmp_path / "empty.png", "Nothing sampled"))


def test_pareto_front_hand_made():
    pts = [
        ("a", 1.0, 0.50),  # cheapest
        ("b", 2.0, 0.80),
        ("c", 2.0, 0.70),  # same cost as b, lower attainment: dominated
        ("d", 3.0, 0.80),  # same attainment as b, dearer: dominated
        ("e", 4.0, 0.95, (3.5, 4.5), (0.9, 0.99)),
        ("f", 5.0, 0.90),  # dearer and worse than e
        ("g", 2.0, 0.80),  # identical to b: neither dominates the other
        ("h", math.nan, 0.99),  # no cost: left out
    ]
    assert pareto_front(pts) == ["a", "b", "g", "e"]
    assert pareto_front([]) == [] and pareto_front([("x", 1.0, 0.1)]) == ["x"]
    with pytest.raises(InputError, match="expected \\(label, cost_per_mtok_usd, slo_attainment"):
        pareto_front([("x", 1.0)])


def test_plot_pareto_writes_png(tmp_path):
    pts = [("rr", 3.1, 0.82, (2.9, 3.3), (0.79, 0.85)), ("ll", 2.8, 0.9, None, (0.88, 0.92)), ("spot", 1.9, 0.71),
           ("od", 4.2, 0.96, (4.0, 4.4), None)]
    assert _is_png(plot_pareto(pts, tmp_path / "pareto.png"))
    assert plot_pareto([("none", math.nan, 0.5)], tmp_path / "empty.png").stat().st_size > 0
