"""The one recipe every learned policy follows (docs/learning.md).

1. **The policy contains its rule.** An environment of a learned policy exposes ``rule_action()``: the action
   that reproduces the best hand-written rule of its level exactly (for a residual action, zero). A test per
   policy checks that this action gives the rule's decisions, decision for decision, over a whole run.
2. **Warm start at the rule**: :func:`rule_demonstrations` runs the rule's action through the environment and
   :func:`behaviour_clone` fits the policy to it (supervised maximum likelihood, a few lines of torch), so
   training starts where the rule is.
3. **Service level as a constraint**: :class:`Lagrangian` keeps a multiplier for "measured >= target" (or <=),
   updated by dual ascent from what each rollout measured; the environment subtracts ``lambda x violation`` from
   its reward. The multiplier is logged in the learning curve.
4. **Train / validation / test**: :class:`Validator` scores the policy on validation windows against the rule every
   few rollouts, keeps the best parameters and stops when they stop improving; only test windows are reported.
5. **The deployment gate**: :func:`gate` compares the policy with its rule on paired windows (mean change and
   its 95% CI); the result goes into the checkpoint's model card, and ``fleetwise serve`` refuses a checkpoint whose
   card does not say it passed (``--force`` overrides). At run time :class:`RuleFallback` hands decisions back to
   the rule once the service level the policy is constrained by is violated, and :class:`InputGuard` while the
   traffic is unlike the training data's.
   Learners judged only on whole runs search the policy directly instead: :class:`CEM`.
6. **Training at scale**: :func:`run_jobs` runs training jobs (topologies x training seeds x variants) on the
   same backends as sweeps: local processes by default, Ray for a cluster.

torch and Stable-Baselines3 are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np


# --------------------------------------------------------------------------------------------- 3. constraint
@dataclass
class Lagrangian:
    """A Lagrange multiplier for the constraint ``measured >= target`` (``sense=">="``) or ``<=``.

    ``update(measured)`` is one step of (projected) dual ascent on the normalised violation
    ``(target - measured) / scale`` (``>=``; the opposite sign for ``<=``): ``lam <- clip(lam + lr * v, 0, lam_max)``,
    with an optional integral term ``ki`` (PI-Lagrangian, Stooke et al. 2020) that damps the oscillation of plain
    dual ascent. ``penalty(measured)`` is what the reward loses: ``lam * max(violation, 0)`` when ``hinge``, else
    ``lam * violation`` (the exact Lagrangian, which also pays the policy for slack)."""

    target: float
    _: KW_ONLY  # (the rest by name: Lagrangian(0.98, 0.1) read 0.1 as the sense)
    sense: str = ">="
    lr: float = 0.5
    ki: float = 0.0
    lam: float = 0.0
    lam_max: float = 100.0
    scale: float = 1.0
    hinge: bool = True
    history: list[tuple[int, float, float]] = field(default_factory=list)  # (step, lam, measured)
    integral: float = 0.0  # the PI term's accumulated violation

    def __post_init__(self) -> None:
        if self.sense not in (">=", "<="):
            raise ValueError(f"Lagrangian sense {self.sense!r}: expected '>=' or '<='")
        for k, lo, strict in (("target", None, False), ("scale", 0.0, True), ("lr", 0.0, False), ("ki", 0.0, False),
                              ("lam", 0.0, False), ("lam_max", 0.0, False)):
            v = getattr(self, k)
            ok = (not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v)
                  and (lo is None or (v > lo if strict else v >= lo)))
            if not ok:
                raise ValueError(f"Lagrangian {k} {v!r}: expected a finite number"
                                 + ("" if lo is None else f" {'>' if strict else '>='} {lo:g}"))

    def violation(self, measured: float) -> float:
        v = (self.target - measured) if self.sense == ">=" else (measured - self.target)
        return v / self.scale

    def penalty(self, measured: float) -> float:
        """What the reward loses for ``measured``: ``lam`` times the violation (only a positive one when ``hinge``)."""
        v = self.violation(measured)
        return self.lam * (max(v, 0.0) if self.hinge else v)

    def update(self, measured: float, step: int = 0) -> float:
        """One step of dual ascent on what a rollout measured (NaN: no step); returns the new multiplier."""
        if not math.isfinite(measured):
            return self.lam
        v = self.violation(measured)
        self.integral = max(0.0, self.integral + v)
        self.lam = float(min(self.lam_max, max(0.0, self.lam + self.lr * v + self.ki * self.integral)))
        self.history.append((int(step), self.lam, float(measured)))
        return self.lam


# --------------------------------------------------------------------------------------------- 2. warm start
def rule_demonstrations(make_env: Callable[[], Any], episodes: int, seed: int = 0,
                        max_steps: int = 1_000_000) -> tuple[np.ndarray, np.ndarray]:
    """(observations, actions) of the rule: ``episodes`` episodes in which every step takes ``env.rule_action()``
    (the action that reproduces the rule)."""
    obs_l, act_l = [], []
    env = make_env()
    base = getattr(env, "unwrapped", env)
    steps = 0
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        done = False
        while not done and steps < max_steps:
            a = base.rule_action()
            obs_l.append(np.asarray(obs, np.float32))
            act_l.append(np.asarray(a))
            obs, _, term, trunc, _ = env.step(a)
            done = term or trunc
            steps += 1
    env.close()
    return np.stack(obs_l), np.stack(act_l)


def quiet_logger(model):
    """Give a Stable-Baselines3 model a logger that writes nothing and makes no folder, and return the model.
    Without one, every ``learn()`` at ``verbose=0`` configures a logger that creates an empty
    ``$TMPDIR/SB3-<timestamp>`` folder (``stable_baselines3.common.logger.configure``): one per training run, left
    behind. The values a callback records are still kept (``model.logger.name_to_value``)."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def behaviour_clone(model, obs: np.ndarray, actions: np.ndarray, epochs: int = 20, lr: float = 1e-3,
                    batch_size: int = 256, seed: int = 0) -> list[float]:
    """Fit a Stable-Baselines3 actor-critic policy to ``actions`` given ``obs`` by maximum likelihood (the
    negative log-likelihood of the demonstrated actions under the policy's distribution; works for Box, Discrete and
    MultiDiscrete actions). Returns the mean loss of each epoch."""
    import torch

    policy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    obs_t = torch.as_tensor(obs, dtype=torch.float32)
    act_t = torch.as_tensor(actions)
    if act_t.dtype in (torch.float64,):
        act_t = act_t.float()
    losses = []
    policy.set_training_mode(True)
    for _ in range(epochs):
        order = rng.permutation(len(obs))
        tot, n = 0.0, 0
        for i in range(0, len(order), batch_size):
            ix = torch.as_tensor(order[i:i + batch_size])
            dist = policy.get_distribution(obs_t[ix])
            loss = -dist.log_prob(act_t[ix]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.item()) * len(ix)
            n += len(ix)
        losses.append(tot / max(n, 1))
    policy.set_training_mode(False)
    return losses


# --------------------------------------------------------------------------------------------- 4. validation
@dataclass
class Validator:
    """Checkpoint choice and early stopping on validation data.

    ``score(model) -> float`` evaluates the current policy on validation windows (higher is better, e.g. minus
    the mean paired change against the rule, with the constraint's violation subtracted). ``check(model, step)``
    runs it, keeps a copy of the best parameters, and returns False once ``patience`` checks in a row brought no
    improvement (stop training), but never within the first ``min_checks`` checks (SB3's
    ``StopTrainingOnNoModelImprovement(min_evals=...)``: a policy warm-started at the rule scores as the rule until
    training has moved its deterministic action). ``restore(model)`` puts the best parameters back."""

    score: Callable[[Any], float]
    patience: int = 4
    min_delta: float = 0.0
    min_checks: int = 0
    best: float = -math.inf
    best_step: int = -1
    curve: list[tuple[int, float]] = field(default_factory=list)
    best_state: Any = None  # a copy of the best parameters
    bad_checks: int = 0  # checks in a row without improvement

    def check(self, model, step: int) -> bool:
        import copy

        s = float(self.score(model))
        self.curve.append((int(step), s))
        if s > self.best + self.min_delta:
            self.best, self.best_step, self.bad_checks = s, int(step), 0
            self.best_state = copy.deepcopy(model.policy.state_dict())
        else:
            self.bad_checks += 1
        return self.bad_checks < self.patience or len(self.curve) <= self.min_checks

    def restore(self, model) -> None:
        if self.best_state is not None:
            model.policy.load_state_dict(self.best_state)


def sb3_callback(every_rollouts: int = 1, on_rollout: Callable[[Any, int], bool] | None = None,
                 on_episode: Callable[[dict], None] | None = None,
                 on_update: Callable[[Any, int], bool] | None = None):
    """A Stable-Baselines3 callback: ``on_episode(info)`` for every finished episode (``info["episode"]``),
    ``on_rollout(model, timesteps)`` after every ``every_rollouts`` rollouts, and ``on_update(model, timesteps)``
    after every ``every_rollouts`` updates; training stops when either returns False (early stopping). SB3 ends a
    rollout *before* the update it feeds, so a validation belongs in ``on_update``: it is called when the next
    rollout starts, with the parameters that update trained (the last update is the caller's to check after
    ``learn``)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class _CB(BaseCallback):
        def __init__(self):
            super().__init__()
            self.rollouts = 0
            self.keep_going = True

        def _on_step(self) -> bool:
            if on_episode is not None:
                for info in self.locals.get("infos", []):
                    if info.get("episode") is not None:
                        on_episode(info)
            return self.keep_going

        def _on_rollout_start(self) -> None:
            if on_update is not None and self.rollouts and self.rollouts % every_rollouts == 0:
                self.keep_going = self.keep_going and bool(on_update(self.model, self.num_timesteps))

        def _on_rollout_end(self) -> None:
            self.rollouts += 1
            if on_rollout is not None and self.rollouts % every_rollouts == 0:
                self.keep_going = bool(on_rollout(self.model, self.num_timesteps))

    return _CB()


# --------------------------------------------------------------------------------------------- direct search
class CEM:
    """The cross-entropy method's search distribution over a policy's parameters: a diagonal Gaussian, centred at
    the rule (zero parameters) at the start (warm start). ``ask()`` draws a population (with ``keep_mean`` the
    current mean is its first member); ``tell(scores)`` (lower is better) moves the mean and spread to the ``elite``
    best and returns their indices. The learners that judge a policy only on whole runs (a day, a segment, a
    window) use it: ``learn.torta_cem``, ``learn.scaler_cem``, ``learn.router``, ``learn.batching_cem``."""

    def __init__(self, mean, sigma, *, population: int, elite: int, min_sigma: float, rng: np.random.Generator,
                 keep_mean: bool = False):
        self.mean = np.array(mean, dtype=np.float64)
        self.sigma = np.broadcast_to(np.asarray(sigma, np.float64), self.mean.shape).copy()
        if not (1 <= elite <= population):
            raise ValueError(f"CEM: elite {elite} must be in [1, population {population}]")
        self.population, self.elite, self.min_sigma = int(population), int(elite), float(min_sigma)
        self.rng, self.keep_mean = rng, keep_mean
        self._pop: np.ndarray | None = None

    def ask(self) -> np.ndarray:
        """A population of parameter vectors (``population`` x dimensions) drawn from the search distribution."""
        pop = self.mean + self.sigma * self.rng.standard_normal((self.population, self.mean.shape[0]))
        if self.keep_mean:
            pop[0] = self.mean
        self._pop = pop
        return pop

    def tell(self, scores: Sequence[float]) -> np.ndarray:
        """The scores of the last ``ask()``'s members (higher is better): refit the distribution to the elite;
        returns the new mean."""
        if self._pop is None or len(scores) != len(self._pop):
            raise ValueError("CEM.tell: one score per member of the last ask()")
        order = np.argsort(np.asarray(scores, np.float64))[:self.elite]
        self.mean = self._pop[order].mean(axis=0)
        self.sigma = np.maximum(self._pop[order].std(axis=0), self.min_sigma)
        return order


# --------------------------------------------------------------------------------------------- 5. the gate
def gate(policy: dict[Any, float], rule: dict[Any, float], *, lower_is_better: bool = True,
         margin: float = 0.0, constraint_ok: bool = True) -> dict[str, Any]:
    """The deployment gate on paired validation windows (keys: window ids): the policy's mean relative change
    against its rule on the primary metric, with its 95% t interval (n - 1 degrees of freedom). It passes when the policy beat the
    rule — the interval's bound on the bad side is below ``margin`` (0: the whole interval is a gain) — and the
    service-level constraint held on those windows (``constraint_ok``)."""
    from fleetwise.errors import InputError
    from fleetwise.metrics.stats import paired_change

    if not isinstance(policy, dict) or not isinstance(rule, dict) or not set(policy) & set(rule):
        raise InputError(f"gate: no validation window in both the policy's and the rule's results (policy windows "
                         f"{list(policy)[:5] if isinstance(policy, dict) else policy!r:.60}, rule windows "
                         f"{list(rule)[:5] if isinstance(rule, dict) else rule!r:.60})")
    ch = paired_change(rule, policy)
    bad_side = ch.hi if lower_is_better else -ch.lo
    passed = bool(constraint_ok and math.isfinite(bad_side) and bad_side < margin)
    return {"change": ch.mean, "ci95": [ch.lo, ch.hi], "windows": ch.n, "lower_is_better": lower_is_better,
            "margin": margin, "constraint_ok": bool(constraint_ok), "passed": passed}


# --------------------------------------------------------------------------------------------- 5b. at run time
@dataclass
class RuleFallback:
    """A run-time monitor that hands control back to the rule for good (the Simplex architecture: a learned
    controller runs only while the service level it is constrained by holds; a trusted one takes over otherwise).

    Before each decision, ``step(ok, ended)`` is given what ended since the previous one (requests within their
    SLO, all requests that ended; numbers, or per-group arrays that are summed). Once at least ``min_count``
    requests have ended since ``reset`` and the attainment over all of them is below ``target``, this decision
    and every later one of the run are the rule's (for a residual policy: the zero action); ``step`` returns
    whether this decision is the rule's. The threshold is the SLO target the policy was trained and gated under,
    not a value fitted to any trace. Measured in docs/graph-marl.md, with the variants that did worse: a
    per-class, per-epoch trigger, a hold of a few epochs, and starting a run with the rule."""

    target: float
    min_count: int = 50
    ok: int = 0  # requests within their SLO since reset
    ended: int = 0  # requests that ended since reset
    tripped_at: int = -1  # the decision (0-based, since reset) from which the rule decides; -1: not tripped
    steps: int = 0  # decisions since reset

    def __post_init__(self) -> None:
        if not (0.0 <= self.target <= 1.0 and self.min_count >= 1):
            raise ValueError("RuleFallback: 0 <= target <= 1 and min_count >= 1")

    def reset(self) -> None:
        self.ok = self.ended = self.steps = 0
        self.tripped_at = -1

    @property
    def rule_steps(self) -> int:
        """Decisions handed to the rule since reset."""
        return 0 if self.tripped_at < 0 else self.steps - self.tripped_at

    def step(self, ok, ended) -> bool:
        self.ok += int(np.sum(ok))
        self.ended += int(np.sum(ended))
        if self.tripped_at < 0 and self.ended >= self.min_count and self.ok < self.target * self.ended:
            self.tripped_at = self.steps
        self.steps += 1
        return self.tripped_at >= 0


@dataclass
class InputGuard:
    """The other half of a run-time monitor: the rule decides while the traffic is unlike the training data's,
    or not yet known. Before each decision, ``step(share)`` is given the share of long requests among those that
    arrived since the previous one (None: too few arrived to tell, as at a cold start); the decision is the
    rule's when that is unknown or above ``share_max``, the highest share any epoch of the training data had (a
    fact of the training data, not a value fitted to a trace; ``unknown=False`` guards only a known share, measured
    and not kept for Graph-MARL). Fewer long requests than in training are not guarded. TORTA's planner has the
    same guard per slot (``ResidualPlanner.long_share_max``); measured for Graph-MARL in docs/graph-marl.md."""

    share_max: float
    steps: int = 0  # decisions since reset
    guarded: int = 0  # ... of which the rule's
    unknown: bool = True  # an unknown share (None) is guarded; False: only a share above share_max is

    def __post_init__(self) -> None:
        if not 0.0 <= self.share_max <= 1.0:
            raise ValueError("InputGuard: 0 <= share_max <= 1")

    def reset(self) -> None:
        self.steps = self.guarded = 0

    def step(self, share: float | None) -> bool:
        self.steps += 1
        out = self.unknown if share is None else share > self.share_max
        self.guarded += out
        return out


# --------------------------------------------------------------------------------------------- 6. at scale
def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], *, backend: str = "local", workers: int | None = None,
             address: str | None = None, on_result: Callable[[Any], None] | None = None) -> list[Any]:
    """``fn`` over ``jobs`` on the sweep backends (``fleetwise.execution``): worker processes (spawned, so each
    imports torch itself) or Ray tasks. Returns the results in job order; ``on_result`` as each finishes."""
    from fleetwise.execution import run_tasks

    return run_tasks(fn, list(jobs), backend=backend, workers=workers, address=address, on_result=on_result,
                     spawn=True)


def trained_by(out, level: str, key: str, n_params: int | None):
    """The model card of the checkpoint at ``out`` if the same training job made it (its ``training.job_key`` is
    ``key`` and, unless ``n_params`` is None, its card holds ``n_params`` parameters), read with the safe loader
    (arrays and JSON only); None otherwise. Training is deterministic, so a learner can return such a checkpoint's
    result instead of training again."""
    from pathlib import Path

    from fleetwise.control.checkpoint import CheckpointError, load_policy

    if out is None or not Path(out).exists():
        return None
    try:
        card = load_policy(out, level=level).card
    except CheckpointError:
        return None
    t = card.training or {}
    ok = t.get("job_key") == key and (n_params is None or len(t.get("params", [])) == n_params)
    return card if ok else None


def mean_ci(values: Iterable[float]) -> tuple[float, float, float]:
    """(mean, lo, hi) with a 95% t interval (``fleetwise.metrics.stats``)."""
    from fleetwise.metrics.stats import mean_ci as ci95

    ci = ci95(list(values))
    return ci.mean, ci.lo, ci.hi
