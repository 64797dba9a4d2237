"""Training the learned router (fleetwise.policies.routers_learned) with the shared recipe (docs/learning.md).

The policy is linear (5 features -> 3 bounded weights, 18 parameters), and a whole simulated run is one sample
of its return, so it is trained by the cross-entropy method (CEM; Rubinstein 1999, Szita & Lorincz 2006), a
derivative-free policy search: numpy only, no torch. The recipe, step by step:

1. The policy contains its rule: zero parameters give ``least_outstanding_tokens`` exactly (tested).
2. Warm start at the rule: the search distribution starts centred on zero parameters.
3. Service level as a constraint: minimise the mean end-to-end latency subject to the P99 time to first token
   staying within ``ttft_slack`` (2%) of the rule's (``recipe.Lagrangian``, dual ascent on the elite's
   violation), the multiplier logged in the learning curve.
4. Train / validation / test: training seeds (1000+) and validation seeds (2000+) of the scenario at each rate;
   the parameters kept are the CEM mean with the best validation score. Test: the demo's sweep (seeds 0-2).
5. The gate: paired against the rule on gate seeds (3000+) at each rate, windows apart from the validation ones
   that chose the parameters (a gate on those would favour the policy that was picked for doing well on them;
   ``recipe.gate``); the result goes into the model card.

Every run is paired with the rule's run on the same scenario, rate and seed (the rule's runs are computed once).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from fleetwise.policies.routers_learned import (
    ACTION,
    N_FEATURES,
    N_WEIGHTS,
    OBS_HIGH,
    RULE,
    LearnedRouter,
    LinearRoutePolicy,
)

N_PARAMS = N_WEIGHTS * N_FEATURES + N_WEIGHTS


@dataclass
class RouterTrainConfig:
    scenario: str = "default"
    # workload.rate_rps values; with ``trace``: the trace's load (fraction of the fleet's capacity) values
    rates: list[float] = field(default_factory=lambda: [12.0, 18.0, 24.0])
    trace: str | None = None  # a trace (file or alias) in place of the scenario's arrivals and lengths
    requests: int = 1500
    train_seeds: int = 2  # per rate, seeds 1000, 1001, ...
    val_seeds: int = 4  # per rate, seeds 2000, 2001, ...: choose the parameters kept
    gate_seeds: int = 4  # per rate, seeds 3000, 3001, ...: the gate's windows
    iterations: int = 6
    population: int = 8
    elite: int = 3
    sigma: float = 0.3
    ttft_slack: float = 0.02  # the constraint: TTFT P99 at most (1 + ttft_slack) x the rule's, on average
    seed: int = 0

    def __post_init__(self) -> None:
        """Values the search cannot take, naming the field (sigma=NaN ran and gave a NaN curve, rates=[] and
        val_seeds=0 returned a gate of NaN, seed=-1 failed in numpy; found by fuzzing, 2026-12-06)."""
        import math

        from fleetwise.limits import MAX_REQUESTS, MAX_SEEDS, MAX_TRAIN_SEED

        ints = {"requests": (1, MAX_REQUESTS), "train_seeds": (1, MAX_SEEDS), "val_seeds": (1, MAX_SEEDS),
                "gate_seeds": (1, MAX_SEEDS),
                "iterations": (1, 10_000), "population": (2, 10_000), "elite": (1, 10_000), "seed": (0, MAX_TRAIN_SEED)}
        for k, (lo, hi) in ints.items():
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"RouterTrainConfig.{k} = {v!r}: expected an integer from {lo} to {hi:,}")
        if self.elite >= self.population:
            raise ValueError(f"RouterTrainConfig.elite = {self.elite}: fewer than population ({self.population})")
        for k, lo, hi in (("sigma", 1e-6, 10.0), ("ttft_slack", 0.0, 10.0)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"RouterTrainConfig.{k} = {v!r}: expected a number from {lo:g} to {hi:g}")
        if not self.rates or not all(isinstance(r, (int, float)) and math.isfinite(r) and r > 0 for r in self.rates):
            raise ValueError(f"RouterTrainConfig.rates = {self.rates!r}: expected at least one number > 0")
        if len(set(self.rates)) != len(self.rates):  # (12,12: the windows of the two were one, a gate of NaN)
            raise ValueError(f"RouterTrainConfig.rates = {self.rates!r}: a rate given twice")
        if self.gate_seeds * len(self.rates) < 2:
            raise ValueError("RouterTrainConfig.gate_seeds: the gate's 95% interval needs at least 2 gate runs "
                             "(gate_seeds x rates)")


def scenario_at(name: str, rate: float, trace: str | None = None):
    """The scenario at arrival rate ``rate`` (its ``workload.rate_rps``), or with ``trace`` in place of its
    workload at load ``rate`` (fleetwise.workload.adapt)."""
    from fleetwise.errors import InputError
    from fleetwise.scenario import load_scenario, parse_scenario

    sc = load_scenario(name)
    if trace is not None:
        from fleetwise.workload.spec import trace_in_place_of

        w = trace_in_place_of(sc.workload, trace, float(rate))[0]
        return parse_scenario(sc.model_dump(mode="json") | {"workload": w},
                              where=f"scenario {name} with trace {trace} at load {rate:g}")
    if "rate_rps" not in sc.workload:
        raise InputError(f"train router: scenario {name!r} has no workload.rate_rps to vary (kind "
                         f"{sc.workload.get('kind')!r}); give --trace to train on a trace at several loads")
    return parse_scenario(sc.model_dump(mode="json") | {"workload": {**sc.workload, "rate_rps": rate}},
                          where=f"scenario {name} at rate {rate:g}")


def _run(sc, seed: int, requests: int, router) -> tuple[float, float]:
    from fleetwise.run import run_scenario

    s = run_scenario(sc, seed, router=None if router is None else router, num_requests=requests).summary
    return float(s["ttft_p99_s"]), float(s["e2e_mean_s"])


class _Evaluator:
    """Runs of a parameter vector on a set of (rate, seed) windows, paired with the rule's runs."""

    def __init__(self, cfg: RouterTrainConfig, seeds: list[int]):
        self.cfg = cfg
        self.windows = [(r, s) for r in cfg.rates for s in seeds]
        self.scen = {r: scenario_at(cfg.scenario, r, cfg.trace) for r in cfg.rates}
        self.rule = {w: self._one(w, None) for w in self.windows}

    def _one(self, w, params: np.ndarray | None) -> tuple[float, float]:
        from fleetwise.policies import make

        rate, seed = w
        router = make("router", RULE) if params is None else LearnedRouter.from_policy(policy_of(params))
        return _run(self.scen[rate], seed, self.cfg.requests, router)

    def runs(self, params: np.ndarray) -> dict:
        return {w: self._one(w, params) for w in self.windows}

    def ratios(self, runs: dict) -> tuple[float, float]:
        """(mean log end-to-end ratio, mean TTFT P99 ratio) against the rule over the windows: the objective and
        the constraint."""
        le = [math.log(max(runs[w][1], 1e-9) / max(self.rule[w][1], 1e-9)) for w in self.windows]
        ttft = [runs[w][0] / max(self.rule[w][0], 1e-9) for w in self.windows]
        return float(np.mean(le)), float(np.mean(ttft))


def policy_of(params: np.ndarray) -> LinearRoutePolicy:
    """The policy with these parameters, rounded to float32 as the checkpoint stores them (so what is validated
    is what is saved)."""
    p = np.asarray(params, dtype=np.float32).astype(np.float64)
    return LinearRoutePolicy(p[:N_WEIGHTS * N_FEATURES], p[N_WEIGHTS * N_FEATURES:])


def train_router(cfg: RouterTrainConfig, out: str | Path | None = None,
                 progress: Callable[[int, dict], None] | None = None) -> dict:
    """CEM on the training windows, the best validation mean kept, gated on validation; writes ``out`` (a
    fleetwise checkpoint and its model card) when given. Returns the curve, the gate and the parameters."""
    from fleetwise.learn.recipe import CEM, Lagrangian, gate

    train = _Evaluator(cfg, [1000 + k for k in range(cfg.train_seeds)])
    val = _Evaluator(cfg, [2000 + k for k in range(cfg.val_seeds)])
    held = _Evaluator(cfg, [3000 + k for k in range(cfg.gate_seeds)])  # the gate's windows
    lag = Lagrangian(target=1.0 + cfg.ttft_slack, sense="<=", lr=20.0, scale=0.01)
    search = CEM(np.zeros(N_PARAMS), cfg.sigma, population=cfg.population, elite=cfg.elite, min_sigma=0.02,
                 rng=np.random.default_rng(cfg.seed))
    best = {"score": -math.inf, "params": search.mean.copy(), "iteration": 0}
    curve = []

    def val_score(params) -> tuple[float, float, float]:
        e, t = val.ratios(val.runs(params))
        return -e - max(t - 1.0 - cfg.ttft_slack, 0.0) * 10.0, e, t  # a score that refuses a broken constraint

    s0, e0, t0 = val_score(search.mean)  # the rule itself (zero parameters): the bar to beat
    best.update(score=s0)
    for it in range(1, cfg.iterations + 1):
        scored = []
        for p in search.ask():
            e, t = train.ratios(train.runs(p))
            scored.append((e + lag.penalty(t), e, t))
        order = search.tell([s[0] for s in scored])
        lag.update(float(np.mean([scored[i][2] for i in order])), step=it)
        vs, ve, vt = val_score(search.mean)
        if vs > best["score"]:
            best = {"score": vs, "params": search.mean.copy(), "iteration": it}
        row = {"iteration": it, "train_log_e2e_ratio": float(np.mean([scored[i][1] for i in order])),
               "train_ttft_p99_ratio": float(np.mean([scored[i][2] for i in order])), "lambda": lag.lam,
               "val_log_e2e_ratio": ve, "val_ttft_p99_ratio": vt}
        curve.append(row)
        if progress is not None:
            progress(it, row)
    params = best["params"]
    runs = held.runs(params)
    key = [f"{r:g}/{s}" for r, s in held.windows]
    ttft_ratio = held.ratios(runs)[1]
    g = gate(dict(zip(key, (runs[w][1] for w in held.windows))),
             dict(zip(key, (held.rule[w][1] for w in held.windows))), constraint_ok=ttft_ratio <= 1.0 + cfg.ttft_slack)
    g |= {"metric": "e2e_mean_s", "constraint": f"ttft_p99_s at most {1 + cfg.ttft_slack:g} x the rule's (mean ratio)",
          "rule": RULE, "ttft_p99_ratio": ttft_ratio,
          "windows_detail": f"rates {cfg.rates} x seeds 3000+ (the gate's own; validation chose on seeds 2000+)"}
    result = {"curve": curve, "gate": g, "params": params.tolist(), "best_iteration": best["iteration"],
              "config": asdict(cfg)}
    if out is not None:
        result["checkpoint"] = str(save_router(out, params, cfg, curve, g))
    return result


def train_command(cfg: RouterTrainConfig, out: str | Path) -> str:
    """The ``fleetwise train router`` command that trains ``cfg`` (its card's ``training.command``): every option
    that differs from the default (the command left out ``--rates``, ``-n``, the search's sizes, seeds and seed)."""
    import shlex

    d = RouterTrainConfig()
    parts = ["fleetwise train router", f"--scenario {shlex.quote(cfg.scenario)}", f"--out {shlex.quote(Path(out).name)}"]
    if cfg.trace:
        parts.append(f"--trace {shlex.quote(cfg.trace)}")
    if cfg.trace or list(cfg.rates) != list(d.rates):  # (with a trace the rates are loads, always written)
        parts.append(f"--rates {','.join(f'{r:g}' for r in cfg.rates)}")
    for k, flag in (("requests", "-n"), ("iterations", "--iterations"), ("population", "--population"),
                    ("elite", "--elite"), ("train_seeds", "--train-seeds"), ("val_seeds", "--val-seeds"),
                    ("gate_seeds", "--gate-seeds"), ("seed", "--seed")):
        if getattr(cfg, k) != getattr(d, k):
            parts.append(f"{flag} {getattr(cfg, k)}")
    api = [f"{k}={getattr(cfg, k)!r}" for k in ("sigma", "ttft_slack") if getattr(cfg, k) != getattr(d, k)]
    return " ".join(parts) + (f"  # and RouterTrainConfig({', '.join(api)}) (Python API only)" if api else "")


def save_router(out: str | Path, params: np.ndarray, cfg: RouterTrainConfig, curve: list, g: dict) -> Path:
    from fleetwise.control.checkpoint import ModelCard, save_policy

    pol = policy_of(params)
    card = ModelCard(level="router", policy="learned", rule=RULE, validation=g,
                     training={"algorithm": "cem", "config": asdict(cfg), "curve": curve,
                               "command": train_command(cfg, out)})
    return save_policy(out, level="router", algorithm="cem", obs_low=np.zeros(N_FEATURES, np.float32),
                       obs_high=OBS_HIGH, action=ACTION, layers=[(pol.w, pol.b)], activation="identity", card=card,
                       act_low=-np.ones(N_WEIGHTS, np.float32), act_high=np.ones(N_WEIGHTS, np.float32))
