"""Size-aware packing, without learning (docs/torta-log.md, "a lever found, not yet learned"): ResidualPlanner's fixed
util weight (packing requests onto the regions that were busy over the last slot, as TORTA's CEM agent does),
applied only to requests of at most ``T`` prompt + output tokens; longer ones get ``LONG`` x the weight (0: plain
least_loaded). Against the zero action (least_loaded + affinity_greedy), paired by day, on 8 held-out days and
on each trace at load 0.7 (the days ``reproduce torta --eval-trace`` uses), or on 8 validation days
(``--where validation``: the training distribution, seeds 500000.., the days TORTA's learner chooses on).

    PYTHONPATH=src python benchmarks/torta-size-gate-probe.py [--topology grid,backbone,...] \
        [--where held-out,azure-conv,mooncake,arxiv-summarization | validation]
"""

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

DAYS = list(range(1000, 1008))
# (label, a_{n+2} util action, T tokens or 0 for every request, LONG multiplier)
VARIANTS = [("every request packed, util action −0.1", -0.1, 0, 1.0),
            ("≤ 1,500 tokens packed at −0.1, longer ones least_loaded", -0.1, 1500, 0.0),
            ("≤ 1,500 at −0.1, longer ones at half the weight", -0.1, 1500, 0.5),
            ("≤ 1,500 at −0.2, longer ones least_loaded", -0.2, 1500, 0.0),
            ("≤ 3,000 at −0.2, longer ones least_loaded", -0.2, 3000, 0.0)]


def _job(job):
    topology, where, util, max_tokens, long_w = job
    from fleetwise.policies.planners import ResidualPlanner
    from fleetwise.workload.spec import load_trace
    from fleetwise.worlds.torta import TortaConfig, evaluate, make_fleet

    class Sized(ResidualPlanner):  # the size-aware residual with this variant's threshold
        LONG_TOKENS = max_tokens or ResidualPlanner.LONG_TOKENS

    cfg = TortaConfig(topology=topology)
    n = len(make_fleet(cfg).names)

    def make(c):
        p = Sized(c)  # a_{n+2}: requests of at most T tokens; a_{n+3}: longer ones (T = 0: every request)
        p.set_action(np.r_[np.zeros(n), 0.0, 0.0, util, util * (long_w if max_tokens else 1.0)])
        return p

    if where == "validation":
        rows = evaluate(cfg, make, "affinity_greedy", [500_000 + d for d in range(len(DAYS))], held_out=False)
    else:
        trace = None if where == "held-out" else load_trace(where)
        rows = evaluate(cfg, make, "affinity_greedy", DAYS, held_out=True, trace=trace, load=0.7)
    return job, np.array([[r["response_time_mean_s"], r["cost_usd"], r["load_cv"]] for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="backbone,grid,random_geometric,ring")
    ap.add_argument("--where", default="held-out,azure-conv,mooncake,arxiv-summarization")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.metrics.stats import paired_change

    topos, wheres = a.topology.split(","), a.where.split(",")
    jobs = [(t, w, 0.0, 0, 1.0) for t in topos for w in wheres]
    jobs += [(t, w, u, mt, lw) for t in topos for w in wheres for _, u, mt, lw in VARIANTS]
    with ProcessPoolExecutor(a.workers) as ex:
        res = dict(ex.map(_job, jobs))
    print("| topology | days | variant | response time | cost | load CV |")
    print("|---|---|---|---|---|---|")
    for t in topos:
        for w in wheres:
            rule = res[(t, w, 0.0, 0, 1.0)]
            for label, u, mt, lw in VARIANTS:
                pol = res[(t, w, u, mt, lw)]
                cells = []
                for k in range(3):
                    c = paired_change({d: rule[d, k] for d in range(len(DAYS))}, {d: pol[d, k] for d in range(len(DAYS))})
                    cells.append(f"{c.mean:+.1%} [{c.lo:+.1%}, {c.hi:+.1%}]")
                print(f"| {t} | {w} | {label} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
