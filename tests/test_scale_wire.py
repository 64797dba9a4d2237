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
from fleetwise.serve.bench_scale import scale_body  # noqa: E402
from fleetwise.serve.scale_wire import decode_scale  # noqa: E402
from fleetwise.serve.schemas import NAN_FIELDS, SCALE_EXAMPLE, ScaleRequest  # noqa: E402


def _pydantic_groups(raw: bytes) -> list[tuple] | None:
    try:
        req = ScaleRequest.model_validate_json(raw)
    except Exception:  # noqa: BLE001 - refused
        return None
    out = []
    for g in req.groups:
        d = dict(g.__dict__)
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
