"""The Python API's contract, found by a helper's audit (2026-12-07): environments refuse what they cannot take
and hand out observations nobody else edits; library calls name the argument that is wrong."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from fleetwise.errors import InputError

gym = pytest.importorskip("gymnasium")


def test_autoscaling_deltas_need_a_zero_and_the_rule_action_is_its_index():
    import fleetwise.envs  # noqa: F401
    from fleetwise.envs.autoscaling import AutoscalingConfig
    from fleetwise.policies.scaler_features import residual_targets

    for bad, what in (((1, 2), "change of 0"), ((0, 0, 1), "twice"), ((), "non-empty"), ((0.5, 0), "whole")):
        with pytest.raises(InputError, match=what):
            AutoscalingConfig(deltas=bad)
    cfg = AutoscalingConfig(deltas=(-1, 0, 1, 2))
    env = gym.make("fleetwise/Autoscaling-v0", config=cfg).unwrapped
    env.reset(seed=1)
    a = env.rule_action()
    assert a.tolist() == [1] * cfg.max_groups  # the index of 0, not len // 2 (which is +1 here)
    obs = env.scale_obs
    assert residual_targets(obs, a, cfg.deltas, env.rule_targets) == env.rule_targets
    assert residual_targets(obs, [], cfg.deltas, env.rule_targets) == env.rule_targets  # a short action: no change
    rule = dict(env.rule_targets)
    _, _, _, _, info = env.step(a)
    assert info["targets"] == rule  # (the rule said 4 per group and 5 was answered)


def test_autoscaling_window_longer_than_its_part_of_the_trace_is_refused_at_construction():
    import fleetwise.envs  # noqa: F401
    from fleetwise.envs.autoscaling import AutoscalingConfig, episode_scenario

    with pytest.raises(InputError, match="window_s.*training part"):
        AutoscalingConfig(window_s=1e7)
    with pytest.raises(InputError, match="window_s.*training part"):
        AutoscalingConfig(train_fraction=0.0005)
    cfg = AutoscalingConfig(window_s=300_000.0)  # fits the first 80%, not the last 20% (241,920 s)
    with pytest.raises(InputError, match="window_s.*held-out part"):
        gym.make("fleetwise/Autoscaling-v0", config=cfg, held_out=True)
    with pytest.raises(InputError, match="held-out part"):
        episode_scenario(0, True, 300_000.0)
    with pytest.raises(InputError, match="held_out"):
        gym.make("fleetwise/Autoscaling-v0", held_out="x")
    env = gym.make("fleetwise/Autoscaling-v0").unwrapped
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(env.rule_action())


def test_every_environment_refuses_a_render_mode_it_does_not_have():
    import fleetwise.envs  # noqa: F401
    from fleetwise.envs.graph_marl import make_env

    for env_id in ("Allocation", "EdgeBatching", "Torta", "Autoscaling"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (gymnasium's own warning about the mode comes first)
            with pytest.raises(ValueError, match="render_mode 'rgb_array'"):
                gym.make(f"fleetwise/{env_id}-v0", render_mode="rgb_array")
        assert gym.make(f"fleetwise/{env_id}-v0").unwrapped.render_mode is None
    with pytest.raises(InputError, match="render_mode"):
        make_env(render_mode="human")
    assert make_env(duration_s=120).render_mode is None
    with pytest.raises(ValueError, match="held_out"):
        gym.make("fleetwise/Torta-v0", held_out="x")


def test_graph_marl_observations_are_each_agents_own():
    pytest.importorskip("pettingzoo")
    from fleetwise.envs.graph_marl import make_env

    env = make_env(duration_s=120)
    obs, _ = env.reset(seed=0)
    a, b = obs["cloud"], obs["model"]
    assert a is not b and a["x"] is not b["x"]
    with pytest.raises(ValueError, match="read-only"):
        a["edge_index"][0, 0] = 1
    a["x"][:] = 123.0  # an agent's edit stays its own
    assert not np.any(b["x"] == 123.0)
    nxt, *_ = env.step(env.rule_action())
    assert not np.any(nxt["model"]["x"] == 123.0)


def test_lagrangian_takes_its_options_by_name_and_names_a_bad_one():
    from fleetwise.learn.recipe import Lagrangian

    with pytest.raises(TypeError):
        Lagrangian(0.98, 0.1)  # (read 0.1 as the sense)
    assert Lagrangian(0.98, lr=0.1).lr == 0.1
    for kw, name in (({"lr": -1}, "lr"), ({"scale": 0}, "scale"), ({"lam": math.nan}, "lam"), ({"ki": math.inf}, "ki")):
        with pytest.raises(ValueError, match=f"Lagrangian {name} "):
            Lagrangian(0.9, **kw)
    with pytest.raises(ValueError, match="target"):
        Lagrangian(math.nan)


def test_gate_needs_windows_in_common():
    from fleetwise.learn.recipe import gate

    for pol, rule in (({1: 1.0}, {2: 1.0}), ({}, {}), ([1.0], [1.0])):
        with pytest.raises(InputError, match="no validation window"):
            gate(pol, rule)
    assert gate({1: 0.9, 2: 0.8}, {1: 1.0, 2: 1.0})["windows"] == 2


def test_sweep_store_and_jobs_name_a_bad_argument(tmp_path):
    from fleetwise.experiments.runner import run_sweep
    from fleetwise.experiments.store import Store
    from fleetwise.learn.recipe import run_jobs

    store = Store(None)
    with pytest.raises(InputError, match="runs"):
        run_sweep("x", store)
    for w in (0, -3, 1.5, True, 10**6):
        with pytest.raises(InputError, match="workers"):
            run_sweep([], store, workers=w)
        with pytest.raises(InputError, match="workers"):
            run_jobs(abs, [1], workers=w)
    with pytest.raises(InputError, match="store"):
        run_sweep([], "results.duckdb")
    with pytest.raises(InputError, match="Store path"):
        Store(123)
    with pytest.raises(InputError, match="lock_timeout_s"):
        Store(None, lock_timeout_s=-1)
    with pytest.raises(InputError, match="fn"):
        run_jobs("abs", [1])
    assert run_jobs(abs, [-1, -2], workers=1) == [1, 2]


def test_required_policy_parameters_checkpoint_levels_and_empty_names_are_named():
    from fleetwise import load_scenario, simulate
    from fleetwise.control.checkpoint import CheckpointError, load_policy
    from fleetwise.policies import make

    for level, name, param in (("allocator", "dqn", "path"), ("allocator", "sarsa", "path"),
                               ("scaler", "rl", "checkpoint")):
        with pytest.raises(InputError, match=f"{level} '{name}' needs the parameter '{param}'"):
            make(level, name)
    with pytest.raises(CheckpointError, match="level 'nope'"):
        load_policy("whatever.npz", level="nope")
    with pytest.raises(InputError, match="empty"):
        load_scenario("")
    with pytest.raises(InputError, match="num_requests -5"):
        simulate("default", num_requests=-5)


def test_envs_name_the_missing_extra(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['gymnasium'] = None\n"
            "try:\n    import fleetwise.envs\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "needs the rl extra" in out and "fleetwise[rl]" in out


def test_dir_lists_the_lazy_names():
    import fleetwise

    assert {"load_scenario", "simulate", "run_scenario"} <= set(dir(fleetwise))


def test_a_scenario_naming_an_unknown_gpu_or_model_is_refused_when_loaded():
    from fleetwise.scenario import parse_scenario

    for field, value, words in (("gpu", "Z9000", "deployments.0.gpu: unknown GPU 'Z9000'"),
                                ("model", "gpt-9", "deployments.0.model: unknown model 'gpt-9'")):
        dep = {"model": "llama-3-8b", "gpu": "a100-80gb", "replicas": 1} | {field: value}
        with pytest.raises(InputError, match=words):
            parse_scenario({"deployments": [dep]})
    assert parse_scenario({"deployments": [{"model": "Llama-3-8B", "gpu": "h100", "replicas": 1}]})
