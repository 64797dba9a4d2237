"""The architecture holds (issue 15, docs/architecture.md): the layer contract, no access to another module's
private attributes, policies typed against views that both the simulator and the decision service implement."""

from __future__ import annotations

import ast
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
