"""TORTA's macro agent trained by the cross-entropy method (CEM) on the shared recipe (docs/torta.md, "Learners").

PPO (``fleetwise.learn.torta``, the paper's learner) finds TORTA's one strong lever -- packing requests onto the
regions that were busy over the last slot, whose servers are billed for the slot anyway -- in about half of its
training seeds within its budget, and overshoots past it. What the policy is judged on (a day's cost and mean
response time against the rule's on the same day) is only known at the end of a simulated day, and the lever is
one number per slot, so this learner searches a small policy directly, as the learned router and the RL scaler do
(``fleetwise.learn.router``, ``fleetwise.learn.scaler_cem``): numpy only, no torch.

**The policy** is linear in the slot observation and sets only the two util weights of ``ResidualPlanner``
(the other ``n + 2`` entries stay 0): the short requests' ``a_{n+2} = clip(b + w . f)`` with ``f`` the fleet-wide
means of the observation (busy fraction, free-server fraction, backlog; with ``temporal``: the last slot's demand
per unit of capacity, and the hour of day as sine and cosine), and the long requests' ``a_{n+3} = clip(b_long)``
(over ``ResidualPlanner.LONG_TOKENS`` prompt + output tokens). It is written as a one-layer fleetwise checkpoint
over the whole observation vector (``PARAMS_TEMPORAL`` / ``PARAMS_REACTIVE`` parameters spread over its entries),
so ``fleetwise serve`` runs it like any TORTA checkpoint.

**The recipe**, step by step:

1. The policy contains its rule: zero parameters are ``least_loaded`` + ``affinity_greedy``, decision for
   decision (``ResidualPlanner``'s zero action; tested).
2. Warm start at the rule: the search distribution starts centred on zero parameters, and the rule is the
   candidate to beat on validation (it scores 0).
3. One metric as the objective, the other as a constraint, paired (the policy's / the rule's on the same day,
   minus 1), with a Lagrange multiplier (``recipe.Lagrangian``, dual ascent on the elite's constrained change,
   logged). ``objective="response"`` (the default since the size-aware util weight): minimise the day's mean
   response time subject to its cost at most ``cost_tolerance`` above the rule's. ``objective="cost"`` (before):
   minimise the day's cost subject to its response time at least ``-response_tolerance`` (a point) below the
   rule's; it spends the util weight on packing every request, which saves 11-14% of cost on the training
   distribution and loses response time on traces with longer prompts (docs/torta.md).
4. Train / validation / test: fresh training days every iteration, drawn from the training distribution at loads
   from light to near saturation (``loads``); the CEM mean is scored on validation days (the training
   distribution at the paper's load, seeds 500000..) after every iteration and the best kept (the rule if
   nothing beats it by ``min_delta``); only held-out test days are reported (``reproduce torta``).
5. The gate: the objective paired against the rule on further validation days, passed when its whole 95%
   interval is a gain and the constrained metric's upper bound is at most ``gate_ci_hi`` above the rule's; it goes
   into the model card, with the guard's threshold: the highest share of long requests that a slot of the
   training days saw (``ResidualPlanner.long_share_max``: after a slot with more, the rule plans; the gate runs
   the policy with it, as deployed).
6. At scale: ``reproduce torta`` runs the training jobs (topologies x agents x training seeds) in worker
   processes.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from fleetwise.learn.torta import VAL_SEED0, day_metrics, paired_mean_change, rule_planner

# the short requests' util weight: bias, mean busy fraction, mean free-server fraction, mean backlog (slots); with
# temporal: the last slot's mean demand per unit of capacity, sin and cos of the hour. The last parameter: the long
# requests' util weight (a constant).
PARAMS_REACTIVE = 5
PARAMS_TEMPORAL = 8
TRAIN_SEED0 = 200_000  # training days: seeds 200000 + 10000 x training seed + ... (validation 500000.., test 1000..)


@dataclass
class TortaCEMConfig:
    iterations: int = 6
    population: int = 10
    elite: int = 3
    train_days: int = 4  # fresh training days per iteration (every candidate runs the same ones: paired)
    loads: tuple[float, ...] = (0.45, 0.55, 0.7)  # training days' load, in turn (the paper's is 0.55)
    sigma: tuple[float, ...] = field(default_factory=lambda: (0.05,) * PARAMS_TEMPORAL)  # initial spread
    min_sigma: float = 0.01
    objective: str = "response"  # "response": min response time s.t. cost; "cost": min cost s.t. response time
    cost_tolerance: float = 0.0  # objective "response": the day's cost <= (1 + tol) x the rule's
    response_tolerance: float = -0.01  # objective "cost": the day's response time <= (1 + tol) x the rule's
    lagrangian_lr: float = 1.0
    val_days: int = 6
    gate_days: int = 6
    gate_ci_hi: float = 0.01  # the gate: the constrained metric's CI upper bound at most +1% on the rule's
    min_delta: float = 0.005  # the search's mean replaces the rule only if 0.5 points better on validation
    val_penalty: float = 30.0  # validation score: -objective change - this x (constrained change above its target)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in ("response", "cost"):
            raise ValueError(f"TortaCEMConfig objective {self.objective!r}: expected 'response' or 'cost'")

    @property
    def constraint_target(self) -> float:
        return self.cost_tolerance if self.objective == "response" else self.response_tolerance


def n_params(temporal: bool) -> int:
    return PARAMS_TEMPORAL if temporal else PARAMS_REACTIVE


def obs_dim(n: int, history: int, temporal: bool) -> int:
    return n * 3 + (n * history + 2 if temporal else 0)


def linear_layer(params, n: int, history: int, temporal: bool) -> tuple[np.ndarray, np.ndarray]:
    """The policy's one layer over the observation vector (``SlotObs.vector``): ``(W, b)`` with ``W`` of shape
    ``(n + 4, obs_dim)``; only the short requests' util weight (row ``n + 2``) has weights, and the long requests'
    (row ``n + 3``) a bias. The means of the observation are weights ``theta / n`` on its per-region entries."""
    from fleetwise.policies.planners import ResidualPlanner

    p = np.asarray(params, np.float64)
    if p.shape != (n_params(temporal),):
        raise ValueError(f"TORTA CEM policy: {p.shape[0] if p.ndim else 0} parameters, expected {n_params(temporal)}")
    d = obs_dim(n, history, temporal)
    W = np.zeros((ResidualPlanner.action_size(n), d))
    b = np.zeros(ResidualPlanner.action_size(n))
    row = W[n + 2]
    b[n + 2] = p[0]
    b[n + 3] = p[-1]
    row[0:3 * n:3] = p[3] / n  # per region r: backlog / slot at 3 r, busy fraction at 3 r + 1, free at 3 r + 2
    row[1:3 * n:3] = p[1] / n
    row[2:3 * n:3] = p[2] / n
    if temporal:
        row[3 * n:4 * n] = p[4] / n  # the newest demand row of the history
        row[d - 2], row[d - 1] = p[5], p[6]
    return W, b


class LinearTortaPolicy:
    """``predict(obs) -> (action, None)`` as SB3's, for ``ResidualPlanner`` (float32 as the checkpoint stores it)."""

    def __init__(self, params, n: int, history: int, temporal: bool):
        W, b = linear_layer(params, n, history, temporal)
        self.W, self.b = W.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)

    def predict(self, obs, state=None, episode_start=None, deterministic: bool = True):
        a = np.clip(self.W @ np.asarray(obs, np.float64) + self.b, -1.0, 1.0)
        return a.astype(np.float32), None


def _changes(pol: dict, rule: dict) -> tuple[float, float]:
    """Mean paired cost and response-time changes (policy / rule - 1 on the same day)."""
    return (paired_mean_change(pol, rule, "cost_usd"), paired_mean_change(pol, rule, "response_time_mean_s"))


def _split(cem: TortaCEMConfig, cost: float, response: float) -> tuple[float, float]:
    """(objective change, constrained change) of a (cost, response) pair of changes."""
    return (response, cost) if cem.objective == "response" else (cost, response)


def _days(cfg, planner, seeds, loads=None) -> dict:
    """{seed: metrics} of ``planner`` (a factory of cfg) on training-distribution days, each at its load."""
    out = {}
    for k, s in enumerate(seeds):
        c = cfg if loads is None else replace(cfg, load=float(loads[k % len(loads)]))
        out.update(day_metrics(c, planner, [s]))
    return out


# Bump when a change to the TORTA world or to this learner changes what training produces without changing its
# configuration: checkpoints keyed with another version are trained again instead of reused (``job_key``).
TRAINING_VERSION = 3  # 2: the long requests' util weight, response time the objective; 3: the guard's threshold


def job_key(tcfg, cem: TortaCEMConfig, policy_name: str) -> str:
    """What determines a training run's result: the world's configuration (``tcfg``, with the contents of a
    topology given as a fleet file), the agent, the whole CEM configuration (budget and seed) and
    ``TRAINING_VERSION`` (a sha256 of them, stored in the model card; a checkpoint is reused only on a match)."""
    import hashlib
    import json

    fleet_file = Path(str(tcfg.topology))
    content = [hashlib.sha256(fleet_file.read_bytes()).hexdigest()] if fleet_file.is_file() else []
    blob = json.dumps([TRAINING_VERSION, policy_name, repr(tcfg), asdict(cem)] + content, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _reuse(out, key: str, temporal: bool) -> dict | None:
    """The result of an earlier run with the same :func:`job_key` from its checkpoint's model card (read with the
    safe loader: arrays and JSON only), or None."""
    from fleetwise.learn.recipe import trained_by

    card = trained_by(out, "planner", key, n_params(temporal))
    if card is None or "validation_curve" not in card.training:  # (a card written before it carried the whole log)
        return None
    t = card.training
    return {"params": [float(x) for x in t["params"]], "curve": t["curve"],
            "validation_curve": [tuple(v) for v in t["validation_curve"]], "lagrangian": t["lagrangian"],
            "response_change_target": t["response_change_target"], "gate": dict(card.validation or {}),
            "objective": t["config"].get("objective", "cost"), "constraint_target": t.get("constraint_target"),
            "best_step": t["best_step"], "config": t["config"], "wall_s": float(t["wall_s"]),
            "long_share_max": t.get("long_share_max"),
            "days_simulated": t["days_simulated"], "checkpoint": str(out), "reused": True}


def train_torta_cem(tcfg, cem: TortaCEMConfig, out: str | Path | None = None, progress=None,
                    policy_name: str = "torta", reuse: bool = False) -> dict:
    """CEM for the util-weight policy of ``ResidualPlanner`` on ``tcfg`` (a ``TortaConfig``; ``temporal`` says which
    features); writes ``out`` (fleetwise checkpoint + model card, which carries the whole training log) when given.
    Returns the parameters, the curve (one row per iteration), the multiplier's history, the validation curve and
    the gate. ``reuse``: when ``out`` holds the checkpoint of a run with the same :func:`job_key` (training is
    deterministic), return its result without training."""
    from fleetwise.learn.recipe import CEM, Lagrangian, gate
    from fleetwise.metrics.stats import paired_change
    from fleetwise.policies.planners import ResidualPlanner
    from fleetwise.worlds.torta import make_fleet

    t0 = time.perf_counter()
    key = job_key(tcfg, cem, policy_name)
    if reuse and (old := _reuse(out, key, tcfg.temporal)) is not None:
        return old
    n, hist, temporal = len(make_fleet(tcfg).names), tcfg.history, tcfg.temporal
    k = n_params(temporal)

    def planner(params, long_share_max=None):
        pol = LinearTortaPolicy(params, n, hist, temporal)
        return lambda c: ResidualPlanner(c, pol, temporal, long_share_max)

    vdays = list(range(VAL_SEED0, VAL_SEED0 + cem.val_days))
    rule_v = _days(tcfg, rule_planner, vdays)

    def val_score(params) -> tuple[float, float, float]:
        c, r = _changes(_days(tcfg, planner(params), vdays), rule_v)
        obj, con = _split(cem, c, r)
        return -obj - cem.val_penalty * max(0.0, con - cem.constraint_target), c, r

    lag = Lagrangian(target=cem.constraint_target, sense="<=", lr=cem.lagrangian_lr, scale=0.01, lam=1.0,
                     hinge=True)
    search = CEM(np.zeros(k), np.asarray(cem.sigma[:k], np.float64), population=cem.population, elite=cem.elite,
                 min_sigma=cem.min_sigma, rng=np.random.default_rng(np.random.SeedSequence([int(cem.seed), 31])),
                 keep_mean=True)  # the current mean is always a candidate (elitism of the mean)
    best = {"score": 0.0, "params": search.mean.copy(), "iteration": 0, "val_cost_change": 0.0,
            "val_response_change": 0.0}
    curve: list[dict] = []
    validation_curve: list[tuple[int, float]] = [(0, 0.0)]  # the warm start (the rule) scores 0 by definition
    simulated = 0
    long_share_max = 0.0  # the guard's threshold: the highest share of long requests of a slot in training
    for it in range(1, cem.iterations + 1):
        seeds = [TRAIN_SEED0 + 10_000 * int(cem.seed) + 100 * it + j for j in range(cem.train_days)]
        rule_t = _days(tcfg, rule_planner, seeds, cem.loads)
        long_share_max = max([long_share_max, *(m["long_share_max"] for m in rule_t.values())])
        chg = [_changes(_days(tcfg, planner(p), seeds, cem.loads), rule_t) for p in search.ask()]  # (cost, resp)
        cmp_ = [_split(cem, *c) for c in chg]  # (objective, constrained)
        simulated += (cem.population + 1) * cem.train_days
        scored = [o + lag.penalty(k_) for o, k_ in cmp_]
        order = search.tell(scored)
        lag.update(float(np.mean([cmp_[i][1] for i in order])), step=it)
        mu = search.mean
        vs, vc, vr = val_score(mu)
        simulated += cem.val_days
        validation_curve.append((it, vs))
        if vs > best["score"] + cem.min_delta:
            best = {"score": vs, "params": mu.copy(), "iteration": it, "val_cost_change": vc,
                    "val_response_change": vr}
        row = {"iteration": it, "days_simulated": simulated, "wall_s": time.perf_counter() - t0, "lambda": lag.lam,
               "train_elite_cost_change": float(np.mean([chg[i][0] for i in order])),
               "train_elite_response_change": float(np.mean([chg[i][1] for i in order])),
               "train_elite_score": float(np.mean([scored[i] for i in order])),
               "val_cost_change": vc, "val_response_change": vr, "val_score": vs,
               "util_weight_bias": float(mu[0]), "long_util_weight": float(mu[-1])}
        curve.append(row)
        if progress is not None:
            progress(it, row)
    params = best["params"]
    gdays = list(range(VAL_SEED0 + cem.val_days, VAL_SEED0 + cem.val_days + cem.gate_days))
    rule_g = _days(tcfg, rule_planner, gdays)
    pol_g = _days(tcfg, planner(params, long_share_max), gdays)  # (as deployed: with the guard)
    pc = {k: paired_change({d: m[k] for d, m in rule_g.items()}, {d: m[k] for d, m in pol_g.items()})
          for k in ("cost_usd", "response_time_mean_s")}
    metric = "response_time_mean_s" if cem.objective == "response" else "cost_usd"
    other = "cost_usd" if cem.objective == "response" else "response_time_mean_s"
    g = gate({d: m[metric] for d, m in pol_g.items()}, {d: m[metric] for d, m in rule_g.items()},
             constraint_ok=pc[other].hi <= cem.gate_ci_hi)
    g.update(rule="least_loaded", metric=metric, days=gdays, cost_change=pc["cost_usd"].mean,
             cost_ci95=[pc["cost_usd"].lo, pc["cost_usd"].hi], response_change=pc["response_time_mean_s"].mean,
             response_ci95=[pc["response_time_mean_s"].lo, pc["response_time_mean_s"].hi], selection_days=vdays,
             best_step=best["iteration"])
    result = {"params": [float(x) for x in params], "curve": curve, "validation_curve": validation_curve,
              "lagrangian": [list(h) for h in lag.history], "objective": cem.objective,
              "constraint_target": cem.constraint_target,
              "response_change_target": cem.response_tolerance if cem.objective == "cost" else None,
              "gate": g, "best_step": best["iteration"], "config": asdict(cem),
              "wall_s": time.perf_counter() - t0, "days_simulated": simulated + 2 * cem.gate_days,
              "long_share_max": float(long_share_max)}
    if out is not None:
        result["checkpoint"] = str(save_torta_cem(out, params, n, hist, temporal, tcfg, cem, result, policy_name, key))
    return result


def save_torta_cem(out, params, n: int, history: int, temporal: bool, tcfg, cem: TortaCEMConfig, result: dict,
                   policy_name: str = "torta", key: str | None = None) -> Path:
    """The policy as a fleetwise checkpoint (one linear layer over the observation, action clipped to [-1, 1])
    and its model card, which ``load_torta_checkpoint`` and ``fleetwise serve`` read as any TORTA checkpoint. The
    card carries the whole training log (curve, validation curve, the multiplier's history), so that ``reproduce
    torta`` can report a checkpoint it did not train in this run."""
    from fleetwise.control.checkpoint import ActionSpec, ModelCard, save_policy
    from fleetwise.policies.planners import ResidualPlanner

    W, b = linear_layer(params, n, history, temporal)
    d, na = obs_dim(n, history, temporal), ResidualPlanner.action_size(n)
    card = ModelCard(level="planner", policy=policy_name, rule="least_loaded", validation=result.get("gate"),
                     training={"algorithm": "cem", "topology": str(tcfg.topology), "temporal": bool(temporal),
                               "params": [float(x) for x in params], "config": asdict(cem),
                               "curve": result.get("curve", []), "best_step": result.get("best_step"),
                               "validation_curve": [list(x) for x in result.get("validation_curve", [])],
                               "lagrangian": result.get("lagrangian", []),
                               "response_change_target": result.get("response_change_target"),
                               "constraint_target": result.get("constraint_target"),
                               "days_simulated": result.get("days_simulated"),
                               "wall_s": round(float(result.get("wall_s", math.nan)), 1),
                               "days": f"training-distribution days at loads {list(cem.loads)} (first 70% of the "
                                       f"traces and ServeGen days); validation days {VAL_SEED0}..",
                               "warm_start": "the rule itself (zero parameters = least_loaded + affinity_greedy)",
                               **({"objective": "mean response time (paired with the rule, day by day)",
                                   "constraint": f"GPU + energy cost <= {1 + cem.cost_tolerance:g} x the rule's on "
                                                 "the same days (Lagrangian)"} if cem.objective == "response" else
                                  {"objective": "GPU + energy cost (paired with the rule, day by day)",
                                   "constraint": f"response time <= {1 + cem.response_tolerance:g} x the rule's on "
                                                 "the same days (Lagrangian)"}),
                               "residual_extra": ResidualPlanner.EXTRA, "long_tokens": ResidualPlanner.LONG_TOKENS,
                               # the guard: a slot after one with more long requests than any training slot is
                               # planned by the rule (ResidualPlanner.long_share_max)
                               "long_share_max": result.get("long_share_max"),
                               "job_key": key})
    return save_policy(out, level="planner", algorithm="cem", obs_low=np.full(d, -1.0, np.float32),
                       obs_high=np.full(d, 5.0, np.float32), action=ActionSpec("box", shape=(na,)),
                       layers=[(W, b)], activation="identity", card=card,
                       act_low=-np.ones(na, np.float32), act_high=np.ones(na, np.float32))
