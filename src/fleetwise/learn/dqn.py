"""DQN (Mnih et al. 2015) on fleetwise/Allocation-v0: a thin Stable-Baselines3 wrapper.

The network sees the continuous observation (no discretizer). torch and SB3 are imported inside the functions
so that the rest of fleetwise imports without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleetwise.errors import InputError


@dataclass
class DQNArgs:
    total_timesteps: int = 30_000
    learning_rate: float = 1e-3
    gamma: float = 0.3
    buffer_size: int = 50_000
    learning_starts: int = 1_000
    batch_size: int = 64
    train_freq: int = 4
    target_update_interval: int = 1_000
    exploration_fraction: float = 0.5
    exploration_final_eps: float = 0.05
    net_arch: tuple[int, ...] = (64, 64)
    seed: int = 0
    log_every: int = 5_000


@dataclass
class DQNPolicy:
    model: object
    name: str = "dqn"
    curve: list[tuple[int, float]] = field(default_factory=list)

    def allocate(self, obs) -> int:
        a, _ = self.model.predict(np.asarray(obs, np.float32), deterministic=True)
        return int(a)

    def allocate_batch(self, obs: np.ndarray) -> np.ndarray:
        a, _ = self.model.predict(np.asarray(obs, np.float32), deterministic=True)
        return np.asarray(a, np.int64)

    def save(self, path: str | Path) -> Path:
        """SB3's zip (to resume training; it unpickles on load) and, beside it, the fleetwise checkpoint (.npz +
        .card.json) that ``load`` and the allocator ``dqn`` read; returns the checkpoint's path."""
        from fleetwise.learn.export import export_sb3

        p = Path(path)
        stem = p.with_suffix("") if p.suffix in (".zip", ".npz") else p
        self.model.save(str(stem.with_suffix(".zip")))
        return export_sb3(self.model, stem.with_suffix(".npz"), level="allocator", policy=self.name,
                          training={"env": "fleetwise/Allocation-v0", "episodes_logged": len(self.curve)})

    @classmethod
    def load(cls, path: str | Path) -> "DQNPolicy":
        """A saved policy from its fleetwise checkpoint (``NAME.npz`` or ``NAME``): numpy only, nothing in the
        file runs; SB3's zip is refused (``fleetwise export-checkpoint`` converts one of yours)."""
        from fleetwise.control.checkpoint import SUFFIX, load_policy

        p = Path(path)
        if p.suffix == ".zip":
            raise InputError(f"{p}: a Stable-Baselines3 zip, which runs code when loaded; give its fleetwise "
                             f"checkpoint {p.with_suffix(SUFFIX).name} (export one with `fleetwise export-checkpoint`, "
                             "only for files you trust)")
        if not p.name.endswith(SUFFIX) and not p.exists():
            p = p.with_name(p.name + SUFFIX)
        pol = load_policy(p, level="allocator")
        if pol.action.kind != "discrete":
            raise InputError(f"{p}: not an allocation policy (action {pol.action.to_json()})")
        return cls(pol)


def train(env, args: DQNArgs | None = None) -> DQNPolicy:
    """SB3 DQN with the literature's hyperparameter names; returns the greedy policy and its learning curve
    (mean training return per episode every ``log_every`` steps)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN

    args = args or DQNArgs()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    class _Returns(gym.Wrapper):
        def __init__(self, e):
            super().__init__(e)
            self.steps, self.ret, self.done, self.curve, self.next_log = 0, 0.0, [], [], args.log_every

        def step(self, action):
            o, r, term, trunc, info = self.env.step(action)
            self.steps += 1
            self.ret += r
            if term or trunc:
                self.done.append(self.ret)
                self.ret = 0.0
            if self.steps >= self.next_log and self.done:
                self.curve.append((self.steps, float(np.mean(self.done))))
                self.done = []
                self.next_log += args.log_every
            return o, r, term, trunc, info

    wrapped = _Returns(env)
    wrapped.reset(seed=args.seed)
    model = DQN("MlpPolicy", wrapped, learning_rate=args.learning_rate, gamma=args.gamma,
                buffer_size=args.buffer_size, learning_starts=args.learning_starts, batch_size=args.batch_size,
                train_freq=args.train_freq, target_update_interval=args.target_update_interval,
                exploration_fraction=args.exploration_fraction, exploration_final_eps=args.exploration_final_eps,
                policy_kwargs={"net_arch": list(args.net_arch)}, seed=args.seed, device="cpu", verbose=0)
    model.learn(total_timesteps=args.total_timesteps)
    return DQNPolicy(model, "dqn", wrapped.curve)
