"""Network numbers between regions: distance, round-trip time and egress price.

RTT
---
Measured where a published measurement exists (:data:`MEASURED_RTT_MS`), else estimated from the great-circle
distance ``d`` between the two metros::

    rtt_s = 2 * d * ROUTE_INFLATION / SIGNAL_SPEED_M_PER_S + RTT_FIXED_S

with light in fibre at ``SIGNAL_SPEED_M_PER_S = 2e8`` m/s (refractive index ~1.5), ``ROUTE_INFLATION = 1.5``
(fibre paths are longer than the great circle) and ``RTT_FIXED_S = 2 ms`` (switching, in-region hops). The two
constants were fitted by least squares to the measured pairs below whose RTT is under twice the fibre lower bound
``2 d / 2e8 m/s`` (32 pairs, routes without a continental detour; fit: inflation 1.53, fixed term 1.4 ms;
rounded; median absolute error on those pairs 14 %, range -23 % .. +36 %).
Pairs that detour (e.g. Europe-Japan, ~2.5x the lower bound) are underestimated by the formula, which is why
measured values win where they exist.

Egress
------
* Same cloud, both regions in that cloud's matrix: ``network_cost/<cloud>_transmission_cost_matrix.csv``
  (row = source). The cells used by the catalog are stored in :data:`_EGRESS` (compact form; the tests compare every
  catalog pair with the file), recomputable with :func:`egress_table_from_data`.
* Same cloud, a region not in the matrix: that cloud's :data:`INTER_REGION_EGRESS_USD_PER_GB`.
* Different clouds: the source cloud's internet egress price, :data:`INTERNET_EGRESS_USD_PER_GB`.
* Same region: 0.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from fleetwise.errors import InputError

EARTH_RADIUS_KM = 6371.0088  # mean Earth radius (IUGG)
SIGNAL_SPEED_M_PER_S = 2.0e8  # light in optical fibre, ~c / 1.47
ROUTE_INFLATION = 1.5  # fibre route length / great-circle distance, fitted to MEASURED_RTT_MS (1.53)
RTT_FIXED_S = 0.002  # fixed per-path term, fitted to MEASURED_RTT_MS (1.4 ms), rounded up

# Internet egress list prices, USD/GB, first pricing tier, from North America / Europe regions (public price pages
# of each cloud; approximate, prices differ by source region and volume tier). Used for traffic between clouds.
INTERNET_EGRESS_USD_PER_GB: dict[str, float] = {"aws": 0.09, "azure": 0.087, "gcp": 0.12}
# Same-cloud inter-region price for a region that is not in the cloud's matrix, USD/GB: the most common off-diagonal
# value of network_cost/<cloud>_transmission_cost_matrix.csv for aws (0.02) / azure (0.08) / gcp (0.08).
INTER_REGION_EGRESS_USD_PER_GB: dict[str, float] = {"aws": 0.02, "azure": 0.08, "gcp": 0.08}
# Any other pair (synthetic or custom clouds), USD/GB: AWS's US/EU inter-region price (aws matrix, us-east-1 row).
DEFAULT_EGRESS_USD_PER_GB = 0.02

# Average inter-region ping RTT, ms, between AWS regions: the "Latency Between AWS Global Regions" measurement as
# tabulated in "AWS Regions" (acomputerscientistlearnsaws.blogspot.com/2017/04/aws-regions.html), mean of the two
# directions, measured 2017. Four pairs of that table are left out because their 2017 routes took a detour that
# today's backbone avoids (current public dashboards such as cloudping.co show them far lower): Frankfurt-Singapore
# (326 ms then), Ireland-Singapore (239), Singapore-Sydney (175), N. Virginia-Oregon (88). The distance formula is
# used for those and for every pair not listed.
MEASURED_RTT_MS: dict[tuple[str, str], float] = {
    ("us-east-1", "us-west-1"): 72.2, ("us-east-1", "eu-west-1"): 80.5, ("us-east-1", "eu-central-1"): 88.6,
    ("us-east-1", "ap-northeast-1"): 145.3, ("us-east-1", "ap-northeast-2"): 177.5,
    ("us-east-1", "ap-southeast-1"): 216.7, ("us-east-1", "ap-southeast-2"): 229.8, ("us-east-1", "sa-east-1"): 119.5,
    ("us-west-1", "us-west-2"): 19.3, ("us-west-1", "eu-west-1"): 153.2, ("us-west-1", "eu-central-1"): 166.6,
    ("us-west-1", "ap-northeast-1"): 102.5, ("us-west-1", "ap-northeast-2"): 132.1,
    ("us-west-1", "ap-southeast-1"): 173.9, ("us-west-1", "ap-southeast-2"): 157.7, ("us-west-1", "sa-east-1"): 192.7,
    ("us-west-2", "eu-west-1"): 137.0, ("us-west-2", "eu-central-1"): 159.5, ("us-west-2", "ap-northeast-1"): 89.1,
    ("us-west-2", "ap-northeast-2"): 118.2, ("us-west-2", "ap-southeast-1"): 161.4,
    ("us-west-2", "ap-southeast-2"): 162.1, ("us-west-2", "sa-east-1"): 182.7, ("eu-west-1", "eu-central-1"): 19.6,
    ("eu-west-1", "ap-northeast-1"): 212.4, ("eu-west-1", "ap-northeast-2"): 242.4,
    ("eu-west-1", "ap-southeast-2"): 309.6, ("eu-west-1", "sa-east-1"): 191.3,
    ("eu-central-1", "ap-northeast-1"): 236.6, ("eu-central-1", "ap-northeast-2"): 265.8,
    ("eu-central-1", "ap-southeast-2"): 323.4, ("eu-central-1", "sa-east-1"): 194.9,
    ("ap-northeast-1", "ap-northeast-2"): 31.4, ("ap-northeast-1", "ap-southeast-1"): 73.8,
    ("ap-northeast-1", "ap-southeast-2"): 103.9, ("ap-northeast-1", "sa-east-1"): 256.8,
    ("ap-northeast-2", "ap-southeast-1"): 71.6, ("ap-northeast-2", "ap-southeast-2"): 134.0,
    ("ap-northeast-2", "sa-east-1"): 286.3, ("ap-southeast-1", "sa-east-1"): 328.1,
    ("ap-southeast-2", "sa-east-1"): 322.5,
}  # fmt: skip

# Name of each catalog region in its cloud's transfer-cost matrix. Stand-ins (region absent from the matrix):
# aws us-west-2 -> us-west-1 (same US price class), gcp asia-northeast3 (Seoul) -> asia-northeast1 (same Asia
# price class).
MATRIX_NAME: dict[str, dict[str, str]] = {
    "aws": {
        "us-east-1": "us-east-1", "us-east-2": "us-east-2", "us-west-1": "us-west-1", "us-west-2": "us-west-1",
        "ca-central-1": "ca-central-1", "eu-west-1": "eu-west-1", "eu-west-2": "eu-west-2", "eu-west-3": "eu-west-3",
        "eu-central-1": "eu-central-1", "eu-central-2": "eu-central-2", "ap-northeast-1": "ap-northeast-1",
        "ap-northeast-2": "ap-northeast-2", "ap-southeast-1": "ap-southeast-1", "ap-southeast-2": "ap-southeast-2",
        "ap-south-1": "ap-south-1", "sa-east-1": "sa-east-1", "af-south-1": "af-south-1",
    },
    "gcp": {
        "us-central1": "us-central1", "us-east1": "us-east1", "us-west1": "us-west1", "europe-west1": "europe-west1",
        "europe-west4": "europe-west4", "asia-northeast1": "asia-northeast1", "asia-northeast3": "asia-northeast1",
        "asia-south1": "asia-south1", "asia-southeast1": "asia-southeast1",
        "australia-southeast1": "australia-southeast1", "southamerica-east1": "southamerica-east1",
        "africa-south1": "africa-south1",
    },
    "azure": {
        "eastus": "East US", "eastus2": "East US 2", "westus": "West US", "southcentralus": "South Central US",
        "canadacentral": "Canada Central", "westeurope": "West Europe", "northeurope": "North Europe",
        "francecentral": "France Central", "germanywestcentral": "Germany West Central",
        "switzerlandnorth": "Switzerland North", "spaincentral": "Spain Central", "japaneast": "Japan East",
        "koreacentral": "Korea Central", "centralindia": "Central India", "southeastasia": "Southeast Asia",
        "australiaeast": "Australia East", "australiasoutheast": "Australia Southeast",
        "brazilsouth": "Brazil South", "southafricanorth": "South Africa North",
    },
}  # fmt: skip

# Egress USD/GB between the MATRIX_NAME regions, from network_cost/<cloud>_transmission_cost_matrix.csv, compacted:
# (orientation, default per row ("src") or per column ("dst") region, exceptions {(src, dst): value}).
# Generated by egress_table_from_data(); tests/test_fleet.py checks it against the files.
_EGRESS: dict[str, tuple[str, dict[str, float], dict[tuple[str, str], float]]] = {
    "aws": (
        "src",
        {
            "af-south-1": 0.147, "ap-northeast-1": 0.09, "ap-northeast-2": 0.08, "ap-south-1": 0.086,
            "ap-southeast-1": 0.09, "ap-southeast-2": 0.098, "ca-central-1": 0.02, "eu-central-1": 0.02,
            "eu-central-2": 0.02, "eu-west-1": 0.02, "eu-west-2": 0.02, "eu-west-3": 0.02, "sa-east-1": 0.138,
            "us-east-1": 0.02, "us-east-2": 0.02, "us-west-1": 0.02,
        },
        {("us-east-1", "us-east-2"): 0.01, ("us-east-2", "us-east-1"): 0.01},
    ),
    "gcp": (
        "dst",
        {
            "africa-south1": 0.11, "asia-northeast1": 0.08, "asia-south1": 0.08, "asia-southeast1": 0.08,
            "australia-southeast1": 0.1, "europe-west1": 0.05, "europe-west4": 0.05, "southamerica-east1": 0.14,
            "us-central1": 0.02, "us-east1": 0.02, "us-west1": 0.02,
        },
        {},
    ),
    "azure": (
        "src",
        {
            "Australia East": 0.08, "Australia Southeast": 0.08, "Brazil South": 0.16, "Canada Central": 0.08,
            "Central India": 0.08, "East US": 0.05, "East US 2": 0.05, "France Central": 0.08,
            "Germany West Central": 0.08, "Japan East": 0.08, "Korea Central": 0.08, "North Europe": 0.05,
            "South Africa North": 0.16, "South Central US": 0.05, "Southeast Asia": 0.08, "Spain Central": 0.08,
            "Switzerland North": 0.08, "West Europe": 0.05, "West US": 0.05,
        },
        {
            ("East US", "East US 2"): 0.02, ("East US", "South Central US"): 0.02, ("East US", "West US"): 0.02,
            ("East US 2", "East US"): 0.02, ("East US 2", "South Central US"): 0.02, ("East US 2", "West US"): 0.02,
            ("North Europe", "West Europe"): 0.02, ("South Central US", "East US"): 0.02,
            ("South Central US", "East US 2"): 0.02, ("South Central US", "West US"): 0.02,
            ("West Europe", "North Europe"): 0.02, ("West US", "East US"): 0.02, ("West US", "East US 2"): 0.02,
            ("West US", "South Central US"): 0.02,
        },
    ),
}  # fmt: skip


def haversine_km(lat1, lon1, lat2, lon2):  # type: ignore[no-untyped-def]
    """Great-circle distance, km (numpy-broadcasting)."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dp, dl = p2 - p1, np.radians(np.asarray(lon2) - np.asarray(lon1))
    h = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def rtt_from_distance_s(
    distance_km: float, route_inflation: float = ROUTE_INFLATION, fixed_s: float = RTT_FIXED_S
) -> float:
    """Estimated round-trip time, seconds, over ``distance_km`` of great circle (formula in the module docstring)."""
    return 2.0 * distance_km * 1e3 * route_inflation / SIGNAL_SPEED_M_PER_S + fixed_s


def estimate_rtt_s(lat1: float, lon1: float, lat2: float, lon2: float, **kw: float) -> float:
    return rtt_from_distance_s(float(haversine_km(lat1, lon1, lat2, lon2)), **kw)


def measured_rtt_s(a: str, b: str) -> float | None:
    """Published RTT between two AWS regions, seconds, or None."""
    ms = MEASURED_RTT_MS.get((a, b), MEASURED_RTT_MS.get((b, a)))
    return None if ms is None else ms / 1000.0


def region_rtt_s(a, b, use_measured: bool = True) -> float:  # type: ignore[no-untyped-def]
    """RTT between two :class:`Region` s: measured (same-cloud AWS pairs) when known, else the distance formula."""
    if a.name == b.name:
        return 0.0
    if use_measured and a.cloud == "aws" and b.cloud == "aws":
        m = measured_rtt_s(a.name, b.name)
        if m is not None:
            return m
    return estimate_rtt_s(a.lat, a.lon, b.lat, b.lon)


def _matrix_egress(cloud: str, src: str, dst: str) -> float | None:
    """Egress between two matrix names of ``cloud`` from the stored constants, or None if not stored."""
    table = _EGRESS.get(cloud)
    if table is None:
        return None
    orient, default, exceptions = table
    if src == dst:
        return 0.0
    if (src, dst) in exceptions:
        return exceptions[(src, dst)]
    if src not in default or dst not in default:
        return None
    return default[src if orient == "src" else dst]


def region_egress_usd_per_gb(a, b) -> float:  # type: ignore[no-untyped-def]
    """Egress price, USD/GB, for data sent from region ``a`` to region ``b`` (rules in the module docstring)."""
    if a.name == b.name:
        return 0.0
    if a.cloud != b.cloud:
        return INTERNET_EGRESS_USD_PER_GB.get(a.cloud, DEFAULT_EGRESS_USD_PER_GB)
    names = MATRIX_NAME.get(a.cloud, {})
    if a.name in names and b.name in names:
        ms, md = names[a.name], names[b.name]
        if ms == md:  # two catalog regions standing in for the same matrix entry: use the matrix's other rows
            return INTER_REGION_EGRESS_USD_PER_GB[a.cloud]
        v = _matrix_egress(a.cloud, ms, md)
        if v is not None:
            return v
    return INTER_REGION_EGRESS_USD_PER_GB.get(a.cloud, DEFAULT_EGRESS_USD_PER_GB)


def egress_table_from_data() -> dict[str, tuple[str, dict[str, float], dict[tuple[str, str], float]]]:
    """Recompute :data:`_EGRESS` from the three matrix files (restricted to the MATRIX_NAME regions)."""
    from fleetwise.fleet.zones import load_transfer_cost_matrix

    out: dict[str, tuple[str, dict[str, float], dict[tuple[str, str], float]]] = {}
    for cloud, mapping in MATRIX_NAME.items():
        names, m = load_transfer_cost_matrix(cloud)
        used = sorted(set(mapping.values()))
        missing = [u for u in used if u not in names]
        if missing:
            raise InputError(f"{cloud} transfer cost matrix: regions {missing} not found (has {list(names)})")
        idx = {nm: names.index(nm) for nm in used}
        best = None
        for orient in ("src", "dst"):
            default: dict[str, float] = {}
            exceptions: dict[tuple[str, str], float] = {}
            for key in used:
                others = [o for o in used if o != key]
                vals = [float(m[idx[key], idx[o]] if orient == "src" else m[idx[o], idx[key]]) for o in others]
                mode = Counter(vals).most_common(1)[0][0] if vals else 0.0
                default[key] = mode
                for o, v in zip(others, vals):
                    if not math.isclose(v, mode):
                        exceptions[(key, o) if orient == "src" else (o, key)] = v
            if best is None or len(exceptions) < len(best[2]):
                best = (orient, default, dict(sorted(exceptions.items())))
        assert best is not None
        out[cloud] = best
    return out
