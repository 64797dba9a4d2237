"""`--load` counts every prompt token as computed: what that means on a trace whose prompts share a prefix.
Quoted in docs/workloads.md (step 3).

Two Mooncake-format traces of 1,000 requests, one a second, 4,096 prompt and 100 output tokens each: one where
every request carries the same 8 prefix-block ids (a shared 4,096-token prefix), one without ids. Each is
replayed with `fleetwise simulate -s prefix-cache --trace T --load L --seed S --json` at several loads; mean over
the seeds of TTFT p50, SLO attainment and the prefix-hit rate.

Usage: python benchmarks/prefix_hits_load.py [--loads 0.7,2,4] [--seeds 0,1,2] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def _trace(path: Path, ids: bool) -> None:
    with open(path, "w") as f:
        for i in range(1000):
            line = {"timestamp": i * 1000, "input_length": 4096, "output_length": 100}
            if ids:
                line["hash_ids"] = list(range(8))
            f.write(json.dumps(line) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0.7,2,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    loads = [float(x) for x in a.loads.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for ids in (True, False):
            t = Path(d) / ("shared-ids.jsonl" if ids else "no-ids.jsonl")
            _trace(t, ids)
            for load in loads:
                got = []
                for s in seeds:
                    p = subprocess.run([sys.executable, "-m", "fleetwise", "simulate", "-s", "prefix-cache", "--trace",
                                        str(t), "--load", str(load), "--seed", str(s), "--json"],
                                       capture_output=True, text=True, check=True)
                    got.append(json.loads(p.stdout))
                rows.append({"trace": "shared block ids" if ids else "no block ids", "load": load,
                             **{k: sum(g[k] for g in got) / len(got)
                                for k in ("ttft_p50_s", "slo_attainment", "prefix_hit_rate")}})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"prefix-cache scenario, 1,000 requests of 4,096 + 100 tokens, seeds {a.seeds} (mean)")
    print("| trace | load | TTFT p50 | SLO attainment | prefix-hit rate |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['trace']} | {r['load']:g} | {r['ttft_p50_s'] * 1e3:.0f} ms | {r['slo_attainment']:.2f} | "
              f"{r['prefix_hit_rate']:.3f} |")


if __name__ == "__main__":
    main()
