#!/usr/bin/env bash
# TORTA at the full budget (docs/torta.md): 3 training seeds x 2 agents x 4 topologies, each trained by CEM
# (fleetwise.learn.torta_cem: 8 iterations x 12 candidates x 4 fresh training days at loads 0.45/0.55/0.7, paired with
# least_loaded, response time the objective and cost the constraint (--objective cost: the other way round, as
# before 2026-12-05); the best of the rule and every iteration on 6
# validation days, the gate on 6 further ones), then every policy on 8 held-out test days. Extra arguments go to
# `fleetwise reproduce torta` (e.g. --learner ppo: 4,800 PPO slots per agent, up to 8 min each on one core).
# Usage: benchmarks/torta-full.sh [OUT_DIR] [WORKERS] [ARGS...]
set -euo pipefail
out=${1:-/tmp/torta-full}
workers=${2:-$(nproc)}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$out"
echo "$(nproc --all) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
TIMEFORMAT='reproduce torta (full): %R s wall, %U s user CPU'
time fleetwise reproduce torta --json --workers "$workers" --db "$out/fleetwise.duckdb" "$@" > "$out/result.json"
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for topo, res in r.items():
    if topo.startswith("_"):
        continue
    for rule in ("least_loaded", "least_loaded_pack_short"):
        v = res["torta"]["changes"].get(f"vs_{rule}")
        if v:
            print(topo, "vs", rule, {m: f"{c['change']:+.1%} [{c['ci95'][0]:+.1%}, {c['ci95'][1]:+.1%}]"
                                     for m, c in v.items()})
    print(topo, "gates passed:", [g["passed"] for g in res["torta"]["gate"]], "unserved:",
          {p: f"{res[p]['rejected_share']:.2%}" for p in ("torta", "least_loaded")})
PY
