"""Export a trained Stable-Baselines3 model to a fleetwise policy checkpoint (``fleetwise.control.checkpoint``):
the actor's weights and metadata in ``NAME.npz`` and a model card in ``NAME.card.json``, which serving and the
policies load without torch, SB3 or unpickling anything. docs/security.md.

``export_sb3(model, path, level=..., policy=...)`` takes a model in memory (what training returns).
``export_file(sb3_zip, out, ...)`` loads an SB3 ``.zip`` first: that **unpickles** objects from the zip and so can
run code: use it only on files you trust (your own training runs). ``fleetwise export-checkpoint`` calls it.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.control.checkpoint import ActionSpec, CheckpointError, ModelCard, save_policy
from fleetwise.errors import InputError, not_a_file

_ACT = {"Tanh": "tanh", "ReLU": "relu", "LeakyReLU": "leaky_relu", "ELU": "elu", "Sigmoid": "sigmoid",
        "Identity": "identity"}


def _activation(mod: Any) -> str:
    name = type(mod).__name__
    if name not in _ACT:
        raise CheckpointError(f"activation {name} cannot be exported (one of {', '.join(_ACT)})")
    if name == "LeakyReLU" and abs(mod.negative_slope - 0.01) > 1e-12:
        raise CheckpointError("LeakyReLU with a slope other than 0.01 cannot be exported")
    if name == "ELU" and abs(mod.alpha - 1.0) > 1e-12:
        raise CheckpointError("ELU with alpha other than 1 cannot be exported")
    return _ACT[name]


def _mlp(seq: Any, last: Any | None) -> tuple[list[tuple[np.ndarray, np.ndarray]], str]:
    """(weights of each Linear, activation) of ``Linear, act, Linear, act, ...`` followed by ``last`` (a Linear)
    or, with ``last`` None, ending in a Linear."""
    import torch.nn as nn

    mods = list(seq) + ([last] if last is not None else [])
    layers, acts = [], set()
    for i, m in enumerate(mods):
        if isinstance(m, nn.Linear):
            if m.bias is None:
                raise CheckpointError("a Linear layer without bias cannot be exported")
            layers.append((m.weight.detach().cpu().numpy().astype(np.float32),
                           m.bias.detach().cpu().numpy().astype(np.float32)))
        else:
            if i == 0 or not isinstance(mods[i - 1], nn.Linear):
                raise CheckpointError(f"unexpected layer {type(m).__name__} in the policy network")
            acts.add(_activation(m))
    if not layers or not isinstance(mods[-1], nn.Linear):
        raise CheckpointError("the policy network must end with a Linear layer")
    if len(acts) > 1:
        raise CheckpointError(f"mixed activations {sorted(acts)} cannot be exported")
    return layers, (acts.pop() if acts else "tanh")


def _spaces(obs_space: Any, act_space: Any) -> tuple[ActionSpec, np.ndarray | None, np.ndarray | None]:
    from gymnasium import spaces

    if not isinstance(obs_space, spaces.Box):
        raise CheckpointError(f"observation space {obs_space} cannot be exported (a Box only)")
    if isinstance(act_space, spaces.Box):
        return ActionSpec("box", shape=tuple(int(x) for x in act_space.shape)), act_space.low, act_space.high
    if isinstance(act_space, spaces.Discrete):
        if int(act_space.start) != 0:
            raise CheckpointError("a Discrete action space that does not start at 0 cannot be exported")
        return ActionSpec("discrete", n=int(act_space.n)), None, None
    if isinstance(act_space, spaces.MultiDiscrete):
        if np.asarray(act_space.nvec).ndim != 1 or np.any(np.asarray(getattr(act_space, "start", 0)) != 0):
            raise CheckpointError("only a 1-D MultiDiscrete action space starting at 0 can be exported")
        return ActionSpec("multi_discrete", nvec=tuple(int(x) for x in act_space.nvec)), None, None
    raise CheckpointError(f"action space {act_space} cannot be exported (Box, Discrete or MultiDiscrete)")


def _features_ok(extractor: Any) -> None:
    if type(extractor).__name__ != "FlattenExtractor" or any(True for _ in extractor.parameters()):
        raise CheckpointError(f"features extractor {type(extractor).__name__} cannot be exported (MlpPolicy's "
                              "FlattenExtractor only)")


def export_sb3(model: Any, path: str | Path, *, level: str, policy: str, rule: str | None = None,
               training: dict | None = None, validation: dict | None = None, vec_normalize: Any = None) -> Path:
    """Write ``model`` (SB3 PPO or DQN with an MLP policy) as ``path`` (.npz) + its model card; returns the .npz
    path. ``vec_normalize``: the ``VecNormalize`` wrapper it was trained in, if any (its observation statistics
    go into the checkpoint)."""
    from stable_baselines3.common.preprocessing import is_image_space

    pol = model.policy
    obs_space, act_space = model.observation_space, model.action_space
    if is_image_space(obs_space):
        raise CheckpointError("image observations cannot be exported")
    action, act_low, act_high = _spaces(obs_space, act_space)
    if hasattr(pol, "q_net"):  # DQN
        algorithm = "dqn"
        _features_ok(pol.q_net.features_extractor)
        layers, act = _mlp(pol.q_net.q_net, None)
    elif hasattr(pol, "mlp_extractor") and hasattr(pol, "action_net"):  # PPO / A2C actor-critic
        algorithm = "ppo"
        if getattr(pol, "squash_output", False):
            raise CheckpointError("a policy with squashed output cannot be exported")
        _features_ok(getattr(pol, "pi_features_extractor", pol.features_extractor))
        layers, act = _mlp(pol.mlp_extractor.policy_net, pol.action_net)
    else:
        raise CheckpointError(f"policy {type(pol).__name__} cannot be exported (PPO/A2C MlpPolicy or DQN MlpPolicy)")
    norm = mean = var = None
    if vec_normalize is not None and getattr(vec_normalize, "norm_obs", False):
        norm = {"clip": float(vec_normalize.clip_obs), "epsilon": float(vec_normalize.epsilon)}
        mean, var = vec_normalize.obs_rms.mean, vec_normalize.obs_rms.var
    train = {"algorithm": type(model).__name__, "num_timesteps": int(getattr(model, "num_timesteps", 0))}
    train.update(training or {})
    card = ModelCard(level=level, policy=policy, rule=rule, training=train, validation=validation)
    return save_policy(path, level=level, algorithm=algorithm, obs_low=obs_space.low, obs_high=obs_space.high,
                       action=action, layers=layers, activation=act, card=card, act_low=act_low, act_high=act_high,
                       obs_norm=norm, obs_mean=mean, obs_var=var)


def _algorithm_of(zip_path: Path) -> str:
    """"ppo" or "dqn" from the SB3 zip's ``data`` JSON (its policy class's module name; nothing unpickled)."""
    try:
        with zipfile.ZipFile(zip_path) as zf:
            data = json.loads(zf.read("data"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, RecursionError) as e:
        raise InputError(f"{zip_path}: not a Stable-Baselines3 zip ({type(e).__name__}: {str(e)[:200]})") from None
    mod = str((data.get("policy_class") or {}).get("__module__", ""))
    return "dqn" if ".dqn." in mod else "ppo"


def export_file(sb3_zip: str | Path, out: str | Path, *, level: str, policy: str, rule: str | None = None) -> Path:
    """Load a Stable-Baselines3 ``.zip`` (this UNPICKLES: only for files you trust) and export it."""
    import torch
    from stable_baselines3 import DQN, PPO

    torch.set_num_threads(1)
    p = Path(sb3_zip)
    if not p.is_file():
        raise InputError(f"{p}: {not_a_file(p, 'Stable-Baselines3 .zip')}")
    algo = _algorithm_of(p)
    try:
        model = (DQN if algo == "dqn" else PPO).load(str(p), device="cpu")
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line
        raise InputError(f"{p}: cannot load as an SB3 {algo.upper()} model ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return export_sb3(model, out, level=level, policy=policy, rule=rule, training={"exported_from": p.name})
