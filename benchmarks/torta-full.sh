#!/usr/bin/env bash
# TORTA at the full budget (docs/torta.md): 3 training seeds x 2 agents x 4 topologies, 4,800 PPO slots each
# (behaviour-cloned at least_loaded, cost the objective and response time the constraint, both paired with the rule
# day by day; validation every rollout, early stopping, the gate on 4 further validation days), then every policy
# on 8 held-out test days. Not run at this budget since the cost objective (about 190 s per agent per 1,920 slots
# on one core: up to 8 min per agent, 24 agents): run it alone on a quiet machine.
# Usage: benchmarks/torta-full.sh [OUT_DIR] [WORKERS]
set -euo pipefail
out=${1:-/tmp/torta-full}
workers=${2:-$(nproc)}
mkdir -p "$out"
echo "$(nproc) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
TIMEFORMAT='reproduce torta (full): %R s wall, %U s user CPU'
time fleetwise reproduce torta --json --workers "$workers" --db "$out/fleetwise.duckdb" > "$out/result.json"
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for topo, res in r.items():
    if topo.startswith("_"):
        continue
    v = res["torta"]["changes"]["vs_least_loaded"]
    print(topo, {m: f"{c['change']:+.1%} [{c['ci95'][0]:+.1%}, {c['ci95'][1]:+.1%}]" for m, c in v.items()},
          "gates passed:", [g["passed"] for g in res["torta"]["gate"]])
PY
