"""Windows of a platform scenario's day (the scenario as a dict): what ``reproduce platform`` evaluates and what the
RL scaler trains on (fleetwise.learn.scaler_cem)."""

from __future__ import annotations

import json

DAY = 86400.0


def windowed(data: dict, start_s: float, end_s: float, day: int = 0) -> dict:
    """The scenario dict restricted to ``[start_s, end_s)`` of ServeGen day ``day`` (0-based): workload parts cut to
    the window, faults and spot traces shifted so that they keep their time of day."""
    d = json.loads(json.dumps(data))
    off = day * DAY + start_s
    for part in d["workload"].get("parts", [d["workload"]]):
        w = part.get("workload", part)
        if w.get("kind") == "servegen":
            w["start_s"], w["end_s"] = off, day * DAY + end_s
    plat = d.setdefault("platform", {})
    plat["duration_s"] = end_s - start_s
    plat["faults"] = [{**f, "at_s": f["at_s"] - start_s} for f in plat.get("faults", [])
                      if start_s <= f["at_s"] < end_s]
    for dep in d["deployments"]:
        if dep.get("pool") == "spot":
            dep["spot_offset_s"] = dep.get("spot_offset_s", 0.0) + off
    return d
