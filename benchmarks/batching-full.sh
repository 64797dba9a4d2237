#!/usr/bin/env bash
# The full budget of `fleetwise reproduce batching` (docs/batching.md): DISPPO and its per-step-discount ablation,
# each warm-started at offload_greedy and trained 400,000 steps x 3 training seeds (6 jobs, 2 worker processes),
# 10 held-out segments + the batch-size sweep; then the same on arXiv lengths at load 0.7 (a trace training never saw).
# Estimated from the quick run's training speed: about 15-20 min per command on 2 free cores (not run yet: the
# shared machine's cores were busy; the quick figures in docs/batching.md are what was measured).
# Usage: benchmarks/batching-full.sh [OUTDIR]
set -euo pipefail
out=${1:-results/batching-full}
mkdir -p "$out"
TIMEFORMAT='%R s wall, %U s user CPU'
time fleetwise reproduce batching --json --workers 2 --db "$out/held-out/fleetwise.duckdb" > "$out/held-out.json"
time fleetwise reproduce batching --json --workers 2 --eval-trace arxiv-summarization --load 0.7 \
    --db "$out/arxiv/fleetwise.duckdb" > "$out/arxiv.json"
