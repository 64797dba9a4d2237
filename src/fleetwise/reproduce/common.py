"""What the paper reproductions share: spread over seeds and storing evaluation rows in the results store."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Iterable


def summarize_rows(rows: list[dict], metrics: Iterable[str]) -> dict:
    """Per metric the mean over seeds and its 95% bootstrap interval (``<metric>_ci95``), plus ``seeds``."""
    from fleetwise.metrics.stats import bootstrap_ci

    out: dict = {}
    for k in metrics:
        ci = bootstrap_ci([r[k] for r in rows])
        out[k] = ci.mean
        out[f"{k}_ci95"] = [ci.lo, ci.hi]
    out["seeds"] = len(rows)
    return out


def store_rows(db: str | None, experiment: str, scenario: str, policy: str, rows: list[dict], *,
               level: str = "router", params: dict | None = None) -> None:
    """One ``runs`` row per evaluated seed (numeric fields as metrics), so ``fleetwise report`` shows them.
    ``level`` says which decision level the policy acts at (stored in ``level``, its name in ``policy``; a router
    or batcher also goes in that column, so the report's tables group by it)."""
    if not db:
        return
    from fleetwise.experiments.runner import code_version
    from fleetwise.experiments.store import Store

    version = code_version()
    res = []
    for r in rows:
        key = f"{experiment}|{scenario}|{json.dumps(params or {}, sort_keys=True)}|{policy}|{r['seed']}"
        router, batcher = (policy, "-") if level != "batcher" else ("-", policy)
        res.append({"run_id": hashlib.sha256(key.encode()).hexdigest()[:20], "experiment": experiment,
                    "scenario": scenario, "scenario_hash": "", "params": json.dumps(params or {}, sort_keys=True),
                    "router": router, "router_params": "{}", "batcher": batcher, "batcher_params": "{}",
                    "router_label": router, "batcher_label": batcher, "seed": r["seed"],
                    "requests": r.get("requests"), "code_version": version, "wall_s": 0.0, "status": "ok",
                    "finished_at": time.time(), "level": level, "policy": policy,
                    "scaler": policy if level == "scaler" else None,
                    "metrics": {k: v for k, v in r.items() if isinstance(v, (int, float)) and k != "seed"}})
    Store(db).write(res)
