"""TORTA's CEM learner with one more parameter (docs/torta-log.md, "a lever found, not yet learned"): the util weight's
multiplier for requests over 1,500 prompt + output tokens (1 + p: 0 = today's policy, -1 = long requests by
least_loaded alone), searched with the others at the full budget (8 iterations x 12 candidates x 4 days, the
same objective, constraint, validation and seeds as ``fleetwise.learn.torta_cem``) for 3 training seeds of the
temporal agent on one topology, then evaluated against least_loaded on 8 held-out days and each trace at 0.7.
An experiment outside the checkpoint format (the multiplier is not in it): nothing is saved but the parameters.

    PYTHONPATH=src python benchmarks/torta-size-cem-probe.py [TOPOLOGY]   (default grid; about 8 min on 2 CPUs)
"""
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

SPLIT = 1500.0

def make_planner_cls():
    from fleetwise.policies.planners import ResidualPlanner
    class SizePlanner(ResidualPlanner):  # the long requests' util weight: the short ones' x long_mult
        def __init__(self, cfg=None, policy=None, temporal=True, long_mult=1.0):
            super().__init__(cfg, policy, temporal)
            self.long_mult = long_mult
        def set_action(self, a, n=None):
            super().set_action(a, n)
            self.w_util_long = self.w_util * self.long_mult
    return SizePlanner

def train(seed, topo="grid"):
    from fleetwise.learn.recipe import CEM, Lagrangian
    from fleetwise.learn.torta_cem import (TortaCEMConfig, LinearTortaPolicy, _changes, _days, n_params, TRAIN_SEED0)
    from fleetwise.learn.torta import VAL_SEED0, rule_planner
    from fleetwise.worlds.torta import TortaConfig, make_fleet
    SP = make_planner_cls()
    cem = TortaCEMConfig(seed=seed, iterations=8, population=12, train_days=4, objective="cost")
    tcfg = TortaConfig(topology=topo)
    n, hist, temporal = len(make_fleet(tcfg).names), tcfg.history, True
    k = n_params(temporal) - 1  # the short requests' row (the long weight is the multiplier below)
    def planner(params):
        pol = LinearTortaPolicy(np.r_[params[:k], 0.0], n, hist, temporal)
        m = float(np.clip(1.0 + params[k], -1.0, 2.0))
        return lambda c: SP(c, pol, temporal, m)
    vdays = list(range(VAL_SEED0, VAL_SEED0 + cem.val_days))
    rule_v = _days(tcfg, rule_planner, vdays)
    def val_score(params):
        c, r = _changes(_days(tcfg, planner(params), vdays), rule_v)
        return -c - cem.val_penalty * max(0.0, r - cem.response_tolerance), c, r
    lag = Lagrangian(target=cem.response_tolerance, sense="<=", lr=cem.lagrangian_lr, scale=0.01, lam=1.0, hinge=True)
    sigma = np.r_[np.asarray(cem.sigma[:k], float), 0.3]
    search = CEM(np.zeros(k + 1), sigma, population=cem.population, elite=cem.elite, min_sigma=cem.min_sigma,
                 rng=np.random.default_rng(np.random.SeedSequence([int(cem.seed), 31])), keep_mean=True)
    best = {"score": 0.0, "params": search.mean.copy(), "it": 0}
    log = []
    for it in range(1, cem.iterations + 1):
        seeds = [TRAIN_SEED0 + 10_000 * seed + 100 * it + j for j in range(cem.train_days)]
        rule_t = _days(tcfg, rule_planner, seeds, cem.loads)
        cmp_ = [_changes(_days(tcfg, planner(p), seeds, cem.loads), rule_t) for p in search.ask()]
        scored = [c + lag.penalty(r) for c, r in cmp_]
        order = search.tell(scored)
        lag.update(float(np.mean([cmp_[i][1] for i in order])), step=it)
        mu = search.mean
        vs, vc, vr = val_score(mu)
        log.append((it, round(vs, 4), round(vc, 4), round(vr, 4), round(float(mu[0]), 3), round(float(mu[k]), 3)))
        if vs > best["score"] + cem.min_delta:
            best = {"score": vs, "params": mu.copy(), "it": it}
    return seed, [float(x) for x in best["params"]], best["it"], log

def evaluate_job(a):
    topo, seed, params, where = a
    from fleetwise.learn.torta_cem import LinearTortaPolicy, n_params
    from fleetwise.worlds.torta import TortaConfig, make_fleet, evaluate
    from fleetwise.workload.spec import load_trace
    from fleetwise.policies.planners import LeastLoadedPlanner
    SP = make_planner_cls()
    tcfg = TortaConfig(topology=topo)
    n = len(make_fleet(tcfg).names); k = n_params(True) - 1
    if params is None:
        mk = LeastLoadedPlanner
    else:
        pol = LinearTortaPolicy(np.r_[params[:k], 0.0], n, tcfg.history, True)
        m = float(np.clip(1.0 + params[k], -1.0, 2.0))
        mk = lambda c: SP(c, pol, True, m)
    tr = None if where == "held-out" else load_trace(where)
    rows = evaluate(tcfg, mk, "affinity_greedy", list(range(1000, 1008)), trace=tr, load=0.7)
    return a[:2] + (a[3],), np.array([[r["response_time_mean_s"], r["cost_usd"], r["load_cv"]] for r in rows])

if __name__ == "__main__":
    topo = sys.argv[1] if len(sys.argv) > 1 else "grid"
    t0 = time.time()
    with ProcessPoolExecutor(2) as ex:
        trained = list(ex.map(train, [0, 1, 2], [topo] * 3))
    print("trained in", round(time.time() - t0), "s", flush=True)
    for s, p, it, log in trained:
        print("seed", s, "best iteration", it, "params", np.round(p, 3).tolist())
        for r in log:  # (iteration, validation score, cost change, response change, util bias, long multiplier - 1)
            print("  ", r)
    print(json.dumps(trained))
    from fleetwise.metrics.stats import paired_change
    wheres = ["held-out", "azure-conv", "mooncake", "arxiv-summarization"]
    jobs = [(topo, None, None, w) for w in wheres] + [(topo, s, p, w) for s, p, _, _ in trained for w in wheres]
    with ProcessPoolExecutor(2) as ex:
        res = dict(ex.map(evaluate_job, jobs))
    for w in wheres:
        rule = res[(topo, None, w)]
        out = []
        for kx in range(3):
            keys = [(s, d) for s in range(3) for d in range(8)]
            c = paired_change({q: rule[q[1], kx] for q in keys}, {q: res[(topo, q[0], w)][q[1], kx] for q in keys})
            out.append(f"{c.mean:+.1%} [{c.lo:+.1%}, {c.hi:+.1%}]")
        print(topo, w, "resp", out[0], "cost", out[1], "loadcv", out[2], flush=True)
    print("total", round(time.time() - t0), "s")
