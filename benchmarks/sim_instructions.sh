#!/usr/bin/env bash
# Machine instructions the simulator executes per simulated request, for several commits (docs/benchmarks.md,
# single-fleet speed): a count under valgrind's callgrind, of the run only (not the imports or the build), so it is
# the same on a busy machine and an idle one. Unlike sim_bytecodes.py it counts the C work too (object
# allocation, dict lookups, attribute stores, heapq); unlike a timing it does not see cache misses.
#
#   FLEETWISE_DATA=../shared/data benchmarks/sim_instructions.sh [-s REQUESTS] REV [REV ...]
#   FLEETWISE_DATA=../shared/data benchmarks/sim_instructions.sh -s 5000 20e7d2c HEAD
#
# vidur-parity, round robin, REQUESTS requests (default 5,000; about 15 s per REV). Needs valgrind, gcc and
# valgrind's headers (Debian: valgrind), and the Python of .venv (make install-test). Each REV is checked out in a
# temporary git worktree whose src/ goes first on PYTHONPATH; PYTHONHASHSEED=0 for the same count every time.
set -euo pipefail
size=5000
while getopts "s:" opt; do
  case $opt in
    s) size=$OPTARG ;;
    *) echo "usage: $0 [-s REQUESTS] REV [REV ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ]; then echo "usage: $0 [-s REQUESTS] REV [REV ...]" >&2; exit 2; fi
root=$(git rev-parse --show-toplevel)
py=$root/.venv/bin/python
[ -x "$py" ] || { echo "error: $py not found: run 'make install-test' first" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "error: valgrind not found (Debian: apt-get install valgrind)" >&2; exit 1; }
[ -f /usr/include/valgrind/callgrind.h ] || { echo "error: valgrind's headers not found" >&2; exit 1; }
export FLEETWISE_DATA=${FLEETWISE_DATA:-$root/../shared/data}
tmp=$(mktemp -d)
cleanup() { for d in "$tmp"/wt*; do [ -d "$d" ] && git -C "$root" worktree remove --force "$d"; done; rm -rf "$tmp"; }
trap cleanup EXIT
# callgrind's client requests, callable from Python through ctypes: count only between start and stop
cat > "$tmp/cgctl.c" <<'EOF'
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT; }
void cg_stop(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
EOF
gcc -O2 -shared -fPIC -o "$tmp/libcgctl.so" "$tmp/cgctl.c"
cat > "$tmp/run.py" <<EOF
import ctypes, gc, json, sys
from fleetwise.scenario import build, load_scenario
lib = ctypes.CDLL("$tmp/libcgctl.so")
sc = load_scenario("vidur-parity")
b = build(sc, sc.seed, num_requests=int(sys.argv[1]))
ctl = b.controller("round_robin")
gc.collect()
gc.freeze()
lib.cg_start()
rec = b.sim.run(ctl)
lib.cg_stop()
print(json.dumps({"events": b.sim.events, "ttft_p99_s": round(float(b.summary(rec)["ttft_p99_s"]), 6)}))
EOF
i=0
first=""
for rev in "$@"; do
  i=$((i + 1))
  wt=$tmp/wt$i
  git -C "$root" worktree add -q --detach "$wt" "$rev"
  out=$(PYTHONHASHSEED=0 PYTHONPATH=$wt/src valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \
        --callgrind-out-file="$tmp/cg$i.%p" "$py" "$tmp/run.py" "$size" 2>/dev/null | tail -1)
  ir=$(grep -h "^summary" "$tmp"/cg$i.*.1 | awk '{print $2}')
  [ -n "$first" ] || first=$ir
  echo "$rev ($(git -C "$root" rev-parse --short "$rev")): $((ir / size)) instructions per request," \
       "$(awk -v a="$ir" -v b="$first" 'BEGIN { printf "%.3f", a / b }') x the first; $out"
done
