"""DISPPO: PPO with action masking on a semi-Markov decision process (prefill/decode batching at edge nodes).

What is library code and what is written here:
- PPO itself, the masked categorical policy and the rollout loop are sb3-contrib's ``MaskablePPO``.
- Written here: ``SMDPRolloutBuffer``, which stores each step's sojourn time ``tau`` (seconds until the next
  decision, from the environment's ``info``) and computes returns and GAE with the discount ``gamma ** tau``
  instead of a fixed per-step ``gamma``:

      delta_t = r_t + gamma^tau_t * V(s_{t+1}) - V(s_t)
      A_t     = delta_t + (gamma^tau_t * gae_lambda^tau_t) * A_{t+1}

  ``gamma`` and ``gae_lambda`` are then per second of simulated time. ``TauCallback`` hands ``tau`` to the buffer: SB3
  calls callbacks after ``env.step`` and before ``rollout_buffer.add``, and passes no info to ``add``.
- With ``time_aware=False`` (the ablation) the same code discounts every step by a fixed per-step
  ``gamma ** mean_tau`` (and ``gae_lambda ** mean_tau``), matched to the mean sojourn time: PPO that ignores
  how long each action takes.

The reward of a step arrives at its end (a lump sum for the requests that ended during the sojourn).

Training follows the shared recipe (``fleetwise.learn.recipe``, docs/batching.md): the action adjusts the rule
``offload_greedy`` (the zero action is the rule), behaviour cloning at the rule before PPO, the TTFT deadline
attainment as a constraint with a Lagrange multiplier (dual ascent after every rollout, target: the rule's
attainment), and checkpoint choice on validation segments (``EdgeValidation``), whose comparison with the rule
is the deployment gate written into the checkpoint's model card.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class DISPPOArgs:
    total_timesteps: int = 200_000
    gamma: float = 0.9  # per second of simulated time (time-aware); per step when time_aware=False
    gae_lambda: float = 0.8  # per second of simulated time (time-aware); per step when time_aware=False
    learning_rate: float = 3e-4
    n_steps: int = 512  # per environment, per rollout
    batch_size: int = 256
    n_epochs: int = 10
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    n_envs: int = 4
    net_arch: tuple[int, ...] = (64, 64)
    time_aware: bool = True
    mean_tau_s: float = 0.025  # for the ablation's per-step discount gamma ** mean_tau_s
    seed: int = 0
    # the recipe (fleetwise.learn.recipe)
    bc_episodes: int = 2  # rule demonstrations for the warm start (0: none)
    bc_epochs: int = 1  # one pass: the rule becomes the most likely action, PPO still explores around it
    ttft_target: float | None = None  # TTFT deadline attainment to keep (None: no constraint)
    lagrange_lr: float = 2.0  # dual ascent step per rollout, on the attainment's shortfall
    validate_every: int = 6  # rollouts between validation checks (checkpoint choice)
    patience: int = 6  # validation checks without improvement before training stops
    # the share of the budget's rollouts before early stopping may stop training (Validator.min_checks, as the RL
    # scaler's): behaviour cloning leaves the greedy policy at the rule, and PPO moved it only after 110,592 and
    # 147,456 steps of the 400,000-step budget (seeds 0 and 1, 2026-12-06), so 6 checks without improvement had
    # stopped every full-budget job at 73,728 steps, still the rule (docs/batching.md)
    early_stop_after: float = 0.5


def _buffer_class():
    from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer

    class SMDPRolloutBuffer(MaskableRolloutBuffer):
        """Maskable rollout buffer whose discounting uses each step's elapsed time."""

        def __init__(self, *args, time_aware: bool = True, **kwargs):
            self.time_aware = time_aware
            self.next_tau = None
            super().__init__(*args, **kwargs)

        def reset(self) -> None:
            self.taus = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)
            super().reset()

        def add(self, *args, **kwargs) -> None:
            if self.next_tau is not None:
                self.taus[self.pos] = self.next_tau
            super().add(*args, **kwargs)

        def compute_returns_and_advantage(self, last_values, dones) -> None:
            last_values = last_values.clone().cpu().numpy().flatten()
            if self.time_aware:  # both per second of simulated time
                disc = self.gamma ** self.taus
                lam = self.gae_lambda ** self.taus
            else:
                disc = np.full_like(self.taus, self.gamma)
                lam = np.full_like(self.taus, self.gae_lambda)
            last_gae_lam = 0.0
            for step in reversed(range(self.buffer_size)):
                if step == self.buffer_size - 1:
                    next_non_terminal = 1.0 - dones.astype(np.float32)
                    next_values = last_values
                else:
                    next_non_terminal = 1.0 - self.episode_starts[step + 1]
                    next_values = self.values[step + 1]
                delta = self.rewards[step] + disc[step] * next_values * next_non_terminal - self.values[step]
                last_gae_lam = delta + disc[step] * lam[step] * next_non_terminal * last_gae_lam
                self.advantages[step] = last_gae_lam
            self.returns = self.advantages + self.values

    return SMDPRolloutBuffer


def _tau_callback(curve: list):
    from stable_baselines3.common.callbacks import BaseCallback

    class TauCallback(BaseCallback):
        """Passes each step's sojourn time to the buffer; records episode returns for the learning curve."""

        def _on_step(self) -> bool:
            infos = self.locals["infos"]
            self.model.rollout_buffer.next_tau = np.array([i.get("tau", 0.0) for i in infos], dtype=np.float32)
            for i in infos:
                ep = i.get("episode")
                if ep is not None:
                    curve.append((self.num_timesteps, float(ep["r"])))
            return True

    return TauCallback()


def train(make_env: Callable[[], object], args: DISPPOArgs, progress: Callable[[int], None] | None = None,
          validation: "EdgeValidation | None" = None):
    """Train DISPPO (or its time-unaware ablation) on environments from ``make_env``, on the recipe: warm start
    at the rule, the TTFT constraint's multiplier, checkpoint choice on ``validation`` (the best parameters
    are restored at the end; the warm start itself is the first candidate).
    Returns (model, learning curve, wall seconds); the curve is a dict of lists: ``episodes`` [(timesteps,
    episode return)], ``lagrange`` [(timesteps, lambda, attainment)], ``validation`` [(timesteps, score)],
    ``bc_loss``, ``best_step``."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from fleetwise.floats import check_torch
    from fleetwise.learn.recipe import (Lagrangian, Validator, behaviour_clone, quiet_logger, rule_demonstrations,
                                        sb3_callback)

    torch.set_num_threads(1)
    check_torch(torch)  # the kernels pinned at import (fleetwise/floats.py)
    venv = DummyVecEnv([lambda: Monitor(make_env()) for _ in range(args.n_envs)])
    venv.seed(args.seed)
    gamma = args.gamma if args.time_aware else args.gamma ** args.mean_tau_s
    lam = args.gae_lambda if args.time_aware else args.gae_lambda ** args.mean_tau_s
    episodes: list = []
    model = MaskablePPO(
        "MlpPolicy", venv, learning_rate=args.learning_rate, n_steps=args.n_steps, batch_size=args.batch_size,
        n_epochs=args.n_epochs, gamma=gamma, gae_lambda=lam, clip_range=args.clip_coef,
        ent_coef=args.ent_coef, vf_coef=args.vf_coef, seed=args.seed, device="cpu",
        policy_kwargs={"net_arch": list(args.net_arch)},
        rollout_buffer_class=_buffer_class(), rollout_buffer_kwargs={"time_aware": args.time_aware},
    )
    quiet_logger(model)
    t0 = time.perf_counter()
    bc_loss: list[float] = []
    if args.bc_episodes > 0:  # 2. warm start at the rule
        obs, acts = rule_demonstrations(make_env, args.bc_episodes, seed=args.seed + 10_000)
        bc_loss = behaviour_clone(model, obs, acts, epochs=args.bc_epochs, seed=args.seed)
    # 3. the TTFT constraint: attainment >= target, multiplier by dual ascent after each rollout
    lag = Lagrangian(target=args.ttft_target, sense=">=", lr=args.lagrange_lr) if args.ttft_target is not None \
        else None
    attained: list[float] = []
    lagrange: list = []
    if not 0.0 <= args.early_stop_after <= 1.0:
        raise ValueError(f"DISPPOArgs.early_stop_after {args.early_stop_after!r}: expected a share from 0 to 1")
    rollouts = math.ceil(args.total_timesteps / (args.n_steps * args.n_envs))
    validator = Validator(score=validation.score, patience=args.patience,
                          min_checks=int(args.early_stop_after * rollouts / max(1, args.validate_every))) \
        if validation is not None else None
    if validator is not None:
        validator.check(model, 0)  # the warm start is the first candidate

    def on_episode(info: dict) -> None:
        if "ttft_attainment" in info:
            attained.append(float(info["ttft_attainment"]))

    rollouts = [0]

    def on_rollout(m, steps: int) -> bool:
        rollouts[0] += 1
        if progress is not None:
            progress(steps)
        if lag is not None and attained:
            lam_now = lag.update(float(np.mean(attained)), steps)
            lagrange.append((steps, lam_now, float(np.mean(attained))))
            venv.env_method("__setattr__", "ttft_lambda", lam_now)
            attained.clear()
        if validator is not None and rollouts[0] % args.validate_every == 0:
            return validator.check(m, steps)  # 4. checkpoint choice, early stop
        return True

    model.learn(total_timesteps=args.total_timesteps,
                callback=CallbackList([_tau_callback(episodes), sb3_callback(1, on_rollout, on_episode)]))
    if validator is not None:
        validator.check(model, model.num_timesteps)
        validator.restore(model)
    curve = {"episodes": episodes, "lagrange": lagrange, "bc_loss": bc_loss,
             "validation": validator.curve if validator is not None else [],
             "best_step": validator.best_step if validator is not None else model.num_timesteps}
    return model, curve, time.perf_counter() - t0


class EdgeValidation:
    """Validation segments of the edge world (the validation part of each trace's time span, never used for
    training or test) for checkpoint choice and the deployment gate.

    ``windows``: (name, config, seed, trace or None, load or None). ``score(model)`` = the mean requests within
    deadline per second, less 10 x the shortfall of the TTFT deadline attainment below the rule's on the same
    windows. ``gate(model)`` = ``fleetwise.learn.recipe.gate`` of the policy against the rule, paired by window,
    with the constraint "TTFT P99 no higher than Sarathi's" on those windows."""

    def __init__(self, windows, rule_factory, sarathi_factory):
        from fleetwise.worlds.edge import evaluate

        self.windows = list(windows)
        self.rule = self._run(rule_factory)
        self.sarathi = self._run(sarathi_factory)
        self._evaluate = evaluate

    def _run(self, make_batcher) -> dict[str, dict]:
        from fleetwise.worlds.edge import evaluate

        out = {}
        for name, cfg, seed, trace, load in self.windows:
            out[name] = evaluate(cfg, make_batcher, [seed], held_out="validation", trace=trace, load=load)[0]
        return out

    def run_policy(self, model) -> dict[str, dict]:
        """Rows per window of ``model``: a MaskablePPO, anything with ``predict(obs, action_masks=...)``
        (``NumpyPolicy``, ``learn.batching_cem.LinearEdgePolicy``), or None (the rule: its rows)."""
        from fleetwise.worlds.edge import EdgePolicyBatcher

        if model is None:
            return self.rule
        pol = NumpyPolicy(model) if hasattr(model, "policy") else model
        return self._run(lambda view: EdgePolicyBatcher(pol, view))

    def score(self, model) -> float:
        rows = self.run_policy(model)
        self.last = rows
        att = np.mean([r["ttft_attainment"] for r in rows.values()])
        att_rule = np.mean([r["ttft_attainment"] for r in self.rule.values()])
        return float(np.mean([r["deadline_rps"] for r in rows.values()]) - 10.0 * max(att_rule - att, 0.0))

    def gate(self, model) -> dict:
        from fleetwise.learn.recipe import gate

        rows = self.run_policy(model)
        p99 = float(np.mean([r["ttft_p99_s"] for r in rows.values()]))
        p99_s = float(np.mean([r["ttft_p99_s"] for r in self.sarathi.values()]))
        g = gate({k: r["deadline_rps"] for k, r in rows.items()}, {k: r["deadline_rps"] for k, r in self.rule.items()},
                 lower_is_better=False, constraint_ok=p99 <= p99_s)
        g.update(rule="offload_greedy", metric="deadline_rps", windows_names=sorted(rows),
                 ttft_p99_s=p99, sarathi_ttft_p99_s=p99_s,
                 deadline_rps=float(np.mean([r["deadline_rps"] for r in rows.values()])),
                 rule_deadline_rps=float(np.mean([r["deadline_rps"] for r in self.rule.values()])))
        return g


class NumpyPolicy:
    """A trained MaskablePPO's deterministic policy evaluated in numpy (same argmax of masked logits as
    ``model.predict(obs, action_masks=m, deterministic=True)``, without torch's per-call overhead)."""

    def __init__(self, model):
        import torch

        pol = model.policy
        layers = []
        act = None
        for m in pol.mlp_extractor.policy_net:
            if isinstance(m, torch.nn.Linear):
                layers.append((m.weight.detach().cpu().numpy().astype(np.float64),
                               m.bias.detach().cpu().numpy().astype(np.float64)))
            else:
                act = type(m).__name__
        if act not in (None, "Tanh", "ReLU"):
            raise ValueError(f"unsupported activation {act}")
        self._relu = act == "ReLU"
        nvec = getattr(model.action_space, "nvec", None)
        self.nvec = None if nvec is None else [int(x) for x in nvec]
        self.layers = layers
        self.head = (pol.action_net.weight.detach().cpu().numpy().astype(np.float64),
                     pol.action_net.bias.detach().cpu().numpy().astype(np.float64))

    @classmethod
    def from_checkpoint(cls, path) -> "NumpyPolicy":
        """The same policy from a checkpoint that ``learn.export.export_sb3`` wrote of such a model (read with the
        safe loader: arrays and JSON only; the float32 weights it stores are the model's own)."""
        from fleetwise.control.checkpoint import CheckpointError, load_policy

        p = load_policy(path, level="batcher")
        if p.algorithm != "ppo" or p.norm is not None or p.activation not in ("tanh", "relu"):
            raise CheckpointError(f"checkpoint {path}: not a DISPPO policy (PPO, tanh or ReLU, no normalisation)")
        self = cls.__new__(cls)
        *hidden, head = [(w.astype(np.float64), b.astype(np.float64)) for w, b in p.layers]
        self.layers, self.head, self._relu = hidden, head, p.activation == "relu"
        self.nvec = [int(x) for x in p.action.nvec] if p.action.kind == "multi_discrete" else None
        return self

    def predict(self, obs, action_masks=None, deterministic=True):
        h = np.asarray(obs, dtype=np.float64)
        for w, b in self.layers:
            h = w @ h + b
            h = np.maximum(h, 0.0) if self._relu else np.tanh(h)
        logits = self.head[0] @ h + self.head[1]
        if action_masks is not None:
            logits = np.where(action_masks, logits, -np.inf)
        if self.nvec is None:
            return int(np.argmax(logits)), None
        parts = np.split(logits, np.cumsum(self.nvec)[:-1])
        return np.array([int(np.argmax(p)) for p in parts], dtype=np.int64), None
