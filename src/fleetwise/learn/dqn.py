"""DQN (Mnih et al. 2015) on fleetwise/Allocation-v0: a thin Stable-Baselines3 wrapper.

The network sees the continuous observation (no discretizer). torch and SB3 are imported inside the functions
so that the rest of fleetwise imports without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetwise.floats import check_torch
from fleetwise.policies.allocators import DQNPolicy  # noqa: F401  (re-exported: what training returns)


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


class TrainedDQN(DQNPolicy):
    """What training returns: the allocator with its SB3 model, which it can save."""

    def save(self, path: str | Path) -> Path:
        """SB3's zip (to resume training; it unpickles on load) and, beside it, the fleetwise checkpoint (.npz +
        .card.json) that ``DQNPolicy.load`` and the allocator ``dqn`` read; returns the checkpoint's path."""
        from fleetwise.learn.export import export_sb3

        p = Path(path)
        stem = p.with_suffix("") if p.suffix in (".zip", ".npz") else p
        self.model.save(str(stem.with_suffix(".zip")))
        return export_sb3(self.model, stem.with_suffix(".npz"), level="allocator", policy=self.name,
                          training={"env": "fleetwise/Allocation-v0", "episodes_logged": len(self.curve)})


def train(env, args: DQNArgs | None = None) -> TrainedDQN:
    """SB3 DQN with the literature's hyperparameter names; returns the greedy policy and its learning curve
    (mean training return per episode every ``log_every`` steps)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN

    from fleetwise.learn.recipe import quiet_logger

    args = args or DQNArgs()
    torch.set_num_threads(1)
    check_torch(torch)  # the kernels pinned at import (fleetwise/floats.py)
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
    quiet_logger(model)
    model.learn(total_timesteps=args.total_timesteps)
    return TrainedDQN(model, "dqn", wrapped.curve)
