"""The allocator level's model: GPU count × parallelism for an LLM inference job whose load follows a real CPU-usage
trace ("Adaptive Optimization of Resource Allocation in Parallel Processing of Large Language Models Using
Reinforcement Learning Algorithms"; docs/allocation.md lists every choice the abstract leaves open).

Outcomes of an action come from :class:`fleetwise.perf.PerfModel` through a per-action performance table computed
once per configuration (:func:`perf_table`); a step is then a few array look-ups. The transition function lives
in :class:`AllocationCore` (plain numpy, no Gymnasium); the allocators (``fleetwise.policies.allocators``), the
Gymnasium env (``fleetwise.envs.allocation``) and the tabular trainers (``fleetwise.learn.tabular``) all call
it, so they see the same MDP. It is the allocator level's domain model (action table, observation layout,
outcomes), so it lives with the policies that read it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from fleetwise.errors import InputError

GPU_COUNTS = (1, 2, 4, 8)
PARALLELISMS = ("data", "model", "hybrid")
ACTIONS: tuple[tuple[int, str], ...] = tuple((n, p) for n in GPU_COUNTS for p in PARALLELISMS)
N_ACTIONS = len(ACTIONS)
OBJECTIVES = ("latency", "throughput", "energy", "cpu", "memory", "bandwidth")
OBS_NAMES = ("cpu", "cpu_prev", "bandwidth", "latency", "energy", "memory") + tuple(
    f"deployed_{n}{p[0]}" for n, p in ACTIONS)
N_OBS = len(OBS_NAMES)
INFEASIBLE_REWARD = -1.0


def deployment(num_gpus: int, parallelism: str) -> tuple[int, int, int]:
    """(replicas, tp, pp) of an action. data: n replicas of one GPU; model: one replica, tp=n; hybrid: n/2
    replicas × tp=2 (n >= 4), one replica with pp=2 for n=2, one GPU for n=1. With one GPU all three coincide."""
    n = int(num_gpus)
    if parallelism == "data":
        return (n, 1, 1)
    if parallelism == "model":
        return (1, n, 1)
    if parallelism == "hybrid":
        if n == 1:
            return (1, 1, 1)
        if n == 2:
            return (1, 1, 2)
        return (n // 2, 2, 1)
    raise InputError(f"parallelism {parallelism!r}: expected one of {', '.join(PARALLELISMS)}")


def canonical_actions() -> np.ndarray:
    """For each action the lowest action id with the same deployment (1 GPU data/model/hybrid are one)."""
    deps = [deployment(n, p) for n, p in ACTIONS]
    return np.array([deps.index(d) for d in deps], np.int64)


CANON = canonical_actions()


@dataclass(frozen=True)
class AllocationConfig:
    """Everything that defines the MDP. Hashable: the performance table is cached per config.

    ``weights`` are over :data:`OBJECTIVES` (balanced by default); ``peak_rps`` None = 90% of the largest
    capacity any action reaches at full bandwidth, so a CPU reading of 1.0 still has a feasible allocation.
    """

    model: str = "CodeLlama-34B"
    gpu: str = "A100-80GB"
    prompt_tokens: int = 1024
    output_tokens: int = 256
    peak_rps: float | None = None
    window_s: float = 300.0  # one trace sample
    weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # OBJECTIVES order
    latency_ref_factor: float = 10.0  # latency score 0 at this multiple of the best unloaded latency (log scale)
    storage_gbps: float = 2.0  # weight loading on reconfiguration (NVMe-class)
    normalize: str = "minmax"  # CPU series: "minmax" per series or "none" (already a fraction of capacity)
    bw_mean: float = 0.6  # available interconnect bandwidth, fraction of the link: AR(1) around this mean
    bw_phi: float = 0.9
    bw_sigma: float = 0.08  # innovation std
    bw_min: float = 0.1
    noise_sigma: float = 0.05  # multiplicative measurement noise on latency, energy and CPU (0 = off)
    episode_steps: int | None = None  # None: the whole series (288 windows = one VM-day)
    load_levels: int = 201
    bw_levels: int = 10
    max_batch: int = 256
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if (len(self.weights) != len(OBJECTIVES) or not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0
                                                             for w in self.weights) or sum(self.weights) <= 0):
            raise InputError(f"weights {self.weights}: expected {len(OBJECTIVES)} non-negative numbers "
                             f"({', '.join(OBJECTIVES)}) with a positive sum")
        if self.normalize not in ("minmax", "none"):
            raise InputError(f"normalize={self.normalize!r}: expected minmax or none")
        if not (0 <= self.bw_phi < 1) or not (0 < self.bw_min <= self.bw_mean <= 1):
            raise InputError("bandwidth AR(1): expected 0 <= bw_phi < 1 and 0 < bw_min <= bw_mean <= 1")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise InputError("prompt_tokens and output_tokens must be >= 1")
        # (window_s=0 divided by zero, a negative one put observations outside Box(0, 1), load_levels=0 and
        # bw_levels=0 failed in numpy, peak_rps=-5 and noise_sigma=-1 were taken)
        for k, lo in (("window_s", 0.0), ("latency_ref_factor", 1.0), ("storage_gbps", 0.0)):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > lo):
                raise InputError(f"{k}={v!r}: expected a finite number > {lo:g}")
        if self.peak_rps is not None and not (math.isfinite(self.peak_rps) and self.peak_rps > 0):
            raise InputError(f"peak_rps={self.peak_rps!r}: expected None or a finite number > 0")
        if not (math.isfinite(self.noise_sigma) and 0 <= self.noise_sigma <= 1) or not 0 <= self.bw_sigma <= 1:
            raise InputError(f"noise_sigma={self.noise_sigma!r}, bw_sigma={self.bw_sigma!r}: expected 0 to 1")
        for k, least in (("load_levels", 2), ("bw_levels", 2), ("max_batch", 1)):
            if getattr(self, k) < least:
                raise InputError(f"{k}={getattr(self, k)!r}: expected at least {least}")
        if self.episode_steps is not None and self.episode_steps < 1:
            raise InputError(f"episode_steps={self.episode_steps!r}: expected None or at least 1")

    def with_(self, **kw: Any) -> "AllocationConfig":
        return dataclasses.replace(self, **kw)


# ------------------------------------------------------------------------------------------ performance table
@dataclass(frozen=True)
class PerfTable:
    """Per action, per bandwidth level, per load level (arrays shaped (A, n_bw, n_load)):
    scores in [0, 1] (1 best) for each objective, and the raw outcomes for ``info``."""

    load_grid: np.ndarray  # fraction of peak_rps
    bw_grid: np.ndarray  # fraction of the link bandwidth
    scores: np.ndarray  # (n_obj, A, n_bw, n_load)
    latency_s: np.ndarray
    throughput_tok_s: np.ndarray
    energy_j: np.ndarray
    cpu_frac: np.ndarray
    mem_frac: np.ndarray  # per GPU
    bw_util: np.ndarray
    feasible: np.ndarray  # (A,) the model fits every GPU of the deployment
    lost_frac: np.ndarray  # (A_from, A_to) fraction of a window's capacity lost to reconfiguration
    peak_rps: float


def _replica_curve(pm, P: int, O: int, max_batch: int, util: float):
    """Steady state of one replica as a function of its decode batch b = 1..B: arrival rate it sustains,
    decode iteration time, prefill time. Little's law: b = rate * O * d_eff(b), d_eff = d(b) / (1 - rate*t_p)."""
    kv_cap = pm.kv_capacity_tokens(util)
    B = int(min(max_batch, kv_cap // (P + O)))
    t_p = pm.iteration_time_s(P, float(P) * P, 0, 0)
    if B < 1:
        return None
    b = np.arange(1, B + 1)
    d = np.array([pm.iteration_time_s(0, 0.0, int(k), int(k) * (P + O // 2)) for k in b])
    rate = b / (O * d + b * t_p)
    rate = np.maximum.accumulate(rate)  # monotone (a larger batch never sustains less)
    return b, d, rate, t_p


@lru_cache(maxsize=16)
def perf_table(cfg: AllocationConfig) -> PerfTable:
    """Compute every action's outcome on a grid of load and bandwidth levels (once per config)."""
    from fleetwise.catalog import get_gpu, get_model
    from fleetwise.perf import PerfModel

    gpu0, model = get_gpu(cfg.gpu), get_model(cfg.model)
    P, O = cfg.prompt_tokens, cfg.output_tokens
    A = N_ACTIONS
    bw_grid = np.linspace(cfg.bw_min, 1.0, cfg.bw_levels)
    load_grid = np.linspace(0.0, 1.0, cfg.load_levels)
    nb, nl = len(bw_grid), len(load_grid)
    curves: dict[tuple, Any] = {}
    models: dict[tuple, Any] = {}
    for a, (n, par) in enumerate(ACTIONS):
        R, tp, pp = deployment(n, par)
        for j, bw in enumerate(bw_grid):
            key = (tp, pp, j)
            if key in curves:
                continue
            g = dataclasses.replace(gpu0, interconnect_gbps=gpu0.interconnect_gbps * float(bw))
            if model.num_heads % tp:
                curves[key] = None
                continue
            pm = PerfModel(g, model, tp=tp, pp=pp)
            models[key] = pm
            curves[key] = _replica_curve(pm, P, O, cfg.max_batch, cfg.gpu_memory_utilization)
    # peak demand: 90% of the best capacity at full bandwidth
    caps = []
    for a, (n, par) in enumerate(ACTIONS):
        R, tp, pp = deployment(n, par)
        c = curves[(tp, pp, nb - 1)]
        if c is not None:
            caps.append(R * c[2][-1])
    if not caps:
        raise InputError(f"{model.name} does not fit on 8 x {gpu0.name} in any deployment")
    peak = cfg.peak_rps if cfg.peak_rps is not None else 0.9 * max(caps)
    shape = (A, nb, nl)
    lat = np.full(shape, np.inf)
    thr = np.zeros(shape)
    served = np.zeros(shape)
    energy = np.zeros(shape)
    cpu = np.zeros(shape)
    mem = np.ones(shape)
    mem_total = np.ones(shape)
    bwu = np.zeros(shape)
    feasible = np.zeros(A, bool)
    h, bpp, L = model.hidden_size, model.bytes_per_param, model.num_layers
    for a, (n, par) in enumerate(ACTIONS):
        R, tp, pp = deployment(n, par)
        for j, bw in enumerate(bw_grid):
            c = curves[(tp, pp, j)]
            if c is None:
                continue
            feasible[a] = True
            pm = models[(tp, pp, j)]
            b, d, rate, t_p = c
            lam = load_grid * peak / R  # per-replica arrival rate
            cap = rate[-1]
            k = np.minimum(np.searchsorted(rate, np.minimum(lam, cap)), len(b) - 1)
            bb, dd = b[k], d[k]
            rho_p = np.minimum(lam * t_p, 0.99)
            d_eff = dd / (1.0 - rho_p)
            ttft = t_p * (1.0 + rho_p / (2.0 * (1.0 - rho_p)))  # M/D/1 wait for the prefill share
            e2e = ttft + O * d_eff
            over = lam > cap
            served_frac = np.where(lam > 0, np.minimum(1.0, cap / np.maximum(lam, 1e-12)), 1.0)
            e2e = np.where(over, e2e / np.maximum(served_frac, 1e-3), e2e)  # queue grows: latency scales with excess
            srv = np.minimum(lam, cap)
            busy = np.clip(srv * (t_p + O * dd / bb), 0.0, 1.0)
            pw = np.array([pm.busy_power_w(0, int(x)) for x in bb])
            power = busy * pw + (1.0 - busy) * pm.idle_power_w()
            energy[a, j] = R * power * cfg.window_s
            cpu_s = np.array([pm.cpu_overhead_s(int(x)) for x in bb])
            # host CPU busy: one driver process per GPU while the engine iterates, cpu overhead per iteration
            cpu[a, j] = R * pm.num_gpus * busy * np.minimum(1.0, cpu_s / dd)
            kv_used = bb * (P + O / 2.0) * pm.kv_bytes_per_token_per_gpu()
            mem[a, j] = np.minimum(1.0, (pm.weight_bytes_per_gpu() + pm.reserved_bytes_per_gpu() + kv_used) / (gpu0.memory_gb * 1e9))
            mem_total[a, j] = mem[a, j] * R * pm.num_gpus / max(GPU_COUNTS)  # share of the host's GPU memory
            # interconnect traffic per GPU: 2 all-reduces per layer (ring), pipeline send/recv per token
            tok_s = srv * (P + O)
            per_tok = 0.0
            if tp > 1:
                per_tok += L * 2 * 2.0 * (tp - 1) / tp * h * bpp
            if pp > 1:
                per_tok += (pp - 1) * h * bpp / pp
            link = gpu0.interconnect_gbps * 1e9 * float(bw)
            bwu[a, j] = np.minimum(1.0, tok_s * per_tok / link)
            lat[a, j] = e2e
            thr[a, j] = R * srv * O
            served[a, j] = served_frac
    # scores in [0, 1], 1 best. Latency: linear from the best unloaded latency (1) to latency_ref_factor x it (0).
    finite = lat[np.isfinite(lat)]
    lat_ref = float(finite.min())
    lat_max = cfg.latency_ref_factor * lat_ref
    s_lat = np.clip((lat_max - np.where(np.isfinite(lat), lat, np.inf)) / (lat_max - lat_ref), 0.0, 1.0)
    s_lat = np.where(served < 1.0, 0.0, s_lat)  # an overloaded deployment violates every latency target
    e_max = float(energy.max()) or 1.0
    c_max = float(cpu.max()) or 1.0
    # resource scores (energy, CPU, memory, bandwidth) are credited per unit of demand actually served, so that
    # dropping requests never looks cheap
    cost = np.stack([1.0 - energy / e_max, 1.0 - cpu / c_max, 1.0 - mem_total, 1.0 - bwu]) * served[None]
    scores = np.stack([s_lat, served, cost[0], cost[1], cost[2], cost[3]])
    scores[:, ~feasible] = 0.0
    # reconfiguration: a new shape (tp, pp) reloads every GPU; more replicas of the same shape load only the new
    # ones; fewer replicas cost nothing. Lost capacity = load time / window x share of capacity not serving.
    lost = np.zeros((A, A))
    for a0, (n0, p0) in enumerate(ACTIONS):
        R0, tp0, pp0 = deployment(n0, p0)
        for a1, (n1, p1) in enumerate(ACTIONS):
            R1, tp1, pp1 = deployment(n1, p1)
            if not feasible[a1] or (R0, tp0, pp0) == (R1, tp1, pp1):
                continue
            pm = models.get((tp1, pp1, nb - 1))
            t_load = pm.load_time_s(cfg.storage_gbps)
            share = 1.0 if (tp0, pp0) != (tp1, pp1) or not feasible[a0] else max(0.0, (R1 - R0) / R1)
            lost[a0, a1] = min(1.0, t_load / cfg.window_s) * share
    return PerfTable(load_grid, bw_grid, scores, lat, thr, energy, cpu, mem, bwu, feasible, lost, float(peak))


# ------------------------------------------------------------------------------------------ transition function
def _normalize(series: np.ndarray, how: str) -> np.ndarray:
    x = np.clip(np.asarray(series, float), 0.0, 1.0)
    if how == "minmax":
        lo, hi = float(x.min()), float(x.max())
        return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
    return x


@dataclass(slots=True)
class Episode:
    """One episode's exogenous path and every action's reward at every step (precomputed at reset)."""

    cpu: np.ndarray  # (T+1,) normalized load; cpu[t] is the window decided at step t
    bw: np.ndarray  # (T,)
    li: np.ndarray  # (T,) load-grid index
    bi: np.ndarray  # (T,) bandwidth-grid index
    base: np.ndarray  # (T, A) reward before reconfiguration cost, with measurement noise
    served_w: np.ndarray  # (T, A) weight x throughput score (the part reconfiguration reduces)
    base_exp: np.ndarray  # (T, A) noise-free
    T: int


class AllocationCore:
    """The MDP without Gymnasium: ``episode(series, rng)`` draws the exogenous path and precomputes rewards;
    ``reward(ep, t, deployed, action)`` is the transition's reward; the next deployed action is ``action``.
    Both the Gymnasium env and the tabular trainers use it."""

    def __init__(self, cfg: AllocationConfig | None = None) -> None:
        self.cfg = cfg or AllocationConfig()
        self._table: PerfTable | None = None

    @property
    def table(self) -> PerfTable:
        if self._table is None:
            self._table = perf_table(self.cfg)
        return self._table

    @property
    def w(self) -> np.ndarray:
        w = np.asarray(self.cfg.weights, float)
        return w / w.sum()

    def episode(self, series: np.ndarray, rng: np.random.Generator, start: int = 0) -> Episode:
        cfg, tab = self.cfg, self.table
        u = _normalize(series, cfg.normalize)
        T = len(u) - start if cfg.episode_steps is None else min(cfg.episode_steps, len(u) - start)
        if T < 1:
            raise InputError(f"CPU series of {len(u)} samples is too short for an episode starting at {start}")
        cpu = np.concatenate([u[start:start + T], u[start + T - 1:start + T]])
        # available bandwidth: AR(1) around bw_mean, clipped to [bw_min, 1]
        eps = rng.normal(0.0, cfg.bw_sigma, T)
        bw = np.empty(T)
        x = cfg.bw_mean + rng.normal(0.0, cfg.bw_sigma / math.sqrt(1 - cfg.bw_phi ** 2))
        for t in range(T):
            x = cfg.bw_mean + cfg.bw_phi * (x - cfg.bw_mean) + eps[t]
            bw[t] = x
        bw = np.clip(bw, cfg.bw_min, 1.0)
        nl, nb = len(tab.load_grid), len(tab.bw_grid)
        li = np.rint(cpu[:T] * (nl - 1)).astype(np.int64)
        bi = np.rint((bw - cfg.bw_min) / (1.0 - cfg.bw_min) * (nb - 1)).astype(np.int64)
        sc = tab.scores[:, :, bi, li]  # (n_obj, A, T)
        w = self.w
        exp = np.einsum("o,oat->ta", w, sc)
        if cfg.noise_sigma > 0:
            # measurement noise: latency, energy and CPU readings are off by a lognormal factor
            noisy = sc.copy()
            for o, name in enumerate(OBJECTIVES):
                if name in ("latency", "energy", "cpu"):
                    f = np.exp(rng.normal(0.0, cfg.noise_sigma, (N_ACTIONS, T)))
                    noisy[o] = np.clip(1.0 - (1.0 - sc[o]) * f, 0.0, 1.0)
            base = np.einsum("o,oat->ta", w, noisy)
        else:
            base = exp.copy()
        inf = ~tab.feasible
        base[:, inf] = INFEASIBLE_REWARD
        exp[:, inf] = INFEASIBLE_REWARD
        served_w = w[1] * sc[1].T
        return Episode(cpu, bw, li, bi, np.ascontiguousarray(base), np.ascontiguousarray(served_w),
                       np.ascontiguousarray(exp), T)

    def reward(self, ep: Episode, t: int, deployed: int, action: int, expected: bool = False) -> float:
        r = (ep.base_exp if expected else ep.base)[t, action]
        lost = self.table.lost_frac[deployed, action]
        return float(r - ep.served_w[t, action] * lost) if lost else float(r)

    def oracle_actions(self, ep: Episode) -> np.ndarray:
        """(T, A): the one-step oracle's action at step t when ``deployed`` is currently running (noise off)."""
        q = ep.base_exp[:, None, :] - ep.served_w[:, None, :] * self.table.lost_frac[None, :, :]
        return q.argmax(axis=2)

    def oracle_action_at(self, ep: Episode, t: int, deployed: int) -> int:
        q = ep.base_exp[t] - ep.served_w[t] * self.table.lost_frac[deployed]
        return int(q.argmax())

    def outcome(self, ep: Episode, t: int, action: int) -> dict[str, float]:
        tab = self.table
        i = (action, int(ep.bi[t]), int(ep.li[t]))
        n, par = ACTIONS[action]
        return {
            "num_gpus": n, "parallelism": par, "feasible": bool(tab.feasible[action]),
            "latency_s": float(tab.latency_s[i]), "throughput_tok_s": float(tab.throughput_tok_s[i]),
            "energy_j": float(tab.energy_j[i]), "cpu_frac": float(tab.cpu_frac[i]),
            "mem_frac_per_gpu": float(tab.mem_frac[i]), "bandwidth_util": float(tab.bw_util[i]),
            "demand_rps": float(ep.cpu[t] * tab.peak_rps), "bandwidth_avail": float(ep.bw[t]),
        }

    def observation(self, ep: Episode, t: int, deployed: int) -> np.ndarray:
        """See AllocationEnv's Observation table."""
        tab = self.table
        o = np.zeros(N_OBS, np.float32)
        o[0] = ep.cpu[t]
        o[1] = ep.cpu[t - 1] if t > 0 else ep.cpu[t]
        o[2] = ep.bw[t] if t < ep.T else ep.bw[-1]
        tp = max(0, t - 1)  # outcome of the deployment in the window that just ended
        i = (deployed, int(ep.bi[tp]), int(ep.li[tp]))
        o[3] = 1.0 - tab.scores[0][i]
        o[4] = 1.0 - tab.scores[2][i]
        o[5] = tab.mem_frac[i]
        o[6 + deployed] = 1.0
        return o


# ------------------------------------------------------------------------------------------ discretizer
@dataclass(frozen=True)
class Discretizer:
    """Maps an observation to a table index for tabular methods: ``cpu_bins`` equal bins of the CPU reading,
    ``bw_bins`` of available bandwidth, and (``deployed``) the current deployment's canonical action."""

    cpu_bins: int = 20
    bw_bins: int = 3
    deployed: bool = True

    def __post_init__(self) -> None:
        # (0 bins was an IndexError at the first decision, a negative count a numpy shape error)
        for name in ("cpu_bins", "bw_bins"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 10_000:
                raise ValueError(f"{name} {v!r}: expected an integer from 1 to 10,000")
        if not isinstance(self.deployed, (bool, np.bool_)):
            raise ValueError(f"deployed {self.deployed!r}: expected true or false")

    @property
    def n_states(self) -> int:
        return self.cpu_bins * self.bw_bins * (N_ACTIONS if self.deployed else 1)

    def index(self, cpu: float, bw: float, deployed: int) -> int:
        c = min(int(cpu * self.cpu_bins), self.cpu_bins - 1)
        b = min(int(bw * self.bw_bins), self.bw_bins - 1)
        s = c * self.bw_bins + b
        return s * N_ACTIONS + int(CANON[deployed]) if self.deployed else s

    def __call__(self, obs: np.ndarray) -> int:
        obs = np.asarray(obs)
        return self.index(float(obs[0]), float(obs[2]), int(np.argmax(obs[6:6 + N_ACTIONS])))

    def episode_indices(self, ep: Episode) -> np.ndarray:
        """(T, A) state index at step t with deployment d (vectorised; used by the lean trainers)."""
        c = np.minimum((ep.cpu[:ep.T] * self.cpu_bins).astype(np.int64), self.cpu_bins - 1)
        b = np.minimum((ep.bw * self.bw_bins).astype(np.int64), self.bw_bins - 1)
        s = c * self.bw_bins + b
        if not self.deployed:
            return np.repeat(s[:, None], N_ACTIONS, axis=1)
        return s[:, None] * N_ACTIONS + CANON[None, :]


# ------------------------------------------------------------------------------------------ Gymnasium env
def synthetic_series(rng: np.random.Generator, n: int = 288) -> np.ndarray:
    t = np.arange(n)
    x = 0.4 + 0.3 * np.sin(2 * np.pi * t / n + rng.uniform(0, 2 * np.pi)) + rng.normal(0, 0.08, n)
    return np.clip(x, 0.0, 1.0)
