"""The learned router contains its rule (least outstanding tokens), trains on the recipe, and loads safely."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fleetwise.errors import InputError
from fleetwise.learn.router import N_PARAMS, RouterTrainConfig, scenario_at, policy_of, train_router
from fleetwise.policies import make
from fleetwise.policies.routers_learned import LearnedRouter, packaged_checkpoint
from fleetwise.run import run_scenario


def test_zero_action_is_least_outstanding_tokens_decision_for_decision():
    sc = scenario_at("default", 24.0)
    rule = run_scenario(sc, 5, router="least_outstanding_tokens", num_requests=800)
    zero = run_scenario(sc, 5, router=LearnedRouter.from_policy(policy_of(np.zeros(N_PARAMS))), num_requests=800)
    assert np.array_equal(rule.records.replica, zero.records.replica)
    assert rule.summary == zero.summary
    some = run_scenario(sc, 5, router=LearnedRouter.from_policy(policy_of(np.r_[np.zeros(N_PARAMS - 3), 1, 1, 1])),
                        num_requests=800)
    assert not np.array_equal(rule.records.replica, some.records.replica)  # a nonzero action does change decisions


def test_the_packaged_checkpoint_loads_without_torch_and_carries_its_gate():
    r = make("router", "learned")
    assert r.checkpoint == str(packaged_checkpoint())
    card = r.card
    assert card.level == "router" and card.rule == "least_outstanding_tokens"
    assert {"passed", "change", "ci95", "windows"} <= set(card.validation)
    code = ("import sys; sys.modules['torch'] = None; sys.modules['gymnasium'] = None\n"
            "from fleetwise.policies import make; make('router', 'learned')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_bad_checkpoint_is_one_line(tmp_path):
    with pytest.raises(InputError, match="not found"):
        make("router", "learned", {"checkpoint": str(tmp_path / "missing.npz")})
    bad = tmp_path / "x.npz"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(InputError):
        make("router", "learned", {"checkpoint": str(bad)})


def test_training_runs_the_recipe_and_writes_a_gated_checkpoint(tmp_path):
    cfg = RouterTrainConfig(rates=[18.0], requests=200, train_seeds=1, val_seeds=1, gate_seeds=3, iterations=2,
                            population=3, elite=1)
    res = train_router(cfg, out=tmp_path / "r.npz")
    assert [row["iteration"] for row in res["curve"]] == [1, 2]
    assert all("lambda" in row for row in res["curve"])
    # the gate's windows are its own: seeds 3000+, not the validation seeds that chose the parameters
    assert res["gate"]["windows"] == 3 and isinstance(res["gate"]["passed"], bool)
    assert "seeds 3000+" in res["gate"]["windows_detail"]
    r = make("router", "learned", {"checkpoint": str(tmp_path / "r.npz")})
    assert r.card.validation["passed"] == res["gate"]["passed"]
    card = json.loads((tmp_path / "r.card.json").read_text())
    assert card["training"]["algorithm"] == "cem" and len(card["training"]["curve"]) == 2
    # the same seed gives the same parameters
    again = train_router(cfg)
    assert again["params"] == res["params"]


def test_a_config_the_search_cannot_run_is_refused():
    """Found by fuzzing, 2026-12-06: sigma=NaN ran and gave a NaN curve; rates=[] and val_seeds=0 returned a gate of
    NaN; seed=-1 failed in numpy."""
    for kw, needle in ((dict(sigma=float("nan")), "sigma"), (dict(rates=[]), "rates"), (dict(val_seeds=0), "val_seeds"),
                       (dict(seed=-1), "seed"), (dict(elite=8), "elite"),
                       (dict(gate_seeds=0), "gate_seeds"), (dict(rates=[18.0], gate_seeds=1), "2 gate runs")):
        with pytest.raises(ValueError, match=needle):
            RouterTrainConfig(**kw)


def test_train_router_stores_its_learning_curve_for_the_report(tmp_path):
    """The learned router's curve was only in its card and a table (a helper's audit, 2026-12-07): `--db` stores it
    where `fleetwise report` draws learning curves."""
    from fleetwise.experiments.report import write_report
    from fleetwise.experiments.store import Store

    db = tmp_path / "r.duckdb"
    p = subprocess.run([sys.executable, "-m", "fleetwise", "train", "router", "--out", str(tmp_path / "x.npz"),
                        "--iterations", "2", "--population", "3", "--elite", "1", "-n", "100", "--train-seeds", "1",
                        "--val-seeds", "2", "--rates", "12", "--db", str(db)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    curve = Store(db, read_only=True).query("SELECT policy, step, metric FROM learning")
    assert set(curve["policy"]) == {"learned router"} and sorted(set(curve["step"])) == [1, 2]
    assert len(set(curve["metric"])) == 2
    page = write_report(Store(db, read_only=True), tmp_path / "rep").read_text()
    assert "learning" in page and (tmp_path / "rep" / "learning.png").exists()
