"""The architecture holds (issue 15, docs/architecture.md): the layer contract, no access to another module's
private attributes, policies typed against views that both the simulator and the decision service implement."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fleetwise"


def test_layer_contract():
    """import-linter's contracts in .importlinter: the layers, policies never import the simulator, and the core
    imports no learning library."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    r = subprocess.run([exe, str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def _class_privates(tree: ast.Module) -> dict[ast.AST, set[str]]:
    """For every function defined in a class: the private names that class defines (methods, self._x = ...)."""
    out: dict[ast.AST, set[str]] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                names.add(n.attr)
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                names.add(n.target.id)
        if slots := [n for n in cls.body if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets)]:
            for c in ast.walk(slots[0].value):
                if isinstance(c, ast.Constant) and isinstance(c.value, str):
                    names.add(c.value)
        for fn in ast.walk(cls):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                out[fn] = names
    return out


def private_accesses(root: Path = SRC) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` is not a private of the class whose method
    holds the access (a classmethod filling a new instance), and ``from fleetwise.x import _name``."""
    hits = []
    for p in sorted(root.rglob("*.py")):
        tree = ast.parse(p.read_text())
        own = _class_privates(tree)
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fleetwise"):
                hits += [f"{p.relative_to(root)}:{node.lineno} import {a.name}" for a in node.names
                         if a.name.startswith("_") and not a.name.startswith("__")]
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            up = parents.get(node)
            while up is not None and up not in own:
                up = parents.get(up)
            if up is not None and node.attr in own[up]:
                continue
            hits.append(f"{p.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return hits


def test_no_module_reads_another_modules_privates():
    assert private_accesses() == []


def test_views_are_implemented_by_the_simulator_the_service_and_the_torta_world():
    from fleetwise.control.views import LaneView, PlanView, RouteView
    from fleetwise.scenario import build, load_scenario

    b = build(load_scenario("default"), 0, num_requests=20)
    seen = set()
    dp = b.sim.advance()
    while dp is not None and len(seen) < 2:
        view_type = RouteView if dp.kind == "route" else LaneView
        assert isinstance(dp.view, view_type)
        seen.add(dp.kind)
        b.sim.apply(0 if dp.kind == "route" else b.controller().batcher.plan(dp.view))
        dp = b.sim.advance()
    assert seen == {"route", "batch"}

    pytest.importorskip("fastapi")
    from fleetwise.serve.policy import RouteRequest, load_route_policy

    pol = load_route_policy("least_outstanding_tokens")
    req = RouteRequest(prompt_tokens=10, replicas=[{"id": "a", "outstanding_tokens": 5}, {"id": "b"}])
    assert isinstance(pol.view(req), RouteView)
    assert pol.route(req) == 1

    from fleetwise.data import data_dir

    if data_dir(required=False) is not None:
        from fleetwise.policies.planners import NearestPlanner, make_micro
        from fleetwise.worlds.torta import Day, TortaConfig, build_replicas, make_fleet, torta_workload

        cfg = TortaConfig(topology="ring")
        fleet = make_fleet(cfg)
        _, srv = build_replicas(cfg, fleet)
        import numpy as np

        w = torta_workload(cfg, fleet, 1.0, np.random.default_rng(0), True)
        assert isinstance(Day(cfg, fleet, w, 0, NearestPlanner(), make_micro("match", cfg)), PlanView)


def _needs_data(name: str) -> bool:
    from fleetwise.scenario import load_scenario

    sc = load_scenario(name)
    text = json.dumps(sc.model_dump(mode="json"))
    return sc.scaler is not None or any(k in text for k in ('"trace"', '"servegen"', "spot_trace"))


@pytest.mark.parametrize("name", __import__("fleetwise.scenario", fromlist=["x"]).scenario_names())
def test_sweep_and_simulate_give_the_same_summary(name, tmp_path):
    """One run path: a sweep's run and `simulate` of the same scenario, seed and request count agree exactly (a
    scenario with a scaler runs the platform layer in both)."""
    from fleetwise.data import data_dir
    from fleetwise.experiments.runner import run_sweep
    from fleetwise.experiments.spec import expand, parse_experiment
    from fleetwise.experiments.store import Store
    from fleetwise.run import run_scenario
    from fleetwise.scenario import load_scenario

    if _needs_data(name) and data_dir(required=False) is None:
        pytest.skip("real datasets not found (set FLEETWISE_DATA)")
    n, seed = 60, 3
    spec = parse_experiment({"name": "same", "scenarios": [name], "seeds": [seed], "requests": n})
    store = Store(str(tmp_path / "r.duckdb"))
    res = run_sweep(expand(spec), store, workers=1)
    assert res.ok == 1, store.runs(where="status = 'failed'")
    stored = store.runs()[0]
    direct = run_scenario(load_scenario(name), seed, num_requests=n).summary
    numeric = {k: v for k, v in direct.items() if isinstance(v, (int, float))}
    assert numeric.keys() <= stored.keys()
    for k, v in numeric.items():
        assert stored[k] == pytest.approx(v, rel=1e-12, nan_ok=True), k


def test_route_and_plan_work_with_torch_and_gymnasium_blocked():
    """The decision service's /v1/route and /v1/plan (and the core) import neither torch nor gymnasium."""
    pytest.importorskip("fastapi")
    pytest.importorskip("ot")
    code = """
import sys
BLOCKED = {"torch", "gymnasium", "stable_baselines3", "sb3_contrib", "pettingzoo", "torch_geometric"}
class Block:  # any import of them fails
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
from fastapi.testclient import TestClient
from fleetwise.serve.app import create_app
import fleetwise.sim, fleetwise.policies, fleetwise.run, fleetwise.worlds.torta, fleetwise.platform.runner
c = TestClient(create_app("least_outstanding_tokens"), base_url="http://127.0.0.1")
r = c.post("/v1/route", json={"prompt_tokens": 100, "replicas": [{"id": "a", "outstanding_tokens": 9}, {"id": "b"}]})
assert r.status_code == 200 and r.json()["replica_id"] == "b", r.text
plan = {"origins": ["a", "b"], "demand_rps": [10.0, 5.0],
        "regions": [{"name": "a", "capacity_rps": 10.0}, {"name": "b", "capacity_rps": 10.0}],
        "rtt_s": [[0.0, 0.05], [0.05, 0.0]]}
r = c.post("/v1/plan", json=plan)
print(r.status_code, r.text[:300])
assert "torch" not in sys.modules and "gymnasium" not in sys.modules
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("200"), r.stdout
