"""DISPPO's batching policy trained by the cross-entropy method (CEM) on the shared recipe (docs/batching.md,
"Learners").

The policy is DISPPO's: the same semi-Markov decision (whenever a node's engine is free), the same observation
(``EdgeView.observe``, 22 features for three nodes), the same masked action adjusting the rule ``offload_greedy``
(a chunk budget x an offload choice x a queue order, ``EdgeView.plan``). Only the learner differs. PPO from the
warm start gains 1-6% on validation in 150,000-400,000 decisions and +1.5% to +1.9% on test, CEM +6.2% to +9.9%
(docs/batching.md): what the policy is judged on (requests within their deadline per second of a segment, against
the rule's on the same segment) is only known once the segment has drained, tens of thousands of decisions later.
CEM scores each candidate on whole segments instead, paired with the rule, numpy only (no torch), as the TORTA,
router and scaler learners do.

**The policy** is linear: one logit per action choice, ``W . obs + b``, masked, argmax per action dimension
(ties to the lowest index). The rows of index 0 (the rule's own choice in every dimension) are fixed at 0, so
**zero parameters are the rule, decision for decision** (masked-out choices are never taken and index 0 is never
masked); (6 + 2 + 1) rows x (22 features + 1) = 207 parameters for three nodes.

**The recipe**, step by step:

1. The policy contains its rule (zero parameters = ``offload_greedy``; tested).
2. Warm start at the rule: the search distribution starts centred on zero, and the rule is the candidate to beat
   on validation.
3. Service level as a constraint: maximise requests within deadline per second (the ratio of the candidate's
   sum over the iteration's segments to the rule's) subject to TTFT deadline attainment no more than
   ``ttft_tolerance`` below the rule's on the same segments, with a Lagrange multiplier (``recipe.Lagrangian``,
   dual ascent on the elite's attainment, logged).
4. Train / validation / test: fresh training segments every iteration, drawn from ``TrainMix`` (the paper's mix at
   1.0-2.5 req/s, and the Azure conversation / code and Mooncake traces fitted to the edge at load 0.4-1.0; the
   first 60% of each trace's span); the search's mean is scored on the validation segments (60-70%,
   ``EdgeValidation``) after every iteration, the best kept (the rule if nothing beats it by ``min_delta``);
   only held-out test segments (the last 30%) are reported (``reproduce batching``).
5. The gate: ``EdgeValidation.gate`` (paired by validation segment, TTFT P99 no higher than Sarathi's), written
   into the model card.
6. At scale: ``reproduce batching`` runs the training jobs (training seeds) on the sweep backends.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

TRAIN_SEED0 = 300_000  # the training segments of iteration i: drawn by default_rng([300000, training seed, i])


@dataclass
class BatchingCEMConfig:
    iterations: int = 8
    population: int = 16
    elite: int = 4
    segments: int = 6  # fresh training segments per iteration (every candidate runs the same ones: paired)
    segment_s: float = 300.0  # simulated seconds of arrivals per training segment (then the drain)
    sigma: float = 0.1  # initial spread of the feature weights (features in [0, 1])
    sigma_bias: float = 0.3  # ... and of the biases (a choice's logit against the rule's 0)
    min_sigma: float = 0.02
    ttft_tolerance: float = 0.005  # TTFT deadline attainment may fall this much (a fraction) below the rule's
    lagrangian_lr: float = 0.5
    min_delta: float = 0.005  # requests/s: the search's mean replaces the best only when this much better
    seed: int = 0


def n_params(cfg) -> int:
    """Parameters of the linear policy for an ``EdgeConfig``: a row per non-rule choice over features + 1."""
    nvec = cfg.action_nvec
    return (sum(nvec) - len(nvec)) * (n_features(cfg) + 1)


def n_features(cfg) -> int:
    from fleetwise.worlds.edge import n_features as nf

    return nf(len(cfg.nodes))


def linear_layer(params, cfg) -> tuple[np.ndarray, np.ndarray]:
    """The policy's one layer ``(W, b)`` over the observation: a logit per choice (chunk choices, then offload
    choices, then queue orders), the rows of index 0 of each dimension (the rule's choice) zero."""
    nvec = cfg.action_nvec
    d = n_features(cfg)
    p = np.asarray(params, np.float64)
    if p.shape != (n_params(cfg),):
        raise ValueError(f"batching CEM policy: {p.size} parameters, expected {n_params(cfg)}")
    rows = p.reshape(sum(nvec) - len(nvec), d + 1)
    W, b = np.zeros((sum(nvec), d)), np.zeros(sum(nvec))
    start = r = 0
    for n in nvec:
        W[start + 1:start + n], b[start + 1:start + n] = rows[r:r + n - 1, :d], rows[r:r + n - 1, d]
        start, r = start + n, r + n - 1
    return W, b


class LinearEdgePolicy:
    """``predict(obs, action_masks) -> (action, None)`` as MaskablePPO's deterministic predict, for
    ``EdgePolicyBatcher``; float32 weights, as the checkpoint stores them."""

    def __init__(self, W: np.ndarray, b: np.ndarray, nvec):
        self.W = np.asarray(W, np.float32).astype(np.float64)
        self.b = np.asarray(b, np.float32).astype(np.float64)
        self.bounds = np.concatenate([[0], np.cumsum([int(n) for n in nvec])])

    @classmethod
    def from_params(cls, params, cfg) -> "LinearEdgePolicy":
        return cls(*linear_layer(params, cfg), cfg.action_nvec)

    def predict(self, obs, action_masks=None, deterministic: bool = True):
        z = self.W @ np.asarray(obs, np.float64) + self.b
        if action_masks is not None:
            z = np.where(action_masks, z, -np.inf)
        bd = self.bounds
        return np.array([int(np.argmax(z[bd[i]:bd[i + 1]])) for i in range(len(bd) - 1)], dtype=np.int64), None


def _segments(cfg, mix, bcfg: BatchingCEMConfig, it: int) -> list[tuple]:
    rng = np.random.default_rng([TRAIN_SEED0, int(bcfg.seed), int(it)])
    base = replace(cfg, segment_s=bcfg.segment_s)
    return [mix.draw(base, rng, "train") for _ in range(bcfg.segments)]


def _run(policy, segs: list[tuple]) -> list[dict]:
    """One row per segment (``worlds.edge.evaluate``) of ``policy`` (None: the rule) on training segments."""
    from fleetwise.worlds.edge import EdgePolicyBatcher, OffloadGreedy, evaluate

    make = OffloadGreedy if policy is None else (lambda view: EdgePolicyBatcher(policy, view))
    return [evaluate(c, make, [s], held_out="train", trace=tr, load=ld)[0] for c, s, tr, ld in segs]


def _compare(rows: list[dict], rule: list[dict]) -> tuple[float, float]:
    """(change of requests within deadline per second, sum over sum - 1; mean TTFT attainment difference)."""
    base = sum(r["deadline_rps"] for r in rule)
    ch = sum(r["deadline_rps"] for r in rows) / base - 1.0 if base > 0 else 0.0
    att = float(np.mean([a["ttft_attainment"] - r["ttft_attainment"] for a, r in zip(rows, rule)]))
    return ch, att


def job_key(cfg, validation, bcfg: BatchingCEMConfig, mix) -> str:
    """What determines a training run's result: the edge scenario, the training mix, the CEM budget and seed, the
    validation windows (a sha256 of them, stored in the model card; a checkpoint is reused only on a match)."""
    import hashlib
    import json

    doc = {"edge": asdict(cfg), "mix": asdict(mix), "cem": asdict(bcfg), "params": n_params(cfg),
           "validation": [[str(x) for x in w[:3]] + [str(w[4])] for w in validation.windows],
           "version": 2}  # bump when the edge world or the policy changes behaviour without changing the config
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _reuse(out, key: str, cfg) -> dict | None:
    """The result of an earlier run with the same :func:`job_key` from its checkpoint's model card (read with the
    safe loader: arrays and JSON only), or None."""
    from fleetwise.learn.recipe import trained_by

    card = trained_by(out, "batcher", key, n_params(cfg))
    if card is None:
        return None
    t = card.training
    params = np.asarray(t["params"], np.float64)
    g = dict(card.validation or {})
    return {"policy": LinearEdgePolicy.from_params(params, cfg), "params": [float(x) for x in params],
            "curve": t["curve"], "validation_curve": [tuple(v) for v in t["validation_curve"]],
            "lagrange": [tuple(v) for v in t["lagrange"]], "gate": g, "best_step": t["best_step"],
            "config": t["config"], "segments_simulated": t["segments_simulated"], "wall_s": float(t["wall_s"]),
            "checkpoint": str(out), "reused": True}


def train_batching_cem(cfg, validation, bcfg: BatchingCEMConfig, mix=None, out: str | Path | None = None,
                       progress=None, policy_name: str = "disppo", reuse: bool = False) -> dict:
    """CEM for the linear policy on ``cfg`` (an ``EdgeConfig``) with training segments from ``mix`` (a
    ``TrainMix``), checkpoint choice and gate on ``validation`` (an ``EdgeValidation``); writes ``out``
    (fleetwise checkpoint + model card) when given. Returns the policy, its parameters, the curve (one row per
    iteration), the multiplier's history, the validation curve (segments simulated, score) and the gate.
    ``reuse``: when ``out`` holds the checkpoint of a run with the same :func:`job_key` (same scenario, mix,
    budget, seed and validation windows: training is deterministic), return its result without training."""
    from fleetwise.learn.recipe import CEM, Lagrangian
    from fleetwise.worlds.edge import TrainMix

    t0 = time.perf_counter()
    mix = mix or TrainMix()
    key = job_key(cfg, validation, bcfg, mix)
    if reuse and (old := _reuse(out, key, cfg)) is not None:
        return old
    k = n_params(cfg)
    sigma = np.full((k // (n_features(cfg) + 1), n_features(cfg) + 1), bcfg.sigma)
    sigma[:, -1] = bcfg.sigma_bias
    search = CEM(np.zeros(k), sigma.reshape(-1), population=bcfg.population, elite=bcfg.elite, min_sigma=bcfg.min_sigma,
                 rng=np.random.default_rng([int(bcfg.seed), 37]), keep_mean=True)
    lag = Lagrangian(target=-bcfg.ttft_tolerance, sense=">=", lr=bcfg.lagrangian_lr, scale=0.01, lam=0.1,
                     hinge=True)
    rule_score = validation.score(None)
    best = {"score": rule_score, "params": np.zeros(k), "iteration": 0}
    curve: list[dict] = []
    validation_curve: list[tuple[int, float]] = [(0, rule_score)]  # the warm start (the rule) is the first
    lagrange: list[tuple[int, float, float]] = []
    simulated = 0
    for it in range(1, bcfg.iterations + 1):
        segs = _segments(cfg, mix, bcfg, it)
        rule = _run(None, segs)
        pop = search.ask()
        cmp_ = [_compare(_run(LinearEdgePolicy.from_params(p, cfg), segs), rule) for p in pop]
        simulated += (len(pop) + 1) * len(segs)
        order = search.tell([-c + lag.penalty(a) for c, a in cmp_])
        elite_att = float(np.mean([cmp_[i][1] for i in order]))
        lam = lag.update(elite_att, step=simulated)
        lagrange.append((simulated, lam, elite_att))
        vs = validation.score(LinearEdgePolicy.from_params(search.mean, cfg))
        simulated += len(validation.windows)
        validation_curve.append((simulated, vs))
        if vs > best["score"] + bcfg.min_delta:
            best = {"score": vs, "params": search.mean.copy(), "iteration": it}
        row = {"iteration": it, "segments_simulated": simulated, "wall_s": time.perf_counter() - t0,
               "lambda": lam, "train_elite_change": float(np.mean([cmp_[i][0] for i in order])),
               "train_elite_ttft_attainment_diff": elite_att, "val_score": vs, "rule_val_score": rule_score}
        curve.append(row)
        if progress is not None:
            progress(it, row)
    policy = LinearEdgePolicy.from_params(best["params"], cfg)
    g = validation.gate(policy)
    g["best_step"] = best["iteration"]
    result = {"policy": policy, "params": [float(x) for x in best["params"]], "curve": curve,
              "validation_curve": validation_curve, "lagrange": lagrange, "gate": g, "best_step": best["iteration"],
              "config": asdict(bcfg), "segments_simulated": simulated + 2 * len(validation.windows),
              "wall_s": time.perf_counter() - t0, "job_key": key}
    if out is not None:
        result["checkpoint"] = str(save_batching_cem(out, best["params"], cfg, bcfg, mix, result, policy_name))
    return result


def save_batching_cem(out, params, cfg, bcfg: BatchingCEMConfig, mix, result: dict,
                      policy_name: str = "disppo") -> Path:
    """The policy as a fleetwise checkpoint (one linear layer over the observation, a MultiDiscrete action: the
    argmax per dimension; the masks are the world's, ``EdgeView.mask``) and its model card."""
    from fleetwise.control.checkpoint import ActionSpec, ModelCard, save_policy

    W, b = linear_layer(params, cfg)
    d = n_features(cfg)
    card = ModelCard(level="batcher", policy=policy_name, rule="offload_greedy", validation=result.get("gate"),
                     training={"algorithm": "cem", "params": [float(x) for x in params], "config": asdict(bcfg),
                               "curve": result.get("curve", []), "best_step": result.get("best_step"),
                               "validation_curve": [list(v) for v in result.get("validation_curve", [])],
                               "lagrange": [list(v) for v in result.get("lagrange", [])],
                               "segments_simulated": result.get("segments_simulated"),
                               "job_key": result.get("job_key"),
                               "wall_s": round(float(result["wall_s"]), 1) if "wall_s" in result else None,
                               "data": "edge segments, first 60% of each trace's span: the paper's mix at "
                                       f"{mix.rate_range[0]:g}-{mix.rate_range[1]:g} req/s, and "
                                       f"{', '.join(mix.traces)} fitted at load {mix.load_range[0]:g}-"
                                       f"{mix.load_range[1]:g}",
                               "warm_start": "the rule itself (zero parameters = offload_greedy)",
                               "objective": "requests within deadline per second (paired with the rule)",
                               "constraint": f"TTFT deadline attainment >= the rule's - {bcfg.ttft_tolerance:g} "
                                             "(Lagrangian)"})
    return save_policy(out, level="batcher", algorithm="cem", obs_low=np.zeros(d, np.float32),
                       obs_high=np.ones(d, np.float32), action=ActionSpec("multi_discrete", nvec=cfg.action_nvec),
                       layers=[(W.astype(np.float32), b.astype(np.float32))], activation="identity", card=card)
