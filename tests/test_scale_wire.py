"""POST /v1/scale's fast path (msgspec, serve/scale_wire.py) accepts exactly what the pydantic schema accepts, with
the same values, and the service answers as before: lax input through pydantic, errors as pydantic's 422."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest

pytest.importorskip("msgspec")

from fleetwise.control.protocols import GroupState  # noqa: E402
from fleetwise.serve.adapters import load_scale_policy  # noqa: E402
from fleetwise.serve.bench_scale import as_columns, scale_body  # noqa: E402
from fleetwise.serve.scale_wire import decode_scale  # noqa: E402
from fleetwise.serve.schemas import NAN_FIELDS, SCALE_EXAMPLE, ScaleRequest, column_groups  # noqa: E402


def _pydantic_groups(raw: bytes) -> list[tuple] | None:
    try:
        req = ScaleRequest.model_validate_json(raw)
    except Exception:  # noqa: BLE001 - refused
        return None
    out = []
    rows = [dict(g.__dict__) for g in req.groups] if req.groups is not None else column_groups(req.columns)
    for d in rows:
        for k in NAN_FIELDS:
            d[k] = math.nan if d[k] is None else d[k]
        d["history_rps"] = tuple(d["history_rps"])
        out.append(_key(GroupState(**d)))
    return out


def _key(g: GroupState) -> tuple:
    """Field values with NaN made comparable (NaN != NaN)."""
    return tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in dataclasses.astuple(g))


def _mutations() -> list[tuple[str, object]]:
    muts: list[tuple[str, object]] = []
    for f in dataclasses.fields(GroupState):
        for v in (-1, 0, 3, 1e15, 1e16, 2.5, "3", "x", "", "y" * 257, None, True, [], {}, 1e400, 10**20):
            muts.append((f.name, v))
    return muts


@pytest.mark.parametrize("name,value", _mutations())
def test_the_fast_path_accepts_exactly_what_pydantic_accepts(name: str, value: object) -> None:
    body = copy.deepcopy(SCALE_EXAMPLE)
    body["groups"][0][name] = value
    raw = json.dumps(body).encode()
    obs = decode_scale(raw)
    want = _pydantic_groups(raw)
    if obs is not None:  # accepted by msgspec: pydantic accepts it too, with the same values
        assert want is not None and [_key(g) for g in obs.groups] == want
        assert all(type(g) is GroupState for g in obs.groups)


@pytest.mark.parametrize("edit", ["unknown", "dup", "minmax", "empty", "epoch0", "missing", "history", "many",
                                  "nan_literal", "not_json"])
def test_bodies_the_schema_refuses_never_pass_the_fast_path(edit: str) -> None:
    body = copy.deepcopy(SCALE_EXAMPLE)
    g = body["groups"][0]
    if edit == "unknown":
        g["surprise"] = 1
    elif edit == "dup":
        body["groups"].append(dict(g))
    elif edit == "minmax":
        g["min_replicas"] = g["max_replicas"] + 1
    elif edit == "empty":
        body["groups"] = []
    elif edit == "epoch0":
        body["epoch_s"] = 0
    elif edit == "missing":
        del g["ready"]
    elif edit == "history":
        g["history_rps"] = [1.0] * 10_001
    elif edit == "many":
        body = scale_body(10_001)
    raw = json.dumps(body).encode()
    if edit == "nan_literal":
        raw = raw.replace(b'"kv_used": 0.7', b'"kv_used": NaN')
    elif edit == "not_json":
        raw = raw[:-3]
    assert _pydantic_groups(raw) is None
    assert decode_scale(raw) is None


def test_a_large_body_decides_as_through_pydantic() -> None:
    raw = json.dumps(scale_body(2_000)).encode()
    obs = decode_scale(raw)
    assert obs is not None and [_key(g) for g in obs.groups] == _pydantic_groups(raw)
    fast, slow = load_scale_policy("slo_aware"), load_scale_policy("slo_aware")
    assert fast.decide(obs) == slow.scale(ScaleRequest.model_validate_json(raw))


def test_the_service_answers_lax_and_bad_bodies_as_pydantic_does() -> None:
    from fastapi.testclient import TestClient

    from fleetwise.serve.app import create_app

    with TestClient(create_app(scaler="slo_aware", token="t" * 16)) as c:
        h = {"authorization": "Bearer " + "t" * 16}
        body = copy.deepcopy(SCALE_EXAMPLE)
        ok = c.post("/v1/scale", json=body, headers=h)
        body["groups"][0]["ready"] = "3"  # lax: msgspec refuses, pydantic accepts -> the same answer
        lax = c.post("/v1/scale", json=body, headers=h)
        assert ok.status_code == lax.status_code == 200 and ok.json() == lax.json()
        body["groups"][0]["ready"] = -1
        bad = c.post("/v1/scale", json=body, headers=h)
        assert bad.status_code == 422 and "ready" in bad.json()["detail"]
        assert "\n" not in bad.json()["detail"]


def _two_groups() -> dict:
    body = copy.deepcopy(SCALE_EXAMPLE)
    g2 = dict(body["groups"][0], key="llama-8b/A100-80GB/us-east-1b/spot", zone="us-east-1b", pool="spot")
    body["groups"].append(g2)
    return body


@pytest.mark.parametrize("name,value", _mutations())
def test_columns_the_fast_path_accepts_exactly_what_pydantic_accepts(name: str, value: object) -> None:
    """The same mutations, in the columnar body (``columns``: field -> one value per group)."""
    body = as_columns(_two_groups())
    body["columns"].setdefault(name, [None, None])[0] = value
    raw = json.dumps(body).encode()
    obs = decode_scale(raw)
    want = _pydantic_groups(raw)
    if obs is not None:
        assert want is not None and [_key(g) for g in obs.groups] == want
        assert all(type(g) is GroupState for g in obs.groups) and obs.columns is not None


@pytest.mark.parametrize("edit", ["short", "dup", "minmax", "both", "neither", "unknown", "empty", "not_list",
                                  "omit_default", "omit_required"])
def test_columns_refused_and_accepted_as_pydantic_does(edit: str) -> None:
    body = as_columns(_two_groups())
    c = body["columns"]
    if edit == "short":
        c["ready"] = c["ready"][:1]
    elif edit == "dup":
        c["key"] = [c["key"][0]] * 2
    elif edit == "minmax":
        c["min_replicas"] = [c["max_replicas"][0] + 1, 0]
    elif edit == "both":
        body["groups"] = _two_groups()["groups"]
    elif edit == "neither":
        del body["columns"]
    elif edit == "unknown":
        c["surprise"] = [1, 2]
    elif edit == "empty":
        body["columns"] = {k: [] for k in c}
    elif edit == "not_list":
        c["ready"] = 3
    elif edit == "omit_default":  # a field with a default may be left out: its default for every group
        del c["history_rps"], c["cold_start_s"]
    elif edit == "omit_required":
        del c["ready"]
    raw = json.dumps(body).encode()
    want, obs = _pydantic_groups(raw), decode_scale(raw)
    if edit == "omit_default":
        assert want is not None and obs is not None and [_key(g) for g in obs.groups] == want
        assert obs.groups[0].history_rps == () and obs.groups[1].cold_start_s == 0.0
    else:
        assert want is None and obs is None


def test_a_columnar_body_decides_as_the_groups_body() -> None:
    """10,000 groups as columns: the scalers read the columns (ScaleObs.columns) and answer as with the objects."""
    body = scale_body(10_000)
    raw, craw = json.dumps(body).encode(), json.dumps(as_columns(body)).encode()
    obs, cobs = decode_scale(raw), decode_scale(craw)
    assert cobs is not None and cobs.columns is not None and cobs.groups == obs.groups
    for name in ("slo_aware", "hpa", "predictive", "static"):
        a = load_scale_policy(name).decide(obs)
        assert load_scale_policy(name).decide(cobs) == a
        assert load_scale_policy(name).scale(ScaleRequest.model_validate_json(craw)) == a


def test_the_service_answers_a_columnar_body() -> None:
    from fastapi.testclient import TestClient

    from fleetwise.serve.app import create_app

    with TestClient(create_app(scaler="hpa", token="t" * 16)) as c:
        h = {"authorization": "Bearer " + "t" * 16}
        body = _two_groups()
        ok = c.post("/v1/scale", json=body, headers=h)
        col = c.post("/v1/scale", json=as_columns(body), headers=h)
        assert ok.status_code == col.status_code == 200 and ok.json()["targets"] == col.json()["targets"]
        bad = as_columns(body)
        bad["columns"]["ready"] = [1]
        r = c.post("/v1/scale", json=bad, headers=h)
        assert r.status_code == 422 and "columns.ready has 1 values for 2 groups" in r.json()["detail"]
        assert "\n" not in r.json()["detail"]
        assert c.post("/v1/scale", json={"time_s": 1, "epoch_s": 60}, headers=h).status_code == 422


def test_fractions_are_at_most_one_on_both_paths() -> None:
    """busy and kv_used are fractions (a fuzzing pass, 2026-12-07: busy 1.5 or 1e15 was taken and moved the target)."""
    for name in ("busy", "kv_used"):
        for v, ok in ((1.0, True), (1.5, False), (1e15, False)):
            body = copy.deepcopy(SCALE_EXAMPLE)
            body["groups"][0][name] = v
            raw = json.dumps(body).encode()
            assert (decode_scale(raw) is not None) == ok and (_pydantic_groups(raw) is not None) == ok, (name, v)
