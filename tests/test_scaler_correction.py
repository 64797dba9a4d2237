"""The RL scaler's model-level correction of slo_aware (policies/scaler_correction.py, learn/scaler_cem.py):
zero parameters are the rule decision for decision; the redundancy switch waits the rule's scale-down window;
a short CEM training writes a checkpoint with its model card that the registered scaler "rl" runs."""

import json
import math

import numpy as np
import pytest

from fleetwise.learn.scaler_cem import N_PARAMS, ScalerCEMConfig, save_scaler, train_scaler_cem, windows
from fleetwise.policies.scaler_correction import (N_FEATURES, N_MEMORY_FEATURES, N_STEP_FEATURES, CorrectedSLOAware,
                                                  LinearCorrection, ModelMemory, model_features)
from fleetwise.workload.readers import cached_servegen
from test_autoscaling_env import _group, assert_answers_as_slo_aware


def _platform(start_h: float, end_h: float):
    from fleetwise.reproduce.platform import windowed
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    return base, parse_scenario(windowed(base, start_h * 3600.0, end_h * 3600.0))


def test_zero_parameters_are_slo_aware_decision_for_decision(tmp_path):
    """A zero-parameter checkpoint, run as the registered scaler "rl", answers every epoch of a platform window
    (with the zone outage) as slo_aware does, and gives the same records."""
    from fleetwise.policies import make

    _, sc = _platform(9.9, 10.15)
    ckpt = save_scaler(tmp_path / "zero", np.zeros(N_PARAMS), ScalerCEMConfig(), [], None)
    rl = assert_answers_as_slo_aware(sc, make("scaler", "rl", {"checkpoint": str(ckpt)}))
    assert rl.inner.correction.decisions > 20  # the policy was asked (and answered zero)


def _obs(t: float, groups):
    from fleetwise.control.protocols import ScaleObs

    return ScaleObs(time_s=t, epoch_s=30.0, groups=groups)


def _two_zones(ready=(1, 1), rps=0.3):
    return [_group(key=f"m/g/z-{z}/on_demand", zone=f"z-{z}", ready=r, arrivals_rps=rps, capacity_rps=5.0,
                   max_replicas=6, min_replicas=0, busy=0.1)
            for z, r in zip("ab", ready)]


def test_redundancy_lifted_only_after_the_scale_down_window():
    """a[1] > 0 lifts the N+1 spread after it has held for downscale_window_s; a[1] <= 0 restores it at once; a[0]
    scales the need by exp(0.3 a[0])."""
    w, b = np.zeros((2, N_FEATURES)), np.array([0.0, 1.0])
    sc = CorrectedSLOAware(LinearCorrection(w, b), downscale_window_s=120.0)
    rule = CorrectedSLOAware(None, downscale_window_s=120.0)
    groups = _two_zones()
    for t in (0.0, 30.0, 60.0, 90.0):
        assert sc.scale(_obs(t, groups)) == rule.scale(_obs(t, groups)) == {g.key: 1 for g in groups}
    late = sc.scale(_obs(150.0, groups))
    assert sum(late.values()) == 1  # one replica: the demand is 6% of one
    sc.policy = LinearCorrection.zeros()
    assert sc.scale(_obs(180.0, groups)) == {g.key: 1 for g in groups}  # spread again at once
    # the need factor
    big = CorrectedSLOAware(LinearCorrection(w, np.array([1.0, 0.0])), zone_redundant=False)
    plain = CorrectedSLOAware(None, zone_redundant=False)
    g = _two_zones(ready=(3, 3), rps=14.0)
    assert sum(big.scale(_obs(0.0, g)).values()) > sum(plain.scale(_obs(0.0, g)).values())


def test_a_network_beyond_the_action_bounds_scales_the_need_by_at_most_exp_0_3():
    """A checkpoint's network (an MLP exported from SB3 may carry any action bounds; a fuzzed one had 3e38) is read
    as a[0] in [-1, 1]: the need is at most exp(0.3) times the rule's, and NaN is the rule's need (it was an
    OverflowError in math.exp)."""
    g = _two_zones(ready=(3, 3), rps=14.0)
    plain = CorrectedSLOAware(None, zone_redundant=False)
    at_one = CorrectedSLOAware(lambda x: np.array([1.0, 0.0]), zone_redundant=False)
    for a0, like in ((3e38, at_one), (-3e38, None), (float("nan"), plain)):
        sc = CorrectedSLOAware(lambda x, a0=a0: np.array([a0, 0.0]), zone_redundant=False)
        out = sc.scale(_obs(0.0, g))
        if like is not None:
            assert out == like.scale(_obs(0.0, g))
        assert all(v >= 0 for v in out.values())


def test_features_bounded_and_nan_safe():
    x = model_features(need=1e9, unit=0.0, rps=float("nan"), history=(float("nan"),), ready=np.array([0]),
                       starting=np.array([0]), waiting=10**9, busy=np.array([float("nan")]), ratios=np.array([]))
    assert x.shape == (N_STEP_FEATURES,) and np.isfinite(x).all() and x[0] == 1.0 and x[1] == 2.0
    y = model_features(need=1.0, unit=1.0, rps=float("inf"), history=(1.0,), ready=np.array([2]),
                       starting=np.array([0]), waiting=0, busy=np.array([float("nan")]),
                       ratios=np.array([float("inf")]))
    assert np.isfinite(y).all() and y[4] == 0.0


def _x(need_replicas=0.1, ratio=0.2, waiting=0.0):
    x = np.zeros(N_STEP_FEATURES)
    x[0], x[1], x[2], x[3] = 1.0, need_replicas / 4.0, ratio, waiting
    return x


def test_memory_features_calm_share_lift_restore_and_hold():
    m = ModelMemory(0.0)
    f = m.features(0.0, _x(), 1.0, False)
    assert f.shape == (N_MEMORY_FEATURES,)
    assert f[0] == pytest.approx(0.0, abs=1e-9) and f[2] == 0.0 and f[3] == 1.0 and f[4] == 0.0
    for t in range(30, 901, 30):  # 15 calm minutes: the 15-minute share reaches 1, the hour's a quarter
        f = m.features(float(t), _x(), 1.0, False)
    assert f[0] == 1.0 and f[1] == pytest.approx(0.25)
    f = m.features(930.0, _x(ratio=0.9), 0.8, True)  # a busy epoch (ratio 0.9), lifted, the need down 20%
    assert f[0] == pytest.approx(29 / 30) and f[2] == 1.0 and f[4] == pytest.approx(math.log(1.25) / 0.3)
    for bad in (_x(need_replicas=0.6), _x(waiting=0.1)):  # a need of 0.6 replicas, or a backlog: not calm either
        m2 = ModelMemory(0.0)
        for t in range(0, 901, 30):
            m2.features(float(t), _x(), 1.0, False)
        assert m2.features(930.0, bad, 1.0, False)[0] == pytest.approx(29 / 30)
    m.restored = 930.0
    assert m.features(2730.0, _x(), 1.0, False)[3] == pytest.approx(0.5)
    assert np.isfinite(ModelMemory(0.0).features(0.0, _x(), float("nan"), False)).all()


def test_a_policy_on_the_calm_share_lifts_after_fifteen_calm_minutes_and_holds():
    """a[1] = 2 x_calm15 - 1.9 + x_lifted: the spread is lifted once the model was calm for 15 minutes and the
    scale-down window passed, and stays lifted through a busy epoch (hysteresis), but not through many."""
    w, b = np.zeros((2, N_FEATURES)), np.array([0.0, -1.9])
    w[1, N_STEP_FEATURES], w[1, N_STEP_FEATURES + 2] = 2.0, 1.0
    sc = CorrectedSLOAware(LinearCorrection(w, b), downscale_window_s=120.0)

    def zones(rps):
        return [_group(key=f"m/g/z-{z}/on_demand", zone=f"z-{z}", ready=1, starting=0, arrivals_rps=rps,
                       capacity_rps=5.0, max_replicas=6, min_replicas=0, busy=0.1, waiting=0, tpot_p90_s=0.01)
                for z in "ab"]

    groups = zones(0.3)
    first_lift = None
    for t in range(0, 1500, 30):
        if sum(sc.scale(_obs(float(t), groups)).values()) == 1 and first_lift is None:
            first_lift = t
    assert first_lift is not None and 960 <= first_lift <= 1080  # ~15 calm minutes, then the 120-s window
    busy = zones(4.0)  # the need at 4 / 5 x 1.2 = ~1 replica: not calm
    assert sum(sc.scale(_obs(1500.0, busy)).values()) == 1 and sc._drop["m"]  # one busy epoch: still lifted
    t = 1530.0
    while sc._drop["m"] and t < 3000:
        sc.scale(_obs(t, busy))
        t += 30.0
    assert not sc._drop["m"] and sc._memory["m"].restored == t - 30.0


@pytest.mark.parametrize("n_in,outs", [(N_STEP_FEATURES, 2), (N_FEATURES - 1, 3)])
def test_a_checkpoint_of_fewer_features_still_loads(tmp_path, n_in, outs):
    """A checkpoint saved before the memory features (7 inputs), or a gated one from before the price feature (12),
    runs as the same policy: it reads the first features; the last weight on each input sees only its own."""
    from fleetwise.control.checkpoint import ActionSpec, ModelCard, save_policy
    from fleetwise.policies import make

    w = np.zeros((outs, n_in))
    w[0, n_in - 1] = 0.25
    b = np.array([0.0, 1.0, 0.5][:outs])
    card = ModelCard(level="scaler", policy="rl", rule="slo_aware", validation={"passed": True},
                     training={"algorithm": "cem", "action": "model_correction", "rule_params": {}})
    ck = save_policy(tmp_path / "old", level="scaler", algorithm="cem", obs_low=np.zeros(n_in, np.float32),
                     obs_high=np.ones(n_in, np.float32), action=ActionSpec("box", shape=(outs,)),
                     layers=[(w, b)], activation="identity", card=card, act_low=-np.ones(outs, np.float32),
                     act_high=np.ones(outs, np.float32))
    rl = make("scaler", "rl", {"checkpoint": str(ck)})
    x = np.concatenate([_x(), np.ones(N_FEATURES - N_STEP_FEATURES)])
    x[n_in - 1], x[N_FEATURES - 1] = 2.0, 3.0
    assert list(rl.correction.policy(x)) == [0.5, 1.0, 0.5][:outs]


def test_free_parameters_name_weights_and_biases():
    """ScalerCEMConfig.free: "output:feature" and "output:b" index the parameter vector (w row-major, then b)."""
    from fleetwise.learn.scaler_cem import SPARSE, free_index, params_policy

    idx = free_index(["0:b", "1:7", "0:11"])
    p = np.zeros(N_PARAMS)
    p[idx] = [0.5, 2.0, 1.0]
    pol = params_policy(p)
    assert pol.b[0] == 0.5 and pol.w[1, 7] == 2.0 and pol.w[0, 11] == 1.0 and np.count_nonzero(pol.w) == 2
    assert len(free_index(SPARSE)) == len(SPARSE) and len(free_index(None)) == N_PARAMS
    for bad in (["2:1"], ["0:13"], ["x"], ["1:b", "1:b"]):
        with pytest.raises(ValueError, match="free parameter"):
            free_index(bad)


def test_windows_are_reproducible_and_inside_the_day():
    from fleetwise.learn.scaler_cem import trace_windows

    a = windows([1, 2], 5, 7200.0, seed=3)
    assert a == windows([1, 2], 5, 7200.0, seed=3) and a != windows([1, 2], 5, 7200.0, seed=4)
    assert all(d in (1, 2) and 0 <= s <= 86400 - 7200 and s % 600 == 0 for d, s, _ in a)
    t = trace_windows(["azure-conv", "mooncake"], 4, 7200.0, (0.5, 0.9), seed=3)
    assert t == trace_windows(["azure-conv", "mooncake"], 4, 7200.0, (0.5, 0.9), seed=3)
    assert [w[0].split("@")[0] for w in t] == ["azure-conv", "mooncake"] * 2
    assert all(0.5 <= float(w[0].split("@")[1]) <= 0.9 and 0 <= w[1] <= 86400 - 7200 for w in t)
    with pytest.raises(ValueError, match="train_traces"):
        ScalerCEMConfig(trace_windows=2)
    with pytest.raises(ValueError, match="trace_loads"):
        ScalerCEMConfig(train_traces=["azure-conv"], trace_windows=1, trace_loads=(0.9, 0.5))
    with pytest.raises(ValueError, match="val_window_s"):
        ScalerCEMConfig(val_window_s=2 * 86400.0)
    assert windows([6], 2, 86400.0, seed=200) == [(6, 0.0, 200000), (6, 0.0, 200001)]  # whole days: seeds differ


def test_validation_takes_its_days_in_turn_and_never_a_training_day():
    """The choice and the gate judge several days, each in turn (a gate on one day's seeds judged that day's
    character); the starts are those of a random draw, so one validation day gives the windows it always gave."""
    from fleetwise.learn.scaler_cem import VAL_DAYS

    cfg = ScalerCEMConfig()
    assert cfg.val_days == [6, 7, 8, 9] == list(VAL_DAYS) and not set(cfg.val_days) & set(cfg.train_days)
    gate = windows(cfg.val_days, 4, 86400.0, seed=300, in_turn=True)
    assert gate == [(6, 0.0, 300000), (7, 0.0, 300001), (8, 0.0, 300002), (9, 0.0, 300003)]
    short = windows([6, 7], 3, 3600.0, seed=200, in_turn=True)
    assert [d for d, _, _ in short] == [6, 7, 6]
    assert [s for _, s, _ in short] == [s for _, s, _ in windows([6, 7], 3, 3600.0, seed=200)]
    assert windows([6], 3, 3600.0, seed=200, in_turn=True) == windows([6], 3, 3600.0, seed=200)
    for bad in ([], [3, 6], [6, 14]):
        with pytest.raises(ValueError, match="val_days"):
            ScalerCEMConfig(val_days=bad)
    from fleetwise.learn.scaler_cem import parse_days

    assert parse_days("7-10") == [6, 7, 8, 9] and parse_days("7, 9") == [6, 8] and parse_days("14") == [13]
    for bad in ("", "10-7", "0-3", "7,7", "seven", "13-15"):
        with pytest.raises(ValueError, match="ServeGen days|from 1 to 14"):
            parse_days(bad)


def test_tiny_cem_training_writes_a_gated_checkpoint_rl_runs(tmp_path):
    """One CEM iteration on 10-minute windows: the curve, the multiplier and the gate go into the model card; the
    checkpoint runs as scaler "rl"; serving refuses it unless its gate passed."""
    from fleetwise.control.checkpoint import CheckpointError, read_card, require_gate
    from fleetwise.run import run_platform

    base, sc = _platform(9.9, 10.0)
    cfg = ScalerCEMConfig(window_s=600.0, train_windows=1, val_windows=1, gate_windows=2, iterations=1,
                          population=2, elite=1, init="calm_lift", train_traces=["azure-conv"], trace_windows=1,
                          gate_slack=0.0123, gate_window_s=1200.0)
    with cached_servegen():
        res = train_scaler_cem(base, cfg, tmp_path / "rl_scaler", workers=1)
        card = read_card(tmp_path / "rl_scaler.card.json")
        assert card.training["action"] == "model_correction" and card.rule == "slo_aware"
        assert [r["iteration"] for r in card.training["curve"]] == [0, 1] and "lambda" in card.training["curve"][1]
        assert res["kept"] in ("rule", "calm_lift", "iteration 1") and card.training["config"]["init"] == "calm_lift"
        assert card.validation["metric"] == "cost_per_mtok_usd" and card.validation["windows"] == 2
        assert card.validation["constraint"].startswith("SLO attainment at most 1.23 points below")  # gate_slack
        assert card.validation["windows_detail"] == "2 windows of 0.333333 h on ServeGen days 7-8"  # gate_window_s
        p = run_platform(sc, 1, scaler={"name": "rl", "checkpoint": res["checkpoint"]}, monitor=False)
    assert p.summary["lost_requests"] == 0
    json.dumps(res)
    if not card.validation["passed"]:
        with pytest.raises(CheckpointError, match="deployment gate"):
            require_gate(card, "scaler 'rl'")


def test_several_searches_are_the_single_seed_searches_and_validation_keeps_their_best():
    """``searches=2`` from seed 1 runs the searches of seeds 1 and 2 (each as a run of that seed alone: the same
    validation figures, iteration by iteration) and keeps the parameters with the best validation score over both
    (here the second search's), which the gate then judges."""
    base, _ = _platform(9.9, 10.0)
    kw = dict(window_s=600.0, train_windows=1, val_windows=1, gate_windows=1, iterations=2, population=3, elite=1,
              sigma=0.5, slack=0.05)
    with cached_servegen():
        both = train_scaler_cem(base, ScalerCEMConfig(seed=1, searches=2, **kw), None, workers=1)
        one = {sd: train_scaler_cem(base, ScalerCEMConfig(seed=sd, **kw), None, workers=1) for sd in (1, 2)}
    keys = ("iteration", "val_log_cost_ratio", "val_attainment_diff", "val_oscillations_added", "val_score", "lambda")
    assert [r["search"] for r in both["curve"]] == [1, 1, 2, 2]
    for sd in (1, 2):
        assert ([{k: r[k] for k in keys} for r in both["curve"] if r["search"] == sd]
                == [{k: r[k] for k in keys} for r in one[sd]["curve"]])
    best = {sd: max(r["val_score"] for r in one[sd]["curve"]) for sd in (1, 2)}
    assert best[2] > best[1] > 0.0  # (so the choice crosses searches)
    assert both["kept"] == f"{one[2]['kept']} of search 2" and both["best_search"] == 2
    assert both["params"] == one[2]["params"]
    assert both["gate"]["change"] == one[2]["gate"]["change"] and both["config"]["searches"] == 2
    with pytest.raises(ValueError, match="searches 0"):
        ScalerCEMConfig(searches=0)


@pytest.mark.ray
def test_cem_training_on_ray_matches_local(tmp_path, local_ray):
    """Every (candidate, window) run is a task on the sweep backends: on Ray the search gives the same curve,
    parameters and gate as in local processes (same seed, same numbers)."""
    base, _ = _platform(9.9, 10.0)
    cfg = ScalerCEMConfig(window_s=300.0, train_windows=1, val_windows=1, gate_windows=2, iterations=1,
                          population=2, elite=1)
    remote = train_scaler_cem(base, cfg, None, backend="ray")
    local = train_scaler_cem(base, cfg, None, workers=2)
    assert remote["curve"][0]["val_score"] == local["curve"][0]["val_score"]
    assert remote["params"] == local["params"] and remote["gate"] == local["gate"]


def test_zero_parameters_of_a_gated_policy_are_slo_aware_too(tmp_path):
    """A gated checkpoint (three outputs: a[1] has its own row once the spread is lifted) with zero parameters is
    the rule, decision for decision, over the same platform window."""
    from fleetwise.learn.scaler_cem import n_params
    from fleetwise.policies import make
    from fleetwise.policies.scaler_correction import N_GATED_OUTPUTS

    _, sc = _platform(9.9, 10.15)
    ckpt = save_scaler(tmp_path / "zero3", np.zeros(n_params(N_GATED_OUTPUTS)), ScalerCEMConfig(init="calm_lift"),
                       [], None)
    rl = assert_answers_as_slo_aware(sc, make("scaler", "rl", {"checkpoint": str(ckpt)}))
    assert len(rl.inner.correction.policy(np.zeros(N_FEATURES))) == N_GATED_OUTPUTS


def test_calm_lift_lifts_after_calm_minutes_restores_at_once_and_waits_an_hour(tmp_path):
    """CALM_LIFT, the gated warm start: lifted after 15 calm minutes and the scale-down window, restored in the
    first busy epoch (unlike one linear row, which holds through it), not lifted again within the hour; it runs
    the same from its checkpoint as scaler "rl"."""
    from fleetwise.learn.scaler_cem import init_params
    from fleetwise.policies import make
    from fleetwise.policies.scaler_correction import CALM_LIFT

    def zones(rps):
        return [_group(key=f"m/g/z-{z}/on_demand", zone=f"z-{z}", ready=1, starting=0, arrivals_rps=rps,
                       capacity_rps=5.0, max_replicas=6, min_replicas=0, busy=0.1, waiting=0, tpot_p90_s=0.01)
                for z in "ab"]

    ckpt = save_scaler(tmp_path / "calm", init_params("calm_lift"), ScalerCEMConfig(init="calm_lift"), [], None)
    served = make("scaler", "rl", {"checkpoint": str(ckpt)})
    sc = CorrectedSLOAware(LinearCorrection.from_spec(CALM_LIFT), downscale_window_s=300.0)
    served.correction.downscale_window_s = 300.0
    calm, busy = zones(0.3), zones(6.0)  # busy: the need at 6 / 5 x 1.2 = 1.44 replicas
    lifts, t = [], 0.0
    for k in range(260):
        groups = busy if 80 <= k < 82 else calm  # a burst of two epochs at 40 minutes
        a, b = sc.scale(_obs(t, groups)), served.scale(_obs(t, groups))
        assert a == b  # the checkpoint is the same policy
        lifts.append(sc._drop.get("m", False))
        t += 30.0
    first = lifts.index(True)
    assert 39 <= first <= 41  # 15 calm minutes (30 epochs), then the 300-s window
    assert not lifts[80] and not any(lifts[80:80 + 118])  # restored in the burst's first epoch, an hour without
    assert lifts[-1]  # then lifted again


def test_calm_hour_price_hold_lifts_only_after_a_calm_hour():
    """CALM_HOUR_PRICE_HOLD: calm_price_hold whose lift also needs every epoch of the last hour calm, so the first
    lift comes after an hour and the scale-down window (calm_price_hold's after 15 minutes), and after a burst
    again only once the hour since it is calm."""
    from fleetwise.policies.scaler_correction import CALM_HOUR_PRICE_HOLD, CALM_PRICE_HOLD, N_HOLD_GATE_OUTPUTS

    def zones(rps):
        return [_group(key=f"m/g/z-{z}/on_demand", zone=f"z-{z}", ready=1, starting=0, arrivals_rps=rps,
                       capacity_rps=5.0, max_replicas=6, min_replicas=0, busy=0.1, waiting=0, tpot_p90_s=0.01)
                for z in "ab"]

    def lifts(spec):
        sc = CorrectedSLOAware(LinearCorrection.from_spec(spec, N_HOLD_GATE_OUTPUTS), downscale_window_s=300.0)
        out, t = [], 0.0
        for k in range(400):
            sc.scale(_obs(t, zones(6.0) if 160 <= k < 162 else zones(0.3)))  # a burst of two epochs at 80 minutes
            out.append(sc._drop.get("m", False))
            t += 30.0
        return out

    quarter, hour = lifts(CALM_PRICE_HOLD), lifts(CALM_HOUR_PRICE_HOLD)
    assert 39 <= quarter.index(True) <= 41  # 15 calm minutes, then the 300-s window
    assert 127 <= hour.index(True) <= 131  # 59 calm minutes (the share above 0.98), then the window
    assert not any(hour[160:162 + 120]) and hour[-1]  # restored by the burst; lifted again after a calm hour


def test_calm_hour_need_restore_keeps_its_lift_through_a_short_queue():
    """CALM_HOUR_NEED_RESTORE: calm_hour_price_hold whose restore weighs the backlog 0.6 instead of 2.5. Lifted after
    a calm hour, a queue of five requests on a replica (the need still a small fraction of one) restores
    calm_hour_price_hold's spread and not this one's; the need at 1.4 replicas restores both at once."""
    from fleetwise.policies.scaler_correction import CALM_HOUR_NEED_RESTORE, CALM_HOUR_PRICE_HOLD, N_HOLD_GATE_OUTPUTS

    def zones(rps, waiting=0):
        return [_group(key=f"m/g/z-{z}/on_demand", zone=f"z-{z}", ready=1, starting=0, arrivals_rps=rps,
                       capacity_rps=5.0, max_replicas=6, min_replicas=0, busy=0.1, waiting=waiting, tpot_p90_s=0.01)
                for z in "ab"]

    def lifted(spec, burst):
        sc = CorrectedSLOAware(LinearCorrection.from_spec(spec, N_HOLD_GATE_OUTPUTS), downscale_window_s=300.0)
        out, t = [], 0.0
        for k in range(150):
            sc.scale(_obs(t, burst if k == 140 else zones(0.3)))
            out.append(sc._drop.get("m", False))
            t += 30.0
        return out

    queue, need = zones(0.3, waiting=5), zones(6.0)
    for spec in (CALM_HOUR_PRICE_HOLD, CALM_HOUR_NEED_RESTORE):
        assert lifted(spec, need)[139] and not lifted(spec, need)[140]  # lifted by then; the need restores it
    assert not lifted(CALM_HOUR_PRICE_HOLD, queue)[140]
    assert lifted(CALM_HOUR_NEED_RESTORE, queue)[140] and lifted(CALM_HOUR_NEED_RESTORE, queue)[-1]


def test_a_search_from_calm_lift_starts_there(tmp_path):
    """ScalerCEMConfig.init names the start; the gated parameters index as output:feature with outputs 0..2."""
    from fleetwise.learn.scaler_cem import free_index, init_params, n_params, params_policy
    from fleetwise.policies.scaler_correction import CALM_LIFT, N_GATED_OUTPUTS

    p = init_params("calm_lift")
    assert len(p) == n_params(N_GATED_OUTPUTS) and np.count_nonzero(p) == len(CALM_LIFT)
    pol = params_policy(p)
    assert pol.w[2, 1] == pytest.approx(-4.0) and pol.b[1] == pytest.approx(-39.6)
    assert len(free_index(["2:b"], N_GATED_OUTPUTS)) == 1
    with pytest.raises(ValueError, match="init"):
        ScalerCEMConfig(init="calm")
    with pytest.raises(ValueError, match="parameters"):
        params_policy(np.zeros(5))


def test_a_fourth_output_adjusts_the_need_only_while_the_spread_is_lifted(tmp_path):
    """A policy of four outputs (calm_lift_only's form): a[0] from row 0 while the spread is kept, from row 3 once
    it is lifted; zero parameters of that form are slo_aware too, and its checkpoint loads as scaler "rl"."""
    import math

    from fleetwise.learn.scaler_cem import INIT_OUTPUTS, init_params, n_params
    from fleetwise.policies import make
    from fleetwise.policies.scaler_correction import CALM_LIFT_ONLY, N_FEATURES, N_GATED_HOLD_OUTPUTS

    sc = CorrectedSLOAware(LinearCorrection.from_spec({"1:b": 1.0, "2:b": 1.0, "3:b": 1.0}, 4),
                           downscale_window_s=60.0)
    out = [sc._apply("m", 1.0, float(t), _x(), 0.0) for t in range(0, 180, 30)]
    assert out[:3] == [1.0] * 3  # lifted at t = 60 (after the window), a[3] used from the next decision on
    assert out[3:] == [pytest.approx(math.exp(0.3))] * 3
    assert INIT_OUTPUTS["calm_lift_only"] == N_GATED_HOLD_OUTPUTS and "0:11" not in CALM_LIFT_ONLY
    _, scen = _platform(9.9, 10.15)
    ckpt = save_scaler(tmp_path / "zero4", np.zeros(n_params(N_GATED_HOLD_OUTPUTS)),
                       ScalerCEMConfig(init="calm_lift_only"), [], None)
    assert_answers_as_slo_aware(scen, make("scaler", "rl", {"checkpoint": str(ckpt)}))
    ck = save_scaler(tmp_path / "only", init_params("calm_lift_only"), ScalerCEMConfig(init="calm_lift_only"), [], None)
    x = np.linspace(0.0, 1.0, N_FEATURES)  # (the loaded checkpoint answers as the hand-written start)
    np.testing.assert_allclose(make("scaler", "rl", {"checkpoint": str(ck)}).correction.policy(x),
                               LinearCorrection.from_spec(CALM_LIFT_ONLY, N_GATED_HOLD_OUTPUTS)(x), atol=1e-6)


def test_a_fifth_output_gates_the_need_outside_a_lift(tmp_path):
    """A policy of five outputs (calm_hold's form): outside a lift, a[0] acts only while a[4] > 0 (calm_hold: in the
    hour after a restore); once lifted, a[3] acts whatever a[4]; zero parameters of that form are slo_aware, and its
    checkpoint loads as scaler "rl" and answers as the hand-written start; calm_hold holds a model's need in the hour
    after its spread was restored, and never one whose spread was never lifted."""
    import math

    from fleetwise.learn.scaler_cem import INIT_OUTPUTS, init_params, n_params
    from fleetwise.policies import make
    from fleetwise.policies.scaler_correction import CALM_HOLD, CALM_HOLD_MULTI, N_FEATURES, N_HOLD_GATE_OUTPUTS

    up = pytest.approx(math.exp(0.3))
    # the gate on the hour's calm share: closed until 11% of the hour was calm (20 x_calm60 - 2.2 > 0 after 396 s)
    sc = CorrectedSLOAware(LinearCorrection.from_spec({"0:b": 1.0, "4:8": 20.0, "4:b": -2.2}, 5))
    out = [sc._apply("m", 1.0, float(t), _x(), 0.0) for t in range(0, 600, 60)]
    assert out[:7] == [1.0] * 7 and out[7:] == [up] * 3
    busy = CorrectedSLOAware(LinearCorrection.from_spec({"0:b": 1.0, "4:8": 20.0, "4:b": -2.2}, 5))
    assert [busy._apply("m", 1.0, float(t), _x(need_replicas=3.0), 0.0) for t in range(0, 600, 60)] == [1.0] * 10
    # a closed gate does not close row 3: once lifted (after the 60 s window), a[3] acts
    lifted = CorrectedSLOAware(LinearCorrection.from_spec({"0:b": 1.0, "1:b": 1.0, "2:b": 1.0, "3:b": 1.0,
                                                           "4:b": -1.0}, 5), downscale_window_s=60.0)
    out = [lifted._apply("m", 1.0, float(t), _x(), 0.0) for t in range(0, 180, 30)]
    assert out[:3] == [1.0] * 3 and out[3:] == [up] * 3
    assert INIT_OUTPUTS["calm_hold"] == N_HOLD_GATE_OUTPUTS and CALM_HOLD["0:11"] == CALM_HOLD["3:11"] == 1.0
    hold = LinearCorrection.from_spec(CALM_HOLD, N_HOLD_GATE_OUTPUTS)
    x = np.zeros(N_FEATURES)
    x[0], x[10], x[11] = 1.0, 1.0, 1.0  # the need 0.3 below its 15-minute high, never restored: the gate is shut
    assert hold(x)[4] < 0.0
    x[10] = 0.5  # restored half an hour ago: open, and a[0] holds the need at its high
    assert hold(x)[4] > 0.0 and hold(x)[0] == 1.0
    multi = LinearCorrection.from_spec(CALM_HOLD_MULTI, N_HOLD_GATE_OUTPUTS)
    x[10], x[1] = 1.0, 0.5 / 4.0  # never restored, the need half a replica: shut; 2 replicas: open
    assert multi(x)[4] < 0.0 and hold(x)[4] < 0.0
    x[1] = 2.0 / 4.0
    assert multi(x)[4] > 0.0 and hold(x)[4] < 0.0
    _, scen = _platform(9.9, 10.15)
    ckpt = save_scaler(tmp_path / "zero5", np.zeros(n_params(N_HOLD_GATE_OUTPUTS)), ScalerCEMConfig(init="calm_hold"),
                       [], None)
    assert_answers_as_slo_aware(scen, make("scaler", "rl", {"checkpoint": str(ckpt)}))
    ck = save_scaler(tmp_path / "hold", init_params("calm_hold"), ScalerCEMConfig(init="calm_hold"), [], None)
    x = np.linspace(0.0, 1.0, N_FEATURES)
    np.testing.assert_allclose(make("scaler", "rl", {"checkpoint": str(ck)}).correction.policy(x),
                               LinearCorrection.from_spec(CALM_HOLD, N_HOLD_GATE_OUTPUTS)(x), atol=1e-6)


def test_the_price_feature_reaches_the_policy_and_gates_calm_price_holds_hold():
    """Feature 12 is one replica's price (the dearest of the model's groups, /20 $ an hour, in [0, 2]); the scaler
    passes each model's to its policy, with a few groups and with many (the numpy columns' path); calm_price_hold's
    gate (row 4) opens outside a lift for a replica under $12 an hour (platform: the chat model's A100, $5.12) and
    stays shut for a dearer one (CodeLlama-34B's 2 x H100, $24.58)."""
    from fleetwise.policies.scale_columns import NP_MIN_GROUPS
    from fleetwise.policies.scaler_correction import CALM_PRICE_HOLD, N_HOLD_GATE_OUTPUTS, price_feature

    assert price_feature(np.array([5.12, 1.9, np.nan, 0.0, -1.0])) == pytest.approx(0.256)
    assert price_feature(np.array([])) == 0.0 and price_feature(np.array([1e6])) == 2.0
    for n in (2, NP_MIN_GROUPS):
        seen = []
        sc = CorrectedSLOAware(lambda x: seen.append(x[N_FEATURES - 1]) or np.zeros(2))
        groups = [_group(key=f"m/g/z-{k}/on_demand", zone=f"z-{k}", price_usd_per_hour=2.0 + 0.01 * k)
                  for k in range(n)]
        sc.scale(_obs(0.0, groups))
        assert seen == [pytest.approx((2.0 + 0.01 * (n - 1)) / 20.0)]
    hold = LinearCorrection.from_spec(CALM_PRICE_HOLD, N_HOLD_GATE_OUTPUTS)
    x = np.zeros(N_FEATURES)
    x[0], x[10], x[11] = 1.0, 1.0, 1.0  # never restored, the need 0.3 below its 15-minute high
    x[12] = 5.12 / 20.0
    assert hold(x)[4] > 0.0 and hold(x)[0] == 1.0
    x[12] = 24.58 / 20.0
    assert hold(x)[4] < 0.0


def test_reproduce_platform_evaluates_a_given_checkpoint_without_training(tmp_path):
    """``reproduce platform --rl-checkpoint``: the checkpoint is run as the rl scaler (no training), its gate is
    its model card's, and a zero-parameter one gives slo_aware's figures on the same seeds."""
    from fleetwise.reproduce import platform as P

    gate = {"passed": True, "change": -0.05, "ci95": [-0.08, -0.02], "rule": "slo_aware", "metric": "cost_per_mtok_usd"}
    ckpt = save_scaler(tmp_path / "given", np.zeros(N_PARAMS), ScalerCEMConfig(), [], gate)
    res = P.run(quick=True, seeds=1, db=str(tmp_path / "db.duckdb"), progress=False, scalers=["slo_aware", "rl"],
                workers=1, window=(9.98 * 3600, 10.08 * 3600), rl_checkpoint=str(ckpt))
    g = res["_meta"]["gates"]["rl"]
    assert g["trained"] is False and g["passed"] is True and g["validation"] == gate
    assert g["checkpoint"] == str(ckpt) and not (tmp_path / "platform" / "rl_scaler.npz").exists()
    for k in ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests"):
        assert res["rl"][k] == res["slo_aware"][k], k
    assert res["rl"]["gate_passed"] is True
    assert "given by --rl-checkpoint" in P.render(res).caption


def test_the_gate_judges_the_attainment_interval_not_its_mean():
    """A checkpoint whose mean attainment loss is within the bar (0.2 point) but whose 95% interval is not fails
    the gate's constraint; one whose whole interval is within passes; an added oscillation or a lost request fails."""
    from fleetwise.learn.scaler_cem import gate_constraint

    def runs(diffs, osc=0.0, lost=0.0):
        return [{"slo_attainment": 0.98 + d, "cost_per_mtok_usd": 1.0, "oscillations": osc, "lost_requests": lost}
                for d in diffs]

    rule = runs([0.0] * 4)
    ok, ci = gate_constraint(runs([-0.0010, -0.0030, -0.0015, -0.0025]), rule, 0.002)  # mean -0.2 pt, lo below
    assert ci.mean == pytest.approx(-0.002) and ci.lo < -0.002 and not ok
    ok, ci = gate_constraint(runs([-0.0010, -0.0012, -0.0011, -0.0013]), rule, 0.002)
    assert ok and ci.lo >= -0.002
    assert not gate_constraint(runs([0.0] * 4, osc=1.0), rule, 0.002)[0]
    assert not gate_constraint(runs([0.0] * 4, lost=1.0), rule, 0.002)[0]
    assert gate_constraint(runs([-0.001]), rule[:1], 0.002)[0]  # one window: its mean


def test_calm_hour_low_need_lifts_only_under_a_third_of_a_replica():
    """CALM_HOUR_LOW_NEED: calm_hour_need_restore whose lift also waits for a need under 0.35 replica. After a calm
    hour at a need under 0.35 replica both lift the spread; between 0.35 and 0.5 replica (still calm) only the older
    one does."""
    from fleetwise.policies.scaler_correction import CALM_HOUR_LOW_NEED, CALM_HOUR_NEED_RESTORE, N_HOLD_GATE_OUTPUTS

    def zones(rps):
        return [_group(key=f"m/g/z-{z}/on_demand", zone=f"z-{z}", ready=1, starting=0, arrivals_rps=rps,
                       capacity_rps=5.0, max_replicas=6, min_replicas=0, busy=0.1, waiting=0, tpot_p90_s=0.01)
                for z in "ab"]

    def lifted(spec, rps):
        sc = CorrectedSLOAware(LinearCorrection.from_spec(spec, N_HOLD_GATE_OUTPUTS), downscale_window_s=300.0)
        t = 0.0
        for _ in range(150):
            sc.scale(_obs(t, zones(rps)))
            t += 30.0
        return sc._drop.get("m", False), sc._memory["m"].needs[-1][1]  # (lifted, the rule's need in rps)

    for spec in (CALM_HOUR_NEED_RESTORE, CALM_HOUR_LOW_NEED):
        ok, need = lifted(spec, 0.3)
        assert ok and need < 0.35 * 5.0  # (a replica serves 5 rps)
    ok, need = lifted(CALM_HOUR_NEED_RESTORE, 1.8)
    assert ok and 0.35 * 5.0 < need < 0.5 * 5.0
    assert not lifted(CALM_HOUR_LOW_NEED, 1.8)[0]
