"""The package works outside the repository: an sdist built from the sources, a wheel built from that sdist,
installed into a fresh venv in a temporary folder, run from a folder outside the repository. The built-in
scenarios and experiment specs ship inside the package (importlib.resources), the repository's scenarios/ shows
the same files. Offline: the wheel is built with the test environment's setuptools, and the fresh venv reuses the
test environment's installed dependencies through a .pth file (never its fleetwise: the wheel's is checked)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(p.name for p in (ROOT / "src" / "fleetwise" / "scenarios").glob("*.yaml"))
SPECS = sorted(p.name for p in (ROOT / "src" / "fleetwise" / "experiments" / "specs").glob("*.yaml"))


def _run(cmd, cwd, env=None, timeout=300):
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
    return p


def test_repository_scenarios_folder_shows_the_package_files():
    repo = sorted(p.name for p in (ROOT / "scenarios").glob("*.yaml"))
    assert repo == SCENARIOS and "default.yaml" in repo
    assert (ROOT / "scenarios" / "default.yaml").read_bytes() == \
        (ROOT / "src" / "fleetwise" / "scenarios" / "default.yaml").read_bytes()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv folder, environment without the repository, a work folder outside the repository)"""
    tmp = tmp_path_factory.mktemp("wheel")
    assert ROOT not in tmp.parents
    # an sdist from a copy of what it needs (the repository stays untouched: no build/ or egg-info in it)
    src = tmp / "source"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                "print(b.build_sdist(sys.argv[1]))", tmp / "sdist"], cwd=src).stdout.strip().splitlines()[-1]
    with tarfile.open(tmp / "sdist" / out) as tf:
        names = tf.getnames()
        top = names[0].split("/")[0]
        for n in SCENARIOS:
            assert f"{top}/src/fleetwise/scenarios/{n}" in names
        for n in SPECS:
            assert f"{top}/src/fleetwise/experiments/specs/{n}" in names
        tf.extractall(tmp / "unpacked", filter="data")
    # a wheel from the sdist
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", tmp / "dist", tmp / "unpacked" / top], cwd=tmp)
    (whl,) = (tmp / "dist").glob("fleetwise-*.whl")
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
    assert {f"fleetwise/scenarios/{n}" for n in SCENARIOS} <= names
    assert {f"fleetwise/experiments/specs/{n}" for n in SPECS} <= names
    # a fresh venv outside the repository; its dependencies: the test environment's site-packages
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
                                                             "FLEETWISE_DATA")}
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    vpy = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", vpy, "install", "-q", "--no-deps", "--no-index", whl], cwd=tmp,
         env=env)
    site = Path(_run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz_test_dependencies.pth").write_text("\n".join(deps) + "\n")
    work = tmp / "work"
    work.mkdir()
    where = _run([vpy, "-c", "import fleetwise; print(fleetwise.__file__)"], cwd=work, env=env).stdout.strip()
    assert Path(where).is_relative_to(env_dir), where  # the wheel's fleetwise, not the repository's
    return env_dir, env, work


def test_wheel_lists_copies_and_simulates_builtin_scenarios(installed):
    env_dir, env, work = installed
    fw = env_dir / "bin" / "fleetwise"
    p = _run([fw, "scenarios"], cwd=work, env=env)
    for n in SCENARIOS:
        assert n.removesuffix(".yaml") in p.stdout
    s = json.loads(_run([fw, "simulate", "--scenario", "default", "--json"], cwd=work, env=env).stdout)
    assert s["requests"] == 2000 and s["completed"] + s["rejected"] == 2000
    # a copy to edit, written in the current folder, then simulated
    _run([fw, "scenarios", "--copy", "default"], cwd=work, env=env)
    text = (work / "default.yaml").read_text()
    assert text == (ROOT / "scenarios" / "default.yaml").read_text()
    (work / "default.yaml").write_text(text.replace("name: default", "name: edited", 1))
    s2 = json.loads(_run([fw, "simulate", "--scenario", "default.yaml", "-n", "200", "--json"], cwd=work,
                         env=env).stdout)
    assert s2["requests"] == 200


def test_wheel_finds_builtin_experiment_specs(installed):
    env_dir, env, work = installed
    p = _run([env_dir / "bin" / "python", "-c", "from fleetwise.experiments.spec import expand, load_experiment; "
              "s = load_experiment('default'); print(s.name, len(expand(s)))"], cwd=work, env=env)
    name, runs = p.stdout.split()
    assert name == "default" and int(runs) > 0


def test_wheel_simulates_a_real_trace_scenario(installed, data_dir):
    env_dir, env, work = installed
    s = json.loads(_run([env_dir / "bin" / "fleetwise", "simulate", "--scenario", "vidur-parity", "--json"],
                        cwd=work, env={**env, "FLEETWISE_DATA": str(data_dir)}).stdout)
    assert s["requests"] > 0 and s["completed"] > 0
