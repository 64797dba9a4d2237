"""GPU count × parallelism allocation for an LLM inference job whose load follows a real CPU-usage trace.

The environment reproduces the setting of "Adaptive Optimization of Resource Allocation in Parallel Processing
of Large Language Models Using Reinforcement Learning Algorithms" (abstract only; every choice the abstract
leaves open is listed in docs/allocation.md). Outcomes of an action come from :class:`fleetwise.perf.PerfModel`
through a per-action performance table computed once per configuration (:func:`perf_table`); a step is then a
few array look-ups. The transition function lives in :class:`fleetwise.policies.allocation_model.AllocationCore`
(plain numpy, no Gymnasium); this Gymnasium env and the tabular trainers (fleetwise.learn.tabular) both call
it, so they see the same MDP.
"""

from __future__ import annotations

from typing import Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fleetwise.envs import checked_action, checked_render_mode
from fleetwise.errors import InputError
from fleetwise.policies.allocation_model import (
    N_ACTIONS,
    N_OBS,
    AllocationConfig,
    AllocationCore,
    Episode,
)


class AllocationEnv(gym.Env):
    """Choose the GPU count and parallelism of an LLM inference deployment every 5-minute window.

    The load of each window follows a real CPU-utilisation series (PlanetLab VM-days by default,
    normalized per series), available interconnect bandwidth follows an AR(1) process, and the outcome of
    an action comes from the calibrated performance model (``perf_table``).

    ## Action Space

    ``Discrete(12)``: action ``a`` = GPU count ``(1, 2, 4, 8)[a // 3]`` × parallelism
    ``("data", "model", "hybrid")[a % 3]``.

    | parallelism | deployment of n GPUs |
    |---|---|
    | data | n replicas, tp=1 |
    | model | 1 replica, tp=n |
    | hybrid | n/2 replicas × tp=2 (n ≥ 4); 1 replica × pp=2 (n = 2); 1 GPU (n = 1) |

    ## Observation Space

    ``Box(0, 1, (18,), float32)``:

    | index | observation |
    |---|---|
    | 0 | CPU utilisation of this window (normalized; drives the request rate: cpu × peak_rps) |
    | 1 | CPU utilisation of the previous window |
    | 2 | available interconnect bandwidth, fraction of the link (AR(1)) |
    | 3 | latency of the running deployment in the previous window (0 best, 1 = 10× the best latency) |
    | 4 | energy of the running deployment in the previous window (fraction of the largest) |
    | 5 | memory used per GPU by the running deployment (fraction of GPU memory) |
    | 6–17 | one-hot of the running deployment (the previous action) |

    ``Discretizer`` maps it to a table index for tabular methods.

    ## Rewards

    Weighted mean (weights ``AllocationConfig.weights``, equal by default) of six scores in [0, 1]:
    latency (log scale), throughput (served share of demand), energy, host CPU, memory per GPU and
    bandwidth headroom (1 − interconnect utilisation). Changing the deployment reduces the throughput
    score by the share of the window lost to loading weights (``PerfModel.load_time_s``). A deployment
    whose model does not fit its GPUs gets −1. Latency, energy and CPU readings carry lognormal
    measurement noise (``noise_sigma``).

    ## Starting State

    A series drawn from the pool with the env's generator (or ``options={"series": i}``), its first window,
    and a random feasible running deployment (or ``options={"deployed": a}``).

    ## Episode End

    | | |
    |---|---|
    | termination | the series ends (288 windows = one VM-day) or ``episode_steps`` windows have passed |
    | truncation | never (use ``gymnasium.wrappers.TimeLimit`` to cut episodes) |

    ## Arguments

    ``gymnasium.make("fleetwise/Allocation-v0", config=AllocationConfig(...), series=[...])``; ``series``
    None reads the first PlanetLab day (50 VMs) on the first reset.
    """

    metadata = {"render_modes": []}

    def __init__(self, config: AllocationConfig | None = None, series: Sequence[np.ndarray] | None = None,
                 render_mode: str | None = None) -> None:
        from fleetwise.policies.allocation_model import AllocationConfig

        if config is not None and not isinstance(config, AllocationConfig):  # (a dict was "unhashable" deep inside)
            raise InputError(f"config {type(config).__name__}: expected an AllocationConfig")
        self.core = AllocationCore(config)
        self.cfg = self.core.cfg
        self._series = None if series is None else [self._checked_series(k, s) for k, s in enumerate(series)]
        if self._series is not None and not self._series:
            raise InputError("series: expected at least one CPU-utilisation series")
        self.action_space = spaces.Discrete(N_ACTIONS)
        self.observation_space = spaces.Box(0.0, 1.0, (N_OBS,), np.float32)
        self.render_mode = checked_render_mode(render_mode, "Allocation-v0")
        self._ep: Episode | None = None
        self._t = 0
        self._deployed = 0

    @staticmethod
    def _checked_series(k: int, s) -> np.ndarray:
        """One CPU-utilisation series: a 1-D array of at least two finite readings in [0, 1] (NaN was taken as no
        demand, an empty or 2-D series failed inside numpy)."""
        try:
            a = np.asarray(s, float)
        except (TypeError, ValueError):
            raise InputError(f"series[{k}]: expected a sequence of numbers") from None
        if a.ndim != 1 or len(a) < 2 or not np.isfinite(a).all() or a.min() < 0 or a.max() > 1:
            raise InputError(f"series[{k}]: expected a 1-D series of at least 2 finite readings in [0, 1] "
                             f"(got shape {a.shape})")
        return a

    @property
    def series(self) -> list[np.ndarray]:
        if self._series is None:
            from fleetwise.data import data_path
            from fleetwise.workload.cpu import read_cpu_traces

            self._series = list(read_cpu_traces(data_path("planetlab-cpu-cloudsim", "20110303"),
                                                max_series=50).values())
        return self._series

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options is not None and not isinstance(options, dict):  # (a list was an AttributeError)
            raise ValueError(f"options {options!r:.60}: expected a dict or None")
        opts = options or {}
        pool = self.series

        def option(name: str, n: int, default) -> int:  # (99 was an IndexError, -1 wrapped, 1.7 was truncated)
            v = opts.get(name, default)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
                raise ValueError(f"options[{name!r}] {v!r}: expected an integer from 0 to {n - 1}")
            return int(v)

        i = option("series", len(pool), self.np_random.integers(len(pool)))
        self._ep = self.core.episode(pool[i], self.np_random)
        feas = np.flatnonzero(self.core.table.feasible)
        self._deployed = option("deployed", N_ACTIONS, feas[self.np_random.integers(len(feas))])
        self._t = 0
        return self.core.observation(self._ep, 0, self._deployed), {"series": i}

    def step(self, action):
        if self._ep is None:
            raise RuntimeError("call reset() before step()")
        ep, t = self._ep, self._t
        if t >= ep.T:
            raise RuntimeError("episode is over; call reset()")
        a = checked_action(self.action_space, action)
        r = self.core.reward(ep, t, self._deployed, a)
        info = self.core.outcome(ep, t, a)
        info["oracle_action"] = self.core.oracle_action_at(ep, t, self._deployed)
        self._deployed = a
        self._t = t + 1
        terminated = self._t >= ep.T
        obs = self.core.observation(ep, min(self._t, ep.T), a)
        return obs, r, terminated, False, info



