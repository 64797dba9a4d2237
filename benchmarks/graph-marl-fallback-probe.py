"""Variants of the run-time monitor (docs/graph-marl.md, "The run-time monitor") on one trained checkpoint: the
10 held-out test segments against `static` and arXiv at load 0.7 against `least_loaded`, paired by segment.

A variant is `TRIGGER[:agents=all|gpu][:start][:hold=N]`:
  epoch-class   trips when a request class with >= 10 requests ended in the last epoch is below the SLO target;
                the rule then decides for N epochs (re-armed by every trip; default 10)
  since-start   trips when the attainment of all requests ended since the segment's start (>= 50) is below the
                target; the rule decides for the rest of the segment (recipe.RuleFallback, the one kept)
  agents=gpu    only the GPU agent's correction is dropped while tripped (the others keep theirs)
  start         the first epoch of every segment is the rule's too

Usage: python benchmarks/graph-marl-fallback-probe.py CHECKPOINT VARIANT[,VARIANT...]
(a checkpoint from `benchmarks/graph-marl-seed-probe.py KIND SEED`, e.g. /tmp/graph-marl-seed-probe-graph-s0.pt).
About a minute per variant and case on one CPU.
"""

from __future__ import annotations

import sys

import numpy as np

from fleetwise.envs.graph_marl import evaluate
from fleetwise.learn.graph_marl import load_trained
from fleetwise.learn.recipe import RuleFallback
from fleetwise.metrics.stats import paired_change
from fleetwise.workload.spec import load_trace
from fleetwise.worlds.multicloud import GraphMARLConfig


class Monitored:
    def __init__(self, pol, target: float, spec: str):
        parts = spec.split(":")
        self.pol, self.target, self.trigger = pol, target, parts[0]
        opts = dict(p.split("=") if "=" in p else (p, "1") for p in parts[1:])
        self.agents = opts.get("agents", "all")
        self.start = "start" in opts
        self.hold = int(opts.get("hold", 10))
        if self.trigger not in ("epoch-class", "since-start"):
            raise SystemExit(f"unknown trigger {self.trigger!r}")

    def reset(self, seed: int) -> None:
        self.pol.reset(seed)
        self.mon = RuleFallback(self.target)
        self.left = self.n = self.rule_epochs = 0

    def __call__(self, env, obs, state):
        mc = env.mc
        if self.trigger == "since-start":
            tripped = self.mon.step(mc.cls_ok, mc.cls_ended)
        else:
            if bool(((mc.cls_ended >= 10) & (mc.cls_ok < self.target * mc.cls_ended)).any()):
                self.left = self.hold
            tripped = self.left > 0
            self.left = max(0, self.left - 1)
        first, self.n = self.n == 0, self.n + 1
        a = self.pol(env, obs, state)
        if tripped or (self.start and first):
            self.rule_epochs += 1
            zero = env.rule_action()
            for k in (a if self.agents == "all" else [self.agents]):
                a[k] = zero[k]
        return a


def main() -> None:
    ckpt, variants = sys.argv[1], sys.argv[2].split(",")
    cfg = GraphMARLConfig()
    seeds = list(range(1000, 1010))
    cases = {"test": ("static", {}),
             "arXiv@0.7": ("least_loaded", {"trace": load_trace("arxiv-summarization"), "load": 0.7})}
    for case, (ref, kw) in cases.items():
        base = {x["seed"]: x for x in evaluate(cfg, ref, seeds, **kw)}
        for v in variants:
            pol = Monitored(load_trained(ckpt, cfg), cfg.slo_target, v)
            rows, rule_epochs = {}, []
            for s in seeds:
                rows[s] = evaluate(cfg, pol, [s], **kw)[0]
                rule_epochs.append(pol.rule_epochs)
            out = []
            for k in ("latency_p99_s", "cost_usd"):
                ch = paired_change({s: base[s][k] for s in base}, {s: rows[s][k] for s in rows})
                out.append(f"{k} {ch.mean:+.1%} [{ch.lo:+.1%}, {ch.hi:+.1%}]")
            att = np.mean([x["slo_attainment"] for x in rows.values()])
            print(f"{case} vs {ref} | {v} | " + " | ".join(out) + f" | attainment {att:.3f} | rule epochs per "
                  f"segment {rule_epochs}", flush=True)


if __name__ == "__main__":
    main()
