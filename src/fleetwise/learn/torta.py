"""TORTA's macro agent: Stable-Baselines3 PPO over ``TortaEnv`` (one step per planning slot).

``train(make_env, args) -> (model, curve, wall_s)``; ``curve`` is (timestep, episode return) pairs.
torch / SB3 are imported lazily; one thread (small networks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class TortaArgs:
    total_timesteps: int = 6000
    n_steps: int = 240  # 10 days per rollout
    batch_size: int = 60
    n_epochs: int = 10
    learning_rate: float = 3e-4
    gamma: float = 0.9  # per slot (one hour of the day)
    gae_lambda: float = 0.9
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    net_arch: tuple[int, ...] = (64, 64)
    seed: int = 0


def train(make_env, args: TortaArgs, progress=None):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(1)
    env = Monitor(make_env())
    curve: list[tuple[int, float]] = []

    class _CB(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                ep = info.get("episode")
                if ep is not None:
                    curve.append((int(self.num_timesteps), float(ep["r"])))
            if progress is not None:
                progress(self.num_timesteps)
            return True

    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs,
                learning_rate=args.learning_rate, gamma=args.gamma, gae_lambda=args.gae_lambda,
                clip_range=args.clip_coef, ent_coef=args.ent_coef, seed=args.seed, device="cpu", verbose=0,
                policy_kwargs={"net_arch": list(args.net_arch)})
    t0 = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps, callback=_CB())
    return model, curve, time.perf_counter() - t0
