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
    saved = torch.load(ck, weights_only=False)
    assert saved["update"] == 2
    resumed, curve_res, info_res = train(env, args, ckpt_path=ck, resume=True)
    assert info_res["update"] == 4
    assert [c for c in curve_res] == [c for c in curve_full]
    for (n1, p1), (n2, p2) in zip(full.nets.state_dict().items(), resumed.nets.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    with pytest.raises(InputError, match="kind"):
        train(env, replace(args, kind="flat"), ckpt_path=ck, resume=True)


@needs_data
def test_mappo_learns_on_a_tiny_budget():
    """Seconds of training: the team return rises above the untrained policy's on the same episodes."""
    from fleetwise.learn.graph_marl import MAPPOArgs, train

    cfg = replace(SMALL, segment_s=90.0, drain_s=30.0)
    args = MAPPOArgs(kind="flat", updates=8, episodes_per_update=2, hidden=16, learning_rate=3e-3)
    _, curve, _ = train(lambda: make_env(cfg, duration_s=90.0), args)
    first, last = np.mean([r for _, r in curve[:2]]), np.mean([r for _, r in curve[-2:]])
    assert last > first


@needs_data
def test_heuristics_run_and_differ():
    rows = {h: evaluate(SMALL, h, [5])[0] for h in HEURISTICS}
    assert len({round(r["cost_usd"], 6) for r in rows.values()}) > 1
