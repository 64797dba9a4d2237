#!/usr/bin/env bash
# The RL scaler at its full budget (issue 17; docs/autoscaling.md, docs/learning.md): the recipe's training on
# ServeGen days 2-6 (12,000 PPO steps after behaviour cloning to slo_aware, the SLO constraint's multiplier, checkpoint
# choice and the gate on 4 windows of day 7), then every scaler on the whole of day 1, 5 seeds.
# About 35-45 minutes of 2 CPUs (the reproduction alone was 32 min before the recipe). Writes results/platform/
# (result.json, rl_scaler.npz + rl_scaler.card.json with the gate's result, rl_scaler.curve.json: the learning curve
# with the multiplier) and prints the JSON of `{scaler: {slo_attainment, cost_per_mtok_usd, oscillations,
# lost_requests, ...}}`; the table's "gate" column and caption say whether the checkpoint passed.
# Usage: benchmarks/rl-scaler-full.sh [extra reproduce options, e.g. --db results/full.duckdb]
set -euo pipefail
cd "$(dirname "$0")/.."
echo "commit $(git rev-parse --short HEAD), $(nproc) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
TIMEFORMAT='reproduce platform (full): %R s wall, %U s user + %S s system CPU'
time OMP_NUM_THREADS=1 python -m fleetwise reproduce platform --json "$@" > results/platform-full.json
python - <<'PY'
import json
d = json.load(open("results/platform-full.json"))
for name in ("slo_aware", "rl"):
    r = d.get(name, {})
    print(name, {k: r.get(k) for k in ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests",
                                         "gate_passed")})
print("gate:", json.dumps((d["_meta"].get("gates") or {}).get("rl", {}).get("validation")))
PY
