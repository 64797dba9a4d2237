"""What a decision-service client can make a scaler keep (docs/security.md, "Known limits"):

1. ever new model names: ``--calls`` calls of ``--names`` groups, each of a model never sent before; the growth of
   the process's resident memory and the per-model entries the scaler keeps;
2. a clock that does not advance: ``--calls`` calls with the same ``time_s`` for one model; the last call's time
   and the stabilization window's length.

    python benchmarks/scaler_state_memory.py [--scaler hpa] [--calls 30] [--names 10000]
"""

from __future__ import annotations

import argparse
import gc
import resource
import time

from fleetwise.control.protocols import GroupState, ScaleObs
from fleetwise.policies import make


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def group(model: str, key: str) -> GroupState:
    return GroupState(key=key, model=model, gpu="A100-80GB", region="us-east-1", zone="a", pool="on_demand", ready=2,
                      starting=0, draining=0, min_replicas=0, max_replicas=16, waiting=1, running=4, kv_used=0.4,
                      busy=0.8, arrivals_rps=3.0, capacity_rps=2.0, price_usd_per_hour=3.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scaler", default="hpa")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--names", type=int, default=10_000)
    ap.add_argument("--same-time-calls", type=int, default=20_000)
    a = ap.parse_args()
    s = make("scaler", a.scaler, {})
    gc.collect()
    r0 = _rss_mb()
    t0 = time.perf_counter()
    for c in range(a.calls):
        gs = [group(f"m{c}-{i}", f"m{c}-{i}/a/od") for i in range(a.names)]
        s.scale(ScaleObs(time_s=60.0 * c, epoch_s=60.0, groups=gs))
    gc.collect()
    kept = len(getattr(s, "_win", getattr(s, "target", {})))
    print(f"{a.scaler}: {a.calls} calls x {a.names:,} new model names: RSS +{_rss_mb() - r0:.1f} MB "
          f"(peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB), {kept:,} models kept, "
          f"{time.perf_counter() - t0:.1f} s")
    s = make("scaler", a.scaler, {})
    obs = ScaleObs(time_s=0.0, epoch_s=60.0, groups=[group("m", "m/a/od")])
    t0 = time.perf_counter()
    for k in range(a.same_time_calls):
        if k == a.same_time_calls - 100:
            t1 = time.perf_counter()
        s.scale(obs)
    last = (time.perf_counter() - t1) / 100 * 1e6
    win = getattr(s, "_win", {}).get("m")
    print(f"{a.scaler}: {a.same_time_calls:,} calls at the same time_s: the last 100 took {last:.0f} us each; "
          f"window entries {len(win.recs) if win is not None else 'n/a'} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
