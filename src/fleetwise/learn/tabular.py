"""Tabular Q-learning (Watkins 1989) and SARSA (Rummery & Niranjan 1994) for fleetwise/Allocation-v0.

Both read top to bottom inside ``train(env, args) -> TabularPolicy``. They step the environment's transition
function (``AllocationCore``) directly instead of ``env.step``: the same rewards and next states, without
building an observation vector and an info dict per step (the lean path; ``fleetwise bench env-steps
allocation`` measures it). The state is the ``Discretizer`` index of the observation the env would return.

Hyperparameters (literature names): step size ``max(alpha, n(s,a)^-alpha_omega)`` (``alpha_omega=0``: constant ``alpha``), ``gamma`` discount, ε-greedy exploration with
ε decaying linearly from ``epsilon_start`` to ``epsilon_end`` over ``exploration_fraction`` of
``total_steps``. The same budget and schedule are used for both algorithms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetwise.errors import InputError
from fleetwise.policies.allocation_model import N_ACTIONS, AllocationCore, Discretizer
from fleetwise.policies.allocators import TabularPolicy  # noqa: F401  (re-exported: what training returns)


@dataclass
class TabularArgs:
    total_steps: int = 600_000
    alpha: float = 0.05  # floor of the step size
    alpha_omega: float = 0.6  # step size max(alpha, 1 / n(s,a)^omega) (polynomial, Even-Dar & Mansour 2003); 0: constant alpha
    gamma: float = 0.3
    epsilon_start: float = 1.0
    epsilon_end: float = 0.3  # exploration kept through training (see docs/allocation.md)
    exploration_fraction: float = 0.5
    cpu_bins: int = 20
    bw_bins: int = 3
    seed: int = 0
    log_every: int = 10_000  # learning-curve point: mean training return per episode over the last interval

    def __post_init__(self) -> None:
        """Values training cannot take, naming the field (gamma=NaN returned a NaN Q table, cpu_bins=0 an
        IndexError, total_steps=0 an empty policy; found by fuzzing, 2026-12-06)."""
        ints = {"total_steps": (1, 10**9), "cpu_bins": (1, 10_000), "bw_bins": (1, 10_000), "seed": (0, 2**63 - 1),
                "log_every": (1, 10**9)}
        for k, (lo, hi) in ints.items():
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
                raise ValueError(f"TabularArgs.{k} = {v!r}: expected an integer from {lo} to {hi}")
        for k, lo, hi in (("alpha", 0.0, 1.0), ("alpha_omega", 0.0, 1.0), ("gamma", 0.0, 1.0),
                          ("epsilon_start", 0.0, 1.0), ("epsilon_end", 0.0, 1.0), ("exploration_fraction", 0.0, 1.0)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"TabularArgs.{k} = {v!r}: expected a number in [{lo:g}, {hi:g}]")


def _pool(env) -> tuple[AllocationCore, list[np.ndarray]]:
    core = getattr(env, "core", None) or getattr(getattr(env, "unwrapped", None), "core", None)
    if core is None:
        raise InputError("tabular training needs a fleetwise/Allocation-v0 environment")
    return core, env.unwrapped.series


def _train(env, args: TabularArgs, on_policy: bool, name: str) -> TabularPolicy:
    core, pool = _pool(env)
    disc = Discretizer(args.cpu_bins, args.bw_bins)
    rng = np.random.default_rng(args.seed)
    Q = np.zeros((disc.n_states, N_ACTIONS))
    N = np.zeros((disc.n_states, N_ACTIONS))  # visits, for the step size
    omega = args.alpha_omega
    lost = core.table.lost_frac
    feasible = np.flatnonzero(core.table.feasible)
    alpha, gamma = args.alpha, args.gamma
    decay_steps = max(1, int(args.exploration_fraction * args.total_steps))
    step, curve, returns = 0, [], []
    next_log = args.log_every
    while step < args.total_steps:
        ep = core.episode(pool[int(rng.integers(len(pool)))], rng)
        S = disc.episode_indices(ep)  # S[t, d]: state at step t with deployment d running
        base, served_w, T = ep.base, ep.served_w, ep.T
        u = rng.random(T + 1)
        rand_a = rng.integers(N_ACTIONS, size=T + 1)
        eps = np.maximum(args.epsilon_end, args.epsilon_start + (args.epsilon_end - args.epsilon_start)
                         * np.minimum(1.0, (step + np.arange(T + 1)) / decay_steps))
        d = int(feasible[rng.integers(len(feasible))])
        s = int(S[0, d])
        a = int(rand_a[0]) if u[0] < eps[0] else int(Q[s].argmax())
        ret = 0.0
        for t in range(T):
            r = base[t, a] - served_w[t, a] * lost[d, a]
            ret += r
            if t + 1 < T:
                s2 = int(S[t + 1, a])
                q2 = Q[s2]
                a2 = int(rand_a[t + 1]) if u[t + 1] < eps[t + 1] else int(q2.argmax())
                # SARSA bootstraps on the action it will take; Q-learning on the greedy one
                target = r + gamma * (q2[a2] if on_policy else q2.max())
            else:
                s2, a2, target = s, a, r  # the series ends: terminal
            if omega > 0:
                n = N[s, a] + 1.0
                N[s, a] = n
                lr = n ** -omega
                lr = lr if lr > alpha else alpha
            else:
                lr = alpha
            Q[s, a] += lr * (target - Q[s, a])
            d, s, a = a, s2, a2
            if step + t + 1 >= args.total_steps:
                T = t + 1
                break
        step += T
        returns.append(ret)
        if step >= next_log or step >= args.total_steps:
            curve.append((step, float(np.mean(returns))))
            returns = []
            next_log += args.log_every
    return TabularPolicy(Q, disc, name, curve)


def train_q_learning(env, args: TabularArgs | None = None) -> TabularPolicy:
    """Off-policy TD control: Q(s,a) += alpha [r + gamma max_a' Q(s',a') - Q(s,a)]."""
    return _train(env, args or TabularArgs(), on_policy=False, name="q_learning")


def train_sarsa(env, args: TabularArgs | None = None) -> TabularPolicy:
    """On-policy TD control: Q(s,a) += alpha [r + gamma Q(s',a') - Q(s,a)], a' the ε-greedy next action."""
    return _train(env, args or TabularArgs(), on_policy=True, name="sarsa")


def train(env, args: TabularArgs | None = None, algo: str = "q_learning") -> TabularPolicy:
    if algo == "q_learning":
        return train_q_learning(env, args)
    if algo == "sarsa":
        return train_sarsa(env, args)
    raise InputError(f"tabular algorithm {algo!r}: expected q_learning or sarsa")
