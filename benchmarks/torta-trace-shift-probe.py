"""What tells a real trace's day from the synthetic days TORTA trained on (docs/torta-log.md, "a monitor on request
lengths, not kept"): per workload, the requests' mean prompt and output tokens, the spread of arrivals over the
day's slots, whether a run-time monitor on the running means of prompt and output tokens since the day's start
(the band: their range over 30 training days at loads 0.45/0.55/0.7, from the 300th request on) would hand the
day to the rule, and from which request (on ``--topology``'s first); with ``--checkpoints DIR`` (``reproduce
torta``'s checkpoints folder) also each agent's mean response time and cost against least_loaded's on the same
days (8 per kind, training seeds pooled, paired), on the held-out days at the paper's load and at 0.7 (diurnal,
``TortaConfig(load=0.7)``) and on each trace at 0.7; and on each of the last two with the same requests at
Poisson arrival times over the day (``+poisson``: no diurnal profile, no bursts, no trace's own burstiness).

    PYTHONPATH=src python benchmarks/torta-trace-shift-probe.py [--checkpoints DIR] [--topology grid[,ring...]] \
        [--agents torta,reactive_ppo]
"""

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

DAYS = list(range(1000, 1008))
MIN_COUNT = 300
TRACES = ("azure-conv", "mooncake", "arxiv-summarization")


def _world(topology: str):
    from fleetwise.worlds.torta import MEAN_TOKENS, SERVICE_EFFICIENCY, TortaConfig, build_replicas, make_fleet

    cfg = TortaConfig(topology=topology)
    fleet = make_fleet(cfg)
    _, srv = build_replicas(cfg, fleet)
    return cfg, fleet, float(srv.region_speed.sum() / MEAN_TOKENS * SERVICE_EFFICIENCY)


def _day(topology: str, where: str, seed: int):
    """One day's requests: ``train@LOAD``, ``validation``, ``held-out[@LOAD]`` or a trace at 0.7; ``+poisson``:
    the same requests (lengths, origins, model types, in order) at Poisson arrival times over the day."""
    from fleetwise.workload.spec import load_trace
    from fleetwise.worlds.torta import HOURS, torta_workload

    cfg, fleet, cap = _world(topology)
    base, _, variant = where.partition("+")
    kind, _, load = base.partition("@")
    rng = np.random.default_rng(seed)
    if kind in ("train", "validation", "held-out"):
        w = torta_workload(replace(cfg, load=float(load)) if load else cfg, fleet, cap, rng, kind == "held-out")
    else:
        w = torta_workload(cfg, fleet, cap, rng, True, load_trace(kind), 0.7)
    if variant == "poisson":
        w.arrival_s = np.sort(np.random.default_rng(seed + 7_000_000).random(len(w)) * HOURS * cfg.slot_s)
    return w


def _running(w):
    n = np.arange(1, len(w) + 1)
    return (np.cumsum(w.prompt_tokens) / n)[MIN_COUNT - 1:], (np.cumsum(w.output_tokens) / n)[MIN_COUNT - 1:]


def _response(job):
    topology, ckdir, agent, seed, where = job
    from fleetwise.policies.planners import load_torta_checkpoint, make_micro
    from fleetwise.reproduce.torta import policies
    from fleetwise.worlds.torta import Day

    models = {} if seed is None else {agent: load_torta_checkpoint(f"{ckdir}/{topology}-{agent}-seed{seed}.npz")[0]}
    mk, micro = policies(models)["least_loaded" if seed is None else agent]
    cfg, fleet, _ = _world(topology)
    rows = [Day(cfg, fleet, _day(topology, where, d), d, mk(cfg), make_micro(micro, cfg)).finish() for d in DAYS]
    return job, [(r["response_time_mean_s"], r["cost_usd"]) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="grid")
    ap.add_argument("--agents", default="torta")
    ap.add_argument("--checkpoints", default=None)
    ap.add_argument("--train-seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    topos = a.topology.split(",")
    cfg, _, _ = _world(topos[0])
    band = [np.inf, -np.inf, np.inf, -np.inf]
    for i in range(30):
        p, o = _running(_day(topos[0], f"train@{(0.45, 0.55, 0.7)[i % 3]}", 200_000 + i))
        band = [min(band[0], p.min()), max(band[1], p.max()), min(band[2], o.min()), max(band[3], o.max())]
    print(f"band (30 training days, running means from request {MIN_COUNT}): prompt {band[0]:.0f}-{band[1]:.0f}, "
          f"output {band[2]:.0f}-{band[3]:.0f} tokens")
    print("| days | mean prompt | mean output | arrivals per slot: CV | monitor trips (days, at request) |")
    print("|---|---:|---:|---:|---|")
    groups = [("validation (training distribution)", "validation", [500_000 + d for d in DAYS]),
              ("held-out test days", "held-out", DAYS)] + [(f"{t} @0.7", t, DAYS) for t in TRACES]
    for label, where, seeds in groups:
        ps, os_, cvs, trips = [], [], [], []
        for s in seeds:
            w = _day(topos[0], where, s)
            ps.append(w.prompt_tokens.mean())
            os_.append(w.output_tokens.mean())
            cnt = np.bincount((w.arrival_s // cfg.slot_s).astype(int), minlength=24)[:24]
            cvs.append(cnt.std() / cnt.mean())
            p, o = _running(w)
            bad = (p < band[0]) | (p > band[1]) | (o < band[2]) | (o > band[3])
            if bad.any():
                trips.append(int(np.argmax(bad)) + MIN_COUNT)
        print(f"| {label} | {np.mean(ps):,.0f} ({min(ps):,.0f}-{max(ps):,.0f}) | {np.mean(os_):.0f} "
              f"({min(os_):.0f}-{max(os_):.0f}) | {np.mean(cvs):.2f} | {len(trips)} of {len(seeds)}"
              f"{' (' + ', '.join(map(str, trips)) + ')' if trips else ''} |")
    if a.checkpoints is None:
        return
    from fleetwise.metrics.stats import paired_change

    wheres = ["held-out", "held-out@0.7", "held-out@0.7+poisson"]
    wheres += [w for t in TRACES for w in (t, t + "+poisson")]
    agents = a.agents.split(",")
    jobs = [(t, a.checkpoints, ag, s, w) for t in topos for w in wheres
            for ag, s in [(None, None)] + [(ag, s) for ag in agents for s in range(a.train_seeds)]]
    with ProcessPoolExecutor(a.workers) as ex:
        res = dict(ex.map(_response, jobs))
    print(f"\nvs least_loaded, mean response time / cost (training seeds {', '.join(map(str, range(a.train_seeds)))} "
          f"x {len(DAYS)} days, paired; per-day sd of the response change):")
    for t in topos:
        for w in wheres:
            rule = np.asarray(res[(t, a.checkpoints, None, None, w)])
            for ag in agents:
                pol = {s: np.asarray(res[(t, a.checkpoints, ag, s, w)]) for s in range(a.train_seeds)}
                keys = [(s, d) for s in pol for d in range(len(DAYS))]
                r, c = (paired_change({k: rule[k[1], m] for k in keys}, {k: pol[k[0]][k[1], m] for k in keys})
                        for m in (0, 1))
                sd = np.std([pol[s][d, 0] / rule[d, 0] - 1 for s, d in keys])
                print(f"{t:17s} {w:22s} {ag:13s} {r.mean:+.1%} [{r.lo:+.1%}, {r.hi:+.1%}] / {c.mean:+.1%} "
                      f"[{c.lo:+.1%}, {c.hi:+.1%}]  (sd {sd:.1%})")


if __name__ == "__main__":
    main()
