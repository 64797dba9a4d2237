"""Tests for fleetwise.fleet: real-data loaders and constants, network numbers, builders, spec."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.errors import InputError
from fleetwise.fleet import (
    CARBON_ZONES,
    CATALOG,
    DEFAULT_BACKBONE,
    ECONOMIC_ZONES,
    HOURS_PER_YEAR,
    INTERNET_EGRESS_USD_PER_GB,
    MEASURED_RTT_MS,
    PRICE_ZONES,
    ZONE_CARBON_G_PER_KWH,
    ZONE_PRICE_USD_PER_MWH,
    Fleet,
    Link,
    Region,
    build_fleet,
    continental_backbone,
    data_available,
    egress_table_from_data,
    get_region,
    grid,
    haversine_km,
    load_carbon_series,
    load_price_series,
    load_transfer_cost_matrix,
    parse_fleet_spec,
    random_geometric,
    region_egress_usd_per_gb,
    region_means_from_data,
    ring,
    rtt_from_distance_s,
    single_region,
    zone_means_from_data,
)
from fleetwise.fleet import network as net
from fleetwise.fleet import zones as zn

needs_data = pytest.mark.skipif(
    not data_available(), reason="real dataset multiregion-carbon-price-network-greendcc not found"
)


# ---------------------------------------------------------------------------------------------------------------
# Real data: loaders, and constants against recomputation
# ---------------------------------------------------------------------------------------------------------------
@needs_data
def test_zone_files_and_shapes():
    carbon, price = zn.zones_in_data()
    assert len(carbon) == 16 and tuple(carbon) == CARBON_ZONES
    assert len(price) == 22 and tuple(price) == PRICE_ZONES
    for z in carbon:
        s = load_carbon_series(z)
        assert s.shape == (HOURS_PER_YEAR,) and np.isfinite(s).all() and (s >= 0).all()
    for z in price:
        s = load_price_series(z)
        assert s.shape == (HOURS_PER_YEAR,) and np.isfinite(s).all()


@needs_data
def test_means_match_provenance_numbers():
    carbon, price = zone_means_from_data()
    # PROVENANCE.md, "Size and span (measured)"
    for zone, g in {"CA-ON": 47, "BR-SP": 56, "GB": 129, "DE-LU": 308, "SG": 369, "IN-WE": 691, "ZA": 645}.items():
        assert round(carbon[zone]) == g, zone
    assert price["SG"] == pytest.approx(184.9, abs=0.05)
    assert price["BR-SP"] == pytest.approx(12.6, abs=0.05)
    assert max(price, key=price.get) == "SG" and min(price, key=price.get) == "BR-SP"


@needs_data
def test_zone_constants_match_recomputation():
    carbon, price = zone_means_from_data()
    assert set(carbon) == set(ZONE_CARBON_G_PER_KWH) and set(price) == set(ZONE_PRICE_USD_PER_MWH)
    for z, v in carbon.items():
        assert ZONE_CARBON_G_PER_KWH[z] == pytest.approx(v, abs=6e-4), z
    for z, v in price.items():
        assert ZONE_PRICE_USD_PER_MWH[z] == pytest.approx(v, abs=6e-4), z


@needs_data
def test_region_constants_match_recomputation():
    means = region_means_from_data()
    assert set(means) == set(CATALOG)
    for name, (usd_kwh, g_kwh) in means.items():
        r = CATALOG[name]
        assert r.electricity_usd_per_kwh == pytest.approx(usd_kwh, abs=1e-6), name
        assert r.carbon_g_per_kwh == pytest.approx(g_kwh, abs=6e-4), name


@needs_data
def test_transfer_matrices_and_egress_constants():
    sizes = {"aws": 20, "azure": 22, "gcp": 13}  # PROVENANCE.md
    for cloud, k in sizes.items():
        names, m = load_transfer_cost_matrix(cloud)
        assert m.shape == (k, k) and len(names) == k
        assert np.all(np.diag(m) == 0)
    assert egress_table_from_data() == net._EGRESS
    # every same-cloud catalog pair equals the file's cell
    checked = 0
    for a in CATALOG.values():
        for b in CATALOG.values():
            if a.cloud != b.cloud or a.name == b.name:
                continue
            ma, mb = net.MATRIX_NAME[a.cloud][a.name], net.MATRIX_NAME[b.cloud][b.name]
            if ma == mb:
                continue
            names, m = load_transfer_cost_matrix(a.cloud)
            assert region_egress_usd_per_gb(a, b) == m[names.index(ma), names.index(mb)], (a.name, b.name)
            checked += 1
    assert checked > 500
    # the documented fallbacks are the matrices' most common off-diagonal values
    for cloud, v in net.INTER_REGION_EGRESS_USD_PER_GB.items():
        _, m = load_transfer_cost_matrix(cloud)
        vals, counts = np.unique(m[~np.eye(len(m), dtype=bool)], return_counts=True)
        assert vals[np.argmax(counts)] == v


@needs_data
def test_hourly_lookup():
    f = continental_backbone(["us-east-1", "ca-central-1", "ap-southeast-1"])
    pjm = load_price_series("US-MIDA-PJM")
    assert f.hourly_price("us-east-1", 0) == pytest.approx(pjm[0] / 1000)
    assert f.hourly_price("us-east-1", 8760 + 5.7) == pytest.approx(pjm[5] / 1000)  # floors and wraps
    hrs = np.array([0, 1, 8759])
    assert np.allclose(f.hourly_carbon(1, hrs), load_carbon_series("CA-ON")[hrs])
    assert f.hourly_price_usd_per_kwh.shape == (3, HOURS_PER_YEAR)
    assert f.hourly_price_usd_per_kwh.mean(axis=1) == pytest.approx(f.electricity_usd_per_kwh, abs=1e-6)
    assert f.hourly_carbon_g_per_kwh.mean(axis=1) == pytest.approx(f.carbon_g_per_kwh, abs=6e-4)
    # SG is the dearest on average, and the series varies over the day
    assert f.hourly_price_usd_per_kwh[2].std() > 0


@needs_data
def test_hourly_series_rescaled_to_overridden_mean():
    f = single_region("us-east-1", electricity_usd_per_kwh=0.10, carbon_g_per_kwh=100.0).load_hourly()
    assert f.hourly_price_usd_per_kwh[0].mean() == pytest.approx(0.10)
    assert f.hourly_carbon_g_per_kwh[0].mean() == pytest.approx(100.0)
    pjm = load_price_series("US-MIDA-PJM")
    assert np.corrcoef(f.hourly_price_usd_per_kwh[0], pjm)[0, 1] == pytest.approx(1.0)


def test_region_without_series_uses_constant_hourly():
    r = Region("x", "custom", "NOWHERE", 10.0, 10.0, 0.0, electricity_usd_per_kwh=0.05, carbon_g_per_kwh=200.0)
    f = Fleet((r,))
    assert f.hourly_price("x", 1234) == 0.05 and f.hourly_carbon("x", 99) == 200.0


# ---------------------------------------------------------------------------------------------------------------
# Catalog and Region
# ---------------------------------------------------------------------------------------------------------------
def test_catalog_covers_three_clouds_and_real_zones():
    clouds = {r.cloud for r in CATALOG.values()}
    assert clouds == {"aws", "gcp", "azure"}
    assert len(CATALOG) >= 40
    for r in CATALOG.values():
        assert r.grid_zone in ZONE_CARBON_G_PER_KWH and r.price_zone in ZONE_PRICE_USD_PER_MWH
        assert abs(r.utc_offset_h - r.lon / 15) <= 2.5, r.name  # offset fits the longitude
    r = get_region("ca-central-1")
    assert r.grid_zone == "CA-ON" and r.carbon_g_per_kwh == pytest.approx(46.938) and "nearest" in r.note
    assert get_region("aws:ap-southeast-1").electricity_usd_per_kwh == pytest.approx(0.184901)
    assert get_region("azure/australiaeast").grid_zone == "AU-NSW"
    for n in DEFAULT_BACKBONE:
        assert n in CATALOG


def test_unknown_region_lists_valid_ones():
    with pytest.raises(InputError, match=r"unknown region 'us-east-9'.*us-east-1.*eastus"):
        get_region("us-east-9")
    with pytest.raises(InputError, match="belongs to aws"):
        get_region("gcp:us-east-1")


def test_region_defaults_and_validation():
    r = Region("a", "x", "SG", 1.0, 2.0)
    assert r.price_zone == "SG" and r.electricity_usd_per_kwh == pytest.approx(0.184901)
    assert r.carbon_g_per_kwh == pytest.approx(369.2)
    with pytest.raises(InputError, match="no electricity price"):
        Region("b", "x", "GB", 51.0, 0.0)  # GB has carbon but no price series
    assert Region("b", "x", "GB", 51.0, 0.0, price_zone="BE").electricity_usd_per_kwh == pytest.approx(0.104823)
    with pytest.raises(InputError, match="lat"):
        Region("c", "x", "SG", 91.0, 0.0)
    with pytest.raises(InputError, match="carbon_g_per_kwh"):
        Region("c", "x", "SG", 0.0, 0.0, carbon_g_per_kwh=-1)
    moved = get_region("us-east-1").with_overrides(grid_zone="CA-ON")
    assert moved.carbon_g_per_kwh == pytest.approx(46.938) and moved.electricity_usd_per_kwh == pytest.approx(0.020011)


# ---------------------------------------------------------------------------------------------------------------
# Network numbers
# ---------------------------------------------------------------------------------------------------------------
def test_rtt_formula():
    assert rtt_from_distance_s(0.0) == pytest.approx(0.002)
    assert rtt_from_distance_s(1000.0) == pytest.approx(2 * 1e6 * 1.5 / 2e8 + 0.002)
    assert float(haversine_km(0, 0, 0, 1)) == pytest.approx(111.195, abs=0.01)


def test_backbone_rtt_matrix_sane():
    f = continental_backbone()
    rtt = f.rtt_s
    assert rtt.shape == (len(DEFAULT_BACKBONE),) * 2
    assert np.allclose(rtt, rtt.T) and np.all(np.diag(rtt) == 0)
    off = ~np.eye(f.n, dtype=bool)
    assert np.all(rtt[off] > 0) and np.all(np.isfinite(rtt))
    i, j = f.index("us-east-1"), f.index("eu-central-1")
    assert 0.070 <= rtt[i, j] <= 0.120
    assert rtt[i, j] == pytest.approx(0.0886)  # measured pair
    # no faster than light in fibre along the great circle
    assert np.all(rtt[off] >= 2 * f.distance_km[off] * 1e3 / 2e8)
    # triangle-ish: a direct path is never much slower than the best two-hop relay
    two_hop = np.min(rtt[:, :, None] + rtt[None, :, :], axis=1)
    assert np.all(rtt[off] <= 1.75 * two_hop[off])
    # same metro, different clouds: a few ms
    assert rtt[i, f.index("eastus")] < 0.010


def test_measured_pairs_and_formula_agree_roughly():
    errs = []
    for (a, b), ms in MEASURED_RTT_MS.items():
        ra, rb = CATALOG[a], CATALOG[b]
        d = float(haversine_km(ra.lat, ra.lon, rb.lat, rb.lon))
        if ms <= 2 * 2 * d * 1e3 / 2e8 * 1e3:  # the fitting set: no continental detour
            errs.append(abs(rtt_from_distance_s(d) * 1e3 - ms) / ms)
    assert len(errs) == 32
    assert np.median(errs) < 0.2 and max(errs) < 0.4


def test_egress_known_pairs():
    names = ["us-east-1", "us-east-2", "ap-northeast-1", "us-east1", "europe-west1", "eastus", "westus"]
    f = continental_backbone(names)
    e = f.egress_usd_per_gb
    ix = f.index
    assert e[ix("ap-northeast-1"), ix("us-east-1")] == 0.09  # aws matrix row ap-northeast-1
    assert e[ix("us-east-1"), ix("ap-northeast-1")] == 0.02
    assert e[ix("us-east-1"), ix("us-east-2")] == 0.01
    assert e[ix("us-east1"), ix("europe-west1")] == 0.05  # gcp matrix
    assert e[ix("eastus"), ix("westus")] == 0.02  # azure matrix
    assert e[ix("us-east-1"), ix("us-east1")] == INTERNET_EGRESS_USD_PER_GB["aws"] == 0.09  # inter-cloud
    assert e[ix("us-east1"), ix("eastus")] == INTERNET_EGRESS_USD_PER_GB["gcp"]
    assert np.all(np.diag(e) == 0)
    assert np.all(np.diag(f.bandwidth_gbps) == f.intra_region_bandwidth_gbps)
    assert f.transfer_cost_usd("ap-northeast-1", "us-east-1", 10) == pytest.approx(0.9)
    assert f.transfer_time_s("us-east-1", "us-east-1", 5) == 0.0


def test_matrices_read_only():
    f = continental_backbone()
    with pytest.raises(ValueError):
        f.rtt_s[0, 1] = 1.0


# ---------------------------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fleet,n",
    [
        (lambda: grid(3, 4), 12),
        (lambda: grid(1, 1), 1),
        (lambda: grid(1, 7, 100.0), 7),
        (lambda: ring(1), 1),
        (lambda: ring(2), 2),
        (lambda: ring(9), 9),
        (lambda: random_geometric(25, 0.05, 3), 25),
        (lambda: random_geometric(60, 0.3, np.random.default_rng(0)), 60),
        (lambda: single_region(), 1),
        (lambda: continental_backbone(), 14),
        (lambda: continental_backbone(list(CATALOG)), len(CATALOG)),
    ],
)
def test_builders_connected_of_requested_size(fleet, n):
    f = fleet()
    assert f.n == n and len(set(f.names)) == n
    assert f.is_connected
    assert np.all(np.isfinite(f.rtt_s)) and np.allclose(f.rtt_s, f.rtt_s.T)
    assert np.all(f.bandwidth_gbps > 0)


def test_grid_links_and_relayed_paths():
    f = grid(3, 3, spacing_km=1000.0, bandwidth_gbps=5.0)
    assert len(f.links) == 2 * 12  # 12 undirected lattice edges
    assert set(f.neighbor_names("grid-1-1")) == {"grid-0-1", "grid-1-0", "grid-1-2", "grid-2-1"}
    hop = rtt_from_distance_s(1000.0)
    a, b = f.index("grid-0-0"), f.index("grid-2-2")
    assert f.rtt_s[a, b] == pytest.approx(4 * hop)
    assert f.egress_usd_per_gb[a, b] == pytest.approx(4 * 0.02)
    assert f.bandwidth_gbps[a, b] == 5.0
    p = f.path(a, b)
    assert len(p) == 5 and p[0] == a and p[-1] == b
    assert f.path(a, f.index("grid-0-1")) == (a, f.index("grid-0-1"))


def test_synthetic_regions_get_real_economics():
    f = grid(4, 5)
    zones = [r.grid_zone for r in f.regions]
    assert zones[: len(ECONOMIC_ZONES)] == list(ECONOMIC_ZONES)
    for r in f.regions:
        assert r.carbon_g_per_kwh == ZONE_CARBON_G_PER_KWH[r.grid_zone]
        assert r.electricity_usd_per_kwh == pytest.approx(ZONE_PRICE_USD_PER_MWH[r.grid_zone] / 1000)
        assert r.utc_offset_h == zn.ZONE_UTC_OFFSET_H[r.grid_zone]
    g = ring(4, zones=["SG", "CA-ON"])
    assert [r.grid_zone for r in g.regions] == ["SG", "CA-ON", "SG", "CA-ON"]
    with pytest.raises(InputError, match="GB"):
        ring(3, zones=["GB"])  # no price series


def test_random_geometric_deterministic_and_pure():
    a = random_geometric(30, 0.2, 42)
    b = random_geometric(30, 0.2, np.random.default_rng(42))
    assert a == b
    assert random_geometric(30, 0.2, 43) != a


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), radius=st.floats(0.01, 1.5), seed=st.integers(0, 2**32 - 1))
def test_random_geometric_always_connected(n, radius, seed):
    f = random_geometric(n, radius, seed)
    assert f.n == n and f.is_connected
    assert np.all(np.isfinite(f.rtt_s))


def test_builder_argument_errors():
    with pytest.raises(InputError, match="rows"):
        grid(0, 3)
    with pytest.raises(InputError, match="spacing_km"):
        ring(3, spacing_km=-1)
    with pytest.raises(InputError, match="n"):
        random_geometric(2.5, 0.3, 0)  # type: ignore[arg-type]


def test_fleet_validation():
    r1 = Region("a", "x", "SG", 0.0, 0.0)
    r2 = Region("b", "x", "SG", 0.0, 1.0)
    with pytest.raises(InputError, match="twice"):
        Fleet((r1, r1))
    with pytest.raises(InputError, match="unknown region 'c'"):
        Fleet((r1, r2), (Link("a", "c", 0.01),))
    with pytest.raises(InputError, match="given twice"):
        Fleet((r1, r2), (Link("a", "b", 0.01), Link("a", "b", 0.02)))
    with pytest.raises(InputError, match="rtt_s"):
        Link("a", "b", -0.01)
    with pytest.raises(InputError, match="two different"):
        Link("a", "a", 0.01)
    # a one-way link: b cannot reach a
    f = Fleet((r1, r2), (Link("a", "b", 0.01),))
    assert not f.is_connected and math.isinf(f.rtt_s[1, 0]) and f.path("b", "a") == ()
    with pytest.raises(InputError, match="unknown region"):
        f.index("zz")


# ---------------------------------------------------------------------------------------------------------------
# Spec
# ---------------------------------------------------------------------------------------------------------------
def test_spec_builds_every_topology():
    assert build_fleet({"topology": "single"}).names == ("local",)
    assert build_fleet({"topology": "single", "region": "eu-central-1"}).regions[0].grid_zone == "DE-LU"
    assert build_fleet({"topology": "backbone"}).n == 14
    assert build_fleet({"topology": "grid", "rows": 2, "cols": 3}).n == 6
    assert build_fleet({"topology": "ring", "n": 5}).n == 5
    a = build_fleet({"topology": "random_geometric", "n": 12, "radius": 0.2}, rng=np.random.default_rng(1))
    b = build_fleet({"topology": "random_geometric", "n": 12, "radius": 0.2}, rng=np.random.default_rng(1))
    assert a == b
    assert build_fleet({"topology": "random_geometric", "n": 12, "seed": 5}) == random_geometric(12, 0.3, 5)


def test_spec_backbone_overrides_and_custom_regions():
    spec = yaml.safe_load(
        """
        topology: backbone
        bandwidth_gbps: 25
        regions:
          - us-east-1
          - {name: eu-central-1, electricity_usd_per_kwh: 0.08}
          - {name: my-dc, grid_zone: CA-ON, lat: 43.7, lon: -79.4, utc_offset_h: -5}
        links:
          - {src: us-east-1, dst: eu-central-1, bandwidth_gbps: 40}
        """
    )
    f = build_fleet(spec)
    assert f.names == ("us-east-1", "eu-central-1", "my-dc")
    assert f.region("eu-central-1").electricity_usd_per_kwh == 0.08
    assert f.region("my-dc").cloud == "custom" and f.region("my-dc").carbon_g_per_kwh == pytest.approx(46.938)
    i, j, k = 0, 1, 2
    assert f.bandwidth_gbps[i, j] == f.bandwidth_gbps[j, i] == 40
    assert f.bandwidth_gbps[i, k] == 25
    assert f.egress_usd_per_gb[i, k] == INTERNET_EGRESS_USD_PER_GB["aws"]


@pytest.mark.parametrize(
    "spec,pattern",
    [
        ({"topology": "mesh"}, r"fleet\.topology: topology must be one of single, backbone, grid"),
        ({}, r"fleet\.topology: topology must be one of"),
        ({"topology": "grid", "rows": 2}, r"fleet\.cols: Field required"),
        ({"topology": "grid", "rows": 0, "cols": 2}, r"fleet\.rows: .*greater than or equal to 1"),
        ({"topology": "ring", "n": 3, "colour": "red"}, r"fleet\.colour: Extra inputs are not permitted"),
        (
            {"topology": "backbone", "regions": ["us-east-1", "mars-1"]},
            r"fleet\.regions\[1\]: unknown region 'mars-1'.*us-east-1",
        ),
        (
            {"topology": "backbone", "regions": [{"name": "mydc", "lat": 1.0}]},
            r"unknown region 'mydc'.*give lon, grid_zone",
        ),
        ({"topology": "backbone", "regions": ["us-east-1", "us-east-1"]}, r"listed twice"),
        ({"topology": "backbone", "links": [{"src": "us-east-1", "dst": "mars-1"}]}, r"'mars-1' is not in the fleet"),
        ({"topology": "ring", "n": 3, "zones": ["XX"]}, r"fleet\.zones: 'XX' has no hourly"),
        ({"topology": "backbone", "regions": [{"name": "us-east-1", "foo": 1}]}, r"fleet\.regions\[0\]\.foo: Extra"),
        ({"topology": "single", "region": "aws:nope-1"}, r"unknown region 'aws:nope-1'"),
        ("grid", r"fleet: expected a mapping"),
    ],
)
def test_spec_errors(spec, pattern):
    with pytest.raises(InputError, match=pattern) as ei:
        build_fleet(spec)
    assert "\n" not in str(ei.value)


def test_parse_spec_returns_models():
    s = parse_fleet_spec({"topology": "ring", "n": 4})
    assert s.topology == "ring" and s.spacing_km == 1000.0
    assert parse_fleet_spec(s) is s
