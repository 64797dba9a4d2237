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


def with_trace(data: dict, path: str, load: float | str = 0.7, start_s: float = 0.0, end_s: float = DAY
               ) -> tuple[dict, list[str]]:
    """The scenario evaluated on a user's trace over ``[start_s, end_s)`` of the day: the trace replaces the
    arrivals and lengths (fitted to ``load`` of the fleet it starts with, block-bootstrapped or windowed per seed
    to fill the window: fleetwise.workload.adapt), each request drawn a tenant (chat, code, batch) with the share
    that tenant has of the scenario's own requests in that window, so each keeps its model, SLO class, origins,
    rate limits and quotas; the faults and spot traces stay at their time of day, as in :func:`windowed`.
    Returns (scenario dict, the override lines)."""
    from fleetwise.workload.spec import trace_in_place_of

    d = windowed(data, start_s, end_s, day=0)
    spec, lines = trace_in_place_of(d["workload"], path, load)
    spec["duration_s"] = end_s - start_s
    d["workload"] = spec
    kept = [f"{f['kind']} fault at {f['at_s']:.0f} s" for f in d.get("platform", {}).get("faults", [])]
    lines.append(f"window {start_s / 3600:g}h-{end_s / 3600:g}h of the scenario's day: "
                 + (", ".join(kept) if kept else "no fault in it")
                 + "; spot capacity from the same hours of the real spot traces")
    return d, lines
