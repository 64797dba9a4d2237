"""What the guard of TORTA's trained planners changes (docs/torta.md, "A guard on the share of long requests"): each
TORTA checkpoint of a ``reproduce torta`` run (``CHECKPOINTS/<topology>-torta-seed<k>.npz``, the CEM learner's or
PPO's export) evaluated on the held-out days, or on a trace fitted to a load, as deployed (with the guard its model
card carries) and without it, each paired by (training seed, day) with ``least_loaded`` on the same days. Prints per
topology the mean response-time and cost changes with 95% intervals and the share of slots the guard planned.

    PYTHONPATH=src FLEETWISE_DATA=../shared/data python benchmarks/torta-guard-on-off.py CHECKPOINTS \\
        [--eval-trace mooncake --load 0.7] [--seeds 5] [--workers 2]

(2026-12-05: the PPO learner's quick checkpoints on Mooncake at load 0.7, 4 topologies x 5 days, about 2 min on 2
cores.)
"""

import argparse
import json
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _one(job: tuple) -> tuple:
    topo, ckpt, guard, seeds, trace, load = job
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.policies.planners import LeastLoadedPlanner, ResidualPlanner, load_torta_checkpoint
    from fleetwise.reproduce.common import fit_load
    from fleetwise.workload.spec import load_trace
    from fleetwise.worlds.torta import TortaConfig, evaluate

    tr = load_trace(trace) if trace else None
    if ckpt is None:
        mk = LeastLoadedPlanner
    else:
        pol = load_torta_checkpoint(ckpt)[0]
        cap = None if guard else 2.0  # None: the card's threshold; a share is at most 1, so 2 never guards

        def mk(c):
            return ResidualPlanner(c, pol, True, cap)
    rows = evaluate(TortaConfig(topology=topo), mk, "affinity_greedy", seeds, held_out=True, trace=tr,
                    load=fit_load(load))
    return job, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoints")
    ap.add_argument("--eval-trace", default=None)
    ap.add_argument("--load", default="0.7")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    from fleetwise.metrics.stats import paired_change

    seeds = list(range(1000, 1000 + a.seeds))
    ckpts: dict[str, list[tuple[int, str]]] = {}
    for p in sorted(Path(a.checkpoints).glob("*-torta-seed*.npz")):
        m = re.fullmatch(r"(.+)-torta-seed(\d+)\.npz", p.name)
        ckpts.setdefault(m.group(1), []).append((int(m.group(2)), str(p)))
    if not ckpts:
        ap.error(f"{a.checkpoints}: no <topology>-torta-seed<k>.npz checkpoints")
    load = a.load if a.load == "real" else float(a.load)
    jobs = [(t, None, False, seeds, a.eval_trace, load) for t in ckpts]
    jobs += [(t, c, g, seeds, a.eval_trace, load) for t, cs in ckpts.items() for _, c in cs for g in (True, False)]
    with ProcessPoolExecutor(a.workers) as ex:
        done = list(ex.map(_one, jobs))
    rule = {job[0]: {r["seed"]: r for r in rows} for job, rows in done if job[1] is None}
    out = {}
    for t, cs in ckpts.items():
        out[t] = {}
        for guard in (True, False):
            base, pol, guarded, slots = {}, {}, 0, 0
            for k, c in cs:
                rows = next(rows for job, rows in done if job[1] == c and job[2] == guard)
                for r in rows:
                    base[(k, r["seed"])] = rule[t][r["seed"]]
                    pol[(k, r["seed"])] = r
                    guarded += r.get("guarded_slots", 0)
                    slots += r.get("slots_planned", 0)
            row = {}
            for m in ("response_time_mean_s", "cost_usd"):
                ch = paired_change({key: v[m] for key, v in base.items()}, {key: v[m] for key, v in pol.items()})
                row[m] = [round(100 * x, 2) for x in (ch.mean, ch.lo, ch.hi)]
            row["guarded_slot_share"] = round(guarded / max(slots, 1), 3)
            out[t]["with_guard" if guard else "without_guard"] = row
    print(json.dumps({"checkpoints": a.checkpoints, "eval_trace": a.eval_trace, "load": load, "days": seeds}))
    for t, row in out.items():  # % against least_loaded: [mean, 95% CI low, high]
        print(json.dumps({"topology": t, **row}))


if __name__ == "__main__":
    main()
