"""Topology builders: pure functions returning a :class:`Fleet`.

* :func:`continental_backbone`: real catalog regions, fully meshed (every cloud region reaches every other over
  the provider backbone / internet); RTT measured or from the distance formula, egress from the cloud matrices.
* :func:`grid`, :func:`ring`, :func:`random_geometric`: synthetic planar layouts. Every synthetic region takes the
  real 2023 economics of a grid zone, cycling through ``zones`` (default: the 15 zones with both an hourly carbon
  and an hourly price series), and that zone's UTC offset, so local time matches its hourly series. Link RTTs come
  from the planar distance through the same formula as real regions; lat/lon are an equirectangular projection
  around (0, 0) for display only.
* :func:`single_region`: one region, no links.

All links are added in both directions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from fleetwise.errors import InputError
from fleetwise.fleet import zones as _z
from fleetwise.fleet.network import (
    DEFAULT_EGRESS_USD_PER_GB,
    EARTH_RADIUS_KM,
    region_egress_usd_per_gb,
    region_rtt_s,
    rtt_from_distance_s,
)
from fleetwise.fleet.regions import CATALOG, DEFAULT_BACKBONE, get_region
from fleetwise.fleet.types import DEFAULT_BANDWIDTH_GBPS, Fleet, Link, Region

KM_PER_DEGREE = math.pi * EARTH_RADIUS_KM / 180.0  # ~111.2 km per degree of latitude
SYNTHETIC_CLOUD = "synthetic"


def continental_backbone(
    cloud_regions: Iterable[str | Region] | None = None,
    *,
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS,
    use_measured_rtt: bool = True,
    link_overrides: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
) -> Fleet:
    """Full mesh over real regions (catalog names or :class:`Region` objects; default :data:`DEFAULT_BACKBONE`).

    ``link_overrides`` maps (src, dst) to replacement Link fields (``rtt_s``, ``bandwidth_gbps``,
    ``egress_usd_per_gb``) for that direction only.
    """
    items = list(DEFAULT_BACKBONE if cloud_regions is None else cloud_regions)
    regions = [
        r if isinstance(r, Region) else get_region(r, where=f"backbone regions[{k}]") for k, r in enumerate(items)
    ]
    overrides = dict(link_overrides or {})
    links = []
    names = {r.name for r in regions}
    for (s, d), fields in overrides.items():
        for end in (s, d):
            if end not in names:
                raise InputError(f"backbone link override {s}->{d}: region {end!r} is not in the fleet")
        bad = set(fields) - {"rtt_s", "bandwidth_gbps", "egress_usd_per_gb"}
        if bad:
            raise InputError(f"backbone link override {s}->{d}: unknown fields {sorted(bad)}")
    for a in regions:
        for b in regions:
            if a.name == b.name:
                continue
            ln = Link(
                a.name,
                b.name,
                rtt_s=region_rtt_s(a, b, use_measured=use_measured_rtt),
                bandwidth_gbps=bandwidth_gbps,
                egress_usd_per_gb=region_egress_usd_per_gb(a, b),
            )
            if (a.name, b.name) in overrides:
                ln = replace(ln, **overrides[(a.name, b.name)])
            links.append(ln)
    return Fleet(tuple(regions), tuple(links), name="backbone")


def single_region(name: str = "local", *, grid_zone: str | None = None, **overrides: Any) -> Fleet:
    """One region, no links. A catalog name gives that real region; any other name a region in ``grid_zone``
    (default US-MIDA-PJM, the grid of aws us-east-1) at the zone's reference city. ``overrides`` are Region fields.
    """
    base: Region | None = None
    if name in CATALOG or ":" in name or "/" in name:
        base = get_region(name, where="single region")
    if base is not None:
        if grid_zone is not None:
            overrides["grid_zone"] = grid_zone
        region = base.with_overrides(**overrides) if overrides else base
    else:
        zone = grid_zone or "US-MIDA-PJM"
        lat, lon = _z.ZONE_REFERENCE_LATLON.get(zone, (0.0, 0.0))
        fields: dict[str, Any] = {
            "cloud": "local",
            "lat": lat,
            "lon": lon,
            "utc_offset_h": _z.ZONE_UTC_OFFSET_H.get(zone, 0.0),
            "note": f"single region with the 2023 economics of {zone}",
        }
        fields.update(overrides)
        region = Region(name=name, grid_zone=zone, **fields)
    return Fleet((region,), (), name="single")


def _check_zones(zones: Sequence[str] | None) -> tuple[str, ...]:
    zs = tuple(_z.ECONOMIC_ZONES if zones is None else zones)
    if not zs:
        raise InputError("zones: expected at least one grid zone")
    for z in zs:
        if z not in _z.ECONOMIC_ZONES:
            raise InputError(
                f"zones: {z!r} has no hourly carbon and price series; use one of {', '.join(_z.ECONOMIC_ZONES)}"
            )
    return zs


def _synthetic_fleet(
    name: str,
    prefix: str,
    xy_km: np.ndarray,
    edges: Iterable[tuple[int, int]],
    zones: Sequence[str] | None,
    bandwidth_gbps: float,
    egress_usd_per_gb: float,
    labels: Sequence[str] | None = None,
) -> Fleet:
    zs = _check_zones(zones)
    xy = np.asarray(xy_km, dtype=float).reshape(-1, 2)
    centered = xy - xy.mean(axis=0) if len(xy) else xy
    regions = []
    for k, (x, y) in enumerate(centered):
        zone = zs[k % len(zs)]
        lat = float(np.clip(y / KM_PER_DEGREE, -89.0, 89.0))
        lon = float((x / KM_PER_DEGREE + 180.0) % 360.0 - 180.0)
        regions.append(
            Region(
                name=f"{prefix}-{labels[k] if labels else k}",
                cloud=SYNTHETIC_CLOUD,
                grid_zone=zone,
                lat=lat,
                lon=lon,
                utc_offset_h=_z.ZONE_UTC_OFFSET_H[zone],
                note=f"synthetic; 2023 economics of {zone}",
            )
        )
    links = []
    seen: set[tuple[int, int]] = set()
    for i, j in edges:
        i, j = int(i), int(j)
        if i == j or (min(i, j), max(i, j)) in seen:
            continue
        seen.add((min(i, j), max(i, j)))
        rtt = rtt_from_distance_s(float(np.hypot(*(xy[i] - xy[j]))))
        for a, b in ((i, j), (j, i)):
            links.append(Link(regions[a].name, regions[b].name, rtt, bandwidth_gbps, egress_usd_per_gb))
    return Fleet(tuple(regions), tuple(links), name=name)


def _positive_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise InputError(f"{what}: expected an integer >= 1, got {v!r}")
    return int(v)


def _positive(v: Any, what: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InputError(f"{what}: expected a number > 0, got {v!r}") from None
    if not (math.isfinite(f) and f > 0):
        raise InputError(f"{what}: expected a number > 0, got {v!r}")
    return f


def grid(
    rows: int,
    cols: int,
    spacing_km: float = 500.0,
    *,
    zones: Sequence[str] | None = None,
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS,
    egress_usd_per_gb: float = DEFAULT_EGRESS_USD_PER_GB,
) -> Fleet:
    """rows x cols regions ``grid-r-c`` on a square lattice, linked to their 4 neighbours, ``spacing_km`` apart."""
    rows, cols = _positive_int(rows, "grid rows"), _positive_int(cols, "grid cols")
    spacing_km = _positive(spacing_km, "grid spacing_km")
    xy = np.array([(c * spacing_km, -r * spacing_km) for r in range(rows) for c in range(cols)], dtype=float)
    edges = []
    for r in range(rows):
        for c in range(cols):
            k = r * cols + c
            if c + 1 < cols:
                edges.append((k, k + 1))
            if r + 1 < rows:
                edges.append((k, k + cols))
    labels = [f"{r}-{c}" for r in range(rows) for c in range(cols)]
    return _synthetic_fleet("grid", "grid", xy, edges, zones, bandwidth_gbps, egress_usd_per_gb, labels)


def ring(
    n: int,
    spacing_km: float = 1000.0,
    *,
    zones: Sequence[str] | None = None,
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS,
    egress_usd_per_gb: float = DEFAULT_EGRESS_USD_PER_GB,
) -> Fleet:
    """n regions ``ring-k`` evenly on a circle of circumference n * spacing_km, each linked to its 2 neighbours."""
    n = _positive_int(n, "ring n")
    spacing_km = _positive(spacing_km, "ring spacing_km")
    radius = n * spacing_km / (2 * math.pi)
    ang = 2 * math.pi * np.arange(n) / n
    xy = np.column_stack([radius * np.cos(ang), radius * np.sin(ang)])
    edges = [(k, (k + 1) % n) for k in range(n)] if n > 1 else []
    return _synthetic_fleet("ring", "ring", xy, edges, zones, bandwidth_gbps, egress_usd_per_gb)


def random_geometric(
    n: int,
    radius: float = 0.3,
    rng: np.random.Generator | int | None = None,
    *,
    side_km: float = 5000.0,
    zones: Sequence[str] | None = None,
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS,
    egress_usd_per_gb: float = DEFAULT_EGRESS_USD_PER_GB,
) -> Fleet:
    """n regions ``rgg-k`` uniform in a ``side_km`` square, linked when closer than ``radius`` x side.

    Always connected: while there are several components, the shortest pair between the component of region 0 and
    the rest is linked too.
    """
    n = _positive_int(n, "random_geometric n")
    radius = _positive(radius, "random_geometric radius")
    side_km = _positive(side_km, "random_geometric side_km")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    pts = gen.random((n, 2))
    d = np.hypot(pts[:, None, 0] - pts[None, :, 0], pts[:, None, 1] - pts[None, :, 1])
    adj = (d <= radius) & ~np.eye(n, dtype=bool)
    while True:
        ncomp, label = connected_components(csr_matrix(adj.astype(np.int8)), directed=False)
        if ncomp <= 1:
            break
        inside = label == label[0]
        sub = np.where(inside[:, None] & ~inside[None, :], d, np.inf)
        i, j = np.unravel_index(int(np.argmin(sub)), sub.shape)
        adj[i, j] = adj[j, i] = True
    ii, jj = np.nonzero(np.triu(adj, 1))
    return _synthetic_fleet(
        "random_geometric", "rgg", pts * side_km, zip(ii, jj), zones, bandwidth_gbps, egress_usd_per_gb
    )
