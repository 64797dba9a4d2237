#!/usr/bin/env bash
# Graph-MARL at the full budget (docs/graph-marl.md): 200 MAPPO updates x 4 episodes per learned variant
# (graph_marl, flat_marl, ippo) on the shared recipe, 5 validation segments for checkpoint choice and the gate,
# 10 held-out test segments; then the same checkpoints on the other real traces at load 0.7.
# Usage: benchmarks/graph-marl-full.sh [OUT_DIR]   (wall time and load average printed; on a shared 2-core
# machine run it under `flock /work/heavy.lock`). Checkpoints are kept in OUT_DIR/graph-marl and resumed.
# Measured 2026-12-02 (2 cores, alone): 19 min 31 s wall for the held-out part at commit 1f30d2b (200 updates
# each, no early stop); at 2bac7b7 (Graph-MARL's step size 3e-3) on the same folder, where the flat and IPPO
# checkpoints resumed complete, 11 min 48 s; then 35 s (Mooncake) and 97 s (arXiv) reusing the checkpoints;
# figures in docs/graph-marl.md. (`nproc` counts OMP_NUM_THREADS; `nproc --all` the CPUs.)
set -euo pipefail
out=${1:-results/graph-marl-full}
mkdir -p "$out"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc --all) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
TIMEFORMAT='%R s wall, %U s user CPU'
time python -m fleetwise reproduce graph-marl --json --workers 2 --db "$out/results.duckdb" > "$out/held-out.json"
for t in mooncake arxiv-summarization; do
  time python -m fleetwise reproduce graph-marl --json --db "$out/results.duckdb" --eval-trace "$t" --load 0.7 \
    > "$out/$t-0.7.json"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python - "$out" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(f.read_text())
    best = r["_meta"]["best_rule"]
    print(f.name, "best rule:", best)
    for n in ("graph_marl", "flat_marl", "ippo", best):
        x = r[n]
        print(f"  {n:12s} P99 {x['latency_p99_s']:.3f} s  cost {x['cost_usd']:.1f}  SLO {x['slo_attainment']:.3f}"
              + (f"  vs {best}: P99 {x['vs_best_rule_latency_p99_s_change']:+.1%} cost {x['vs_best_rule_cost_usd_change']:+.1%}"
                 f"  gate {'passed' if (x.get('gate') or {}).get('passed') else 'failed'}" if n != best else ""))
PY
