"""Edge batching SMDP: the environment, its masks and sojourn times, the zero action = the rule (offload_greedy), the
time-aware buffer, DISPPO on the recipe end to end."""

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
    OffloadGreedy,
    evaluate,
    segment,
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


def test_odd_arguments_and_actions():
    """Found by fuzzing, 2026-12-06: trace="x" and mix="x" failed at reset with AttributeErrors; step([10**30, 0,
    0]) was an OverflowError and NaN a ValueError. Arguments are checked by type; since 2026-12-07 an action
    outside the space is a ValueError naming it, as in the other environments (it ran the rule's action, flagged,
    which hid the caller's bug), and held_out must be a bool or a split name."""
    for kw in ({"trace": "x"}, {"mix": "x"}, {"config": {"rate_rps": 1}}):
        with pytest.raises(TypeError, match=next(iter(kw))):
            gym.make("fleetwise/EdgeBatching-v0", **kw)
    with pytest.raises(ValueError, match="held_out"):
        gym.make("fleetwise/EdgeBatching-v0", held_out="nope")
    env = gym.make("fleetwise/EdgeBatching-v0", config=SMALL).unwrapped
    env.reset(seed=0)
    for bad in ([10**30, 0, 0], [np.nan, 0, 0], [1.7, 0, 0], "abc", None, [99, 0, 0], [0, 0], [-1, 0, 0]):
        with pytest.raises(ValueError, match="action"):
            env.step(bad)
    _, r, *_, info = env.step(np.array([0, 0, 0]))  # the refused actions changed nothing
    assert not info["invalid_action"] and np.isfinite(r)


def _random_action(m, rng, nvec):
    bounds = np.concatenate([[0], np.cumsum(nvec)])
    return [int(rng.choice(np.flatnonzero(m[bounds[i]:bounds[i + 1]]))) for i in range(len(nvec))]


def test_masked_random_rollout_times_and_rewards():
    env = EdgeBatchingEnv(SMALL)
    obs, info = env.reset(seed=3)
    rng = np.random.default_rng(0)
    total_tau, t0 = 0.0, info["time_s"]
    outcomes = 0
    nc = len(SMALL.chunk_sizes)
    deviations = 0
    while True:
        m = env.action_masks()
        lane = env._lane
        assert m[0] and m[nc] and m[nc + 3]  # the rule's choices are always allowed
        assert m[nc + 4] == (len(lane.waiting) >= 2)  # deadline order needs two waiting requests
        assert m[1] == bool(lane.running and (lane.waiting or lane.prefilling))  # decode-only needs both
        if not (lane.waiting or lane.prefilling):
            assert not m[1:nc].any()  # nothing to prefill: every chunk budget is the rule's plan
        assert not (m[nc + 1] and m[nc + 2])  # "never" when the rule offloads, "now" when it does not
        a = _random_action(m, rng, SMALL.action_nvec)
        deviations += a != [0, 0, 0]
        obs, r, term, trunc, info = env.step(a)
        assert not info["invalid_action"]
        assert info["tau"] >= 0.0 and env.observation_space.contains(obs)
        total_tau += info["tau"]
        outcomes += info["on_time"] + info["late"] + info["dropped"]
        assert r == pytest.approx(info["on_time"] - SMALL.miss_penalty * info["late"]
                                  - SMALL.drop_penalty * info["dropped"])  # ttft_lambda is 0
        if term:
            break
    sim = env.view.sim
    assert deviations > 0
    assert total_tau == pytest.approx(info["time_s"] - t0)
    assert outcomes == sim.n  # every request ended and was rewarded exactly once
    assert 0.0 <= info["ttft_attainment"] <= 1.0 and info["deadline_rps"] >= 0.0
    with pytest.raises(RuntimeError):
        env.step([0, 0])


def test_masked_choice_runs_the_rule_and_is_flagged():
    env = EdgeBatchingEnv(SMALL)
    env.reset(seed=0)
    nc = len(SMALL.chunk_sizes)
    for _ in range(2000):
        m = env.action_masks()
        if not m[nc + 1]:  # "never" is masked: the rule does not offload
            _, _, _, _, info = env.step([0, 1, 0])
            assert info["invalid_action"]
            return
        env.step([0, 0, 0])
    pytest.skip("no masked choice met")


def test_the_ttft_multiplier_is_charged_per_missed_first_token():
    env = EdgeBatchingEnv(SMALL)
    env.ttft_lambda = 3.0
    env.reset(seed=2)
    missed = 0
    while True:
        _, r, term, _, info = env.step(env.rule_action())
        missed += info["ttft_missed"]
        assert r == pytest.approx(info["on_time"] - SMALL.miss_penalty * info["late"]
                                  - SMALL.drop_penalty * info["dropped"] - 3.0 * info["ttft_missed"])
        if term:
            break
    assert missed > 0  # the test means something: first tokens were missed at this load
    assert info["ttft_attainment"] == pytest.approx(1.0 - missed / env.view.sim.n)


def test_zero_action_is_offload_greedy_decision_for_decision():
    """The learned policy contains its rule: the zero action over a whole segment gives exactly the records of
    the rule ``offload_greedy`` run as a batcher (every request's first token, completion and offload)."""
    from fleetwise.control.controller import Controller

    cfg = replace(EdgeConfig(), segment_s=60.0)
    env = EdgeBatchingEnv(cfg, held_out="test")
    env.reset(options={"segment_seed": 1003})
    plans = []
    while True:
        plans.append(env.view.plan(env._lane, env.rule_action()))
        _, _, term, _, _ = env.step(env.rule_action())
        if term:
            break
    a = env.view.sim
    view = segment(cfg, 1003, "test")
    rule = OffloadGreedy(view)
    seen = []

    class Recording:
        stationary = False

        def plan(self, lane):
            p = rule.plan(lane)
            seen.append(p)
            return p

    view.sim.run(Controller(router=make("router", "nearest_region"), batcher=Recording()))
    b = view.sim
    assert seen == plans  # decision for decision
    hops = np.frombuffer(a.hops, dtype=np.int8)
    assert hops.sum() > 0  # the rule offloads on this segment: the test covers offloads
    assert np.array_equal(hops, np.frombuffer(b.hops, dtype=np.int8))
    for x, y in ((a.first_token_s, b.first_token_s), ):
        assert np.array_equal(np.frombuffer(x), np.frombuffer(y), equal_nan=True)
    done_a = [a.client_completion_s(r) for r in range(a.n)]
    done_b = [b.client_completion_s(r) for r in range(b.n)]
    assert np.array_equal(done_a, done_b, equal_nan=True)
    # and evaluate() of the rule reports that run
    row = evaluate(cfg, OffloadGreedy, [1003])[0]
    assert row["on_time"] == sum(env.view.outcome(r) == 1 for r in range(a.n))
    assert row["offloaded"] == int(hops.sum())


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
    rng = np.random.default_rng(0)
    for _ in range(300):
        assert len(env._lane.running) + len(env._lane.prefilling) <= 2
        _, _, term, _, _ = env.step(_random_action(env.action_masks(), rng, lim.action_nvec))
        if term:
            break


def test_training_mix_draws_loads_and_trace_shapes():
    from fleetwise.envs.edge import TrainMix

    env = EdgeBatchingEnv(replace(SMALL, segment_s=20.0), mix=TrainMix(p_paper=0.5))
    names, rates = set(), []
    for k in range(8):
        env.reset(seed=k)
        w = env.view.sim.workload
        names.add(w.name)
        rates.append(len(w))
    assert len(names) >= 2 and len(set(rates)) > 1  # the paper's mix and fitted single traces, several sizes


def test_disppo_on_the_recipe_starts_at_the_rule_and_gates(tmp_path):
    from fleetwise.learn.disppo import DISPPOArgs, EdgeValidation, NumpyPolicy, train

    tiny = replace(SMALL, segment_s=8.0)  # episodes of ~1,000 decisions: several end within the budget
    val = EdgeValidation([("a", tiny, 2000, None, None), ("b", tiny, 2001, None, None)], OffloadGreedy,
                         lambda view: make("batcher", "sarathi", {"max_num_seqs": 32}))
    args = DISPPOArgs(total_timesteps=4096, n_steps=512, n_envs=2, batch_size=256, n_epochs=2, bc_episodes=1,
                      bc_epochs=3, ttft_target=0.99, validate_every=2, patience=10)
    model, curve, wall = train(lambda: EdgeBatchingEnv(tiny), args, validation=val)
    assert wall > 0 and curve["bc_loss"][-1] < curve["bc_loss"][0]
    assert curve["validation"][0][0] == 0 and len(curve["validation"]) >= 3  # the warm start is a candidate
    assert curve["lagrange"] and all(lam >= 0 for _, lam, _ in curve["lagrange"])
    # the warm start reproduces the rule: the chosen checkpoint never scores below it on validation
    rule_score = float(np.mean([r["deadline_rps"] for r in val.rule.values()]))
    assert max(v for _, v in curve["validation"]) >= rule_score - 1e-9
    g = val.gate(model)
    assert g["rule"] == "offload_greedy" and g["windows"] == 2 and isinstance(g["passed"], bool)
    rows = evaluate(SMALL, lambda view: EdgePolicyBatcher(NumpyPolicy(model), view), [5])
    assert rows[0]["completed"] > 0
    # the checkpoint it exports is reused by a job of the same key: the same decisions, gate and curve
    from fleetwise.learn.export import export_sb3
    from fleetwise.reproduce.batching import _reuse_ppo

    ck = export_sb3(model, tmp_path / "disppo-seed0.npz", level="batcher", policy="disppo", rule="offload_greedy",
                    training={"job_key": "k1", "curve": curve, "wall_s": wall}, validation=g)
    job = {"name": "disppo", "seed": 0, "checkpoint": str(ck)}
    assert _reuse_ppo(job, "k2", 0.99) is None  # another job's key: train
    bad = export_sb3(model, tmp_path / "bad.npz", level="batcher", policy="disppo", rule="offload_greedy",
                     training={"job_key": "k1", "curve": {"validation": 3}, "wall_s": wall}, validation=g)
    assert _reuse_ppo({**job, "checkpoint": str(bad)}, "k1", 0.99) is None  # a malformed curve: train
    old = _reuse_ppo(job, "k1", 0.99)
    assert old["reused"] and old["gate"] == g and old["curve"]["validation"] == [tuple(v) for v in curve["validation"]]
    env = EdgeBatchingEnv(tiny)
    obs, _ = env.reset(seed=3)
    for _ in range(200):
        m = env.action_masks()
        a, _ = old["policy"].predict(obs, action_masks=m)
        assert np.array_equal(a, NumpyPolicy(model).predict(obs, action_masks=m)[0])
        obs, _, done, _, _ = env.step(a)
        if done:
            break


def test_disppo_early_stopping_waits_for_half_the_budget():
    """Behaviour cloning leaves PPO's greedy policy at the rule for the first 110,000-150,000 steps of the full
    budget, so the validation score is the rule's at every early check; 6 checks without improvement stopped all
    six full-budget jobs at 73,728 steps, still the rule (2026-12-06). Early stopping now waits for half the
    budget's rollouts (``early_stop_after``), as the RL scaler's does."""
    from fleetwise.learn.disppo import DISPPOArgs, train

    class Flat:  # a validation whose score never improves
        @staticmethod
        def score(model):
            return 0.0

    tiny = replace(SMALL, segment_s=8.0)
    args = DISPPOArgs(total_timesteps=8192, n_steps=256, n_envs=2, batch_size=256, n_epochs=1, bc_episodes=0,
                      validate_every=1, patience=1)
    steps = {}
    for share in (0.0, 0.5):
        model, curve, _ = train(lambda: EdgeBatchingEnv(tiny), replace(args, early_stop_after=share), validation=Flat)
        steps[share] = model.num_timesteps
    assert steps[0.0] <= 2 * 512 and 8 * 512 <= steps[0.5] < 8192
    with pytest.raises(ValueError, match="early_stop_after"):
        train(lambda: EdgeBatchingEnv(tiny), replace(args, early_stop_after=1.5), validation=Flat)


def test_cem_policy_zero_parameters_are_offload_greedy_decision_for_decision():
    """DISPPO's linear policy (the CEM learner's) contains the rule: zero parameters give the rule's batch plan at
    every decision of a whole segment (offloads included), and so its records."""
    from fleetwise.learn.batching_cem import LinearEdgePolicy, n_params

    cfg = replace(EdgeConfig(), segment_s=60.0)
    pol = LinearEdgePolicy.from_params(np.zeros(n_params(cfg)), cfg)
    seen: dict[str, list] = {"rule": [], "cem": [], "edf": []}

    def recording(name, inner):
        class Rec:
            stationary = False

            def plan(self, lane):
                p = inner.plan(lane)
                seen[name].append(p)
                return p
        return Rec()

    a = evaluate(cfg, lambda view: recording("rule", OffloadGreedy(view)), [1003], held_out="test")[0]
    b = evaluate(cfg, lambda view: recording("cem", EdgePolicyBatcher(pol, view)), [1003], held_out="test")[0]
    assert len(seen["rule"]) > 100 and seen["cem"] == seen["rule"]
    assert a == b and a["offloaded"] > 0  # the rule offloads on this segment: the test covers offloads
    # a parameter moves the decision: a positive bias on "offload now" offloads more
    d1 = len(pol.W[0]) + 1
    p = np.zeros(n_params(cfg))
    p[8 * d1 - 1] = 1.0  # the bias of row 8 (6 chunk rows, then offload 1 and 2): offload choice 2 ("now")
    c = evaluate(cfg, lambda view: EdgePolicyBatcher(LinearEdgePolicy.from_params(p, cfg), view), [1003],
                 held_out="test")[0]
    assert c["offloaded"] > a["offloaded"]
    # ... and a positive bias on the last row (queue order 1, "deadline") reorders admissions
    q = np.zeros(n_params(cfg))
    q[-1] = 1.0
    e = evaluate(cfg, lambda view: recording("edf", EdgePolicyBatcher(LinearEdgePolicy.from_params(q, cfg), view)),
                 [1003], held_out="test")[0]
    assert seen["edf"] != seen["rule"] and e["requests"] == a["requests"]


def test_deadline_order_puts_feasible_requests_first_by_deadline():
    """EdgeView.deadline_order: requests that can still be prefilled by their TTFT deadline first, earliest
    deadline first, then the late ones; the plan with queue order 1 admits in that order."""
    seen: list = []

    class Probe:
        stationary = False

        def __init__(self, view):
            self.view = view

        def plan(self, lane):
            if len(lane.waiting) >= 3 and not seen:
                order = self.view.deadline_order(lane)
                now, tps = lane.time_s, self.view.prefill_tps[lane.replica]
                slack = [self.view._ttft_dl[r] - now - lane.context(r) / tps for r in order]
                late = [x < 0 for x in slack]
                assert late == sorted(late)  # feasible ones first
                dl = [self.view._ttft_dl[r] for r in order]
                k = late.count(False)
                assert dl[:k] == sorted(dl[:k]) and dl[k:] == sorted(dl[k:])
                assert sorted(order) == sorted(lane.waiting)
                seen.append(order)
            return self.view.plan(lane, (0, 0, 1))

    evaluate(replace(EdgeConfig(), segment_s=60.0), Probe, [1003], held_out="test")
    assert seen


def test_batching_cem_on_the_recipe_starts_at_the_rule_gates_and_writes_a_numpy_checkpoint(tmp_path):
    from fleetwise.control.checkpoint import load_policy
    from fleetwise.learn.batching_cem import BatchingCEMConfig, LinearEdgePolicy, train_batching_cem
    from fleetwise.learn.disppo import EdgeValidation

    tiny = replace(SMALL, segment_s=20.0)
    val = EdgeValidation([("a", tiny, 2000, None, None), ("b", tiny, 2001, None, None)], OffloadGreedy,
                         lambda view: make("batcher", "sarathi", {"max_num_seqs": 32}))
    bcfg = BatchingCEMConfig(iterations=2, population=3, elite=1, segments=2, segment_s=20.0)
    r = train_batching_cem(tiny, val, bcfg, out=tmp_path / "disppo.npz")
    rule_score = float(np.mean([x["deadline_rps"] for x in val.rule.values()]))
    assert r["validation_curve"][0] == (0, pytest.approx(rule_score))  # the warm start (the rule) is the first
    assert len(r["curve"]) == 2 and len(r["lagrange"]) == 2 and all(lam >= 0 for _, lam, _ in r["lagrange"])
    assert max(v for _, v in r["validation_curve"]) >= rule_score - 1e-9
    g = r["gate"]
    assert g["rule"] == "offload_greedy" and g["windows"] == 2 and isinstance(g["passed"], bool)
    # the checkpoint: numpy only, its card carries the gate; its argmax per dimension is the policy's (no masks)
    ck = load_policy(r["checkpoint"], level="batcher")
    assert ck.algorithm == "cem" and ck.card.validation["passed"] == g["passed"] and ck.card.rule == "offload_greedy"
    # the same job again reuses the checkpoint (training is deterministic); another seed retrains
    again = train_batching_cem(tiny, val, bcfg, out=tmp_path / "disppo.npz", reuse=True)
    assert again["reused"] and again["params"] == r["params"] and again["gate"] == r["gate"]
    assert again["validation_curve"] == r["validation_curve"] and again["best_step"] == r["best_step"]
    other = train_batching_cem(tiny, val, replace(bcfg, seed=1), out=tmp_path / "disppo.npz", reuse=True)
    assert not other.get("reused")
    from fleetwise.learn.batching_cem import save_batching_cem
    from fleetwise.worlds.edge import TrainMix

    rng = np.random.default_rng(0)
    params = rng.normal(0.0, 1.0, len(r["params"]))
    pol = LinearEdgePolicy.from_params(params, tiny)
    ck2 = load_policy(save_batching_cem(tmp_path / "random.npz", params, tiny, bcfg, TrainMix(), {"gate": g}),
                      level="batcher")
    obs = rng.random((32, len(pol.W[0]))).astype(np.float32)
    assert np.array_equal(ck2.predict(obs)[0], np.stack([pol.predict(o)[0] for o in obs]))


@pytest.mark.ray
def test_batching_training_jobs_on_ray_match_local(tmp_path, local_ray):
    """`reproduce batching --backend ray`: the CEM training jobs run as Ray tasks (recipe.run_jobs, the sweep
    backends) and give the same policy, gate and held-out numbers as in-process."""
    import json

    from fleetwise.reproduce import batching as B

    tiny = {"iterations": 1, "population": 2, "elite": 1, "segments": 1}
    kw = dict(quick=True, seeds=2, sweep=False, progress=False, cem=tiny)
    remote = B.run(db=str(tmp_path / "ray" / "fleetwise.duckdb"), backend="ray", **kw)
    local = B.run(db=str(tmp_path / "local" / "fleetwise.duckdb"), **kw)
    assert remote["disppo"]["deadline_rps"] == local["disppo"]["deadline_rps"]
    assert remote["disppo"]["gates"] == local["disppo"]["gates"]
    cards = [json.loads((tmp_path / d / "batching" / "disppo-seed0.card.json").read_text()) for d in ("ray", "local")]
    assert cards[0]["training"]["params"] == cards[1]["training"]["params"]
    assert cards[0]["training"]["algorithm"] == "cem" and cards[0]["rule"] == "offload_greedy"


def test_world_configs_refuse_values_a_run_cannot_take():
    """Found by fuzzing the Python API (2026-12-06): EdgeConfig(max_running=0) divided by zero, nodes=() failed in
    numpy, rate_rps=0 gave an episode with no decision; TortaConfig(slot_s=0) divided by zero, load=-1 failed in
    numpy's Poisson draw and history=0 changed the observation's length after reset."""
    from fleetwise.worlds.torta import TortaConfig

    for kw, field in ((dict(max_running=0), "max_running"), (dict(nodes=()), "nodes"), (dict(rate_rps=0.0), "rate_rps"),
                      (dict(segment_s=float("nan")), "segment_s"), (dict(train_fraction=0.05), "train_fraction")):
        with pytest.raises(ValueError, match=f"EdgeConfig.{field} = "):
            EdgeConfig(**kw)
    for kw, field in ((dict(slot_s=0.0), "slot_s"), (dict(load=-1.0), "load"), (dict(history=0), "history"),
                      (dict(burst_prob=2.0), "burst_prob")):
        with pytest.raises(ValueError, match=f"TortaConfig.{field} = "):
            TortaConfig(**kw)
    assert replace(EdgeConfig(), max_running=np.int64(4)).max_running == 4  # (a sweep's numpy integers)
    # the second pass (2026-12-06): max_running=10**12 hung the reset, a type's rate_share 0 gave an episode with
    # no decision, a node's user_share -1 failed in numpy; TortaConfig(load=1e6) took 9 GB, a share 0 failed
    from fleetwise.worlds.edge import EdgeNode, RequestType
    from fleetwise.worlds.torta import ModelType

    for kw, needle in ((dict(max_running=10**12), "max_running"), (dict(types=()), "types"),
                       (dict(types=(RequestType("chat", "azure-conv", 2.0, 0.1, 0.0),)), "rate_share 0.0"),
                       (dict(nodes=(EdgeNode("l4", "l4", -1.0),)), "user_share -1.0")):
        with pytest.raises(ValueError, match=f"EdgeConfig.*{needle}"):
            EdgeConfig(**kw)
    for kw, needle in ((dict(load=1e6), "load"), (dict(slot_s=1e7), "slot_s"), (dict(types=()), "types"),
                       (dict(types=(ModelType("chat", "azure-conv", "m-large", 0.0),)), "share 0.0")):
        with pytest.raises(ValueError, match=f"TortaConfig.*{needle}"):
            TortaConfig(**kw)
