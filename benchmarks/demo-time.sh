#!/usr/bin/env bash
# How long `make demo` takes on a fresh clone, install included, and how big its venv is (quoted in README.md).
# Usage: benchmarks/demo-time.sh warm|cold [REPO]   (REPO: what to clone, default: this checkout's committed HEAD)
#   warm: pip's cache as it is; cold: an empty pip cache and matplotlib config (fresh PIP_CACHE_DIR, MPLCONFIGDIR)
set -euo pipefail
mode=${1:?warm or cold}
repo=${2:-$(cd "$(dirname "$0")/.." && pwd)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
git clone -q "$repo" "$dir/fleetwise"
cd "$dir/fleetwise"
if [ "$mode" = cold ]; then export PIP_CACHE_DIR="$dir/pip-cache" MPLCONFIGDIR="$dir/mpl"; fi
echo "commit $(git rev-parse --short HEAD), $mode pip cache, $(nproc --all) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
TIMEFORMAT='make demo: %R s wall, %U s user + %S s system CPU'
time make demo > demo.log 2>&1 || { tail -20 demo.log; exit 1; }
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -E "runs:|report written" demo.log
echo "venv: $(du -sm .venv | cut -f1) MB"
python3 -c "import sys; print('widest table line:', max(len(l) for l in open('demo.log', encoding='utf-8').read().splitlines() if l[:1] in '│┃┏┡└ '))"
