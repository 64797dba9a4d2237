"""Heuristic autoscalers (issue 8) on hand-made observations, the group split, and the capacity estimate."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fakes import LinearPerf
from fleetwise.control.protocols import GroupState, ScaleObs, Scaler
from fleetwise.errors import InputError
from fleetwise.perf.capacity import capacity_rps
from fleetwise.policies import make, names
from fleetwise.policies.scalers import holt_forecast, split_replicas

NAN = float("nan")


def grp(key="m/a/od", model="m", zone="a", pool="on_demand", ready=1, starting=0, *, min_replicas=0,
        max_replicas=100, waiting=0, running=0, kv=0.0, busy=0.0, rps=0.0, cap=10.0, price=3.0, **kw) -> GroupState:
    return GroupState(key=key, model=model, gpu="A100-80GB", region="us-east-1", zone=zone, pool=pool, ready=ready,
                      starting=starting, draining=0, min_replicas=min_replicas, max_replicas=max_replicas,
                      waiting=waiting, running=running, kv_used=kv, busy=busy, arrivals_rps=rps, capacity_rps=cap,
                      price_usd_per_hour=price, **kw)


def obs(t, *groups, epoch=30.0):
    return ScaleObs(time_s=float(t), epoch_s=epoch, groups=list(groups))


def one(scaler, t, **kw):
    """Target of the single group "m/a/od" after one call."""
    return scaler.scale(obs(t, grp(**kw)))["m/a/od"]


NO_SPLIT = {"on_demand_floor": 0, "min_zones": 1}


# --------------------------------------------------------------------------------------------- registry
def test_registered_names_and_protocol():
    assert {"hpa", "slo_aware", "predictive", "static"} <= set(names("scaler"))
    for n in ("hpa", "slo_aware", "predictive", "static"):
        assert isinstance(make("scaler", n), Scaler)


@pytest.mark.parametrize("name,params", [
    ("hpa", {"bogus": 1}), ("slo_aware", {"headroom_pct": 20}), ("predictive", {"lead": 60}),
    ("hpa", {"metric": "gpu"}), ("hpa", {"target": 0}), ("predictive", {"alpha": 1.5}),
    ("slo_aware", {"drain_s": 0}), ("static", {"replicas": -1}),
])
def test_bad_parameters_are_input_errors(name, params):
    with pytest.raises(InputError):
        make("scaler", name, params, where="scenario.yaml: ")


# --------------------------------------------------------------------------------------------- static
def test_static_keeps_initial_replicas_and_replaces_lost_ones():
    s = make("scaler", "static")
    a, b = grp("m/a/spot", pool="spot", ready=3), grp("m/b/od", zone="b", ready=0, min_replicas=2)
    assert s.scale(obs(0, a, b)) == {"m/a/spot": 3, "m/b/od": 2}
    a.ready, a.busy, a.arrivals_rps = 1, 1.0, 500.0  # spot reclaimed two, load soars: no change
    assert s.scale(obs(30, a, b)) == {"m/a/spot": 3, "m/b/od": 2}
    assert make("scaler", "static", {"replicas": 5}).scale(obs(0, a, b)) == {"m/a/spot": 5, "m/b/od": 5}


def test_static_answers_within_each_groups_bounds():
    """Static answered its fixed target whatever the group's bounds: the decision service (which, unlike the
    platform, does not clamp) told a group of max_replicas 3 to run 10 (found by fuzzing, 2026-12-06). It now
    answers within [min_replicas, max_replicas] and ``available``, as every other scaler, and keeps its target."""
    s = make("scaler", "static", {"replicas": 10})
    a, b = grp("m/a/od", max_replicas=3), grp("m/b/spot", zone="b", pool="spot", available=4)
    assert s.scale(obs(0, a, b)) == {"m/a/od": 3, "m/b/spot": 4}
    b.available = None  # the spot pool has capacity again: back to the target
    assert s.scale(obs(30, a, b)) == {"m/a/od": 3, "m/b/spot": 10}
    cols = {"key": ["m/a/od", "m/b/spot"], "ready": [1, 1], "starting": [0, 0], "min_replicas": [0, 12],
            "max_replicas": [3, 20], "available": [None, None]}
    assert make("scaler", "static", {"replicas": 10}).scale(ScaleObs(0.0, 30.0, [a, b], cols)) == \
        {"m/a/od": 3, "m/b/spot": 12}


# --------------------------------------------------------------------------------------------- HPA
def test_hpa_tolerance_and_proportional_rule():
    hpa = make("scaler", "hpa", {"metric": "busy", "target": 0.7, **NO_SPLIT})
    assert one(hpa, 0, ready=4, busy=0.75, rps=1) == 4  # ratio 1.07: within 10%
    assert one(hpa, 30, ready=4, busy=0.66, rps=1) == 4  # ratio 0.94
    assert one(hpa, 60, ready=4, busy=0.8, rps=1) == 5  # ceil(4 * 0.8 / 0.7) = ceil(4.57)
    kv = make("scaler", "hpa", {"metric": "kv", **NO_SPLIT})
    assert one(kv, 0, ready=3, kv=0.95, busy=0.1, rps=1) == 5  # ceil(3 * 0.95 / 0.7) = ceil(4.07)


def test_hpa_rising_load_within_rate_limit():
    hpa = make("scaler", "hpa", {"target": 0.1, **NO_SPLIT})
    n, seen = 2, []
    for k in range(5):
        n = one(hpa, 30 * k, ready=n, busy=1.0, rps=100)  # wants 10x every epoch; gets at most +100% or +4
        seen.append(n)
    assert seen == [6, 12, 24, 48, 96]  # max(2x, +4): 2 -> 6 (+4), then doubling
    capped = make("scaler", "hpa", {"target": 0.1, "scale_up_factor": 1.5, "scale_up_pods": 1, **NO_SPLIT})
    assert one(capped, 0, ready=10, busy=1.0, rps=1) == 15


def test_hpa_starting_replicas_count_as_idle_when_scaling_up():
    hpa = make("scaler", "hpa", {"target": 0.7, **NO_SPLIT})
    # 2 ready at 0.9 (ratio 1.29) but 2 more starting: (1.8 / 4) / 0.7 = 0.64 reverses the direction: hold
    assert one(hpa, 0, ready=2, starting=2, busy=0.9, rps=1) == 4
    # 2 ready at 1.0 + 1 starting: (2.0 / 3) / 0.7 = 0.95 is within the tolerance: hold
    assert one(hpa, 30, ready=2, starting=1, busy=1.0, rps=1) == 3
    # 4 ready at 1.0 + 1 starting: ratio 1.14 -> ceil(4.0 / 0.7) = 6
    assert one(hpa, 60, ready=4, starting=1, busy=1.0, rps=1) == 6
    # nothing ready yet: no metric, no change
    assert one(hpa, 90, ready=0, starting=3, busy=NAN, rps=1) == 3


def test_hpa_queue_metric():
    hpa = make("scaler", "hpa", {"metric": "queue", "target": 2.0, **NO_SPLIT})
    assert one(hpa, 0, ready=2, waiting=12, rps=5) == 6  # 6 waiting per replica / 2 -> 3x, capped at max(4, 2+4)
    assert one(hpa, 30, ready=10, waiting=21, rps=5) == 10  # 2.1 per replica: within tolerance


def test_hpa_stabilization_window_delays_scale_down():
    hpa = make("scaler", "hpa", {"target": 0.7, "downscale_window_s": 300, **NO_SPLIT})
    assert one(hpa, 0, ready=8, busy=0.7, rps=1) == 8
    assert one(hpa, 30, ready=8, busy=0.4, rps=1) == 8  # wants ceil(8*0.4/0.7) = 5, but 8 is in the window
    for t in range(60, 300, 30):
        assert one(hpa, t, ready=8, busy=0.1, rps=1) == 8  # wants 2
    assert one(hpa, 300, ready=8, busy=0.1, rps=1) == 5  # t=0 left the window: the highest left is t=30's 5
    assert one(hpa, 330, ready=5, busy=0.16, rps=1) == 2
    # scale-up is not delayed by the window
    assert one(hpa, 360, ready=2, busy=1.0, rps=1) == 3


def test_scale_up_window_acts_on_a_rise_only_once_every_epoch_of_the_window_sees_it():
    """upscale_window_s (HPA's behavior.scaleUp.stabilizationWindowSeconds): the lowest recommendation of the last
    window counts, so a one-epoch burst scales nothing up and a lasting rise one epoch later; 0 (the default) is
    the rule as before, epoch for epoch."""
    plain = make("scaler", "slo_aware", {"downscale_window_s": 120, **NO_SPLIT})
    up = make("scaler", "slo_aware", {"downscale_window_s": 120, "upscale_window_s": 60, **NO_SPLIT})
    same = make("scaler", "slo_aware", {"downscale_window_s": 120, "upscale_window_s": 0, **NO_SPLIT})
    rates = [10.0, 10.0, 50.0, 10.0, 10.0, 10.0, 10.0, 10.0, 50.0, 50.0, 50.0, 10.0]
    ready_p = ready_u = 2
    got_p, got_u = [], []
    for k, r in enumerate(rates):
        t = 30 * k
        ready_p = one(plain, t, ready=ready_p, rps=r)
        ready_u = one(up, t, ready=ready_u, rps=r)
        assert one(same, t, ready=got_p[-1] if got_p else 2, rps=r) == ready_p
        got_p.append(ready_p)
        got_u.append(ready_u)
    # 10 rps * 1.2 / 10 -> 2 replicas; 50 rps -> 6
    assert got_p == [2, 2, 6, 6, 6, 6, 2, 2, 6, 6, 6, 6]  # the burst at t=60 is held for the scale-down window
    assert got_u == [2, 2, 2, 2, 2, 2, 2, 2, 2, 6, 6, 6]  # ignored; the rise at t=240 acted on at t=270
    hpa = make("scaler", "hpa", {"target": 0.7, "upscale_window_s": 60, **NO_SPLIT})
    assert one(hpa, 0, ready=2, busy=0.7, rps=1) == 2
    assert one(hpa, 30, ready=2, busy=1.0, rps=1) == 2  # wants 3 for one epoch
    assert one(hpa, 60, ready=2, busy=1.0, rps=1) == 3  # seen twice
    with pytest.raises(InputError, match="upscale_window_s"):
        make("scaler", "slo_aware", {"upscale_window_s": -1})


def test_scale_up_window_holds_back_a_one_epoch_rise_behind_zone_redundancy():
    """A zone-redundant scaler's current capacity counts the spare zone, so HPA's test (up only above the current
    replicas) would let a one-epoch rise through: the window acts on the recommendation itself."""
    def run(params):
        s = make("scaler", "slo_aware", {"downscale_window_s": 120, **params})
        ra = rb = 1
        out = []
        for k, r in enumerate([5.0, 5.0, 40.0, 5.0, 5.0, 5.0, 5.0, 5.0]):
            tg = s.scale(obs(30 * k, grp("m/a/od", zone="a", ready=ra, rps=r / 2),
                             grp("m/b/od", zone="b", ready=rb, rps=r / 2)))
            ra, rb = tg["m/a/od"], tg["m/b/od"]
            out.append(ra + rb)
        return out

    assert run({}) == [2, 2, 6, 6, 6, 6, 2, 2]  # one epoch at 40 rps: 3 replicas in each zone for the window
    assert run({"upscale_window_s": 60}) == [2] * 8


def test_hpa_keeps_one_replica_or_scales_to_zero_and_back():
    hpa = make("scaler", "hpa", NO_SPLIT)
    for t in range(0, 2000, 60):
        n = one(hpa, t, ready=1, busy=0.0, rps=0.0)
    assert n == 1  # HPA cannot scale to zero
    z = make("scaler", "hpa", {"scale_to_zero": True, "idle_s": 300, **NO_SPLIT})
    assert one(z, 0, ready=2, busy=0.0, rps=0.0) == 1  # idle metric: down to one, not zero
    assert one(z, 240, ready=1, busy=0.0, rps=0.0) == 1
    assert one(z, 300, ready=1, busy=0.0, rps=0.0) == 0  # after idle_s without demand
    assert one(z, 330, ready=0, rps=0.0) == 0
    assert one(z, 360, ready=0, waiting=3, rps=0.1) == 1  # scale from zero: requests are held for a replica
    q = make("scaler", "hpa", {"metric": "queue", "scale_to_zero": True, **NO_SPLIT})
    assert one(q, 0, ready=0, waiting=6, rps=1.0) == 3  # ceil(6 / 2)
    assert one(q, 30, ready=0, waiting=50, rps=1.0) == 4  # from 0: at most +4 per epoch


def test_hpa_computes_per_model_over_groups():
    hpa = make("scaler", "hpa", {"target": 0.5, "on_demand_floor": 1, "min_zones": 2})
    spot = grp("m/a/spot", pool="spot", zone="a", ready=2, busy=1.0, rps=10, price=1.0, available=10)
    od = grp("m/b/od", zone="b", ready=1, busy=1.0, rps=10, price=3.0)
    other = grp("x/a/od", model="x", ready=1, busy=0.5, rps=1)
    out = hpa.scale(obs(0, spot, od, other))
    assert out == {"m/a/spot": 5, "m/b/od": 1, "x/a/od": 1}  # m: ceil(3 / 0.5) = 6, the floor on demand


# --------------------------------------------------------------------------------------------- split
def test_split_prefers_spot_capped_by_available():
    spot = grp("m/a/spot", pool="spot", price=1.0, available=3, ready=0)
    od = grp("m/a/od", price=3.0, ready=0)
    assert split_replicas([od, spot], 5, **NO_SPLIT) == {"m/a/od": 2, "m/a/spot": 3}
    spot.available = 0  # spot gone
    assert split_replicas([od, spot], 5, **NO_SPLIT) == {"m/a/od": 5, "m/a/spot": 0}
    spot.available, spot.max_replicas = None, 4
    assert split_replicas([od, spot], 5, **NO_SPLIT) == {"m/a/od": 1, "m/a/spot": 4}


def test_split_on_demand_floor_and_zone_spread():
    spot_a = grp("m/a/spot", pool="spot", zone="a", price=1.0, ready=0)
    spot_b = grp("m/b/spot", pool="spot", zone="b", price=1.2, ready=0)
    od_a = grp("m/a/od", zone="a", price=3.0, ready=0)
    g = [spot_a, spot_b, od_a]
    assert split_replicas(g, 4, on_demand_floor=0, min_zones=1) == {"m/a/spot": 4, "m/b/spot": 0, "m/a/od": 0}
    assert split_replicas(g, 4, on_demand_floor=0, min_zones=2) == {"m/a/spot": 3, "m/b/spot": 1, "m/a/od": 0}
    # the on-demand replica (zone a) comes first; spreading then sends the next to zone b
    assert split_replicas(g, 4, on_demand_floor=1, min_zones=2) == {"m/a/spot": 2, "m/b/spot": 1, "m/a/od": 1}
    assert split_replicas(g, 1, on_demand_floor=2, min_zones=2) == {"m/a/spot": 0, "m/b/spot": 0, "m/a/od": 2}
    # a model with no on-demand group: the floor does not apply
    assert split_replicas([spot_a, spot_b], 1, on_demand_floor=1) == {"m/a/spot": 1, "m/b/spot": 0}
    # scaled to zero: only the groups' minimums
    od_a.min_replicas = 1
    assert split_replicas(g, 0, on_demand_floor=1) == {"m/a/spot": 0, "m/b/spot": 0, "m/a/od": 1}


def test_split_by_capacity_units_and_no_needless_moves():
    big = grp("m/a/h100", price=8.0, cap=40.0, ready=0)  # 0.2 $/h per rps
    small = grp("m/a/a100", price=4.0, cap=10.0, ready=0)  # 0.4 $/h per rps
    units = {"m/a/h100": 40.0, "m/a/a100": 10.0}
    assert split_replicas([small, big], 70.0, units=units, **NO_SPLIT) == {"m/a/a100": 0, "m/a/h100": 2}
    # equal prices: keep the replicas where they are
    a, b = grp("m/a/x", price=1.0, ready=1), grp("m/a/y", price=1.0, ready=3)
    assert split_replicas([a, b], 3, **NO_SPLIT) == {"m/a/x": 1, "m/a/y": 2}
    assert split_replicas([a, b], 4, **NO_SPLIT) == {"m/a/x": 1, "m/a/y": 3}


# --------------------------------------------------------------------------------------------- SLO-aware
def test_slo_aware_capacity_headroom_and_backlog():
    s = make("scaler", "slo_aware", {"headroom": 0.2, "drain_s": 60, **NO_SPLIT})
    assert one(s, 0, ready=1, rps=50.0, cap=10.0) == 6  # 50 * 1.2 / 10
    assert one(s, 30, ready=6, rps=50.0, cap=10.0, waiting=600) == 7  # + 600 / 60 = 10 rps of backlog


def test_slo_correction_raises_replicas_when_ttft_exceeds_slo():
    s = make("scaler", "slo_aware", {"headroom": 0.2, "correction_gain": 0.5, **NO_SPLIT})
    slo = {"slo_ttft_s": 1.0, "slo_tpot_s": 0.05}
    assert one(s, 0, ready=6, rps=50.0, tpot_p90_s=0.04, ttft_p90_s=0.5, **slo) == 6
    # the ready replicas had the capacity (60 >= 50 rps) yet TTFT p90 is twice the SLO: capacity was optimistic
    assert one(s, 30, ready=6, rps=50.0, tpot_p90_s=0.04, ttft_p90_s=2.0, **slo) == 9  # correction 1.5
    assert s.correction["m"] == pytest.approx(1.5)
    assert one(s, 60, ready=9, rps=50.0, tpot_p90_s=0.04, ttft_p90_s=2.0, **slo) == 14  # 1.5 -> 2.25
    # met again: the correction relaxes toward 1 (the window keeps the replicas for now)
    one(s, 90, ready=14, rps=50.0, tpot_p90_s=0.01, ttft_p90_s=0.2, **slo)
    assert s.correction["m"] == pytest.approx(1.625)
    # a shortage explains a violation (3 ready replicas = 30 < 50 rps): the estimate is kept
    t = make("scaler", "slo_aware", NO_SPLIT)
    assert one(t, 0, ready=3, rps=50.0, tpot_p90_s=0.5, ttft_p90_s=9.0, **slo) == 6
    assert "m" not in t.correction
    # NaN percentiles (nothing completed) change nothing
    assert one(t, 30, ready=6, rps=50.0, **slo) == 6


def test_slo_aware_scale_down_window_and_scale_to_zero():
    s = make("scaler", "slo_aware", {"downscale_window_s": 120, "idle_s": 600, **NO_SPLIT})
    assert one(s, 0, ready=1, rps=50.0) == 6
    for t in (30, 60, 90):
        assert one(s, t, ready=6, rps=10.0) == 6
    assert one(s, 120, ready=6, rps=10.0) == 2  # lower for the whole window
    for t in range(150, 240, 30):
        assert one(s, t, ready=2, rps=0.0) == 2  # the need of 12 rps at t = 120 is still in the window
    for t in range(240, 720, 30):
        assert one(s, t, ready=2, rps=0.0) == 1  # no demand, not yet idle_s: one replica
    assert one(s, 720, ready=1, rps=0.0) == 0  # idle since t=120 for 600 s
    assert one(s, 750, ready=0, rps=0.0) == 0
    assert one(s, 780, ready=0, rps=25.0, waiting=40) == 4  # back from zero: 25 * 1.2 / 10 + 40 / 60 / 10
    keep = make("scaler", "slo_aware", {"scale_to_zero": False, **NO_SPLIT})
    assert one(keep, 0, ready=1, rps=0.0) == 1 and one(keep, 5000, ready=1, rps=0.0) == 1


def test_capacity_scalers_without_capacity_estimate():
    s = make("scaler", "slo_aware", NO_SPLIT)
    # capacity unknown (0 / NaN): observed 10 rps on 2 ready replicas at 50% busy -> 10 rps per busy replica
    assert one(s, 0, ready=2, rps=10.0, busy=0.5, cap=0.0) == 2  # 10 * 1.2 / 10
    assert one(s, 30, ready=2, rps=40.0, busy=NAN, cap=NAN) == 5  # remembered estimate: 40 * 1.2 / 10
    # nothing known at all: hold, one more while requests wait
    p = make("scaler", "predictive", NO_SPLIT)
    assert one(p, 0, ready=3, rps=10.0, busy=0.0, cap=0.0) == 3
    assert one(p, 30, ready=3, rps=10.0, busy=0.0, cap=0.0, waiting=5) == 4
    # a group without an estimate uses its model's other groups'
    a = grp("m/a/od", ready=1, rps=30.0, cap=10.0, price=1.0)
    b = grp("m/b/od", zone="b", ready=1, rps=30.0, cap=0.0, price=1.0)
    assert sum(make("scaler", "slo_aware", NO_SPLIT).scale(obs(0, a, b)).values()) == 4  # 36 rps / 10


# --------------------------------------------------------------------------------------------- predictive
def test_holt_is_exact_on_a_line_and_seasonal_term():
    assert holt_forecast([3.0, 5.0, 7.0, 9.0], 2.5) == pytest.approx(14.0)
    assert holt_forecast([4.0], 10) == 4.0 and holt_forecast([], 3) == 0.0
    p = make("scaler", "predictive", {"season_s": 300, "season_weight": 1.0, "lead_s": 30, **NO_SPLIT})
    pattern = [10.0] * 5 + [50.0] * 5  # a 10-epoch (300 s) season; epoch 15 is the next rise
    g = grp(rps=10.0, history_rps=tuple(pattern + [10.0] * 4))
    assert p.forecast([g], obs(0, g)) == pytest.approx(50.0)
    h = make("scaler", "predictive", {"lead_s": 30, **NO_SPLIT})
    assert h.forecast([g], obs(0, g)) < 15.0  # without the season Holt sees a flat 10


def test_predictive_leads_a_linear_ramp_by_lead_s():
    lead = 120.0  # cold start 90 s + one 30 s epoch
    kw = {"headroom": 0.0, **NO_SPLIT}
    pred, react = make("scaler", "predictive", kw), make("scaler", "slo_aware", kw)
    first_p: dict[int, float] = {}
    first_r: dict[int, float] = {}
    hist: list[float] = []
    for k in range(40):
        t = 30.0 * k
        rps = 5.0 + 0.05 * t  # +1.5 rps per epoch
        g = {"ready": 1, "rps": rps, "cap": 10.0, "cold_start_s": 90.0, "history_rps": tuple(hist)}
        n_p, n_r = one(pred, t, **g), one(react, t, **g)
        first_p.setdefault(n_p, t)
        first_r.setdefault(n_r, t)
        # the forecast is exact on a line: it needs now what the load needs lead_s later
        if k >= 1:  # (two points give Holt the trend)
            assert n_p == math.ceil((rps + 0.05 * lead) / 10.0 - 1e-9)
        hist.append(rps)
    leads = [first_r[n] - first_p[n] for n in first_r if n in first_p and first_p[n] > 0]
    assert len(leads) >= 3
    assert all(abs(d - lead) <= 30.0 for d in leads)


def test_predictive_scale_to_zero_respects_the_season():
    day = [0.0] * 20 + [5.0] * 5  # quiet, then a burst at the same time every 25 epochs (750 s)
    series = day * 2

    def run(**params):
        p = make("scaler", "predictive", {"idle_s": 300, "lead_s": 60, **params, **NO_SPLIT})
        return [one(p, 30 * k, ready=1, rps=series[k], history_rps=tuple(series[:k])) for k in range(len(series))]

    seasonal = run(season_s=750)
    assert seasonal[20:34] == [1] * 14  # the first burst (k = 20..24), then idle_s = 300 s with one replica
    assert seasonal[34:43] == [0] * 9  # zero while quiet
    assert seasonal[43:] == [1] * 7  # back 2 epochs (lead_s) before the second burst at k = 45
    plain = run()
    assert plain[34:45] == [0] * 11 and plain[45] == 1  # without the season: only when the burst arrives


# --------------------------------------------------------------------------------------------- all scalers
def test_every_scaler_is_deterministic_and_never_negative():
    rng = np.random.default_rng(0)
    seq = []
    for k in range(30):
        gs = []
        for j, (zone, pool) in enumerate([("a", "spot"), ("b", "spot"), ("a", "on_demand"), ("c", "on_demand")]):
            model = "m1" if j < 3 else "m2"
            gs.append(grp(f"{model}/{zone}/{pool}/{j}", model=model, zone=zone, pool=pool,
                          ready=int(rng.integers(0, 5)), starting=int(rng.integers(0, 2)),
                          waiting=int(rng.integers(0, 30)), busy=float(rng.choice([NAN, rng.random()])),
                          kv=float(rng.random()), rps=float(rng.choice([0.0, 20 * rng.random()])),
                          cap=float(rng.choice([0.0, NAN, 8.0])), price=float(rng.choice([1.0, 3.0])),
                          available=int(rng.integers(0, 4)) if pool == "spot" else None,
                          ttft_p90_s=float(rng.choice([NAN, 3 * rng.random()])), slo_ttft_s=1.0,
                          history_rps=tuple(float(x) for x in rng.random(k) * 10)))
        seq.append(obs(60 * k, *gs, epoch=60.0))
    for name in ("static", "hpa", "slo_aware", "predictive"):  # the heuristic ones (not the trained "rl")
        params = {"scale_to_zero": True, "idle_s": 120} if name in ("hpa", "slo_aware", "predictive") else {}
        runs = []
        for _ in range(2):
            s = make("scaler", name, params)
            runs.append([s.scale(o) for o in seq])
        assert runs[0] == runs[1], name
        for o, out in zip(seq, runs[0]):
            assert set(out) == {g.key for g in o.groups}
            assert all(isinstance(v, int) and v >= 0 for v in out.values()), (name, out)


# --------------------------------------------------------------------------------------------- capacity
def test_capacity_rps_from_the_real_performance_model():
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel

    pm = PerfModel(get_gpu("h100"), get_model("llama-3-8b"))
    caps = [capacity_rps(pm, 1000, 200, 2.0, slo) for slo in (None, 0.05, 0.02, 0.01)]
    assert caps[0] > 0 and all(a >= b > 0 for a, b in itertools.pairwise(caps))
    assert capacity_rps(pm, 1000, 200, 2.0, 0.001) == 0.0  # no batch meets 1 ms per token
    assert capacity_rps(pm, 1000, 200, 0.001, None) == 0.0  # nor a 1 ms first token
    assert capacity_rps(pm, 1000, 200, slo_ttft_s=NAN, slo_tpot_s=NAN) == caps[0]
    assert capacity_rps(pm, 10**9, 10, kv_capacity_tokens=None) == 0.0  # does not fit the KV cache
    with pytest.raises(InputError):
        capacity_rps(pm, 0, 10)


def _simulate(perf, rate, P, O, n=2500, seed=0):
    from fleetwise.policies import make_controller
    from fleetwise.sim.build import make_replica
    from fleetwise.sim.simulator import SimOptions, Simulator
    from fleetwise.workload.request import Workload

    rng = np.random.default_rng(seed)
    w = Workload(arrival_s=np.cumsum(rng.exponential(1 / rate, n)), prompt_tokens=np.full(n, P),
                 output_tokens=np.full(n, O))
    sim = Simulator([make_replica(0, perf)], w, options=SimOptions(check_invariants=False))
    return sim.run(make_controller("round_robin", "vllm", batcher_params={"max_num_seqs": 64}))


def test_capacity_rps_matches_a_direct_simulation():
    perf = LinearPerf(kv_tokens=10**7)
    P, O, slo = 200, 50, 0.02
    cap = capacity_rps(perf, P, O, slo_tpot_s=slo, max_num_seqs=64)
    assert 5.0 < cap < 20.0
    below = _simulate(perf, 0.8 * cap, P, O)
    above = _simulate(perf, 1.25 * cap, P, O)
    assert np.nanmean(below.tpot_s[500:]) <= slo < np.nanmean(above.tpot_s[500:])


def test_a_capacity_too_small_to_mean_anything_is_read_as_unknown():
    """``capacity_rps`` 5e-324 made the replicas slo_aware and predictive ask for infinite (OverflowError in
    /v1/scale, found by fuzzing 2026-12-06). Below MIN_UNIT_RPS it is unknown, as 0 is; the answer is as for 0."""
    from fleetwise.policies.scalers import MIN_UNIT_RPS

    for name in ("slo_aware", "predictive"):
        tiny, zero = (make("scaler", name).scale(obs(0, grp(rps=3.0, cap=c, min_replicas=1, max_replicas=10)))
                      for c in (5e-324, 0.0))
        assert tiny == zero
    assert MIN_UNIT_RPS == 1e-6


def test_stabilization_window_drops_only_dominated_recommendations():
    """The kept recommendations are pruned (a newer one no lower, or no higher for the scale-up window, makes an
    older one irrelevant), with the answers of the unpruned window, whatever the clock does; and a clock that does
    not advance no longer grows the lists."""
    from fleetwise.policies.scalers import _Window

    class Unpruned:
        def __init__(self, w, up):
            self.w, self.up, self.recs, self.raw = w, up, [], []

        def stabilize(self, now, rec, current):
            if self.up > 0.0:
                self.raw = [(t, r) for t, r in self.raw if t > now - self.up]
                self.raw.append((now, rec))
                rec = min(r for _, r in self.raw)
            self.recs = [(t, r) for t, r in self.recs if t > now - self.w]
            self.recs.append((now, rec))
            return rec if rec > current else min(current, max(r for _, r in self.recs))

    rng = np.random.default_rng(0)
    for trial in range(300):
        up = [0.0, 60.0][trial % 2]
        a, b = _Window(300.0, up), Unpruned(300.0, up)
        t = 0.0
        for _ in range(200):
            t += float(rng.choice([0.0, 1.0, 30.0, 200.0, -50.0])) if trial % 3 else 30.0  # also backwards
            rec, cur = int(rng.integers(0, 12)), int(rng.integers(0, 12))
            assert a.stabilize(t, rec, cur) == b.stabilize(t, rec, cur)
    w = _Window(300.0, 60.0)
    for k in range(10_000):
        w.stabilize(0.0, k % 7, 3)
    assert len(w.recs) <= 7 and len(w.raw) <= 7


@pytest.mark.parametrize("name", ["static", "hpa", "slo_aware", "predictive", "corrected"])
def test_state_for_ever_new_models_is_bounded_and_the_fleets_own_is_kept(name, monkeypatch):
    """A client sending ever new model names cannot grow a scaler's state past MAX_KEYS_KEPT; the models of every
    call (a fleet's own) are never forgotten, so their decisions are those of a scaler that forgets nothing."""
    import fleetwise.policies.scalers as sc

    def call(t, k):
        gs = [grp(key=f"m/{z}/od", zone=z, ready=2, busy=0.2 + 0.05 * (k % 5), rps=3.0 + k % 4) for z in "ab"]
        gs += [grp(key=f"x{k}-{i}/a/od", model=f"x{k}-{i}", rps=1.0) for i in range(10)]
        return obs(t, *gs)

    def new():  # "corrected": the rl scaler's rule with its correction (a zero policy)
        from fleetwise.policies.scaler_correction import CorrectedSLOAware

        return CorrectedSLOAware() if name == "corrected" else make("scaler", name, {})

    keep = new()
    monkeypatch.setattr(sc, "MAX_KEYS_KEPT", 50)
    small = new()
    for k in range(40):
        a, b = small.scale(call(30.0 * k, k)), keep.scale(call(30.0 * k, k))
        assert {g: a[g] for g in ("m/a/od", "m/b/od")} == {g: b[g] for g in ("m/a/od", "m/b/od")}
    state = small.target if name == "static" else small._win
    assert len(small._recent.last) <= 50 and len(state) <= 50
    if name == "corrected":
        assert len(small._memory) <= 50 and len(small._drop) <= 50
    assert ("m/a/od" if name == "static" else "m") in state and len(keep._recent.last) > 300


@pytest.mark.parametrize("name", ["static", "hpa", "slo_aware", "predictive"])
def test_no_valid_observation_makes_a_scaler_fail(name):
    """Random observations within the service's bounds (counts up to 10^15, rates up to 1e300, NaN metrics, time
    standing still or jumping, epochs of 1e-9 s to 1e15 s): every call answers a target per group, so a refused
    /v1/scale call cannot leave half-made state behind (docs/security.md)."""
    rng = np.random.default_rng(7)

    def pick(xs):
        return xs[int(rng.integers(len(xs)))]

    nums = [0.0, 1e-300, 0.5, 1.0, 3.0, 1e6, 1e15, 1e300, NAN]
    counts = [0, 1, 2, 7, 100, 10**6, 10**15]
    for _ in range(1000):
        s = make("scaler", name, {})
        t = 0.0
        for _ in range(3):
            gs = []
            for i in range(pick([1, 2, 5])):
                lo = pick(counts)
                gs.append(grp(key=f"k{i}", model=pick(["a", "b"]), zone=pick("xyz"), pool=pick(["on_demand", "spot"]),
                              ready=pick(counts), starting=pick(counts), min_replicas=lo,
                              max_replicas=max(lo, pick(counts)), waiting=pick(counts), running=pick(counts),
                              kv=pick([0.0, 0.5, 1.0, NAN]), busy=pick([0.0, 0.5, 1.0, NAN]), rps=pick(nums),
                              cap=pick(nums), price=pick(nums),
                              history_rps=tuple(pick(nums) for _ in range(pick([0, 3])))))
            t += pick([0.0, 1.0, 60.0, 1e15])
            out = s.scale(obs(t, *gs, epoch=pick([1e-9, 60.0, 1e15])))
            assert set(out) == {g.key for g in gs} and all(isinstance(v, int) and v >= 0 for v in out.values())
