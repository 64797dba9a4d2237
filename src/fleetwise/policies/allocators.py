"""Allocator policies for fleetwise/Allocation-v0: ``allocate(obs) -> action`` (an index into ``ACTIONS``).

Registered names: ``fixed`` (static CPU-threshold rule), ``constant``, ``oracle`` (one-step, noise off),
``random``, and the trained ones loaded from a file: ``q_learning`` / ``sarsa`` (a Q table in an ``.npz``, read
with ``allow_pickle=False``), ``dqn`` (a fleetwise checkpoint, ``fleetwise.control.checkpoint``). Neither format can
run code when loaded; an SB3 zip is refused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from fleetwise.control.registry import register_allocator
from fleetwise.errors import InputError
from fleetwise.policies.allocation_model import (
    ACTIONS,
    CANON,
    GPU_COUNTS,
    N_ACTIONS,
    PARALLELISMS,
    AllocationConfig,
    AllocationCore,
    N_OBS,
    Discretizer,
)


MAX_TABLE_BYTES = 64 << 20  # a saved Q table (20 x 3 x 12 states x 12 actions is 23 KB)


def checked_obs(obs, batch: bool = False) -> np.ndarray:
    """An observation of ``fleetwise/Allocation-v0`` (``batch``: a stack of them) as the allocators read it, or a
    ValueError: finite values of the env's shape (a NaN CPU reading chose 8 GPUs in ``fixed`` and action 0 in
    ``dqn``, -0.5 wrapped to another state's Q row, 5 was an IndexError in ``oracle``; found by fuzzing,
    2026-12-06). Readings are fractions: the allocators clip them to [0, 1]."""
    try:
        a = np.asarray(obs, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"observation {obs!r:.60}: expected {N_OBS} numbers") from None
    want = (a.shape[0], N_OBS) if batch and a.ndim == 2 else (N_OBS,)
    if a.shape != want or not np.isfinite(a).all():
        raise ValueError(f"observation of shape {a.shape}{' with NaN or infinity' if a.shape == want else ''}: "
                         f"expected {'a stack of ' if batch else ''}{N_OBS} finite numbers")
    return np.clip(a, 0.0, 1.0)


def action_of(num_gpus: int, parallelism: str) -> int:
    try:
        return ACTIONS.index((int(num_gpus), parallelism))
    except ValueError:
        raise InputError(f"action ({num_gpus} GPUs, {parallelism!r}): expected GPUs in {GPU_COUNTS} and "
                         f"parallelism in {PARALLELISMS}") from None


@register_allocator("fixed")
class FixedThreshold:
    """Static rule: GPU count from the CPU reading (obs[0]) by ``thresholds`` (ascending, one fewer than
    ``gpu_counts``), one fixed ``parallelism``. ``fit`` picks thresholds and parallelism on training series."""

    def __init__(self, thresholds: Sequence[float] = (0.25, 0.5, 0.75), parallelism: str = "model",
                 gpu_counts: Sequence[int] = GPU_COUNTS) -> None:
        th = [float(x) for x in thresholds]
        if len(th) != len(gpu_counts) - 1 or th != sorted(th):
            raise InputError(f"thresholds {list(thresholds)}: expected {len(gpu_counts) - 1} ascending values")
        self.thresholds = np.asarray(th)
        self.parallelism = parallelism
        self.gpu_counts = tuple(int(n) for n in gpu_counts)
        self._acts = np.array([action_of(n, parallelism) for n in self.gpu_counts])

    def allocate(self, obs) -> int:
        return int(self._acts[int(np.searchsorted(self.thresholds, float(checked_obs(obs)[0]), side="right"))])

    def allocate_batch(self, obs: np.ndarray) -> np.ndarray:
        return self._acts[np.searchsorted(self.thresholds, checked_obs(obs, True)[:, 0], side="right")]

    @classmethod
    def fit(cls, core: AllocationCore, series: Sequence[np.ndarray], rng: np.random.Generator,
            grid_step: float = 0.05) -> "FixedThreshold":
        """The best static rule on ``series`` (mean expected reward): every parallelism and every ascending
        triple of thresholds on a ``grid_step`` grid (an operator tuning a threshold rule on history)."""
        eps = [core.episode(s, rng) for s in series]
        cpu = np.concatenate([e.cpu[:e.T] for e in eps])
        first = np.concatenate([np.arange(e.T) == 0 for e in eps])
        base = np.concatenate([e.base_exp for e in eps])
        sw = np.concatenate([e.served_w for e in eps])
        lost = core.table.lost_frac
        g = np.round(np.arange(grid_step, 1.0, grid_step), 6)
        import itertools

        best, best_r = None, -np.inf
        rows = np.arange(len(cpu))
        for par in PARALLELISMS:
            acts = np.array([action_of(n, par) for n in GPU_COUNTS])
            for th in itertools.combinations(g, 3):
                a = acts[np.searchsorted(th, cpu, side="right")]
                prev = np.where(first, a, np.roll(a, 1))
                r = (base[rows, a] - sw[rows, a] * lost[prev, a]).mean()
                if r > best_r + 1e-12:
                    best, best_r = (th, par), r
        assert best is not None
        return cls(best[0], best[1])

    def __repr__(self) -> str:
        return f"FixedThreshold({self.thresholds.tolist()}, {self.parallelism!r})"


@register_allocator("constant")
class Constant:
    """Always the same deployment."""

    def __init__(self, num_gpus: int = 4, parallelism: str = "model") -> None:
        self.action = action_of(num_gpus, parallelism)

    def allocate(self, obs) -> int:
        return self.action

    def allocate_batch(self, obs: np.ndarray) -> np.ndarray:
        return np.full(len(obs), self.action)


@register_allocator("random")
class RandomAllocator:
    """Uniformly random action from its own seeded generator."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def allocate(self, obs) -> int:
        return int(self.rng.integers(N_ACTIONS))

    def allocate_batch(self, obs: np.ndarray) -> np.ndarray:
        return self.rng.integers(N_ACTIONS, size=len(obs))


@register_allocator("oracle")
class Oracle:
    """One-step oracle: the action of highest expected immediate reward (noise off) in the observed state,
    reconfiguration cost from the running deployment included. It reads the exact CPU and bandwidth values of
    the observation, so its labels are what every learner is scored against."""

    def __init__(self, config: AllocationConfig | None = None) -> None:
        self.core = AllocationCore(config)

    def allocate(self, obs) -> int:
        return int(self.allocate_batch(checked_obs(obs)[None])[0])

    def allocate_batch(self, obs: np.ndarray) -> np.ndarray:
        obs = checked_obs(obs, True)
        core, tab, cfg = self.core, self.core.table, self.core.cfg
        nl, nb = len(tab.load_grid), len(tab.bw_grid)
        li = np.rint(obs[:, 0] * (nl - 1)).astype(np.int64)
        bi = np.rint((np.clip(obs[:, 2], cfg.bw_min, 1.0) - cfg.bw_min) / (1.0 - cfg.bw_min) * (nb - 1)).astype(
            np.int64)
        dep = obs[:, 6:6 + N_ACTIONS].argmax(axis=1)
        sc = tab.scores[:, :, bi, li]  # (obj, A, n)
        exp = np.einsum("o,oan->na", core.w, sc)
        exp[:, ~tab.feasible] = -1.0
        q = exp - core.w[1] * sc[1].T * tab.lost_frac[dep]
        return q.argmax(axis=1)


# ------------------------------------------------------------------ learned allocators (trained by fleetwise.learn)
@dataclass
class TabularPolicy:
    """Greedy policy of a Q table. ``allocate(obs) -> action``; ``save``/``load`` as .npz (table + JSON meta)."""

    q: np.ndarray
    disc: Discretizer
    name: str = "q_learning"
    curve: list[tuple[int, float]] = field(default_factory=list)

    def allocate(self, obs) -> int:
        return int(np.argmax(self.q[self.disc(checked_obs(obs))]))

    def allocate_batch(self, obs: np.ndarray) -> np.ndarray:
        idx = [self.disc(o) for o in checked_obs(obs, True)]
        return self.q[idx].argmax(axis=1)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        meta = {"name": self.name, "discretizer": asdict(self.disc), "curve": self.curve}
        np.savez(p, q=self.q, meta=np.array(json.dumps(meta)))
        return p if p.suffix == ".npz" else p.with_name(p.name + ".npz")

    @classmethod
    def load(cls, path: str | Path) -> "TabularPolicy":
        """A saved Q table (``save``): numeric arrays and JSON only (``allow_pickle=False``: an object array in the
        file is refused, nothing in it runs), its metadata checked before use."""
        import os
        import stat
        import zipfile

        from fleetwise.errors import nonblocking_opener

        p = Path(path)
        try:
            # opened without waiting and checked to be a regular file (a FIFO hung np.load); an empty file was an
            # EOFError; the members' uncompressed sizes are checked before reading (a 4 MB file may inflate to GiB)
            with open(p, "rb", opener=nonblocking_opener) as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise ValueError("not a regular file (a device, a pipe or a socket)")
                if st.st_size > MAX_TABLE_BYTES:
                    raise ValueError(f"larger than {MAX_TABLE_BYTES >> 20} MiB")
                from fleetwise.control.checkpoint import zip_directory

                d = zip_directory(f)  # (the end record's count, before zipfile reads the directory: a zip of 1.2
                if d is not None and not 0 <= d[0] <= 8:  # million members took 10-15 s to refuse; -1: a zip64)
                    raise ValueError(f"a zip of {'zip64' if d[0] < 0 else d[0]} members, not a Q table (q, meta)")
                with zipfile.ZipFile(f) as zf:
                    infos = zf.infolist()
                    if len(infos) > 8 or sum(i.file_size for i in infos) > MAX_TABLE_BYTES:
                        raise ValueError(f"{len(infos)} members: more than a Q table (q, meta) or larger than "
                                         f"{MAX_TABLE_BYTES >> 20} MiB")
                f.seek(0)
                with np.load(f, allow_pickle=False) as z:
                    raw = z["q"]
                    if raw.dtype.kind not in "fiu":  # (strings, records, complex and bools were converted)
                        raise ValueError(f"q has dtype {raw.dtype}, expected a number type")
                    q = np.asarray(raw, dtype=np.float64)
                    meta = json.loads(str(z["meta"]), parse_constant=_no_constant)
            d = meta["discretizer"]
            if not (isinstance(meta, dict) and isinstance(d, dict) and set(d) <= {"cpu_bins", "bw_bins", "deployed"}):
                raise ValueError("its metadata is not {name, discretizer: {cpu_bins, bw_bins, deployed}, curve}")
            disc = Discretizer(**d)
            curve = [(int(a), float(b)) for a, b in meta.get("curve", [])]
        except (OSError, KeyError, ValueError, TypeError, RecursionError, EOFError, zipfile.BadZipFile) as e:
            raise InputError(f"{p}: not a saved tabular policy ({type(e).__name__}: {str(e)[:200]})") from None
        if q.shape != (disc.n_states, N_ACTIONS):
            raise InputError(f"{p}: Q table shape {q.shape} does not match its discretizer "
                             f"({disc.n_states} states x {N_ACTIONS} actions)")
        if not np.isfinite(q).all():  # (a NaN table chose action 0 everywhere)
            raise InputError(f"{p}: the Q table holds NaN or infinite values")
        return cls(q, disc, str(meta.get("name", "tabular")), curve)



def _no_constant(name: str):
    """``json.loads``' hook for NaN and Infinity: refused (a curve of NaN loaded)."""
    raise ValueError(f"{name} in the metadata")

@dataclass
class DQNPolicy:
    """The allocator ``dqn``: ``model`` is anything with SB3's ``predict`` (the numpy policy of a checkpoint, or
    the SB3 model right after training)."""

    model: object
    name: str = "dqn"
    curve: list[tuple[int, float]] = field(default_factory=list)

    def allocate(self, obs) -> int:
        a, _ = self.model.predict(checked_obs(obs).astype(np.float32), deterministic=True)
        return int(a)

    def allocate_batch(self, obs: np.ndarray) -> np.ndarray:
        a, _ = self.model.predict(checked_obs(obs, True).astype(np.float32), deterministic=True)
        return np.asarray(a, np.int64)

    @classmethod
    def load(cls, path: str | Path) -> "DQNPolicy":
        """A saved policy from its fleetwise checkpoint (``NAME.npz`` or ``NAME``; ``fleetwise.learn.dqn`` writes
        it): numpy only, nothing in the file runs; SB3's zip is refused (``fleetwise export-checkpoint`` converts
        one of yours)."""
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


@register_allocator("q_learning")
def load_q_learning(path: str):
    return TabularPolicy.load(path)


@register_allocator("sarsa")
def load_sarsa(path: str):
    return TabularPolicy.load(path)


@register_allocator("dqn")
def load_dqn(path: str):
    return DQNPolicy.load(path)


def canonical(actions: np.ndarray) -> np.ndarray:
    """Actions naming the same deployment mapped to one id (1 GPU data / model / hybrid are one deployment)."""
    return CANON[np.asarray(actions, np.int64)]
