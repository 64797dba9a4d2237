#!/usr/bin/env bash
# The RL scaler at its full budget (issue 17; docs/autoscaling.md, docs/learning.md): the recipe's training of the
# gated model-level correction of slo_aware (CEM from calm_hour_low_need: 3 searches, seeds 0-2, each 6 iterations of 8
# candidates on its own 4 two-hour windows of ServeGen days 2-6 and 2 of real traces (azure-conv, mooncake) at loads
# 0.5-0.9; the parameters kept over all three on whole-day runs of days 7 and 8, the gate on one of each of days 7-10
# with other seeds), then the RL scaler and slo_aware on the whole of day 1 (the test day), 5 seeds. Measured
# 2026-12-06 from calm_hour_low_need, validated on days 7-10: 40 min 12 s wall on 2 CPUs (validated on day 7 alone
# the same morning: 35 min 0 s; from calm_hour_need_restore, 2026-12-05: one search alone, --set searches=1,
# 18 min 26 s).
# Needs fleetwise on PATH's python (a venv). The other scalers' figures are `fleetwise reproduce platform` (all of
# them, with this training inside). Writes results/platform-rl/platform/ (result.json, rl_scaler.npz +
# rl_scaler.card.json with the gate, rl_scaler.curve.json) and prints `{scaler: {slo_attainment, cost_per_mtok_usd,
# oscillations, lost_requests}}` and rl's paired change against slo_aware.
# Usage: benchmarks/rl-scaler-full.sh [--quick] [--init NAME] [--set FIELD=JSON ...] [--name NAME]
#   --init NAME: the search's start (scaler_cem.INITS, e.g. calm_lift); --set: a ScalerCEMConfig field for this
#   run (e.g. --set slack=0.0005, --set val_window_s=86400); results then go to results/platform-rl-NAME/ and
#   results/platform-rl-NAME.json (NAME: --name, else the init's name)
set -euo pipefail
cd "$(dirname "$0")/.."
echo "commit $(git rev-parse --short HEAD), $(nproc --all) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
QUICK=False
NAME=""
SETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=True; shift ;;
    --init) SETS+=("init=\"$2\""); NAME="${NAME:-$2}"; shift 2 ;;
    --set) SETS+=("$2"); shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    *) echo "usage: $0 [--quick] [--init NAME] [--set FIELD=JSON ...] [--name NAME]" >&2; exit 2 ;;
  esac
done
OUT=results/platform-rl${NAME:+-$NAME}
mkdir -p "$OUT"
export RL_SCALER_SETS="${SETS[*]:-}"
TIMEFORMAT='rl scaler vs slo_aware: %R s wall, %U s user + %S s system CPU'
# (a script file, not stdin: reproduce platform's evaluation spawns worker processes, which import the main module)
SCRIPT=$(mktemp --suffix .py)
trap 'rm -f "$SCRIPT"' EXIT
cat > "$SCRIPT" <<PY
import json
import os
from fleetwise.learn import scaler_cem
from fleetwise.reproduce import platform as P

if __name__ == "__main__":
    sets = {}
    try:  # (an unknown field or a bad value fails here, in one line, before any run)
        for item in os.environ["RL_SCALER_SETS"].split():
            k, _, v = item.partition("=")
            sets[k] = json.loads(v)
        for b in scaler_cem.CEM_BUDGETS.values():
            b.update(sets)
            scaler_cem.ScalerCEMConfig(**b)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"rl-scaler-full.sh: --set {item!r}: {e}")
    r = P.run(quick=$QUICK, db="$OUT/fleetwise.duckdb", scalers=["slo_aware", "rl"], progress=True)
    json.dump(r, open("$OUT.json", "w"), default=float, indent=1)
    keep = ("slo_attainment", "cost_per_mtok_usd", "oscillations", "lost_requests", "gate_passed")
    print(json.dumps({n: {k: r[n].get(k) for k in keep} for n in ("slo_aware", "rl")}, default=float))
    rl = r["rl"]
    print(json.dumps({k: rl[k] for k in rl if k.startswith("vs_slo_aware")}, default=float))
    print("gate:", json.dumps(r["_meta"]["gates"]["rl"]["validation"], default=float))
PY
time OMP_NUM_THREADS=1 python "$SCRIPT"
