"""What coarse timestamps do to a replay, and what `spread_ties` gives back. Quoted in docs/workloads.md.

Azure's conversation trace (sub-second timestamps) is replayed on the `default` scenario at load 0.7 three ways: as
recorded; with every arrival rounded down to its minute (as a trace logged per minute would have it); and the
rounded trace with `spread_ties: true` (each arrival drawn uniformly within its minute). Seeds 0..N-1, mean
[95% bootstrap CI]; the trace files are written to a temporary folder.

Usage: FLEETWISE_DATA=../shared/data python benchmarks/spread_ties.py [--seeds 5] [--tick 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from fleetwise.data import data_dir
from fleetwise.metrics.stats import mean_ci
from fleetwise.run import simulate
from fleetwise.scenario import Scenario, load_scenario
from fleetwise.workload.readers import read_azure

METRICS = ("ttft_p50_s", "ttft_p99_s", "queue_delay_mean_s", "e2e_p99_s", "slo_attainment")


def _write(path: Path, t: np.ndarray, p: np.ndarray, o: np.ndarray) -> None:
    with open(path, "w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        for a, b, c in zip(t.tolist(), p.tolist(), o.tolist()):
            f.write(f"{a!r},{b},{c}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tick", type=float, default=60.0, help="the resolution the rounded trace is logged at (s)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    w = read_azure(data_dir() / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv")
    t = w.arrival_s - w.arrival_s[0]
    rows: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        exact, rounded = Path(d) / "azure-conv.csv", Path(d) / "azure-conv-rounded.csv"
        _write(exact, t, w.prompt_tokens, w.output_tokens)
        _write(rounded, np.floor(t / a.tick) * a.tick, w.prompt_tokens, w.output_tokens)
        base = load_scenario("default").model_dump()
        for name, path, spread in (("as recorded", exact, False), (f"rounded to {a.tick:g} s", rounded, False),
                                   (f"rounded to {a.tick:g} s, spread_ties", rounded, True)):
            base["workload"] = {"kind": "trace", "path": str(path), "load": 0.7, "max_total_tokens": 8192,
                                "spread_ties": spread}
            sc = Scenario.model_validate(base)
            rows[name] = {k: [] for k in METRICS}
            for seed in range(a.seeds):
                _, s = simulate(sc, seed)
                for k in METRICS:
                    rows[name][k].append(float(s[k]))
    out = {name: {k: (lambda c: [c.mean, c.lo, c.hi])(mean_ci(v)) for k, v in m.items()}
           for name, m in rows.items()}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"default scenario, azure-conv at load 0.7, seeds 0-{a.seeds - 1}: mean [95% CI]")
    print("| trace | " + " | ".join(METRICS) + " |")
    print("|---|" + "---:|" * len(METRICS))
    for name, m in out.items():
        print(f"| {name} | " + " | ".join(f"{v[0]:.3g} [{v[1]:.3g}, {v[2]:.3g}]" for v in m.values()) + " |")


if __name__ == "__main__":
    main()
