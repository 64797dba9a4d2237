"""Edge batching SMDP: the environment, its masks and sojourn times, the time-aware buffer, DISPPO end to end."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pytest.importorskip("sb3_contrib")

import fleetwise.envs  # noqa: E402,F401
from fleetwise.policies import make  # noqa: E402
from fleetwise.envs.edge import EdgeBatchingEnv  # noqa: E402
from fleetwise.worlds.edge import (  # noqa: E402
    EdgeConfig,
    EdgePolicyBatcher,
    evaluate,
    with_batch_limit,
)

SMALL = replace(EdgeConfig(), segment_s=40.0, drain_s=60.0)


@pytest.fixture(autouse=True)
def _needs_data(data_dir):
    return data_dir


def test_check_env():
    from gymnasium.utils.env_checker import check_env

    env = gym.make("fleetwise/EdgeBatching-v0", config=SMALL)
    check_env(env.unwrapped)


def test_masked_random_rollout_times_and_rewards():
    env = EdgeBatchingEnv(SMALL)
    obs, info = env.reset(seed=3)
    rng = np.random.default_rng(0)
    total_tau, t0 = 0.0, info["time_s"]
    outcomes = 0
    steps = 0
    while True:
        m = env.action_masks()
        lane = env._lane
        assert m[-1] == (not lane.running)  # wait only when nothing decodes
        j = len(SMALL.prefill_sizes)
        assert m[j] == bool(lane.running)  # decode needs a decoding sequence
        if not lane.waiting:
            assert not m[:j].any() and not m[j + 1]  # nothing to prefill or offload
        obs, r, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(m))))
        steps += 1
        assert info["tau"] >= 0.0 and env.observation_space.contains(obs)
        total_tau += info["tau"]
        outcomes += info["on_time"] + info["late"] + info["dropped"]
        assert r == pytest.approx(info["on_time"] - SMALL.miss_penalty * info["late"] - SMALL.drop_penalty * info["dropped"])
        if term:
            break
    sim = env.view.sim
    assert total_tau == pytest.approx(info["time_s"] - t0)
    assert outcomes == sim.n  # every request ended and was rewarded exactly once
    with pytest.raises(RuntimeError):
        env.step(0)


def test_masked_action_runs_the_default_and_is_flagged():
    env = EdgeBatchingEnv(SMALL)
    env.reset(seed=0)
    for _ in range(500):
        m = env.action_masks()
        if (~m).any():
            _, _, term, _, info = env.step(int(np.flatnonzero(~m)[0]))
            assert info["invalid_action"]
            return
        env.step(int(np.flatnonzero(m)[0]))
    pytest.skip("no masked action met")


def test_time_aware_returns_discount_by_tau():
    import torch
    from gymnasium import spaces

    from fleetwise.learn.disppo import _buffer_class

    cls = _buffer_class()
    for time_aware in (True, False):
        buf = cls(4, spaces.Box(0, 1, (1,)), spaces.Discrete(2), gamma=0.5, gae_lambda=1.0, n_envs=1,
                  time_aware=time_aware)
        taus = [0.5, 2.0, 1.0, 3.0]
        for i, tau in enumerate(taus):
            buf.next_tau = np.array([tau], dtype=np.float32)
            buf.add(np.zeros((1, 1)), np.zeros((1, 1)), np.array([1.0]), np.array([i == 0]), torch.zeros(1),
                    torch.zeros(1), action_masks=np.ones((1, 2)))
        buf.compute_returns_and_advantage(torch.zeros(1), np.array([True]))
        # values are 0 and the episode ends: return_t = r_t + d_t * return_{t+1}
        d = [0.5 ** t if time_aware else 0.5 for t in taus]
        expect = [0.0] * 4
        nxt = 0.0
        for t in reversed(range(4)):
            nxt = 1.0 + (d[t] * nxt if t < 3 else 0.0)
            expect[t] = nxt
        assert buf.returns[:, 0] == pytest.approx(expect)


def test_baselines_conserve_requests_and_batch_limit_applies():
    rows = evaluate(SMALL, lambda view: make("batcher", "sarathi", {"max_num_seqs": 32}), [1, 2])
    assert all(r["completed"] <= r["requests"] for r in rows)
    assert all(0 <= r["on_time"] <= r["completed"] for r in rows)
    lim = with_batch_limit(SMALL, 2)
    env = EdgeBatchingEnv(lim)
    env.reset(seed=1)
    for _ in range(200):
        m = env.action_masks()
        assert not m[2:len(lim.prefill_sizes)].any()  # prefill sizes above 2 are masked
        assert len(env._lane.running) <= 2
        _, _, term, _, _ = env.step(int(np.flatnonzero(m)[0]))
        if term:
            break


def test_disppo_trains_and_runs_as_a_batcher():
    from fleetwise.learn.disppo import DISPPOArgs, train

    model, curve, wall = train(lambda: EdgeBatchingEnv(replace(SMALL, segment_s=20.0)),
                               DISPPOArgs(total_timesteps=4096, n_steps=1024, n_envs=2, batch_size=256, n_epochs=2))
    assert curve and wall > 0
    rows = evaluate(SMALL, lambda view: EdgePolicyBatcher(model, view), [5])
    assert rows[0]["completed"] > 0
