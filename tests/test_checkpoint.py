"""Safe policy checkpoints (fleetwise.control.checkpoint): the numpy forward pass acts as SB3's predict, and a file
that is not exactly a checkpoint (a pickle, an SB3 zip, a zip bomb, extra or odd arrays) is refused before any
array is read."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from fleetwise.control.checkpoint import (
    CheckpointError,
    ModelCard,
    card_path,
    load_policy,
    read_card,
    resolve_inside,
)
from fleetwise.learn.recipe import quiet_logger


def _env(obs_dim: int, action_space):
    import gymnasium as gym
    from gymnasium import spaces

    class Env(gym.Env):
        observation_space = spaces.Box(-2.0, 3.0, (obs_dim,), np.float32)

        def __init__(self):
            self.action_space = action_space
            self.rng = np.random.default_rng(0)
            self.t = 0

        def reset(self, seed=None, options=None):
            self.t = 0
            return self.rng.uniform(-1, 1, obs_dim).astype(np.float32), {}

        def step(self, a):
            self.t += 1
            r = float(np.sum(np.asarray(a, float)))  # something to learn
            return self.rng.uniform(-1, 1, obs_dim).astype(np.float32), r, self.t >= 8, False, {}

    return Env()


def _spaces():
    from gymnasium import spaces

    return {"box": spaces.Box(np.array([-1.0, -0.5, 0.0], np.float32), np.array([1.0, 0.5, 2.0], np.float32)),
            "discrete": spaces.Discrete(5), "multi_discrete": spaces.MultiDiscrete([3, 5, 2, 4])}


@pytest.fixture(scope="module")
def torch_threads():
    torch = pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    torch.set_num_threads(1)


@pytest.mark.parametrize("kind", ["box", "discrete", "multi_discrete"])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_numpy_forward_pass_acts_as_sb3_ppo(kind, activation, tmp_path, torch_threads):
    import torch.nn as nn
    from stable_baselines3 import PPO

    from fleetwise.learn.export import export_sb3

    env = _env(6, _spaces()[kind])
    act_fn = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=2, seed=1, device="cpu",
                policy_kwargs={"net_arch": [16, 8], "activation_fn": act_fn})
    quiet_logger(model).learn(64)  # trained a little: weights away from their initialisation
    path = export_sb3(model, tmp_path / "p", level="planner", policy="test")
    assert path.name == "p.npz" and card_path(path).is_file()
    pol = load_policy(path, level="planner")
    obs = np.random.default_rng(3).uniform(-3, 4, (500, 6)).astype(np.float32)  # beyond the bounds too
    want, _ = model.predict(obs, deterministic=True)
    got, _ = pol.predict(obs)
    if kind == "box":
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert (got >= -1.0).all() and (got[:, 1] <= 0.5).all()  # clipped to the bounds
    else:
        assert got.shape == want.shape
        _same_up_to_float32_ties(pol, obs, got, want)
    one, _ = pol.predict(obs[0])
    ref, _ = model.predict(obs[0], deterministic=True)
    np.testing.assert_allclose(one, ref, atol=1e-5)
    card = read_card(card_path(path))
    assert card.level == "planner" and card.policy == "test" and card.training["algorithm"] == "PPO"


def _same_up_to_float32_ties(pol, obs, got, want):
    """Equal actions, except where the two choices' logits differ by less than float32 resolution (SB3 computes
    in float32, the numpy pass in float64: an exact near-tie may go either way)."""
    out = pol.forward(obs)
    nvec = pol.action.nvec or (pol.action.n,)
    parts = np.split(out, np.cumsum(nvec)[:-1], axis=1)
    g, w = got.reshape(len(obs), -1), np.asarray(want).reshape(len(obs), -1)
    for d, part in enumerate(parts):
        rows = np.flatnonzero(g[:, d] != w[:, d])
        gap = np.abs(part[rows, g[rows, d]] - part[rows, w[rows, d]])
        assert (gap < 1e-5).all(), (d, rows, gap)
    assert (g == w).mean() > 0.98


def test_numpy_forward_pass_acts_as_sb3_dqn(tmp_path, torch_threads):
    from stable_baselines3 import DQN

    from fleetwise.learn.export import export_sb3

    model = DQN("MlpPolicy", _env(4, _spaces()["discrete"]), learning_starts=8, buffer_size=200, train_freq=4,
                seed=0, device="cpu", policy_kwargs={"net_arch": [12]})
    quiet_logger(model).learn(64)
    pol = load_policy(export_sb3(model, tmp_path / "q.npz", level="allocator", policy="dqn"))
    obs = np.random.default_rng(0).uniform(-2, 3, (300, 4)).astype(np.float32)
    _same_up_to_float32_ties(pol, obs, pol.predict(obs)[0], model.predict(obs, deterministic=True)[0])


def test_vec_normalize_statistics_are_applied(tmp_path, torch_threads):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from fleetwise.learn.export import export_sb3

    venv = VecNormalize(DummyVecEnv([lambda: _env(3, _spaces()["discrete"])]), norm_reward=False, clip_obs=2.0)
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu")
    quiet_logger(model).learn(64)
    venv.training = False
    pol = load_policy(export_sb3(model, tmp_path / "n", level="scaler", policy="rl", vec_normalize=venv))
    obs = np.random.default_rng(1).uniform(-3, 3, (200, 3)).astype(np.float32)
    want = model.predict(venv.normalize_obs(obs), deterministic=True)[0]
    _same_up_to_float32_ties(pol, obs, pol.predict(obs)[0], want)


def test_export_command_and_an_sb3_zip_is_refused_with_how_to_export(tmp_path, torch_threads):
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", _env(3, _spaces()["box"]), n_steps=16, batch_size=16, n_epochs=1, device="cpu")
    model.save(tmp_path / "sb3.zip")
    with pytest.raises(CheckpointError, match="Stable-Baselines3 zip.*export-checkpoint"):
        load_policy(tmp_path / "sb3.zip")
    p = subprocess.run([sys.executable, "-m", "fleetwise", "export-checkpoint", str(tmp_path / "sb3.zip"),
                        str(tmp_path / "out.npz"), "--level", "planner", "--policy", "torta"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "unpickles" in p.stdout + p.stderr  # the warning
    pol = load_policy(tmp_path / "out.npz", level="planner")
    obs = np.zeros(3, np.float32)
    np.testing.assert_allclose(pol.predict(obs)[0], model.predict(obs, deterministic=True)[0], atol=1e-5)
    with pytest.raises(CheckpointError, match="a planner policy, expected a scaler"):
        load_policy(tmp_path / "out.npz", level="scaler")


def test_serving_code_imports_neither_torch_nor_sb3(tmp_path):
    code = ("import sys, fleetwise.control.checkpoint as c; "
            "print(sorted(m for m in ('torch', 'stable_baselines3', 'gymnasium') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------- refused files
def _write_valid(tmp_path, name="ok"):
    from fleetwise.control.checkpoint import ActionSpec, save_policy

    rng = np.random.default_rng(0)
    layers = [(rng.normal(size=(4, 3)), rng.normal(size=4)), (rng.normal(size=(2, 4)), rng.normal(size=2))]
    return save_policy(tmp_path / name, level="planner", algorithm="ppo", obs_low=-np.ones(3), obs_high=np.ones(3),
                       action=ActionSpec("discrete", n=2), layers=layers, activation="tanh",
                       card=ModelCard(level="planner", policy="t"))


def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def _rezip(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def test_a_valid_file_loads_and_every_tampering_is_refused(tmp_path):
    path = _write_valid(tmp_path)
    pol = load_policy(path)
    assert pol.predict(np.zeros(3))[0] in (0, 1)
    good = _members(path)
    cases = {
        "extra member": ({**good, "evil.npy": _npy(np.zeros(1))}, "unexpected member 'evil.npy'"),
        "missing member": ({k: v for k, v in good.items() if k != "layer1_b.npy"}, "missing member"),
        "object array (pickle)": ({**good, "layer0_b.npy": _npy(np.array([object()] * 4, dtype=object))},
                                  "dtype object is not allowed"),
        "wrong shape": ({**good, "layer0_w.npy": _npy(np.zeros((5, 3), np.float32))}, r"shape \(5, 3\)"),
        "NaN weights": ({**good, "layer1_w.npy": _npy(np.full((2, 4), np.nan, np.float32))}, "NaN"),
        "bad metadata": ({**good, "__meta__.npy": _npy(np.frombuffer(b'{"format": "x"}', np.uint8))},
                         "format is 'x'"),
        "not an npy": ({**good, "layer0_b.npy": b"\x80\x04junk"}, "not a numpy array"),
        "no meta": ({k: v for k, v in good.items() if k != "__meta__.npy"}, "no __meta__"),
    }
    for label, (members, needle) in cases.items():
        bad = tmp_path / f"bad-{label.replace(' ', '_')}.npz"
        _rezip(bad, members)
        card_path(bad).write_text(card_path(path).read_text())
        with pytest.raises(CheckpointError, match=needle) as e:
            load_policy(bad)
        assert "\n" not in str(e.value), label
    with pytest.raises(CheckpointError, match="model card .*no such file"):
        card_path(path).unlink()
        load_policy(path)


def test_size_limits_refuse_before_reading(tmp_path):
    path = _write_valid(tmp_path)
    with pytest.raises(CheckpointError, match="more than the limit"):
        load_policy(path, max_file_bytes=100)
    # a zip bomb: a small file that declares (and would inflate to) a huge member
    bomb = tmp_path / "bomb.npz"
    members = _members(path)
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, b in members.items():
            z.writestr(n, b)
        z.writestr("huge.npy", b"\0" * (64 << 20))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(CheckpointError, match="uncompressed, more than the limit"):
        load_policy(bomb, max_uncompressed_bytes=32 << 20)
    for junk in (b"", b"not a zip", json.dumps({"a": 1}).encode()):
        (tmp_path / "junk.npz").write_bytes(junk)
        with pytest.raises(CheckpointError, match="not a fleetwise policy checkpoint"):
            load_policy(tmp_path / "junk.npz")
    with pytest.raises(CheckpointError, match="is a directory"):
        load_policy(tmp_path)
    # a zip that lists many members: refused from its end record, before zipfile reads the directory (1.15 M
    # members took 10 s and 620 MB)
    flood = tmp_path / "flood.npz"
    with zipfile.ZipFile(flood, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
        for i in range(300):
            z.writestr(f"m{i}", b"")
    with pytest.raises(CheckpointError, match="a zip of 30[0-9] members"):
        load_policy(flood)


def test_json_naming_a_key_twice_is_refused(tmp_path):
    path = _write_valid(tmp_path)
    text = card_path(path).read_text()
    card_path(path).write_text(text.replace('"level":', '"level": "router", "level":', 1))
    with pytest.raises(CheckpointError, match="duplicate key 'level'"):
        read_card(card_path(path))


def test_model_card_schema(tmp_path):
    path = _write_valid(tmp_path)
    d = json.loads(card_path(path).read_text())
    assert set(d) == {"format", "version", "level", "policy", "rule", "created_at", "training", "validation"}
    for field, value, needle in [("level", "nope", "level"), ("created_at", "yesterday", "created_at"),
                                 ("validation", 3, "validation"), ("surprise", 1, "unknown field")]:
        card_path(path).write_text(json.dumps({**d, field: value}))
        with pytest.raises(CheckpointError, match=needle):
            read_card(card_path(path))
    card_path(path).write_text(json.dumps({**d, "level": "scaler"}))
    with pytest.raises(CheckpointError, match="model card says level 'scaler'"):
        load_policy(path)


def test_resolve_inside_the_folder(tmp_path):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "a.npz").write_bytes(b"x")
    (tmp_path / "outside.npz").write_bytes(b"x")
    (folder / "link.npz").symlink_to(tmp_path / "outside.npz")
    assert resolve_inside(folder, "a.npz") == (folder / "a.npz").resolve()
    assert resolve_inside(folder, str(folder / "a.npz")) == (folder / "a.npz").resolve()
    # the name without its suffix is the file the policies open (they add ".npz"): checked as that file (a fuzzing
    # pass, 2026-12-07: "learned?checkpoint=link" passed the check as DIR/link, then loaded DIR/link.npz, outside)
    assert resolve_inside(folder, "a") == (folder / "a.npz").resolve()
    for name in ("../outside.npz", str(tmp_path / "outside.npz"), "link.npz", "link", "/etc/passwd", ".", ""):
        with pytest.raises(CheckpointError):
            resolve_inside(folder, name)
    with pytest.raises(CheckpointError, match="--checkpoint-dir"):
        resolve_inside(None, "a.npz")
