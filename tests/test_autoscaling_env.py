"""fleetwise/Autoscaling-v0 (the RL scaler of issue 8): env checks, determinism, a short PPO run and the
trained policy as the registered scaler "rl" through run_platform."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("stable_baselines3")
if __import__("fleetwise.data", fromlist=["data_dir"]).data_dir(required=False) is None:
    pytest.skip("real datasets not found (set FLEETWISE_DATA): the scenario replays ServeGen rates",
                allow_module_level=True)

from fleetwise.control.protocols import GroupState, ScaleObs  # noqa: E402
from fleetwise.envs.autoscaling import (  # noqa: E402
    N_GLOBAL_FEATURES,
    N_GROUP_FEATURES,
    AutoscalingConfig,
    AutoscalingEnv,
    cached_servegen,
    default_scenario,
    episode_scenario,
    features,
    residual_targets,
    targets_from_action,
)
from fleetwise.errors import InputError  # noqa: E402

# a short window keeps the episodes in these tests at ~10 epochs
SHORT = AutoscalingConfig(window_s=300.0)


def _group(key="m/g/z-a/on_demand", pool="on_demand", **kw) -> GroupState:
    base = dict(key=key, model="m", gpu="g", region="r", zone=key.split("/")[2], pool=pool, ready=2, starting=1,
                draining=0, min_replicas=0, max_replicas=6, waiting=4, running=10, kv_used=0.3, busy=0.8,
                arrivals_rps=5.0, history_rps=(3.0, 4.0), ttft_p90_s=float("nan"), tpot_p90_s=0.04,
                slo_ttft_s=0.5, slo_tpot_s=0.05, capacity_rps=2.5, price_usd_per_hour=2.0, cold_start_s=75.0)
    base.update(kw)
    return GroupState(**base)


def test_check_env_and_registration():
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import fleetwise.envs  # noqa: F401  (registers the ids)

    env = gym.make("fleetwise/Autoscaling-v0", config=SHORT)
    check_env(env.unwrapped)
    assert env.observation_space.shape == (4 * N_GROUP_FEATURES + N_GLOBAL_FEATURES,)
    assert list(env.action_space.nvec) == [5, 5, 5, 5]


def _rollout(seed: int, actions_seed: int = 7) -> tuple[list, list, dict]:
    env = AutoscalingEnv(config=SHORT)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(actions_seed)
    obs_l, rew = [obs], []
    while True:
        obs, r, term, trunc, info = env.step(rng.integers(0, 5, size=4))
        obs_l.append(obs)
        rew.append(r)
        if term or trunc:
            return obs_l, rew, info


def test_same_seed_same_episode_and_no_lost_requests():
    o1, r1, i1 = _rollout(3)
    o2, r2, i2 = _rollout(3)
    assert len(o1) == len(o2) > 3
    assert all(np.array_equal(a, b) for a, b in zip(o1, o2))
    assert r1 == r2 and i1 == i2
    assert i1["lost_requests"] == 0
    assert all(r <= 0 for r in r1)
    assert i1["cost_usd"] > 0 and 0 <= i1["slo_attainment"] <= 1
    o3, _, _ = _rollout(4)
    assert not all(np.array_equal(a, b) for a, b in zip(o1, o3))  # another seed: another window


def test_a_copied_env_goes_on_as_the_original():
    """Environments over the simulator could not be pickled or deep-copied (a lane view held dict views, scheduled
    events were lambdas; found by fuzzing, 2026-12-06), which gymnasium's and SB3's tools do. A copy taken mid-
    episode, and one pickled, continue step for step as the original. Autoscaling-v0 (platform events: spot
    changes, reconciles) and EdgeBatching-v0 (lane views)."""
    import copy
    import pickle

    import gymnasium as gym

    import fleetwise.envs  # noqa: F401

    for env in (AutoscalingEnv(config=SHORT), gym.make("fleetwise/EdgeBatching-v0").unwrapped):
        env.reset(seed=3)
        env.action_space.seed(1)
        acts = [env.action_space.sample() for _ in range(400)]
        for a in acts[:3]:
            env.step(a)
        copies = [copy.deepcopy(env), pickle.loads(pickle.dumps(env))]
        runs = []
        for e in (env, *copies):
            out = []
            for a in acts[3:]:
                obs, r, term, trunc, _ = e.step(a)
                out.append((obs.tobytes(), r))
                if term or trunc:
                    break
            runs.append(out)
        assert len(runs[0]) > 3 and runs[0] == runs[1] == runs[2], type(env).__name__


def test_episode_windows_split_train_and_held_out():
    def starts(held: bool) -> list[float]:
        return [episode_scenario(s, held).workload["parts"][0]["workload"]["start_s"] for s in range(20)]

    train, held = starts(False), starts(True)
    assert max(train) < min(held)
    assert len(set(train)) == 20


def test_features_and_action_mapping():
    od = _group()
    spot = _group("m/g/z-b/spot", pool="spot", ready=1, starting=0, available=2, price_usd_per_hour=0.8)
    obs = ScaleObs(time_s=21600.0, epoch_s=30.0, groups=[od, spot])
    x = features(obs, 3)
    assert x.shape == (3 * N_GROUP_FEATURES + N_GLOBAL_FEATURES,) and x.dtype == np.float32
    f = x[:N_GROUP_FEATURES]
    assert f[0] == 1 and f[1] == 0
    assert math.isclose(f[2], 2 / 6, rel_tol=1e-6) and math.isclose(f[3], 1 / 6, rel_tol=1e-6)
    assert f[10] == 0.0  # NaN TTFT percentile -> 0
    assert math.isclose(f[11], 0.8, rel_tol=1e-6)  # tpot p90 0.04 / slo 0.05
    assert math.isclose(f[15], (3 * 2.5 + 1 * 2.5) / 5.0, rel_tol=1e-6)  # model coverage
    assert x[N_GROUP_FEATURES + 1] == 1 and math.isclose(x[N_GROUP_FEATURES + 12], 0.4, rel_tol=1e-6)
    assert not x[2 * N_GROUP_FEATURES:-2].any()  # padding
    assert math.isclose(x[-2], 1.0, abs_tol=1e-6)  # 6 h: sin = 1
    # +2 on-demand (3 -> 5), +2 spot capped by available (1 -> 2)
    assert targets_from_action(obs, [4, 4, 0], (-2, -1, 0, 1, 2)) == {od.key: 5, spot.key: 2}
    # all down with demand: the safety floor keeps one replica in the cheapest group that can have one
    low = ScaleObs(0.0, 30.0, [_group(ready=1, starting=0), _group("m/g/z-b/spot", pool="spot", ready=0, starting=0,
                                                                   price_usd_per_hour=0.8, available=0)])
    assert targets_from_action(low, [0, 0], (-2, -1, 0, 1, 2)) == {od.key: 1, spot.key: 0}
    with pytest.raises(InputError, match="at most 1"):
        features(obs, 1)
    # the residual action corrects the rule's targets: the centre keeps them exactly, a change is clamped
    rule = {od.key: 4, spot.key: 2}
    x = features(obs, 3, rule)
    assert math.isclose(x[17], 4 / 6, rel_tol=1e-6) and math.isclose(x[18], (4 - 3) / 6, rel_tol=1e-6)
    assert residual_targets(obs, [2, 2, 2], (-2, -1, 0, 1, 2), rule) == rule
    assert residual_targets(obs, [0, 4, 2], (-2, -1, 0, 1, 2), rule) == {od.key: 2, spot.key: 2}  # spot capped
    assert residual_targets(obs, [3, 2, 2], (-2, -1, 0, 1, 2), {od.key: 7, spot.key: 0}) == {od.key: 6, spot.key: 0}


def test_importing_fleetwise_does_not_import_torch():
    code = ("import sys, fleetwise, fleetwise.envs.autoscaling, fleetwise.policies.scalers_rl, "
            "fleetwise.learn.autoscaling; from fleetwise.policies import names; "
            "assert 'rl' in names('scaler'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_rl_scaler_missing_checkpoint_is_an_input_error(tmp_path):
    from fleetwise.policies import make

    with pytest.raises(InputError, match="not found"):
        make("scaler", "rl", {"checkpoint": str(tmp_path / "nope.zip")})


def test_short_ppo_training_then_rl_scaler_runs_the_platform(tmp_path):
    import torch

    from fleetwise.learn.autoscaling import TrainConfig, train_autoscaler
    from fleetwise.policies import make
    from fleetwise.run import run_platform

    torch.set_num_threads(1)
    path = tmp_path / "rl.zip"
    cfg = TrainConfig(env=SHORT, n_steps=64, batch_size=32, n_epochs=2, save_path=str(path), bc_episodes=1,
                      val_seeds=(2000, 2001))
    model = train_autoscaler(128, seed=0, config=cfg)
    assert path.is_file() and model.curve  # at least one episode finished
    # the recipe: warm start (the behaviour-cloning loss fell), the multiplier in the curve, the gate in the card
    assert len(model.bc_losses) >= 1 and model.bc_losses[-1] < model.bc_losses[0]
    assert all(len(c) == 5 and c[4] >= 0 for c in model.curve) and model.lagrangian
    assert model.val_curve[0][0] == 0 and len(model.val_curve) >= 2
    from fleetwise.control.checkpoint import card_path, read_card

    card = read_card(card_path(path.with_suffix(".npz")))
    assert card.rule == "slo_aware" and card.training["action"] == "residual"
    v = card.validation
    assert isinstance(v["passed"], bool) and v["windows"] == 2 and len(v["slo_attainment_diff"]) == 3
    assert v == model.validation
    with pytest.raises(InputError, match="Stable-Baselines3 zip, which runs code"):  # the safe export only
        make("scaler", "rl", {"checkpoint": str(path)})
    sc = default_scenario(start_s=36_000.0, window_s=300.0)
    with cached_servegen():  # the rates read once per process (same workload)
        p = run_platform(sc, 5, scaler={"name": "rl", "checkpoint": str(path.with_suffix(".npz"))}, monitor=False)
    s = p.summary
    assert s["lost_requests"] == 0
    assert s["completed"] == s["requests"] > 0
    assert 0.0 <= s["slo_attainment"] <= 1.0 and s["cost_usd"] > 0


# ---------------------------------------------------------------- the policy contains its rule (issue 17)
def _zero_action_checkpoint(path, groups: int, n: int = 5, card: dict | None = None):
    """A checkpoint whose deterministic action is the centre (a change of 0) in every group."""
    from fleetwise.control.checkpoint import ActionSpec, ModelCard, save_policy

    d = groups * N_GROUP_FEATURES + N_GLOBAL_FEATURES
    bias = np.zeros(groups * n, np.float32)
    bias[n // 2::n] = 1.0
    mc = card if card is not None else {"rule": "slo_aware", "training": {"action": "residual"}}
    return save_policy(path, level="scaler", algorithm="ppo", obs_low=-5 * np.ones(d), obs_high=5 * np.ones(d),
                       action=ActionSpec("multi_discrete", nvec=(n,) * groups),
                       layers=[(np.zeros((groups * n, d), np.float32), bias)], activation="tanh",
                       card=ModelCard(level="scaler", policy="rl", **mc))


class _Recorder:
    """A scaler that records every answer of the one it wraps."""

    def __init__(self, inner):
        self.inner, self.answers = inner, []

    def scale(self, obs):
        t = self.inner.scale(obs)
        self.answers.append(dict(t))
        return t


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x == y or (x != x and y != y) for x, y in ((a[k], b[k]) for k in a))


def test_zero_action_reproduces_slo_aware_over_a_platform_run(tmp_path):
    """The RL scaler with a zero (centre) action gives slo_aware's targets at every epoch of a platform run (a
    15-minute window of the built-in scenario with the zone outage), and so the same records."""
    from fleetwise.policies import make
    from fleetwise.reproduce.platform import windowed
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    sc = parse_scenario(windowed(base, 9.9 * 3600.0, 10.15 * 3600.0))
    ckpt = _zero_action_checkpoint(tmp_path / "zero.npz", len(sc.deployments))
    assert_answers_as_slo_aware(sc, make("scaler", "rl", {"checkpoint": str(ckpt)}))


def assert_answers_as_slo_aware(sc, scaler, seed: int = 3):
    """``scaler`` answers every epoch of a platform run of ``sc`` as slo_aware does, and the records are the same;
    returns it (wrapped in a _Recorder)."""
    from fleetwise.policies import make
    from fleetwise.run import run_platform

    rule, other = _Recorder(make("scaler", "slo_aware")), _Recorder(scaler)
    with cached_servegen():
        a = run_platform(sc, seed, scaler=rule, monitor=False)
        b = run_platform(sc, seed, scaler=other, monitor=False)
    assert len(rule.answers) == len(other.answers) > 20
    assert rule.answers == other.answers  # decision for decision
    assert len({tuple(sorted(x.items())) for x in rule.answers}) > 1  # the rule did scale in this window
    assert _same(a.summary, b.summary)
    for col in ("arrival_s", "first_token_s", "completion_s"):
        assert np.array_equal(getattr(a.records, col), getattr(b.records, col), equal_nan=True), col
    return other


def test_env_rule_action_is_slo_aware():
    """Autoscaling-v0 driven by rule_action() answers every epoch as slo_aware does on its own through
    run_platform (the env and the deployed scaler see the same rule)."""
    from fleetwise.policies import make
    from fleetwise.run import run_platform

    env = AutoscalingEnv(config=SHORT, held_out=True)
    env.reset(seed=1003)
    answers = []
    while env.scale_obs is not None:
        _, _, term, trunc, info = env.step(env.rule_action())
        answers.append(info["targets"])
        if term or trunc:
            break
    rule = _Recorder(make("scaler", "slo_aware"))
    with cached_servegen():
        run_platform(env.scenario_for(1003), 1003, scaler=rule, monitor=False)
    assert answers == rule.answers and len(answers) > 5


def test_an_old_rl_checkpoint_is_one_clear_line(tmp_path):
    from fleetwise.policies import make

    old = _zero_action_checkpoint(tmp_path / "old.npz", 2, card={})  # no rule: the old action
    with pytest.raises(InputError, match=r"old action .* corrects slo_aware.*retrain") as e:
        make("scaler", "rl", {"checkpoint": str(old)})
    assert "\n" not in str(e.value)
    r = subprocess.run([sys.executable, "-m", "fleetwise", "serve", "--scaler", f"rl?checkpoint={old}", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "old action" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- training jobs on the sweep backends
def _tiny_job(tmp_path, seed: int, tag: str) -> dict:
    from fleetwise.learn.autoscaling import TrainConfig

    cfg = TrainConfig(env=SHORT, n_steps=32, batch_size=32, n_epochs=1, bc_episodes=1, bc_max_epochs=5,
                      save_path=str(tmp_path / f"{tag}-s{seed}.zip"))
    return {"timesteps": 32, "seed": seed, "config": cfg}


@pytest.mark.ray
def test_training_jobs_on_ray_match_local(tmp_path, local_ray):
    """Training jobs (here two seeds) run as Ray tasks through recipe.run_jobs, as sweeps do; a job gives the same
    policy, learning curve and multiplier as the same job run locally (same seed, same numbers)."""
    from fleetwise.control.checkpoint import load_policy
    from fleetwise.learn.autoscaling import train_job
    from fleetwise.learn.recipe import run_jobs

    remote = run_jobs(train_job, [_tiny_job(tmp_path, s, "ray") for s in (0, 1)], backend="ray")
    local = run_jobs(train_job, [_tiny_job(tmp_path, 1, "local")], workers=1)[0]
    assert [r["seed"] for r in remote] == [0, 1]
    assert remote[1]["curve"] == local["curve"] and remote[1]["lagrangian"] == local["lagrangian"]
    a, b = load_policy(remote[1]["checkpoint"]), load_policy(local["checkpoint"])
    assert all(np.array_equal(wa, wb) and np.array_equal(ba, bb) for (wa, ba), (wb, bb) in zip(a.layers, b.layers))
    c = load_policy(remote[0]["checkpoint"])
    assert not all(np.array_equal(wa, wc) for (wa, _), (wc, _) in zip(a.layers, c.layers))  # another seed


def test_early_stopping_waits_for_min_checks():
    """Warm-started at the rule, the deterministic policy scores as the rule for tens of rollouts; 4 checks
    without improvement stopped the documented 61,500-step training at 1,970 steps, still the rule (2026-12-06).
    ``min_checks`` (SB3's ``min_evals``) keeps early stopping off until then."""
    from fleetwise.learn.recipe import Validator

    class M:
        class policy:
            @staticmethod
            def state_dict():
                return {}

    flat = Validator(lambda m: 0.0, patience=4)
    assert [flat.check(M, k) for k in range(5)] == [True, True, True, True, False]
    late = Validator(lambda m: 0.0, patience=4, min_checks=10)
    assert all(late.check(M, k) for k in range(10)) and not late.check(M, 10)


def test_the_ppo_scaler_gate_refuses_added_oscillations():
    """A PPO checkpoint that saved 5.1% on held-out windows reversed its targets 10.8 times per window against
    the rule's 2.4 (2026-12-06): its gate passed, though the issue's bar is no more oscillations than the rule.
    The gate now counts them, as the CEM scaler's does."""
    from fleetwise.learn.autoscaling import gate_result

    rule = {s: {"cost_usd": 10.0 + s, "slo_attainment": 0.99, "lost_requests": 0, "oscillations": 2}
            for s in range(4)}
    cheaper = {s: dict(rule[s], cost_usd=rule[s]["cost_usd"] * 0.9) for s in range(4)}
    assert gate_result(cheaper, rule, 0.002)["passed"]
    flappy = {s: dict(cheaper[s], oscillations=5) for s in range(4)}
    g = gate_result(flappy, rule, 0.002)
    assert not g["passed"] and not g["constraint_ok"] and g["oscillations_added"] == 12


def test_env_info_counts_the_platforms_oscillations():
    env = AutoscalingEnv(config=SHORT)
    env.reset(seed=3)
    done, info = False, {}
    while not done:
        _, _, term, trunc, info = env.step(env.rule_action())
        done = term or trunc
    assert info["oscillations"] == env.platform.flaps >= 0
