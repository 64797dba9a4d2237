"""What fixed corrections of slo_aware buy on the platform scenario's test day (docs/autoscaling.md, "RL scaler"):
the cost / SLO attainment trade-off a learned correction has to beat. Each variant runs the whole of ServeGen day 1
(seed 0 unless --seeds) through the same CorrectedSLOAware the RL scaler runs, paired with slo_aware itself.

    PYTHONPATH=src python benchmarks/scaler-frontier-probe.py [--seeds 0,1] [--workers 2] [--only "NAME|NAME"]

"calm_lift" is the RL scaler's warm start (policies/scaler_correction.py CALM_LIFT), a gated linear form of a calm
variant. The "calm" variants are hand-set corrections *with memory*, which the learned policy's features (one epoch's view)
cannot express: a model's N+1 spread is lifted once the model has been calm for ``calm_s`` (every epoch of that
window: the rule's need below ``need_below`` replicas, the worst p90 / SLO ratio below ``q_below``, nothing
waiting), and restored at once when the ratio exceeds ``q_restore``, more than ``waiting_restore`` of
``log1p(waiting per replica) / log1p(100)`` waits, or the need reaches ``need_below``. No time of day and no
model name: what lifts is whichever model is calm.

About 70 s of one core per whole-day run (the rule and 13 variants per seed)."""

import argparse
import json
import math
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor

import numpy as np

VARIANTS = {  # name: (slo_aware parameters, {"o.i": weight | "o.b": bias} of the linear correction)
    "slo_aware": ({}, None),
    "zero correction": ({}, {}),
    "headroom 0": ({"headroom": 0.0}, None),
    "need x 0.74 (a0 = -1)": ({}, {"0.b": -1.0}),
    "no N+1 below 0.2 replicas of need": ({}, {"1.b": 1.0, "1.1": -20.0}),
    "no N+1 below 0.8 replicas of need": ({}, {"1.b": 1.0, "1.1": -5.0}),  # (feature 1 is need in replicas / 4)
    "no N+1 below 2 replicas of need": ({}, {"1.b": 1.0, "1.1": -2.0}),
    "no N+1 below 4 replicas of need": ({}, {"1.b": 1.0, "1.1": -1.0}),
    "no N+1 ever": ({}, {"1.b": 1.0}),
    "calm_lift (the gated linear warm start)": ({}, "calm_lift"),
}
CALM = {  # name: CalmLift parameters
    "calm 20 min, restore at 0.7 replicas, 60 min between lifts, 15-min hold":
        dict(calm_s=1200, q_below=0.8, q_restore=2.0, waiting_restore=0.4, need_restore=0.7, relift_s=3600,
             hold_s=900),
    "calm 30 min, restore at 0.7 replicas, 60 min between lifts, 15-min hold":
        dict(calm_s=1800, q_below=0.8, q_restore=2.0, waiting_restore=0.4, need_restore=0.7, relift_s=3600,
             hold_s=900),
    "calm 20 min, restore at 0.7 replicas, 60 min between lifts":
        dict(calm_s=1200, q_below=0.8, q_restore=2.0, waiting_restore=0.4, need_restore=0.7, relift_s=3600),
    "15-min hold only": dict(calm_s=1200, q_below=-1.0, q_restore=2.0, waiting_restore=0.4, hold_s=900),
    "calm 15 min, restore at ratio 2": dict(calm_s=900, q_below=0.8, q_restore=2.0, waiting_restore=0.4),
    "calm 15 min, restore at ratio 2, need x 1.16": dict(calm_s=900, q_below=0.8, q_restore=2.0, waiting_restore=0.4,
                                                         a0=0.5),
    "calm 20 min, restore at ratio 1.5": dict(calm_s=1200, q_below=0.8, q_restore=1.5, waiting_restore=0.2),
    "calm 15 min, restore at ratio 1.5, 30 min between lifts": dict(calm_s=900, q_below=0.8, q_restore=1.5,
                                                                      waiting_restore=0.2, relift_s=1800),
}


def calm_lift(**kw):
    """A CorrectedSLOAware whose N+1 lift is decided with memory (module docstring); ``a0``: a constant capacity
    correction (the need x exp(0.3 a0)); ``hold_s``: the need held at its high of the last ``hold_s`` (at most
    x 1.35, the learned correction's bound), as a longer scale-down window would."""
    from fleetwise.policies.scaler_correction import NEED_SCALE, CorrectedSLOAware

    class CalmLift(CorrectedSLOAware):
        def __init__(self, calm_s, q_below, q_restore, waiting_restore, need_below=0.5, need_restore=None,
                     relift_s=0.0, a0=0.0, hold_s=0.0):
            super().__init__()
            self.calm_s, self.q_below, self.q_restore = calm_s, q_below, q_restore
            self.waiting_restore, self.need_below, self.relift_s, self.a0 = waiting_restore, need_below, relift_s, a0
            self.need_restore = need_below if need_restore is None else need_restore
            self.hold_s, self.needs = hold_s, {}
            self.seen: dict[str, deque] = {}
            self.first: dict[str, float] = {}
            self.restored: dict[str, float] = {}

        def _apply(self, model, need, now, x, price=0.0):  # (price: the feature the learned correction reads)
            self.decisions += 1
            reps, q, w = x[1] * 4.0, x[2], x[3]  # the rule's need in replicas, worst p90 / SLO, waiting (features)
            h = self.seen.setdefault(model, deque())
            h.append((now, reps < self.need_below and q < self.q_below and w <= 0.0))
            while h[0][0] < now - self.calm_s:
                h.popleft()
            was = self._drop.get(model, False)
            if was:
                lift = reps < self.need_restore and q < self.q_restore and w <= self.waiting_restore
                if not lift:
                    self.restored[model] = now
            else:
                lift = (now - self.first.setdefault(model, now) >= self.calm_s and all(c for _, c in h)
                        and now - self.restored.get(model, -math.inf) >= self.relift_s)
            self._drop[model] = lift
            if self.hold_s and need > 0:
                nh = self.needs.setdefault(model, deque())
                nh.append((now, need))
                while nh[0][0] < now - self.hold_s:
                    nh.popleft()
                return need * min(math.exp(NEED_SCALE), max(v for _, v in nh) / need)
            return need * math.exp(NEED_SCALE * self.a0)

    return CalmLift(**kw)


def make_scaler(name):
    """The scaler of a variant name (VARIANTS or CALM)."""
    from fleetwise.policies.scaler_correction import CALM_LIFT, CorrectedSLOAware, LinearCorrection

    params, spec = VARIANTS.get(name, ({}, None))
    if name in CALM:
        return calm_lift(**CALM[name])
    if spec == "calm_lift":
        return CorrectedSLOAware(LinearCorrection.from_spec(CALM_LIFT), **params)
    if spec is None:
        return {"name": "slo_aware", **params}
    return CorrectedSLOAware(LinearCorrection.from_spec({k.replace(".", ":"): v for k, v in spec.items()}, 2), **params)


def one(args):
    name, seed = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fleetwise.reproduce.platform import DAY, windowed
    from fleetwise.run import run_platform
    from fleetwise.scenario import SCENARIO_DIR, parse_scenario, read_yaml

    _, base = read_yaml("platform", SCENARIO_DIR, "scenario")
    s = run_platform(parse_scenario(windowed(base, 0.0, DAY)), seed, scaler=make_scaler(name), monitor=False).summary
    return name, seed, {k: s[k] for k in ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="variant names separated by | (the rule always runs)")
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    names = [n for n in (*VARIANTS, *CALM) if not a.only or n == "slo_aware" or n in a.only.split("|")]
    with ProcessPoolExecutor(a.workers) as ex:
        res = list(ex.map(one, [(n, s) for n in names for s in seeds]))
    by = {(n, s): r for n, s, r in res}
    for n in names:
        rs = [by[n, s] for s in seeds]
        ref = [by["slo_aware", s] for s in seeds]
        dc = np.mean([r["cost_per_mtok_usd"] / q["cost_per_mtok_usd"] - 1 for r, q in zip(rs, ref)])
        da = np.mean([r["slo_attainment"] - q["slo_attainment"] for r, q in zip(rs, ref)])
        do = np.mean([r["oscillations"] - q["oscillations"] for r, q in zip(rs, ref)])
        print(json.dumps({"variant": n, "seeds": seeds, "cost_per_mtok_change": round(float(dc), 4),
                          "slo_attainment_diff_points": round(float(da) * 100, 3), "oscillations_added": float(do),
                          "lost": sum(r["lost_requests"] for r in rs),
                          "per_seed": [[round(100 * (r["cost_per_mtok_usd"] / q["cost_per_mtok_usd"] - 1), 2),
                                        round(100 * (r["slo_attainment"] - q["slo_attainment"]), 3),
                                        r["oscillations"] - q["oscillations"]] for r, q in zip(rs, ref)]}))


if __name__ == "__main__":
    main()
