"""The RL scaler's model-level correction of slo_aware (policies/scaler_correction.py, learn/scaler_cem.py):
zero parameters are the rule decision for decision; the redundancy switch waits the rule's scale-down window;
a short CEM training writes a checkpoint with its model card that the registered scaler "rl" runs."""

import json

import numpy as np
import pytest

from fleetwise.learn.scaler_cem import N_PARAMS, ScalerCEMConfig, save_scaler, train_scaler_cem, windows
from fleetwise.policies.scaler_correction import N_FEATURES, CorrectedSLOAware, LinearCorrection, model_features
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


def test_features_bounded_and_nan_safe():
    x = model_features(need=1e9, unit=0.0, rps=float("nan"), history=(float("nan"),), ready=np.array([0]),
                       starting=np.array([0]), waiting=10**9, busy=np.array([float("nan")]), ratios=np.array([]))
    assert x.shape == (N_FEATURES,) and np.isfinite(x).all() and x[0] == 1.0 and x[1] == 2.0
    y = model_features(need=1.0, unit=1.0, rps=float("inf"), history=(1.0,), ready=np.array([2]),
                       starting=np.array([0]), waiting=0, busy=np.array([float("nan")]),
                       ratios=np.array([float("inf")]))
    assert np.isfinite(y).all() and y[4] == 0.0


def test_windows_are_reproducible_and_inside_the_day():
    a = windows([1, 2], 5, 7200.0, seed=3)
    assert a == windows([1, 2], 5, 7200.0, seed=3) and a != windows([1, 2], 5, 7200.0, seed=4)
    assert all(d in (1, 2) and 0 <= s <= 86400 - 7200 and s % 600 == 0 for d, s, _ in a)


def test_tiny_cem_training_writes_a_gated_checkpoint_rl_runs(tmp_path):
    """One CEM iteration on 10-minute windows: the curve, the multiplier and the gate go into the model card; the
    checkpoint runs as scaler "rl"; serving refuses it unless its gate passed."""
    from fleetwise.control.checkpoint import CheckpointError, read_card, require_gate
    from fleetwise.run import run_platform

    base, sc = _platform(9.9, 10.0)
    cfg = ScalerCEMConfig(window_s=600.0, train_windows=1, val_windows=1, gate_windows=2, iterations=1,
                          population=2, elite=1)
    with cached_servegen():
        res = train_scaler_cem(base, cfg, tmp_path / "rl_scaler", workers=1)
        card = read_card(tmp_path / "rl_scaler.card.json")
        assert card.training["action"] == "model_correction" and card.rule == "slo_aware"
        assert len(card.training["curve"]) == 1 and "lambda" in card.training["curve"][0]
        assert card.validation["metric"] == "cost_per_mtok_usd" and card.validation["windows"] == 2
        p = run_platform(sc, 1, scaler={"name": "rl", "checkpoint": res["checkpoint"]}, monitor=False)
    assert p.summary["lost_requests"] == 0
    json.dumps(res)
    if not card.validation["passed"]:
        with pytest.raises(CheckpointError, match="deployment gate"):
            require_gate(card, "scaler 'rl'")


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
