#!/usr/bin/env bash
# Simulator speed of several commits side by side (docs/benchmarks.md, single-fleet speed): each REV is checked out
# in a temporary git worktree, and `fleetwise bench sim-speed --sizes N --json` runs once per REV per round, the
# REVs interleaved in fresh processes, so that a drift of a shared machine moves them alike. Prints requests/s,
# events and TTFT p99 per run, then each REV's sum over the rounds and its ratio to the first REV's sum.
#
#   FLEETWISE_DATA=../shared/data benchmarks/sim_speed_ab.sh [-n ROUNDS] [-s REQUESTS] REV [REV ...]
#   FLEETWISE_DATA=../shared/data benchmarks/sim_speed_ab.sh -n 5 20f7832 c3815a9 HEAD
#
# Uses the Python of .venv (make install-test); each worktree's src/ goes first on PYTHONPATH.
set -euo pipefail
rounds=3
size=100000
while getopts "n:s:" opt; do
  case $opt in
    n) rounds=$OPTARG ;;
    s) size=$OPTARG ;;
    *) echo "usage: $0 [-n ROUNDS] [-s REQUESTS] REV [REV ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ]; then echo "usage: $0 [-n ROUNDS] [-s REQUESTS] REV [REV ...]" >&2; exit 2; fi
root=$(git rev-parse --show-toplevel)
py=$root/.venv/bin/python
[ -x "$py" ] || { echo "error: $py not found: run 'make install-test' first" >&2; exit 1; }
export FLEETWISE_DATA=${FLEETWISE_DATA:-$root/../shared/data}
tmp=$(mktemp -d)
cleanup() { for d in "$tmp"/wt*; do [ -d "$d" ] && git -C "$root" worktree remove --force "$d"; done; rm -rf "$tmp"; }
trap cleanup EXIT
i=0
for rev in "$@"; do
  git -C "$root" worktree add -q --detach "$tmp/wt$i" "$rev"
  i=$((i + 1))
done
for r in $(seq "$rounds"); do
  i=0
  for rev in "$@"; do
    out=$(cd "$tmp" && PYTHONPATH="$tmp/wt$i/src" "$py" -m fleetwise bench sim-speed --sizes "$size" --json)
    echo "$out" | "$py" -c "
import json, sys
d = json.load(sys.stdin)['$size']
print('round $r', '$rev', round(d['requests_per_s']), 'req/s', d['events'], 'events', 'ttft_p99', round(d['ttft_p99_s'], 4))"
    i=$((i + 1))
  done
done | tee "$tmp/runs.txt"
"$py" - "$tmp/runs.txt" "$@" <<'EOF'
import sys
runs = [line.split() for line in open(sys.argv[1])]
revs = sys.argv[2:]
sums = {rev: sum(int(x[3]) for x in runs if x[2] == rev) for rev in revs}
for rev in revs:
    print(f"{rev}: sum {sums[rev]:,} req/s over the rounds, {sums[rev] / sums[revs[0]]:.3f} x {revs[0]}")
EOF
