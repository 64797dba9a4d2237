"""Graph-MARL-CloudLLM: the multi-cloud PettingZoo environment, the GNN/MAPPO learner, checkpoints."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fleetwise.data import data_path
from fleetwise.errors import InputError

pytest.importorskip("pettingzoo")
torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from fleetwise.envs.graph_marl import (  # noqa: E402
    AGENTS,
    HEURISTICS,
    GraphMARLConfig,
    MultiCloud,
    evaluate,
    heuristic,
    make_env,
    multicloud_workload,
)

needs_data = pytest.mark.skipif(not (data_path("azure-llm-inference-2023").exists()
                                     and data_path("servegen-alibaba-modelstudio").exists()
                                     and data_path("spot-availability-multiregion").exists()),
                                reason="real traces not available")

# a small, fast configuration: 2-minute segments, 30-s epochs
SMALL = replace(GraphMARLConfig(), segment_s=120.0, drain_s=60.0)


@needs_data
def test_parallel_api_test():
    from pettingzoo.test import parallel_api_test

    env = make_env(replace(SMALL, segment_s=60.0))
    parallel_api_test(env, num_cycles=5)
    obs, _ = env.reset(seed=0)
    assert set(obs) == set(AGENTS)
    o = obs["gpu"]
    assert env.observation_space("gpu").contains(o)
    assert env.state().shape == env.state_space.shape
    # the graph: every edge's endpoints are of the types its edge type says
    from fleetwise.envs.graph_marl import EDGE_TYPES, NODE_TYPES

    nt, ei, et = o["node_type"], o["edge_index"], o["edge_type"]
    for k, (s, _, d) in enumerate(EDGE_TYPES):
        sel = et == k
        assert sel.any()
        assert (nt[ei[0, sel]] == NODE_TYPES.index(s)).all() and (nt[ei[1, sel]] == NODE_TYPES.index(d)).all()


@needs_data
def test_step_refuses_an_action_outside_the_agents_spaces():
    """The PettingZoo env took any action: a float correction, a wrong shape (broadcast), a value out of range
    (taken modulo the choices), an unknown agent (ignored) (found by fuzzing, 2026-12-06). Each is a ValueError
    naming the agent; an agent left out keeps the rule's choice, as before."""
    env = make_env(replace(SMALL, segment_s=60.0))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.rule_action())
    env.reset(seed=0)
    zero = env.rule_action()
    n = env.action_space("gpu").shape[0]
    for bad, needle in [
        ({**zero, "gpu": np.full(n, 0.5)}, "agent gpu"),
        ({**zero, "gpu": np.zeros(n + 1, np.int64)}, "agent gpu"),
        ({**zero, "cloud": np.full(env.action_space("cloud").shape, 99)}, "agent cloud"),
        ({**zero, "gpu": np.full(n, -1)}, "agent gpu"),
        ({**zero, "nope": 1}, "no such agent"),
        ([0, 1], "expected a dict"),
    ]:
        with pytest.raises(ValueError, match=needle):
            env.step(bad)
    env.step({"router": zero["router"]})  # the others keep the rule's choice
    with pytest.raises(ValueError, match="decision NoneType"):
        env.step_raw(None)
    from fleetwise.worlds.multicloud_rules import heuristic

    raw = heuristic("least_loaded", env.mc)
    pools, nc = len(env.mc.pools), len(raw["model"])
    for bad, needle in [  # (clipped, cast or ignored before: NaN was code 0, 7 a spot add, "gpus" nothing)
        ({**raw, "gpu": np.full(pools, np.nan)}, "'gpu': expected"),
        ({**raw, "gpu": np.full(pools, 7)}, "'gpu': codes in 0..3"),
        ({**raw, "router": np.full(nc, -1)}, "'router': codes in 0..2"),
        ({**raw, "model": np.zeros(nc + 1, np.int64)}, "'model': expected"),
        ({**raw, "gpus": np.zeros(pools, np.int64)}, "decision key 'gpus'"),
    ]:
        with pytest.raises(ValueError, match=needle):
            env.step_raw(bad)
    env.step_raw({"gpu": raw["gpu"]})  # the others keep their codes
    with pytest.raises(ValueError, match="seed 1.5"):
        env.reset(seed=1.5)


def test_config_and_make_env_arguments_are_checked():
    """Found by fuzzing, 2026-12-06: load_gb_per_s=0 divided by zero, initial_replicas=-1 ran with rewards of -3e9,
    epoch_s=NaN failed in numpy, segment_s=1e12 and duration_s=1e12 were MemoryErrors, trace="x" an
    AttributeError at reset."""
    for kw, needle in ((dict(load_gb_per_s=0.0), "load_gb_per_s"), (dict(initial_replicas=-1), "initial_replicas"),
                       (dict(epoch_s=float("nan")), "epoch_s"), (dict(segment_s=1e12), "segment_s"),
                       (dict(variants=()), "variants"), (dict(slo_target=2.0), "slo_target")):
        with pytest.raises(InputError, match=needle):
            replace(GraphMARLConfig(), **kw)
    for kw, needle in ((dict(trace="x"), "trace"), (dict(duration_s=1e12), "duration_s"), (dict(load=-1.0), "load"),
                       (dict(config={"epoch_s": 1}), "config")):
        with pytest.raises(InputError, match=needle):
            make_env(**kw)


@needs_data
def test_same_seed_same_numbers_and_conservation():
    a = evaluate(SMALL, "least_loaded", [3])
    b = evaluate(SMALL, "least_loaded", [3])
    assert a == b
    m = a[0]
    assert m["requests"] > 100
    assert 0.0 < m["gpu_util"] <= 1.0
    assert m["cost_usd"] > 0 and 0.0 <= m["slo_attainment"] <= 1.0
    assert m["throughput_rps"] * 0 == 0 and m["latency_p99_s"] >= m["latency_p50_s"] > 0


@needs_data
def test_workload_held_out_differs_and_classes_present():
    cfg = SMALL
    w1 = multicloud_workload(cfg, np.random.default_rng(0), held_out=False)
    w2 = multicloud_workload(cfg, np.random.default_rng(0), held_out=True)
    assert len(w1) > 0 and len(w2) > 0
    assert set(np.unique(w1.slo_class)) == {0, 1, 2}
    assert (np.diff(w1.arrival_s) >= 0).all()
    assert not (len(w1) == len(w2) and np.array_equal(w1.prompt_tokens, w2.prompt_tokens))
    assert (w1.prompt_tokens + w1.output_tokens <= cfg.max_context).all()


@needs_data
def test_training_segments_vary_each_class_rate_and_the_others_do_not():
    """Robustness: a training segment scales each class's rate by a factor from train_rate_range (one value: that
    factor); test and validation segments are unchanged by it (validation is with validation_varies)."""
    from fleetwise.worlds.multicloud import multicloud_workload

    def counts(cfg, split, seed):
        w = multicloud_workload(cfg, np.random.default_rng(seed), split != "train", 300.0, split=split)
        return np.bincount(w.slo_class, minlength=len(cfg.classes)), w

    cfg = GraphMARLConfig()
    one, half = replace(cfg, train_rate_range=(1.0, 1.0)), replace(cfg, train_rate_range=(0.5, 0.5))
    for seed in (1, 2):
        full_n, _ = counts(one, "train", seed)
        half_n, _ = counts(half, "train", seed)
        assert np.all(np.abs(half_n / full_n - 0.5) < 0.1), (half_n, full_n)
        for split in ("validation", "test"):
            a, wa = counts(cfg, split, seed)
            b, wb = counts(one, split, seed)
            assert np.array_equal(wa.arrival_s, wb.arrival_s) and np.array_equal(a, b)
        vh, vo = (counts(replace(c, validation_varies=True), "validation", seed)[0] for c in (half, one))
        assert np.all(np.abs(vh / vo - 0.5) < 0.1), (vh, vo)
    # the default range: per-class factors, so the class mix of training segments varies
    mix = np.array([counts(cfg, "train", s)[0] / counts(one, "train", s)[0] for s in range(6)])
    assert mix.min() < 0.8 and mix.max() > 1.2
    with pytest.raises(InputError, match="train_rate_range"):
        replace(cfg, train_rate_range=(1.5, 0.5))


@needs_data
def test_training_segments_scale_prompts_by_train_prompt_range_and_the_others_do_not():
    """Workload shapes: a training segment multiplies its prompts by one factor from train_prompt_range (clipped to
    the context); the same arrivals; test segments keep the traces' lengths."""
    from fleetwise.worlds.multicloud import multicloud_workload

    cfg = GraphMARLConfig()
    x3 = replace(cfg, train_prompt_range=(3.0, 3.0))
    for seed in (1, 2):
        a = multicloud_workload(cfg, np.random.default_rng(seed), False, 300.0)
        b = multicloud_workload(x3, np.random.default_rng(seed), False, 300.0)
        assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.output_tokens, b.output_tokens)
        want = np.clip(np.round(a.prompt_tokens * 3.0), 1, cfg.max_context - a.output_tokens)
        assert np.array_equal(b.prompt_tokens, want)
        t1, t3 = (multicloud_workload(c, np.random.default_rng(seed), True, 300.0) for c in (cfg, x3))
        assert np.array_equal(t1.prompt_tokens, t3.prompt_tokens)
    with pytest.raises(InputError, match="train_prompt_range"):
        replace(cfg, train_prompt_range=(2.0, 1.0))


@needs_data
def test_scale_up_waits_for_provisioning_and_costs_more():
    cfg = SMALL
    w = multicloud_workload(cfg, np.random.default_rng(1), held_out=True)
    mc = MultiCloud(cfg, w, seed=1)
    p = mc.pools[0]
    m = p.spec.max_replicas
    for _ in range(m + 1):  # pool 0 up to its maximum, on demand (and once more: no effect)
        mc.act({"gpu": [2] + [0] * (len(mc.pools) - 1)})
    on = [i for i in p.replicas if mc.inst[i].on]
    assert len(on) == m
    new = on[cfg.initial_replicas:]
    assert all(not mc.routable(i, 0.0) for i in new)
    assert all(mc.routable(i, p.provision_s + 1e-6) for i in new)
    r_up = mc.run_epoch()
    mc2 = MultiCloud(cfg, w, seed=1)
    r_hold = mc2.run_epoch()
    assert mc.gpu_usd > mc2.gpu_usd
    assert r_up < r_hold  # nothing to gain in the first epoch: the new replicas are still provisioning
    # scaling down never leaves the fleet empty
    mc3 = MultiCloud(cfg, w, seed=1)
    for _ in range(3):
        mc3.act({"gpu": [1] * len(mc3.pools)})
    assert sum(s.on for s in mc3.inst) == 1


def test_bad_input_is_input_error():
    with pytest.raises(InputError, match="heuristic"):
        heuristic("nope", None)
    from fleetwise.learn.graph_marl import build_networks

    with pytest.raises(InputError, match="kind"):
        build_networks("cnn", None, {}, 4)
    with pytest.raises(InputError, match="origin_weights"):
        GraphMARLConfig(origin_weights=(1.0, 2.0))
    with pytest.raises(InputError, match="epoch_s"):
        GraphMARLConfig(epoch_s=0.0)
    with pytest.raises(InputError, match="region"):
        GraphMARLConfig(regions=("mars-1",), origin_weights=(1.0,))


def test_graph_actor_scales_with_the_graph():
    from fleetwise.learn.graph_marl import inference_time_vs_nodes

    out = inference_time_vs_nodes((100, 1000), repeats=1)
    assert [o["nodes"] for o in out][0] < out[1]["nodes"]
    assert all(o["inference_s"] < 2.0 for o in out)


def test_building_the_graph_actor_leaves_no_generated_source_in_tmpdir(tmp_path):
    """PyG writes each conv class's generated propagate / edge_updater to $TMPDIR once per process and keeps the
    files; building the actor removes them (learn.graph_marl._drop_generated_sources). In a fresh process, whose
    TMPDIR is this test's folder."""
    import os
    import subprocess
    import sys

    code = ("from fleetwise.envs.graph_marl import make_env\n"
            "from fleetwise.learn.graph_marl import _sizes, build_networks\n"
            "env = make_env()\n"
            "nets = build_networks('graph', env.layout, _sizes(env), env.state_dim)\n"
            "import sys; print(sum(n.startswith('torch_geometric.nn.conv.gatv2_conv_') for n in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp_path)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) == 2  # the generated modules were made and imported ...
    assert not [p.name for p in tmp_path.glob("torch_geometric*")]  # ... and their files removed


@needs_data
def test_checkpoint_resume_equals_uninterrupted(tmp_path):
    from fleetwise.learn.graph_marl import MAPPOArgs, train

    cfg = replace(SMALL, segment_s=60.0, drain_s=30.0)
    args = MAPPOArgs(kind="graph", updates=4, episodes_per_update=1, n_epochs=2, ckpt_every=2, hidden=8)
    env = lambda: make_env(cfg, duration_s=60.0)  # noqa: E731
    full, curve_full, info_full = train(env, args)
    ck = tmp_path / "ck.pt"
    _, _, info_k = train(env, args, ckpt_path=ck, stop_after=2)  # killed after update 2 (checkpointed)
    assert info_k["update"] == 2 and ck.exists()
    assert not list(tmp_path.glob("*.tmp*"))  # atomic write left no temporary file
    saved = torch.load(ck, weights_only=True)  # tensors and plain values only: nothing to unpickle
    assert saved["update"] == 2
    resumed, curve_res, info_res = train(env, args, ckpt_path=ck, resume=True)
    assert info_res["update"] == 4
    assert [tuple(c) for c in curve_res] == [tuple(c) for c in curve_full]
    for (n1, p1), (n2, p2) in zip(full.nets.state_dict().items(), resumed.nets.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    with pytest.raises(InputError, match="kind"):
        train(env, replace(args, kind="flat"), ckpt_path=ck, resume=True)


@needs_data
def test_target_kl_stops_an_updates_epochs_and_none_changes_nothing(tmp_path):
    """``target_kl`` (Stable-Baselines3's): an update's gradient steps stop once an agent's approximate KL from the
    rollout policy passes 1.5 x it; None and a bound never reached train the same networks; resumed, the per-update
    record continues."""
    from fleetwise.learn.graph_marl import MAPPOArgs, train

    cfg = replace(SMALL, segment_s=60.0, drain_s=30.0)
    args = MAPPOArgs(kind="graph", updates=3, episodes_per_update=1, n_epochs=3, ckpt_every=1, hidden=8,
                     bc_episodes=0)
    env = lambda: make_env(cfg, duration_s=60.0)  # noqa: E731
    base, _, info = train(env, args)
    loose, _, info_loose = train(env, replace(args, target_kl=1e9))
    for (n1, p1), (n2, p2) in zip(base.nets.state_dict().items(), loose.nets.state_dict().items()):
        assert torch.equal(p1, p2), n1
    assert [s for _, s in info["kl"]] == [3, 3, 3] and info["kl"] == info_loose["kl"]
    assert all(k > 0 for k, _ in info["kl"])
    ck = tmp_path / "ck.pt"
    _, _, tight = train(env, replace(args, target_kl=1e-6), ckpt_path=ck, stop_after=2)
    assert [s for _, s in tight["kl"]] == [1, 1]  # the first step (KL 0) taken, the second refused
    assert all(k > 1.5e-6 for k, _ in tight["kl"])
    _, _, resumed = train(env, replace(args, target_kl=1e-6), ckpt_path=ck, resume=True)
    assert len(resumed["kl"]) == 3 and resumed["kl"][:2] == tight["kl"]


@needs_data
def test_rollback_restarts_from_the_best_parameters_after_checks_below_the_rule(tmp_path):
    """``rollback_checks``: after that many validation checks in a row below the warm start's score, training goes
    back to the best parameters, with a fresh optimizer and the multipliers at 0; resumed runs keep the record."""
    from fleetwise.learn.graph_marl import MAPPOArgs, train

    class Scores:  # a validation whose scores are given: the warm start 0, then always below it
        def __init__(self):
            self.n = 0

        def policy_result(self, policy):
            self.n += 1
            return {"score": 0.0 if self.n == 1 else -1.0}

    cfg = replace(SMALL, segment_s=60.0, drain_s=30.0)
    args = MAPPOArgs(kind="flat", updates=5, episodes_per_update=1, n_epochs=1, hidden=8, bc_episodes=0, val_every=1,
                     patience=100, rollback_checks=2, lagrange_lr=50.0, ckpt_every=1)
    env = lambda: make_env(cfg, duration_s=60.0)  # noqa: E731
    start, _, _ = train(env, replace(args, updates=0), validation=Scores())
    _, curve, info = train(env, args, validation=Scores())
    steps = [s for s, _ in curve]
    assert info["rollbacks"] == [steps[1], steps[3]]  # after checks 2 and 4 below the rule's 0
    _, _, info0 = train(env, replace(args, rollback_checks=0), validation=Scores())
    assert info0["rollbacks"] == []
    assert any(lg["lam"] > 0 for lg in info0["lagrange"])
    ck = tmp_path / "ck.pt"
    train(env, args, ckpt_path=ck, validation=Scores(), stop_after=2)  # killed just after the first rollback
    saved = torch.load(ck, weights_only=True)
    assert saved["rollbacks"] == info["rollbacks"][:1]
    for (n1, p1), p2 in zip(start.nets.state_dict().items(), saved["nets"].values()):
        assert torch.equal(p1, p2), n1  # back at the best parameters (the warm start) ...
    assert saved["opt"]["state"] == {} and all(lg["lam"] == 0.0 for lg in saved["lagrange"])  # ... fresh
    sc = Scores()
    sc.n = 3  # (the warm start and two checks were made before the kill)
    _, _, resumed = train(env, args, ckpt_path=ck, resume=True, validation=sc)
    assert resumed["rollbacks"] == info["rollbacks"]


class _RunsCode:
    def __reduce__(self):
        return (print, ("this ran",))


def test_checkpoint_that_pickles_an_object_is_refused(tmp_path):
    from fleetwise.learn.graph_marl import load_checkpoint, load_trained

    bad = tmp_path / "evil.pt"
    torch.save({"nets": {}, "args": {}, "update": 0, "x": _RunsCode()}, bad)
    with pytest.raises(InputError, match="not a fleetwise graph-marl checkpoint"):
        load_checkpoint(bad)
    with pytest.raises(InputError, match="evil.pt"):
        load_trained(bad, SMALL)
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="junk.pt"):
        load_checkpoint(tmp_path / "junk.pt")


@needs_data
def test_mappo_learns_on_a_tiny_budget():
    """Seconds of training from uniform corrections (no warm start, no prior on the rule): the team return rises
    (at the classes' own rates: with rates drawn per segment the return of 2 updates is mostly the load's)."""
    from fleetwise.learn.graph_marl import MAPPOArgs, train

    cfg = replace(SMALL, segment_s=90.0, drain_s=30.0, train_rate_range=(1.0, 1.0))
    args = MAPPOArgs(kind="flat", updates=8, episodes_per_update=2, hidden=16, learning_rate=3e-3, bc_episodes=0,
                     hold_bias=0.0)
    _, curve, _ = train(lambda: make_env(cfg, duration_s=90.0), args)
    first, last = np.mean([r for _, r in curve[:2]]), np.mean([r for _, r in curve[-2:]])
    assert last > first


@needs_data
def test_heuristics_run_and_differ():
    rows = {h: evaluate(SMALL, h, [5])[0] for h in HEURISTICS}
    assert len({round(r["cost_usd"], 6) for r in rows.values()}) > 1


# ------------------------------------------------------------------ the shared recipe (issue 18)
@needs_data
def test_zero_action_is_the_rule_decision_for_decision():
    """Every agent's zero correction reproduces least_loaded exactly over a whole segment: the same world
    decisions every epoch and the same summary."""
    from fleetwise.envs.graph_marl import RULE

    cfg = replace(SMALL, segment_s=300.0)
    runs = []
    for zero in (True, False):
        env = make_env(cfg, held_out=True)
        env.reset(seed=11)
        m = None
        while env.agents:
            out = env.step(env.rule_action()) if zero else env.step_raw(heuristic(RULE, env.mc))
            m = out[4]["gpu"].get("metrics", m)
        runs.append((m, env.mc.decisions))
    (m0, d0), (m1, d1) = runs
    assert m0 == m1
    assert len(d0) == len(d1) == 10
    assert all(set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(d0, d1))
    assert any((d["gpu"] != 0).any() for d in d0)  # the rule did scale: the comparison is not vacuous
    # a correction changes the decision
    env = make_env(cfg, held_out=True)
    env.reset(seed=11)
    mk = env.action_masks()
    act = env.rule_action()
    pi = int(np.nonzero(mk["gpu"][:, 2])[0][0])
    act["gpu"][pi] = 2
    env.step(act)
    assert env.mc.decisions[0]["gpu"][pi] == 2


@needs_data
def test_masks_never_leave_a_class_without_a_ready_replica():
    """Random corrections drawn from the masks (scale-downs as likely as anything): after every decision each class
    still has a ready replica of its variant in its cloud; without the masks the same draws strand a class."""
    from fleetwise.worlds.multicloud_rules import compose

    env = make_env(replace(SMALL, segment_s=240.0, spot=False))
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    while env.agents:
        mk = env.action_masks()
        act = {a: np.array([rng.choice(np.nonzero(row)[0]) for row in mk[a]]) for a in mk}
        act["gpu"] = np.where(mk["gpu"][:, 1], 1, act["gpu"])  # every allowed scale-down
        dec = compose(env.mc, act, base=env._base)
        env.mc.act(dec)
        assert env.mc.covered(env.mc.cloud_choice, env.mc.variant).all()
        env.mc.decisions.pop()
        env.mc.act({"gpu": np.zeros(len(env.mc.pools), np.int64)})  # (already applied; hold)
        env.mc.decisions.pop()
        env.step_raw({"gpu": np.zeros(len(env.mc.pools), np.int64)})
    # unmasked: every pool down at once does strand a class (what the masks prevent)
    env.reset(seed=3)
    env.mc.act({"gpu": np.ones(len(env.mc.pools), np.int64)})
    assert not env.mc.covered(env.mc.cloud_choice, env.mc.variant).all()


@needs_data
def test_no_correction_cuts_capacity_inside_the_scale_down_window():
    """With ``scale_down_after_s`` no GPU correction that removes a replica is allowed before that time of the
    segment (the other corrections are); after it, the same masks as without the window."""
    from fleetwise.worlds.multicloud_rules import _gpu_code

    def cuts(env):
        mk, base = env.action_masks(), env._base["gpu"]
        return sum(bool(mk["gpu"][pi, c]) for pi in range(len(base)) for c in (1, 2, 3)
                   if _gpu_code(int(base[pi]), c) == 1 and int(base[pi]) != 1)

    plain, windowed = make_env(SMALL), make_env(replace(SMALL, scale_down_after_s=60.0))
    plain.reset(seed=3)
    windowed.reset(seed=3)
    assert cuts(plain) > 0 and cuts(windowed) == 0
    assert windowed.action_masks()["gpu"][:, 2].any()  # adding is still allowed
    for _ in range(2):  # 60 s of the rule's decisions
        plain.step(plain.rule_action())
        windowed.step(windowed.rule_action())
    assert windowed.mc.sim.now >= 60.0
    for a in AGENTS:
        assert (windowed.action_masks()[a] == plain.action_masks()[a]).all()
    with pytest.raises(InputError, match="scale_down_after_s"):
        replace(SMALL, scale_down_after_s=-1.0)


def test_tail_guard_no_correction_cancels_the_rules_reaction_to_a_backlog():
    """A pool backlogged by more than BACKLOG_S: the masks forbid "one fewer" (hold instead of the rule's scale-up,
    or a scale-down), and compose does not apply it; other pools are unaffected."""
    from fleetwise.worlds.multicloud_rules import BACKLOG_S, action_masks, compose

    env = make_env(replace(SMALL, segment_s=120.0, spot=False))
    env.reset(seed=3)
    mc = env.mc
    m0 = action_masks(mc, base=env._base)
    hot = int(np.flatnonzero(m0["gpu"][:, 1])[0])  # a pool where "one fewer" is allowed without a backlog
    real = mc.backlog_s
    mc.backlog_s = lambda i, now: BACKLOG_S + 1.0 if mc.pool_of[i] == hot else real(i, now)
    base = env._base
    m = action_masks(mc, base=base)
    assert not m["gpu"][hot, 1] and m["gpu"][hot, 0]
    corr = {"gpu": np.where(m["gpu"][:, 1], 1, 0)}
    corr["gpu"][hot] = 1  # a policy that ignores the mask
    dec = compose(mc, corr, base=base)
    assert dec["gpu"][hot] == base["gpu"][hot]  # not applied: the rule's decision stands
    mc.backlog_s = real


@needs_data
def test_tail_guard_with_guard_scale_ups_no_correction_cancels_the_rules_scale_up():
    """With guard_scale_ups, where the rule adds a replica (a busy pool, no backlog), "one fewer" (hold instead) is
    masked and not applied; without it (the default), it is allowed."""
    from fleetwise.worlds.multicloud_rules import action_masks, compose

    env = make_env(replace(SMALL, segment_s=120.0, spot=False, guard_scale_ups=True))
    env.reset(seed=3)
    mc = env.mc
    m0 = action_masks(mc, base=env._base)
    pi = int(np.flatnonzero(m0["gpu"][:, 1] & m0["gpu"][:, 2])[0])  # may shrink and may grow
    base = {k: v.copy() for k, v in env._base.items()}
    assert base["gpu"][pi] == 0
    base["gpu"][pi] = 2  # the rule scales this pool up
    m = action_masks(mc, base=base)
    assert not m["gpu"][pi, 1] and m["gpu"][pi, 0]
    corr = {"gpu": np.zeros(len(mc.pools), np.int64)}
    corr["gpu"][pi] = 1  # a policy that ignores the mask
    assert compose(mc, corr, base=base)["gpu"][pi] == 2
    env.mc.cfg = replace(env.mc.cfg, guard_scale_ups=False)  # the default: the correction may cancel the scale-up
    assert action_masks(mc, base=base)["gpu"][pi, 1] and compose(mc, corr, base=base)["gpu"][pi] == 0


@needs_data
def test_provisioning_delay_is_observed():
    from fleetwise.envs.graph_marl import NODE_TYPES

    env = make_env(SMALL)
    obs, _ = env.reset(seed=2)
    lay = env.layout
    P, I = lay.offsets["pool"][0], lay.offsets["instance"][0]
    x = obs["gpu"]["x"]
    assert NODE_TYPES.index("pool") == 2
    assert (x[P:P + lay.offsets["pool"][1], 12] > 0.3).all()  # each pool's delay (>= 48 s / 120)
    assert x[P, 13] == 0 and x[I:I + 4, 6].max() == 0
    act = env.rule_action()
    act["gpu"][0] = 2
    obs, *_ = env.step(act)
    x = obs["gpu"]["x"]
    p0 = env.mc.pools[0]
    assert x[P, 13] * 120 == pytest.approx(p0.provision_s - SMALL.epoch_s, abs=1e-3)  # seconds still to wait
    assert x[I + p0.replicas[1], 6] > 0


@needs_data
def test_recipe_training_logs_multipliers_validates_and_gates(tmp_path):
    """Warm start at the rule, per-class Lagrange multipliers in the learning curve, checkpoint choice on validation
    segments, and the gate against the best rule in the model card beside the checkpoint."""
    import json

    from fleetwise.control.checkpoint import ModelCard
    from fleetwise.learn.graph_marl import MAPPOArgs, ValidationWindows, card_file, train

    cfg = replace(SMALL, segment_s=60.0, drain_s=30.0)
    val = ValidationWindows(cfg, [1, 2], 60.0)
    assert val.best_rule in HEURISTICS
    args = MAPPOArgs(kind="graph", updates=2, episodes_per_update=1, n_epochs=1, hidden=8, val_every=1,
                     lagrange_lr=5.0)
    ck = tmp_path / "g.pt"
    _, _, info = train(lambda: make_env(cfg, duration_s=60.0), args, ckpt_path=ck, validation=val)
    assert info["bc"][0] < info["bc"][-1] and info["bc"][-1] >= args.bc_target  # cloned towards the rule
    assert len(info["lagrange"]) == len(cfg.classes)
    assert all(len(g["history"]) == 2 for g in info["lagrange"])  # one multiplier update per rollout
    assert info["validation_curve"][0][0] == 0 and len(info["validation_curve"]) == 3  # + the warm start
    card = ModelCard.from_json(json.loads(card_file(ck).read_text()))
    assert card.rule == "least_loaded" and card.validation["rule"] == val.best_rule
    g = card.validation["gate"]
    assert set(g) >= {"passed", "change", "ci95", "constraint_ok"} and g["windows"] == 2
    assert isinstance(g["passed"], bool)


def test_a_window_reads_only_its_split_and_wraps_around():
    """A segment longer than its split of a trace repeats the split's requests; it never reads the next split
    (a validation window at a high rate factor would otherwise read the test part of the trace)."""
    from fleetwise.worlds.multicloud import _window

    t = np.arange(0.0, 100.0, 1.0)  # one request a second; split [20, 30)
    idx, rel = _window(t, 20.0, 30.0, 25.0, 3.0)  # fits: requests 25, 26, 27
    assert idx.tolist() == [25, 26, 27] and rel.tolist() == [0.0, 1.0, 2.0]
    idx, rel = _window(t, 20.0, 30.0, 20.0, 25.0)  # 2.5 laps of the split
    assert idx.min() >= 20 and idx.max() <= 29 and len(idx) == 25
    assert np.all(np.diff(rel) > 0) and rel[0] == 0.0 and rel[-1] == 24.0


def test_rule_fallback_trips_on_the_attainment_so_far_and_stays_tripped():
    from fleetwise.learn.recipe import RuleFallback

    fb = RuleFallback(target=0.9, min_count=20)
    assert not fb.step([0, 0], [0, 0])  # nothing ended yet
    assert not fb.step([5, 0], [9, 0])  # 5 of 9 below target, but fewer than min_count ended
    assert fb.step([20, 0], [20, 0])  # 25 of 29 since reset (pooled) = 0.86 < 0.9: the rule's from here
    assert fb.tripped_at == 2 and fb.rule_steps == 1
    assert fb.step([100], [100])  # and for the rest of the run, whatever follows
    assert fb.rule_steps == 2
    fb.reset()
    assert (fb.ok, fb.ended, fb.tripped_at, fb.rule_steps) == (0, 0, -1, 0)
    assert not fb.step([9], [10])
    assert not fb.step([9], [10])  # 18 of 20 = 0.9: not below
    assert fb.step([0], [1])  # 18 of 21
    with pytest.raises(ValueError):
        RuleFallback(target=1.5)


@needs_data
def test_trained_policy_with_a_tripped_fallback_takes_the_rules_decisions():
    """A policy whose monitor has tripped, handing over the whole decision (``handover="rule"``), decides exactly
    as the rule does (zero correction) from then on."""
    from fleetwise.learn.graph_marl import TrainedPolicy, _sizes, build_networks
    from fleetwise.learn.recipe import RuleFallback

    env = make_env(SMALL, held_out=True)
    obs, _ = env.reset(seed=3)
    nets = build_networks("flat", env.layout, _sizes(env), env.state_dim)
    pol = TrainedPolicy(nets, fallback=RuleFallback(target=1.0, min_count=1), handover="rule")
    pol.reset(3)
    env.step(pol(env, obs, env.state()))  # first epoch: nothing ended, the networks decide
    while env.agents:
        a = pol(env, obs, env.state())
        if pol.fallback.tripped_at >= 0:
            assert all((a[k] == 0).all() for k in a)
        obs, *_ = env.step(a)
    assert pol.fallback.tripped_at >= 1  # some request missed its SLO (the target is 1.0): the rule took over


@needs_data
def test_handover_action_keeps_the_placement_and_restores_the_rules_floor():
    """``handover_action``: neither option is the rule's action; ``placement`` corrects the rule's cloud and model
    to the classes' current ones (so the world's placement stays), ``restore`` adds one replica to every pool
    with none on, and the rule's scaling and routing are kept."""
    from fleetwise.worlds.multicloud_rules import compose

    env = make_env(SMALL, held_out=True)
    env.reset(seed=3)
    with pytest.raises(RuntimeError, match="reset"):
        make_env(SMALL, held_out=True).handover_action()
    mc = env.mc
    mc.cloud_choice = np.array([0, 1, len(mc.clouds)])  # as a learned policy might have moved the classes
    mc.variant = np.array([0, 0, 1])
    for i in mc.pools[2].replicas:  # and switched a pool off
        mc.inst[i].on = False
    rule = env.rule_action()
    assert all((a == b).all() for a, b in zip(env.handover_action().values(), rule.values()))
    held = env.handover_action(placement=True)
    d = compose(mc, held)
    assert d["cloud"].tolist() == [0, 1, len(mc.clouds)] and d["model"].tolist() == [0, 0, 1]
    assert (held["gpu"] == 0).all() and (held["router"] == 0).all()
    back = compose(mc, env.handover_action(restore=True))
    assert back["gpu"][2] == 2 and (back["gpu"][[i for i in range(len(mc.pools)) if i != 2]] ==
                                    compose(mc, rule)["gpu"][[i for i in range(len(mc.pools)) if i != 2]]).all()


@needs_data
def test_trained_policy_hands_over_as_its_handover_says():
    from fleetwise.learn.graph_marl import TrainedPolicy, _sizes, build_networks
    from fleetwise.learn.recipe import RuleFallback

    env = make_env(SMALL, held_out=True)
    obs, _ = env.reset(seed=3)
    nets = build_networks("flat", env.layout, _sizes(env), env.state_dim)
    with pytest.raises(ValueError, match="handover 'nope'"):
        TrainedPolicy(nets, handover="nope")
    with pytest.raises(ValueError, match="handover 'nope'"):
        TrainedPolicy(nets).handover = "nope"  # (as monitored(handover=...) sets it)
    assert TrainedPolicy(nets).handover == "placement"  # (the default)
    pol = TrainedPolicy(nets, fallback=RuleFallback(target=1.0, min_count=1))
    pol.reset(3)
    obs, *_ = env.step(pol(env, obs, env.state()))
    env.mc.cloud_choice = np.array([1, 1, 1])  # (where the networks' decisions left the classes)
    checked = 0
    while env.agents:
        a = pol(env, obs, env.state())
        if pol.fallback.tripped_at >= 0:
            want = env.handover_action(placement=True)
            assert all((a[k] == want[k]).all() for k in want)
            checked += 1
        obs, *_ = env.step(a)
    assert checked >= 1


@needs_data
def test_rule_start_epochs_are_the_rules_in_training_and_in_evaluation(tmp_path):
    """With ``rule_start_epochs`` k the first k epochs of every episode take the rule's decision: the trained
    policy returns the zero correction there (and its networks decide after), training records only the epochs
    after them, and a checkpoint reloads with the same k. k must leave the policy an epoch to decide."""
    from fleetwise.learn.graph_marl import MAPPOArgs, TrainedPolicy, _sizes, build_networks, load_trained, train

    env = make_env(SMALL, held_out=True)
    obs, _ = env.reset(seed=3)
    nets = build_networks("flat", env.layout, _sizes(env), env.state_dim)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random networks: they choose other corrections than the rule's
        for p in nets.parameters():
            p.normal_(0.0, 1.0, generator=g)
    pol = TrainedPolicy(nets, rule_start=2)
    pol.reset(3)
    seen = []
    while env.agents:
        a = pol(env, obs, env.state())
        seen.append(all((a[k] == 0).all() for k in a))
        obs, *_ = env.step(a)
    assert seen[:2] == [True, True] and not all(seen[2:])

    cfg = replace(SMALL, segment_s=90.0, drain_s=30.0)
    args = MAPPOArgs(kind="flat", updates=1, episodes_per_update=1, n_epochs=1, hidden=8, bc_episodes=0,
                     rule_start_epochs=1)
    ck = tmp_path / "f.pt"
    _, curve, info = train(lambda: make_env(cfg, duration_s=90.0), args, ckpt_path=ck)
    assert info["env_steps"] == 2  # 3 epochs of 30 s, the first the rule's
    assert load_trained(ck, cfg).rule_start == 1
    with pytest.raises(InputError, match="rule_start_epochs 3"):
        train(lambda: make_env(cfg, duration_s=90.0), replace(args, rule_start_epochs=3))


def test_input_guard_gives_the_rule_unknown_and_longer_traffic():
    from fleetwise.learn.recipe import InputGuard

    g = InputGuard(share_max=0.5)
    assert [g.step(s) for s in (None, 0.2, 0.5, 0.51, 1.0, 0.0)] == [True, False, False, True, True, False]
    assert (g.steps, g.guarded) == (6, 3)
    g.reset()
    assert (g.steps, g.guarded) == (0, 0)
    known = InputGuard(share_max=0.5, unknown=False)  # only a known share above the threshold is guarded
    assert [known.step(s) for s in (None, 0.2, 0.51, None)] == [False, False, True, False]
    with pytest.raises(ValueError):
        InputGuard(share_max=1.5)


@needs_data
def test_long_share_per_epoch_is_what_the_world_reports():
    """``MultiCloud.long_share`` after each epoch is the share of long requests among that epoch's arrivals, as
    ``epoch_long_share`` computes it from the workload alone (what the guard's threshold is computed from)."""
    from fleetwise.worlds.multicloud import LONG_SHARE_MIN_ARRIVALS, epoch_long_share

    env = make_env(SMALL, held_out=True)
    env.reset(seed=5)
    ref = epoch_long_share(env.mc.workload, SMALL.epoch_s)
    got = []
    while env.agents:
        env.step(env.rule_action())
        got.append(env.mc.long_share)
    assert len(ref) >= 4 and np.isfinite(ref[:4]).all()
    assert got[:len(ref)] == pytest.approx(list(ref))
    assert all(s is None for s in got[len(ref):])  # the drain: nothing arrives
    few = multicloud_workload(SMALL, np.random.default_rng(0), True).head(LONG_SHARE_MIN_ARRIVALS - 1)
    assert np.isnan(epoch_long_share(few, 1e6)).all()  # too few arrivals to tell


@needs_data
def test_guarded_policy_takes_the_rules_decisions_on_long_traffic_and_at_the_start(tmp_path):
    """Behind the input guard a trained policy decides as the rule does in the first epoch (nothing arrived yet)
    and after every epoch whose share of long requests is above its threshold; at threshold 1 its networks
    decide after the first. ``monitored`` reads the threshold from the card, or recomputes it from the
    checkpoint's training segments (a card written before the field)."""
    import json

    from fleetwise.learn.graph_marl import (
        MAPPOArgs,
        TrainedPolicy,
        _sizes,
        build_networks,
        card_file,
        monitored,
        train,
        training_episode_seeds,
        training_long_share_max,
    )
    from fleetwise.learn.recipe import InputGuard

    env = make_env(SMALL, held_out=True)
    nets = build_networks("flat", env.layout, _sizes(env), env.state_dim)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random networks: they choose other corrections than the rule's
        for p in nets.parameters():
            p.normal_(0.0, 1.0, generator=g)
    for share_max in (1.0, 0.0):
        pol = TrainedPolicy(nets, guard=InputGuard(share_max))
        obs, _ = env.reset(seed=3)
        pol.reset(3)
        seen, known = [], []
        while env.agents:
            known.append(env.mc.long_share is not None)  # what the guard reads before this decision
            a = pol(env, obs, env.state())
            seen.append(all((a[k] == 0).all() for k in a))
            obs, *_ = env.step(a)
        assert not known[0] and all(known[1:4])  # nothing arrived before the first decision
        assert all(s for s, k in zip(seen, known) if not k)  # unknown: the rule's
        if share_max == 1.0:  # never above: the networks decide wherever the share is known
            assert not all(s for s, k in zip(seen, known) if k)
        else:  # every share is above 0 here: the rule's throughout
            assert all(seen)
        assert (pol.guard.steps, pol.guard.guarded) == (len(seen), sum(seen) if share_max == 0.0 else
                                                      sum(not k for k in known))

    # the threshold: the highest epoch share of the segments training drew, recorded in the card
    cfg = replace(SMALL, segment_s=90.0, drain_s=30.0)
    args = MAPPOArgs(kind="flat", updates=1, episodes_per_update=2, n_epochs=1, hidden=8, bc_episodes=1)
    drawn = []
    real_reset = None

    def env_fn():
        nonlocal real_reset
        e = make_env(cfg, duration_s=args.train_segment_s)
        real_reset = e.reset

        def reset(seed=None, options=None):
            drawn.append(seed)
            return real_reset(seed=seed, options=options)

        e.reset = reset
        return e

    ck = tmp_path / "f.pt"
    from fleetwise.learn.graph_marl import ValidationWindows

    train(env_fn, args, ckpt_path=ck, validation=ValidationWindows(cfg, [500], 90.0))
    assert [s for s in drawn if s is not None][:3] == training_episode_seeds(args, 1)
    card = json.loads(card_file(ck).read_text())
    thr = training_long_share_max(cfg, args, 1)
    assert 0.0 < thr < 1.0 and card["training"]["long_share_max"] == thr
    pol = monitored(TrainedPolicy(nets), ck, cfg)
    assert pol.guard.share_max == thr and pol.fallback.target == cfg.slo_target
    del card["training"]["long_share_max"]  # a card from before the field: recomputed from the checkpoint
    card_file(ck).write_text(json.dumps(card))
    assert monitored(TrainedPolicy(nets), ck, cfg).guard.share_max == thr


def test_checkpoint_key_leaves_out_a_field_at_its_neutral_value():
    """A MAPPOArgs field added later, at the value that trains as before, does not change the name under which
    `reproduce graph-marl` finds (and resumes) a checkpoint; any other value does."""
    from dataclasses import asdict

    from fleetwise.learn.graph_marl import MAPPOArgs
    from fleetwise.reproduce.graph_marl import _key_args, _key_cfg

    a = MAPPOArgs()
    later = ("rule_start_epochs", "target_kl", "rollback_checks", "tail_quantile", "tail_scale")
    before = {k: v for k, v in asdict(a).items() if k not in later}  # the fields before they were added
    assert _key_args(a) == before
    assert _key_args(replace(a, rule_start_epochs=1)) == {**before, "rule_start_epochs": 1}
    assert _key_args(replace(a, target_kl=0.1, rollback_checks=16)) == {**before, "target_kl": 0.1,
                                                                      "rollback_checks": 16}
    assert _key_args(replace(a, tail_quantile=0.99)) == {**before, "tail_quantile": 0.99}
    cfg = GraphMARLConfig()
    assert _key_cfg(cfg) == repr(cfg).replace(", scale_down_after_s=0.0", "")  # the repr before the field
    assert _key_cfg(replace(cfg, scale_down_after_s=30.0)) == repr(replace(cfg, scale_down_after_s=30.0))


def test_paired_rows_by_segment_with_training_seeds_averaged():
    """Rows of one segment (one per training seed) are not independent samples: a policy's value of a segment is the
    mean of its trained policies there, and the interval is over segments (a statistics audit, 2026-12-07)."""
    from fleetwise.reproduce.graph_marl import _paired

    rule = [{"seed": s, "x": 10.0} for s in (1, 2)]
    learned = [{"seed": s, "train_seed": t, "x": 10.0 - t - s} for t in (0, 1) for s in (1, 2)]
    b, p = _paired(rule, learned, "x")
    assert b == {1: 10.0, 2: 10.0} and p == {1: 8.5, 2: 7.5}
    b, p = _paired(learned, rule, "x")  # the other way round
    assert b == {1: 8.5, 2: 7.5} and p == {1: 10.0, 2: 10.0}
    b, p = _paired(learned, learned, "x")
    assert b == p


def test_budget_per_variant_and_an_override_applies_to_every_variant():
    from fleetwise.reproduce.graph_marl import _budget, _train_args

    full = _budget(False)
    assert [_train_args(full, k, 0).updates for k in ("graph", "flat", "ippo")] == [400, 400, 400]
    assert _train_args(full, "graph", 1).learning_rate == 3e-3 and _train_args(full, "flat", 1).learning_rate == 1e-3
    assert _train_args(full, "ippo", 2).patience == 40 and _train_args(full, "ippo", 2).seed == 2
    full["by_kind"]["flat"] = {"updates": 50}  # a variant's own budget wins over the shared one ...
    assert _train_args(full, "flat", 0).updates == 50 and _train_args(full, "ippo", 0).updates == 400
    small = _budget(False, updates=3)  # ... and an override (tests) applies to every variant
    assert [_train_args(small, k, 0).updates for k in ("graph", "flat", "ippo")] == [3, 3, 3]
    assert _budget(True)["updates"] == 35 and _budget(False, train_seeds=2)["train_seeds"] == 2


@needs_data
def test_a_resumed_run_stops_early_under_its_own_patience(tmp_path):
    """Early stopping on resume follows this run's patience, not the flag of the run that wrote the checkpoint: a
    run resumed with more patience goes on where a fresh run of those arguments would."""
    from fleetwise.learn.graph_marl import MAPPOArgs, ValidationWindows, load_checkpoint, save_checkpoint, train

    cfg = replace(SMALL, segment_s=60.0, drain_s=30.0)
    val = ValidationWindows(cfg, [1], 60.0)
    make = lambda: make_env(cfg, duration_s=60.0)  # noqa: E731
    args = MAPPOArgs(kind="flat", updates=1, episodes_per_update=1, n_epochs=1, hidden=8, val_every=1, patience=3)
    ck = tmp_path / "f.pt"
    train(make, args, ckpt_path=ck, validation=val)
    c = load_checkpoint(ck)
    c["validator"]["bad_checks"], c["stopped"] = 3, True  # as if three checks had brought nothing
    save_checkpoint(ck, c)
    _, _, info = train(make, replace(args, updates=2), ckpt_path=ck, resume=True, validation=val)
    assert info["early_stopped"] and info["update"] == 1  # patience 3: stopped
    _, _, info = train(make, replace(args, updates=2, patience=5), ckpt_path=ck, resume=True, validation=val)
    assert not info["early_stopped"] and info["update"] == 2  # patience 5: one more update


def test_tail_targets_are_the_rules_quantile_per_class():
    from fleetwise.learn.graph_marl import tail_targets

    t = tail_targets([[1.0, 2.0, 3.0, 4.0, 5.0], [], [np.inf, np.inf], [0.5] * 10 + [np.inf]], 0.5, 2.0)
    assert t == [6.0, np.inf, np.inf, 1.0]  # no TTFT, or only dropped requests: no constraint for the class


@needs_data
def test_info_carries_each_classs_ttfts_of_the_requests_that_ended():
    env = make_env(SMALL, duration_s=120.0)
    env.reset(seed=3)
    seen = 0
    while env.agents:
        _, _, _, _, info = env.step(env.rule_action())
        inf = info[AGENTS[0]]
        for k, t in enumerate(inf["class_ttft"]):
            assert len(t) == inf["class_ended"][k]
            assert np.count_nonzero(t <= SMALL.classes[k].ttft_s) >= inf["class_ok"][k]  # within SLO: TTFT too
            seen += len(t)
    assert seen > 0


@needs_data
def test_tail_constraint_adds_a_multiplier_per_class_at_the_rules_quantile(tmp_path):
    """``MAPPOArgs.tail_quantile``: per class, the share of requests within the rule's TTFT quantile (on the BC
    episodes) as one more constraint; a checkpoint trained without it is not resumed with it."""
    from fleetwise.learn.graph_marl import MAPPOArgs, tail_targets, train

    args = MAPPOArgs(kind="flat", updates=1, episodes_per_update=1, n_epochs=1, hidden=8, bc_episodes=1,
                     tail_quantile=0.99, tail_scale=0.9)
    _, _, info = train(lambda: make_env(SMALL, duration_s=120.0), args, ckpt_path=tmp_path / "t.pt")
    nc = len(SMALL.classes)
    assert len(info["lagrange"]) == 2 * nc and all(g["target"] == 0.99 for g in info["lagrange"][nc:])
    env = make_env(SMALL, duration_s=120.0)  # the BC episode, replayed: the rule's TTFTs per class
    env.reset(seed=args.seed * 1_000_003 + 999_999)
    ttft: list = [[] for _ in range(nc)]
    while env.agents:
        _, _, _, _, info2 = env.step(env.rule_action())
        for k, t in enumerate(info2[AGENTS[0]]["class_ttft"]):
            ttft[k].extend(t.tolist())
    assert info["tail_targets"] == tail_targets(ttft, 0.99, 0.9)
    with pytest.raises(InputError, match="tail_quantile differs"):
        train(lambda: make_env(SMALL, duration_s=120.0), replace(args, tail_quantile=None, updates=2),
              ckpt_path=tmp_path / "t.pt", resume=True)
    for bad, match in (({"tail_quantile": 1.0}, "tail_quantile=1.0"), ({"tail_scale": 0.0}, "tail_scale=0.0")):
        with pytest.raises(InputError, match=match):
            train(lambda: make_env(SMALL, duration_s=120.0), replace(args, **bad))
