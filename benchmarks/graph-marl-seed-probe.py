"""One learned variant of `reproduce graph-marl` at the full budget with another training seed: the same arguments
as `benchmarks/graph-marl-full.sh` (up to 400 updates x 4 episodes, warm start to 0.7, 5 validation segments, early
stop after 40 checks without improvement, none for Graph-MARL; its step size 3e-3) but `MAPPOArgs.seed`; then the
chosen checkpoint on the 10 held-out test segments against `static` and on arXiv at load 0.7 against
`least_loaded`, paired. Quoted in docs/graph-marl.md (how much the arXiv result depends on the training seed; those
runs had 200 updates). About 10-12 minutes of one CPU per 200 updates.

Usage: python benchmarks/graph-marl-seed-probe.py KIND SEED ['{GraphMARLConfig overrides}' ['{MAPPOArgs overrides}']]
(KIND: graph, flat or ippo; JSON, e.g. '{"train_prompt_range": [1, 4]}', '{"scale_down_after_s": 30}', or '{}'
'{"rule_start_epochs": 1}'; "validation_s" among the second sets the validation segments' length, default the
training segments' 300 s). The test segments and arXiv run in the default world but for the overrides that limit
the actions (ACTION_LIMITS). Each case is printed bare, behind the SLO fallback alone (`recipe.RuleFallback`,
"+monitor", as measured before 2026-12-06) and behind the whole run-time monitor (`learn.graph_marl.monitored`:
the fallback and the input guard, `recipe.InputGuard`; "+monitor+guard", what `reproduce graph-marl` calls
"+fallback")."""

from __future__ import annotations

import fleetwise  # noqa: F401  (first: pins the kernels before numpy and torch load, fleetwise/floats.py)

import hashlib
import json
import os
import sys
from dataclasses import asdict, replace

import numpy as np

from fleetwise.envs.graph_marl import evaluate
from fleetwise.learn.graph_marl import MAPPOArgs, ValidationWindows, load_trained, monitored, train_job
from fleetwise.learn.recipe import RuleFallback
from fleetwise.metrics.stats import paired_change
from fleetwise.reproduce.graph_marl import _budget, _train_args
from fleetwise.workload.spec import load_trace
from fleetwise.worlds.multicloud import GraphMARLConfig


ACTION_LIMITS = ("guard_scale_ups", "scale_down_after_s")  # GraphMARLConfig fields that shape the action masks


def main() -> None:
    kind, seed = sys.argv[1], int(sys.argv[2])
    over = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    over_args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    bud = _budget(False)
    cfg = replace(GraphMARLConfig(), **{k: tuple(v) if isinstance(v, list) else v for k, v in over.items()})
    val_s = over_args.get("validation_s", MAPPOArgs().train_segment_s)  # (not a MAPPOArgs field)
    val = ValidationWindows(cfg, range(500, 500 + bud["val_seeds"]), val_s)
    args = replace(_train_args(bud, kind, seed), **{k: v for k, v in over_args.items() if k != "validation_s"})
    tag = "-" + hashlib.sha256(json.dumps(over, sort_keys=True).encode()).hexdigest()[:8] if over else ""
    if over_args:
        tag += "-args-" + hashlib.sha256(json.dumps(over_args, sort_keys=True).encode()).hexdigest()[:8]
    # runs with the kernels pinned at import (fleetwise/floats.py, since 2e9fc6a) keep their own checkpoints
    tag += "-native" if os.environ.get("FLEETWISE_NATIVE_KERNELS") else "-pinned"
    ckpt = f"/tmp/graph-marl-seed-probe-{kind}-s{seed}{tag}.pt"
    r = train_job({"name": kind, "cfg": cfg, "args": asdict(args), "ckpt": ckpt, "validation": val})
    info = r["info"]
    print(kind, "seed", seed, "best step", info["best_step"], "gate", (info["validation"] or {}).get("gate"))
    pol = load_trained(ckpt, cfg)
    # evaluated in the default world (test segments, arXiv) whatever it trained on, but for what limits the actions
    cfg = replace(GraphMARLConfig(), **{k: v for k, v in over.items() if k in ACTION_LIMITS})
    seeds = list(range(1000, 1010))
    for label, ref, kw in (("test vs static", "static", {}),
                           ("arXiv@0.7 vs least_loaded", "least_loaded",
                            {"trace": load_trace("arxiv-summarization"), "load": 0.7})):
        base = {x["seed"]: x for x in evaluate(cfg, ref, seeds, **kw)}
        for monitor in ("", " +monitor", " +monitor+guard"):
            pol.fallback = RuleFallback(cfg.slo_target) if monitor else None
            pol.guard = monitored(pol, ckpt, cfg).guard if monitor == " +monitor+guard" else None
            rows = {x["seed"]: x for x in evaluate(cfg, pol, seeds, **kw)}
            out = []
            for k in ("latency_p99_s", "cost_usd"):
                ch = paired_change({s: base[s][k] for s in base}, {s: rows[s][k] for s in rows})
                out.append(f"{k} {np.mean([x[k] for x in rows.values()]):.3f} {ch.mean:+.1%} "
                           f"[{ch.lo:+.1%}, {ch.hi:+.1%}]")
            att = np.mean([x["slo_attainment"] for x in rows.values()])
            print(kind, "seed", seed, label + monitor, "|", " | ".join(out),
                  f"| attainment {att:.3f}", flush=True)


if __name__ == "__main__":
    main()
