"""Frozen fleet data types: :class:`Region`, :class:`Link`, :class:`Fleet` (units in the field names).

A :class:`Fleet` is a set of regions and directed links between them. Its matrices are indexed by region position
(``fleet.index(name)``) and computed once, on first use:

* ``rtt_s[i, j]``: round-trip time of the direct link i->j when there is one; otherwise the minimum-RTT path of
  links (relayed through other regions); ``inf`` when j cannot be reached; 0 on the diagonal.
* ``egress_usd_per_gb[i, j]``: egress price of the direct link, or the sum over the hops of that path; 0 on the
  diagonal.
* ``bandwidth_gbps[i, j]``: the direct link's bandwidth, or the smallest along that path; the diagonal holds
  ``intra_region_bandwidth_gbps``.

Hourly prices and carbon intensities are loaded from the real data on first use (see :mod:`.zones`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components, shortest_path

from fleetwise.errors import InputError
from fleetwise.fleet import zones as _z

# Default bandwidth of an inter-region link, Gbit/s: a modest, commonly provisioned inter-region pipe (a single
# cross-region VPC-peering / interconnect flow is typically a few Gbit/s; aggregate backbone capacity is far
# higher). A modelling assumption, overridable per link and per builder.
DEFAULT_BANDWIDTH_GBPS = 10.0
# Bandwidth inside one region (the diagonal of ``Fleet.bandwidth_gbps``), Gbit/s: a 100 GbE data-centre fabric.
INTRA_REGION_BANDWIDTH_GBPS = 100.0


def _finite(x: float, what: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise InputError(f"{what}: expected a number, got {x!r}") from None
    if not math.isfinite(v):
        raise InputError(f"{what}: expected a finite number, got {x!r}")
    return v


@dataclass(frozen=True, slots=True)
class Region:
    """One place GPUs can run.

    ``electricity_usd_per_kwh`` / ``carbon_g_per_kwh`` default (None) to the 2023 annual means of ``price_zone`` /
    ``grid_zone`` (see :mod:`.zones`); ``price_zone`` defaults to ``grid_zone`` when that zone has a price series.
    A region in a zone without a series must be given the value explicitly.
    """

    name: str
    cloud: str
    grid_zone: str  # carbon-intensity zone (Electricity Maps zone id)
    lat: float  # degrees north
    lon: float  # degrees east
    utc_offset_h: float = 0.0  # standard time, hours
    electricity_usd_per_kwh: float | None = None
    carbon_g_per_kwh: float | None = None  # gCO2eq/kWh, direct (operational)
    price_zone: str | None = None  # electricity-price zone; None -> grid_zone if it has prices
    note: str = ""  # where a value is a stand-in (nearest grid etc.)

    def __post_init__(self) -> None:
        where = f"region {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"region name: expected a non-empty string, got {self.name!r}")
        lat = _finite(self.lat, f"{where}: lat")
        lon = _finite(self.lon, f"{where}: lon")
        if not -90 <= lat <= 90:
            raise InputError(f"{where}: lat = {lat}: expected -90..90 degrees")
        if not -180 <= lon <= 180:
            raise InputError(f"{where}: lon = {lon}: expected -180..180 degrees")
        utc = _finite(self.utc_offset_h, f"{where}: utc_offset_h")
        if not -12 <= utc <= 14:
            raise InputError(f"{where}: utc_offset_h = {utc}: expected -12..14 hours")
        pz = self.price_zone
        if pz is None and self.grid_zone in _z.ZONE_PRICE_USD_PER_MWH:
            pz = self.grid_zone
        price = self.electricity_usd_per_kwh
        if price is None:
            if pz not in _z.ZONE_PRICE_USD_PER_MWH:
                zone = f"price zone {pz!r}" if pz is not None else f"grid zone {self.grid_zone!r}"
                raise InputError(
                    f"{where}: no electricity price: {zone} has no 2023 price series; give price_zone "
                    f"(one of {', '.join(_z.PRICE_ZONES)}) or electricity_usd_per_kwh"
                )
            price = _z.ZONE_PRICE_USD_PER_MWH[pz] / 1000.0
        price = _finite(price, f"{where}: electricity_usd_per_kwh")
        carbon = self.carbon_g_per_kwh
        if carbon is None:
            if self.grid_zone not in _z.ZONE_CARBON_G_PER_KWH:
                raise InputError(
                    f"{where}: no carbon intensity: grid zone {self.grid_zone!r} has no 2023 series "
                    f"(known: {', '.join(_z.CARBON_ZONES)}); give grid_zone or carbon_g_per_kwh"
                )
            carbon = _z.ZONE_CARBON_G_PER_KWH[self.grid_zone]
        carbon = _finite(carbon, f"{where}: carbon_g_per_kwh")
        if carbon < 0:
            raise InputError(f"{where}: carbon_g_per_kwh = {carbon}: expected >= 0")
        for k, v in (("lat", lat), ("lon", lon), ("utc_offset_h", utc), ("price_zone", pz),
                     ("electricity_usd_per_kwh", price), ("carbon_g_per_kwh", carbon)):  # fmt: skip
            object.__setattr__(self, k, v)

    def with_overrides(self, **fields: object) -> Region:
        """A copy with some fields replaced. Changing ``grid_zone`` (or ``price_zone``) without giving the mean
        values re-derives them from the new zone; changing ``grid_zone`` alone also re-derives ``price_zone``."""
        from dataclasses import replace

        kw = dict(fields)
        if "grid_zone" in kw:
            kw.setdefault("carbon_g_per_kwh", None)
            kw.setdefault("price_zone", None)
        if "grid_zone" in kw or "price_zone" in kw:
            kw.setdefault("electricity_usd_per_kwh", None)
        return replace(self, **kw)  # type: ignore[arg-type]

    @property
    def has_hourly_price(self) -> bool:
        return self.price_zone in _z.ZONE_PRICE_USD_PER_MWH

    @property
    def has_hourly_carbon(self) -> bool:
        return self.grid_zone in _z.ZONE_CARBON_G_PER_KWH


@dataclass(frozen=True, slots=True)
class Link:
    """A directed network link src -> dst. Builders add both directions."""

    src: str
    dst: str
    rtt_s: float
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS
    egress_usd_per_gb: float = 0.0  # charged to data leaving src towards dst

    def __post_init__(self) -> None:
        where = f"link {self.src}->{self.dst}"
        if self.src == self.dst:
            raise InputError(f"{where}: a link needs two different regions")
        rtt = _finite(self.rtt_s, f"{where}: rtt_s")
        bw = _finite(self.bandwidth_gbps, f"{where}: bandwidth_gbps")
        eg = _finite(self.egress_usd_per_gb, f"{where}: egress_usd_per_gb")
        if rtt < 0:
            raise InputError(f"{where}: rtt_s = {rtt}: expected >= 0")
        if bw <= 0:
            raise InputError(f"{where}: bandwidth_gbps = {bw}: expected > 0")
        if eg < 0:
            raise InputError(f"{where}: egress_usd_per_gb = {eg}: expected >= 0")
        object.__setattr__(self, "rtt_s", rtt)
        object.__setattr__(self, "bandwidth_gbps", bw)
        object.__setattr__(self, "egress_usd_per_gb", eg)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Fleet:
    """Regions and the directed links between them, with matrices computed on first use (read-only numpy)."""

    regions: tuple[Region, ...]
    links: tuple[Link, ...] = ()
    intra_region_bandwidth_gbps: float = INTRA_REGION_BANDWIDTH_GBPS
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        regions = tuple(self.regions)
        links = tuple(self.links)
        if not regions:
            raise InputError("fleet: expected at least one region")
        for r in regions:
            if not isinstance(r, Region):
                raise InputError(f"fleet: regions must be Region objects, got {type(r).__name__}")
        seen: set[str] = set()
        for r in regions:
            if r.name in seen:
                raise InputError(f"fleet: region name {r.name!r} appears twice")
            seen.add(r.name)
        pairs: set[tuple[str, str]] = set()
        for ln in links:
            if not isinstance(ln, Link):
                raise InputError(f"fleet: links must be Link objects, got {type(ln).__name__}")
            for end in (ln.src, ln.dst):
                if end not in seen:
                    raise InputError(f"fleet: link {ln.src}->{ln.dst}: unknown region {end!r}")
            if (ln.src, ln.dst) in pairs:
                raise InputError(f"fleet: link {ln.src}->{ln.dst} given twice")
            pairs.add((ln.src, ln.dst))
        bw = _finite(self.intra_region_bandwidth_gbps, "fleet: intra_region_bandwidth_gbps")
        if bw <= 0:
            raise InputError(f"fleet: intra_region_bandwidth_gbps = {bw}: expected > 0")
        object.__setattr__(self, "regions", regions)
        object.__setattr__(self, "links", links)
        object.__setattr__(self, "intra_region_bandwidth_gbps", bw)

    # ---- names and lookup -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.regions)

    @property
    def n(self) -> int:
        return len(self.regions)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {nm: i for i, nm in enumerate(self.names)}

    def index(self, region: str | int | Region) -> int:
        """Position of a region given by name, index or Region; :class:`InputError` if unknown."""
        if isinstance(region, Region):
            region = region.name
        if isinstance(region, (int, np.integer)) and not isinstance(region, bool):
            i = int(region)
            if not 0 <= i < self.n:
                raise InputError(f"fleet: region index {i} out of range 0..{self.n - 1}")
            return i
        try:
            return self._index[region]  # type: ignore[index]
        except (KeyError, TypeError):
            raise InputError(f"fleet: unknown region {region!r}; regions: {', '.join(self.names)}") from None

    def region(self, region: str | int) -> Region:
        return self.regions[self.index(region)]

    # ---- per-region vectors -----------------------------------------------------------------------------------
    @cached_property
    def electricity_usd_per_kwh(self) -> np.ndarray:
        return _readonly(np.array([r.electricity_usd_per_kwh for r in self.regions], dtype=float))

    @cached_property
    def carbon_g_per_kwh(self) -> np.ndarray:
        return _readonly(np.array([r.carbon_g_per_kwh for r in self.regions], dtype=float))

    @cached_property
    def utc_offset_h(self) -> np.ndarray:
        return _readonly(np.array([r.utc_offset_h for r in self.regions], dtype=float))

    @cached_property
    def latlon(self) -> np.ndarray:
        return _readonly(np.array([(r.lat, r.lon) for r in self.regions], dtype=float).reshape(-1, 2))

    # ---- graph ------------------------------------------------------------------------------------------------
    @cached_property
    def _direct(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(has_link bool, rtt, egress, bandwidth) of direct links, n x n."""
        n = self.n
        has = np.zeros((n, n), dtype=bool)
        rtt = np.full((n, n), np.inf)
        eg = np.zeros((n, n))
        bw = np.zeros((n, n))
        for ln in self.links:
            i, j = self._index[ln.src], self._index[ln.dst]
            has[i, j] = True
            rtt[i, j] = ln.rtt_s
            eg[i, j] = ln.egress_usd_per_gb
            bw[i, j] = ln.bandwidth_gbps
        return has, rtt, eg, bw

    @cached_property
    def adjacency(self) -> np.ndarray:
        """Boolean n x n: True where a direct link i->j exists."""
        return _readonly(self._direct[0].copy())

    @cached_property
    def _paths(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """All-pairs (rtt, egress, bandwidth, predecessor) as described in the module docstring."""
        n = self.n
        has, rtt_d, eg_d, bw_d = self._direct
        ii, jj = np.nonzero(has)
        graph = csr_matrix((rtt_d[ii, jj], (ii, jj)), shape=(n, n))  # explicit zeros stay edges
        dist, pred = shortest_path(graph, method="D", directed=True, return_predecessors=True)
        pred = pred.astype(np.int64)
        rows = np.broadcast_to(np.arange(n)[:, None], (n, n))
        cols = np.broadcast_to(np.arange(n)[None, :], (n, n))
        valid = pred >= 0
        p = np.where(valid, pred, 0)
        eg = np.zeros((n, n))
        bw = np.full((n, n), np.inf)
        # Extend paths one hop per pass (pred of j on the i-tree is one hop closer to i); stops after max hop count.
        for _ in range(n):
            eg_new = np.where(valid, eg[rows, p] + eg_d[p, cols], 0.0)
            bw_new = np.where(valid, np.minimum(bw[rows, p], bw_d[p, cols]), np.inf)
            if np.array_equal(eg_new, eg) and np.array_equal(bw_new, bw):
                break
            eg, bw = eg_new, bw_new
        # A direct link is used as is, even where a relayed path would be faster.
        rtt = np.where(has, rtt_d, dist)
        eg = np.where(has, eg_d, eg)
        bw = np.where(has, bw_d, bw)
        unreachable = ~np.isfinite(rtt)
        eg[unreachable] = np.inf
        bw[unreachable] = 0.0
        np.fill_diagonal(rtt, 0.0)
        np.fill_diagonal(eg, 0.0)
        np.fill_diagonal(bw, self.intra_region_bandwidth_gbps)
        return _readonly(rtt), _readonly(eg), _readonly(bw), _readonly(pred)

    @property
    def rtt_s(self) -> np.ndarray:
        """n x n round-trip times, seconds (0 on the diagonal, inf if unreachable)."""
        return self._paths[0]

    @property
    def egress_usd_per_gb(self) -> np.ndarray:
        """n x n egress price, USD per GB sent from row region to column region (0 on the diagonal)."""
        return self._paths[1]

    @property
    def bandwidth_gbps(self) -> np.ndarray:
        """n x n bandwidth, Gbit/s (intra-region bandwidth on the diagonal, 0 if unreachable)."""
        return self._paths[2]

    @cached_property
    def distance_km(self) -> np.ndarray:
        """n x n great-circle distance between region locations, km."""
        from fleetwise.fleet.network import haversine_km

        ll = self.latlon
        return _readonly(haversine_km(ll[:, None, 0], ll[:, None, 1], ll[None, :, 0], ll[None, :, 1]))

    @cached_property
    def _neighbors(self) -> tuple[tuple[int, ...], ...]:
        has, rtt, _, _ = self._direct
        out = []
        for i in range(self.n):
            js = np.nonzero(has[i])[0]
            out.append(tuple(int(j) for j in js[np.argsort(rtt[i, js], kind="stable")]))
        return tuple(out)

    def neighbors(self, region: str | int) -> tuple[int, ...]:
        """Indices of the regions with a direct link from ``region``, nearest (lowest RTT) first."""
        return self._neighbors[self.index(region)]

    def neighbor_names(self, region: str | int) -> tuple[str, ...]:
        return tuple(self.names[j] for j in self.neighbors(region))

    def path(self, src: str | int, dst: str | int) -> tuple[int, ...]:
        """Region indices of the route src..dst used by the matrices (the direct link if any); () if unreachable."""
        i, j = self.index(src), self.index(dst)
        if i == j:
            return (i,)
        if self._direct[0][i, j]:
            return (i, j)
        pred = self._paths[3]
        if pred[i, j] < 0:
            return ()
        out = [j]
        while out[-1] != i:
            out.append(int(pred[i, out[-1]]))
        return tuple(reversed(out))

    @cached_property
    def is_connected(self) -> bool:
        """True when every region can reach every other (strongly connected)."""
        has = self._direct[0]
        ncomp, _ = connected_components(csr_matrix(has.astype(np.int8)), directed=True, connection="strong")
        return bool(ncomp == 1)

    def transfer_time_s(self, src: str | int, dst: str | int, gigabytes: float) -> float:
        """One-way time to move ``gigabytes`` (1e9 bytes) src -> dst: rtt/2 + size / bandwidth (0 if src == dst)."""
        i, j = self.index(src), self.index(dst)
        if i == j:
            return 0.0
        return float(self.rtt_s[i, j] / 2.0 + gigabytes * 8.0 / self.bandwidth_gbps[i, j])

    def transfer_cost_usd(self, src: str | int, dst: str | int, gigabytes: float) -> float:
        i, j = self.index(src), self.index(dst)
        return float(gigabytes * self.egress_usd_per_gb[i, j])

    # ---- hourly series ----------------------------------------------------------------------------------------
    @cached_property
    def _hourly_price(self) -> np.ndarray:
        rows = []
        for r in self.regions:
            if r.has_hourly_price:
                zone_mean = _z.ZONE_PRICE_USD_PER_MWH[r.price_zone]  # type: ignore[index]
                s = _z.load_price_series(r.price_zone) / 1000.0  # type: ignore[arg-type]
                rows.append(_rescale(s, zone_mean / 1000.0, r.electricity_usd_per_kwh))  # type: ignore[arg-type]
            else:
                rows.append(np.full(_z.HOURS_PER_YEAR, r.electricity_usd_per_kwh))
        return _readonly(np.vstack(rows))

    @cached_property
    def _hourly_carbon(self) -> np.ndarray:
        rows = []
        for r in self.regions:
            if r.has_hourly_carbon:
                s = _z.load_carbon_series(r.grid_zone)
                zone_mean = _z.ZONE_CARBON_G_PER_KWH[r.grid_zone]
                rows.append(_rescale(s, zone_mean, r.carbon_g_per_kwh))  # type: ignore[arg-type]
            else:
                rows.append(np.full(_z.HOURS_PER_YEAR, r.carbon_g_per_kwh))
        return _readonly(np.vstack(rows))

    def load_hourly(self) -> Fleet:
        """Load the hourly 2023 series of every region now (else on first use); :class:`InputError` if data missing."""
        _ = self._hourly_price, self._hourly_carbon
        return self

    @property
    def hourly_price_usd_per_kwh(self) -> np.ndarray:
        """n x 8760 electricity price, USD/kWh, by UTC hour of 2023 (loads the data on first use)."""
        return self._hourly_price

    @property
    def hourly_carbon_g_per_kwh(self) -> np.ndarray:
        """n x 8760 carbon intensity, gCO2eq/kWh, by UTC hour of 2023 (loads the data on first use)."""
        return self._hourly_carbon

    def hourly_price(self, region: str | int, hour_of_year: float | np.ndarray) -> float | np.ndarray:
        """Electricity price, USD/kWh, of ``region`` at UTC hour ``hour_of_year`` (floored, wraps every 8760 h)."""
        return _at_hour(self._hourly_price[self.index(region)], hour_of_year)

    def hourly_carbon(self, region: str | int, hour_of_year: float | np.ndarray) -> float | np.ndarray:
        """Carbon intensity, gCO2eq/kWh, of ``region`` at UTC hour ``hour_of_year`` (floored, wraps every 8760 h)."""
        return _at_hour(self._hourly_carbon[self.index(region)], hour_of_year)

    def summary(self) -> str:
        lines = [f"fleet {self.name or ''}: {self.n} regions, {len(self.links)} links"]
        for r in self.regions:
            lines.append(
                f"  {r.name:22s} {r.cloud:9s} {r.grid_zone:12s} {r.electricity_usd_per_kwh * 1000:7.1f} USD/MWh "
                f"{r.carbon_g_per_kwh:6.0f} g/kWh"
            )
        return "\n".join(lines)


def _rescale(series: np.ndarray, zone_mean: float, target_mean: float) -> np.ndarray:
    """The zone's series, scaled so its mean is the region's value (unchanged when the region uses the zone mean)."""
    if math.isclose(zone_mean, target_mean, rel_tol=1e-12, abs_tol=0.0):
        return np.array(series, dtype=float)
    actual = float(np.mean(series))
    if actual == 0:
        return np.array(series, dtype=float) + target_mean
    return series * (target_mean / actual)


def _at_hour(series: np.ndarray, hour_of_year: float | np.ndarray) -> float | np.ndarray:
    h = np.floor(np.asarray(hour_of_year, dtype=float)).astype(np.int64) % _z.HOURS_PER_YEAR
    out = series[h]
    return float(out) if np.ndim(out) == 0 else out
