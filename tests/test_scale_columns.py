"""The scalers over numpy columns (policies/scale_columns.py: models with many groups, as /v1/scale takes) give the
per-group code's targets exactly: the same scalers, fed the same epochs, once with every model on the columns and
once with none."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import fleetwise.policies.scalers as scalers
from fleetwise.control.protocols import GroupState, ScaleObs
from fleetwise.policies import make
from test_split_replicas import random_groups, reference_split_replicas


def _group(rng: np.random.Generator, model: str, i: int, zones: list[str], cap_known: float) -> GroupState:
    lo = int(rng.integers(0, 2))
    hi = lo + int(rng.integers(0, 8))
    nan = math.nan
    p90 = lambda: float(rng.choice([nan, rng.uniform(0.05, 3.0)]))  # noqa: E731
    return GroupState(
        key=f"{model}/g{i}", model=model, gpu="A100", region="r", zone=str(rng.choice(zones)),
        pool="spot" if rng.random() < 0.4 else "on_demand", ready=int(rng.integers(0, 6)),
        starting=int(rng.integers(0, 3)), draining=0, min_replicas=lo, max_replicas=hi,
        waiting=int(rng.integers(0, 30)) if rng.random() < 0.5 else 0, running=int(rng.integers(0, 40)),
        kv_used=float(rng.choice([nan, rng.uniform(0, 1)])), busy=float(rng.choice([nan, 0.0, rng.uniform(0, 1)])),
        arrivals_rps=float(rng.choice([0.0, rng.uniform(0, 300)])) if rng.random() < 0.9 else nan,
        history_rps=tuple(float(x) for x in rng.uniform(0, 200, int(rng.integers(0, 6)))),
        ttft_p90_s=p90(), tpot_p90_s=p90(), slo_ttft_s=float(rng.choice([nan, 0.5, 1.0])),
        slo_tpot_s=float(rng.choice([nan, 0.05, 0.1])),
        capacity_rps=float(rng.uniform(0.5, 6.0)) if rng.random() < cap_known else 0.0,
        price_usd_per_hour=float(rng.choice([0.0, 0.8, 1.2, 2.5])) if rng.random() < 0.5 else float(rng.uniform(0, 5)),
        cold_start_s=float(rng.uniform(0, 120)),
        available=None if rng.random() < 0.7 else int(rng.integers(0, 6)))


def _epochs(seed: int, n_epochs: int = 4) -> list[ScaleObs]:
    rng = np.random.default_rng(seed)
    models = [(f"m{k}", int(rng.integers(1, 400))) for k in range(int(rng.integers(1, 4)))]
    spec = {m: ([f"z{z}" for z in range(int(rng.integers(1, 7)))], float(rng.choice([0.0, 0.5, 1.0])))
            for m, _ in models}
    out = []
    for e in range(n_epochs):
        groups = [_group(rng, m, i, *spec[m]) for m, n in models for i in range(n)]
        out.append(ScaleObs(time_s=60.0 * (e + 1) + float(rng.choice([0.0, 900.0])), epoch_s=60.0, groups=groups))
    return out


SPECS = [("slo_aware", {}), ("slo_aware", {"zone_redundant": False}), ("slo_aware", {"scale_to_zero": False}),
         ("slo_aware", {"min_zones": 3, "on_demand_floor": 2}), ("predictive", {}), ("predictive", {"season_s": 120}),
         ("hpa", {}), ("hpa", {"metric": "kv"}), ("hpa", {"metric": "queue"}), ("hpa", {"scale_to_zero": True}),
         ("static", {})]


@pytest.mark.parametrize("name,params", SPECS, ids=[f"{n}-{'-'.join(p) or 'default'}" for n, p in SPECS])
def test_columns_give_the_per_group_targets(name: str, params: dict, monkeypatch) -> None:
    for seed in range(6):
        epochs = _epochs(1000 * seed + len(name))
        answers = []
        for threshold in (10 ** 9, 1):  # every model per group, then every model (and zone) over columns
            monkeypatch.setattr(scalers, "NP_MIN_GROUPS", threshold)
            pol = make("scaler", name, dict(params))
            answers.append([pol.scale(obs) for obs in epochs])
        per_group, columns = answers
        assert columns == per_group, (name, params, seed)
        for a in columns:
            assert all(type(v) is int for v in a.values())


def test_split_replicas_over_columns_matches_the_quadratic_reference(monkeypatch) -> None:
    monkeypatch.setattr(scalers, "NP_MIN_GROUPS", 1)
    rng = np.random.default_rng(11)
    for _ in range(1500):
        groups, units = random_groups(rng, int(rng.integers(1, 40)))
        need = float(rng.choice([0.0, -1.0, rng.uniform(0, 60), float(rng.integers(0, 40))]))
        kw = {"units": units, "min_total": int(rng.integers(0, 6)), "on_demand_floor": int(rng.integers(0, 4)),
              "min_zones": int(rng.integers(0, 5))}
        got = scalers.split_replicas(groups, need, **kw)
        assert got == reference_split_replicas(groups, need, **kw), (need, kw)
        assert list(got) == [g.key for g in groups]


def test_columns_on_a_large_model(monkeypatch) -> None:
    """One model of 3,000 groups (the service's case), default threshold: the columns decide, as the loop would."""
    rng = np.random.default_rng(3)
    groups = [_group(rng, "big", i, [f"z{z}" for z in range(50)], 1.0) for i in range(3000)]
    obs = ScaleObs(time_s=3600.0, epoch_s=60.0, groups=groups)
    for name in ("slo_aware", "hpa"):
        fast = make("scaler", name, {}).scale(obs)
        monkeypatch.setattr(scalers, "NP_MIN_GROUPS", 10 ** 9)
        slow = make("scaler", name, {}).scale(obs)
        monkeypatch.undo()
        assert fast == slow and sum(fast.values()) > 0


def _with_columns(obs: ScaleObs, leave_out: tuple[str, ...] = ()) -> ScaleObs:
    names = [f.name for f in dataclasses.fields(GroupState) if f.name not in leave_out]
    cols = {n: [getattr(g, n) for g in obs.groups] for n in names}
    return ScaleObs(time_s=obs.time_s, epoch_s=obs.epoch_s, groups=obs.groups, columns=cols)


@pytest.mark.parametrize("name", ["slo_aware", "hpa", "predictive", "static"])
def test_columns_carried_by_the_observation_give_the_same_targets(name: str, monkeypatch) -> None:
    """ScaleObs.columns (the service's columnar body) read for each model's groups (several models, some fields
    left out and read from the groups instead) give the targets of the groups themselves."""
    monkeypatch.setattr(scalers, "NP_MIN_GROUPS", 1)
    for seed in range(4):
        epochs = _epochs(77 + seed)
        plain = make("scaler", name, {})
        carried = make("scaler", name, {})
        for k, obs in enumerate(epochs):
            leave = ("available", "busy") if k % 2 else ()
            assert carried.scale(_with_columns(obs, leave)) == plain.scale(obs), (name, seed, k)


def test_an_overflowing_need_fails_alike_on_both_paths(monkeypatch) -> None:
    """Capacities so small that the replicas needed overflow: the per-group code's ``math.ceil`` raises, and so
    does the columns path (its first check of what is missing is the same arithmetic), not a silent answer."""
    rng = np.random.default_rng(5)
    groups = [dataclasses.replace(_group(rng, "m", i, ["z0", "z1"], 1.0), capacity_rps=1e-307, arrivals_rps=50.0)
              for i in range(200)]
    obs = ScaleObs(time_s=60.0, epoch_s=60.0, groups=groups)
    outcomes = []
    for threshold in (10 ** 9, 1):
        monkeypatch.setattr(scalers, "NP_MIN_GROUPS", threshold)
        try:
            outcomes.append(make("scaler", "slo_aware", {"zone_redundant": False}).scale(obs))
        except OverflowError as e:
            outcomes.append(type(e))
    assert outcomes[0] == outcomes[1]
