"""The ``fleet:`` part of a scenario YAML (pydantic v2, unknown keys rejected) and :func:`build_fleet`.

Examples::

    fleet: {topology: single}                                    # one region "local" on the PJM grid
    fleet: {topology: single, region: eu-central-1}
    fleet: {topology: backbone}                                  # the 14-region default backbone
    fleet:
      topology: backbone
      regions:
        - us-east-1
        - {name: eu-central-1, electricity_usd_per_kwh: 0.08}   # catalog region with an override
        - {name: my-dc, cloud: onprem, grid_zone: CA-ON, lat: 43.7, lon: -79.4, utc_offset_h: -5}  # custom region
      links:
        - {src: us-east-1, dst: eu-central-1, bandwidth_gbps: 40}   # both directions unless both_directions: false
    fleet: {topology: grid, rows: 3, cols: 4, spacing_km: 800}
    fleet: {topology: ring, n: 8}
    fleet: {topology: random_geometric, n: 20, radius: 0.35, seed: 7}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from fleetwise.strict import StrictModel
from fleetwise.errors import InputError
from fleetwise.fleet.network import DEFAULT_EGRESS_USD_PER_GB
from fleetwise.fleet.regions import CATALOG, get_region
from fleetwise.fleet.topology import continental_backbone, grid, random_geometric, ring, single_region
from fleetwise.fleet.types import DEFAULT_BANDWIDTH_GBPS, Fleet, Region
from fleetwise.fleet.zones import ECONOMIC_ZONES
from fleetwise.limits import MAX_REGIONS, MAX_SEED


class _Model(StrictModel):  # no unknown fields, NaN, infinity or true for a number
    model_config = ConfigDict(frozen=True)


class RegionEntry(_Model):
    """A catalog region with overrides, or (name not in the catalog) a custom region: then lat, lon and grid_zone
    are required."""

    name: str = Field(min_length=1)
    cloud: str | None = None
    grid_zone: str | None = None
    price_zone: str | None = None
    lat: float | None = Field(default=None, ge=-90, le=90)
    lon: float | None = Field(default=None, ge=-180, le=180)
    utc_offset_h: float | None = Field(default=None, ge=-12, le=14)
    electricity_usd_per_kwh: float | None = Field(default=None, ge=-1e4, le=1e4)  # wholesale prices may be negative
    carbon_g_per_kwh: float | None = Field(default=None, ge=0, le=1e5)

    def overrides(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(exclude={"name"}).items() if v is not None}


# bounds of a network's numbers: a round trip over a minute, a link under 1 kbit/s or over 1 Pbit/s, or a synthetic
# distance beyond 100,000 km (Earth's circumference is 40,075 km) is a typo; rtt_s 1e308 gave Infinity latencies
MAX_RTT_S = 60.0
BANDWIDTH_GBPS = {"ge": 1e-6, "le": 1e6}
MAX_KM = 100_000.0


class LinkOverride(_Model):
    src: str
    dst: str
    rtt_s: float | None = Field(default=None, ge=0, le=MAX_RTT_S)
    bandwidth_gbps: float | None = Field(default=None, **BANDWIDTH_GBPS)
    egress_usd_per_gb: float | None = Field(default=None, ge=0, le=1e6)
    both_directions: bool = True

    @model_validator(mode="after")
    def _two_regions(self):  # (a link from a region to itself was ignored: traffic inside a region is local)
        if self.src == self.dst:
            raise ValueError(f"a link joins two regions; src and dst are both {self.src!r}")
        return self


class SingleSpec(_Model):
    topology: Literal["single"]
    region: str | RegionEntry = "local"


class BackboneSpec(_Model):
    topology: Literal["backbone"]
    # None: DEFAULT_BACKBONE
    regions: list[str | RegionEntry] | None = Field(default=None, min_length=1, max_length=MAX_REGIONS)
    bandwidth_gbps: float = Field(default=DEFAULT_BANDWIDTH_GBPS, **BANDWIDTH_GBPS)
    measured_rtt: bool = True
    links: list[LinkOverride] = Field(default_factory=list)


class _Synthetic(_Model):
    zones: list[str] | None = Field(default=None, min_length=1)  # None: the 15 zones with hourly price and carbon
    bandwidth_gbps: float = Field(default=DEFAULT_BANDWIDTH_GBPS, **BANDWIDTH_GBPS)
    egress_usd_per_gb: float = Field(default=DEFAULT_EGRESS_USD_PER_GB, ge=0, le=1e6)

    @field_validator("zones")
    @classmethod
    def _known_zones(cls, v: list[str] | None) -> list[str] | None:
        for z in v or []:
            if z not in ECONOMIC_ZONES:
                raise ValueError(f"{z!r} has no hourly carbon and price series; use one of {', '.join(ECONOMIC_ZONES)}")
        return v


class GridSpec(_Synthetic):
    topology: Literal["grid"]
    rows: int = Field(ge=1, le=MAX_REGIONS)
    cols: int = Field(ge=1, le=MAX_REGIONS)
    spacing_km: float = Field(default=500.0, gt=0, le=MAX_KM)

    @field_validator("cols")
    @classmethod
    def _size(cls, v: int, info) -> int:
        rows = info.data.get("rows")
        if rows is not None and rows * v > MAX_REGIONS:
            raise ValueError(f"rows x cols = {rows * v:,} regions, above the limit of {MAX_REGIONS:,} (docs/limits.md)")
        return v


class RingSpec(_Synthetic):
    topology: Literal["ring"]
    n: int = Field(ge=1, le=MAX_REGIONS)
    spacing_km: float = Field(default=1000.0, gt=0, le=MAX_KM)


class RandomGeometricSpec(_Synthetic):
    topology: Literal["random_geometric"]
    n: int = Field(ge=1, le=MAX_REGIONS)
    radius: float = Field(default=0.3, gt=0, le=10)  # link distance as a fraction of side_km
    side_km: float = Field(default=5000.0, gt=0, le=MAX_KM)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)  # None: use the rng given to build_fleet


FleetSpec = Annotated[
    Union[SingleSpec, BackboneSpec, GridSpec, RingSpec, RandomGeometricSpec], Field(discriminator="topology")
]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(FleetSpec)
TOPOLOGIES = ("single", "backbone", "grid", "ring", "random_geometric")


_BRANCH_TAGS = {"str", "RegionEntry", "LinkOverride", *TOPOLOGIES}


def _format_error(e: ValidationError, where: str) -> str:
    errors = e.errors()
    # In "str | RegionEntry" unions, the model branch's error says more than "Input should be a valid string".
    err = next((x for x in errors if "str" not in x["loc"]), errors[0])
    loc = ""
    for part in err["loc"]:
        if isinstance(part, int):
            loc += f"[{part}]"
        elif part not in _BRANCH_TAGS:
            loc += f".{part}" if loc else str(part)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "union_tag_invalid" or err["type"] == "union_tag_not_found":
        msg = f"topology must be one of {', '.join(TOPOLOGIES)}"
        loc = "topology"
    got = err.get("input")
    tail = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    model_branch = [x for x in errors if "str" not in x["loc"]] or errors
    n_more = len({tuple(p for p in x["loc"] if p not in _BRANCH_TAGS) for x in model_branch}) - 1
    more = f" [+{n_more} more]" if n_more > 0 else ""
    return f"{where}{'.' + loc if loc else ''}: {msg}{tail}{more}"


def parse_fleet_spec(data: Mapping[str, Any] | Any, where: str = "fleet") -> Any:
    """Validate a ``fleet:`` mapping into one of the spec models; :class:`InputError` with a one-line message."""
    if isinstance(data, BaseModel):
        return data
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected a mapping with a 'topology' key, got {type(data).__name__}")
    try:
        return _ADAPTER.validate_python(dict(data))
    except ValidationError as e:
        raise InputError(_format_error(e, where)) from None


def _entry_region(entry: str | RegionEntry, where: str) -> Region:
    if isinstance(entry, str):
        return get_region(entry, where=where)
    if entry.name in CATALOG or ":" in entry.name or "/" in entry.name:
        base = get_region(entry.name, where=where)
        return base.with_overrides(**entry.overrides()) if entry.overrides() else base
    missing = [k for k in ("lat", "lon", "grid_zone") if getattr(entry, k) is None]
    if missing:
        try:
            get_region(entry.name, where=where)
        except InputError as e:
            raise InputError(
                f"{e}; or give {', '.join(missing)} to define a custom region {entry.name!r}"
            ) from None
    kw = entry.overrides()
    kw.setdefault("cloud", "custom")
    return Region(name=entry.name, **kw)


def build_fleet(spec: Mapping[str, Any] | Any, rng: np.random.Generator | int | None = None) -> Fleet:
    """Build the :class:`Fleet` a spec (model or plain mapping) describes. ``rng`` drives random topologies."""
    s = parse_fleet_spec(spec)
    if isinstance(s, SingleSpec):
        if isinstance(s.region, str):
            return single_region(s.region)
        ov = s.region.overrides()
        return single_region(s.region.name, grid_zone=ov.pop("grid_zone", None), **ov)
    if isinstance(s, BackboneSpec):
        regions = None
        if s.regions is not None:
            regions = [_entry_region(e, f"fleet.regions[{k}]") for k, e in enumerate(s.regions)]
            seen: set[str] = set()
            for k, r in enumerate(regions):
                if r.name in seen:
                    raise InputError(f"fleet.regions[{k}]: region {r.name!r} listed twice")
                seen.add(r.name)
        overrides: dict[tuple[str, str], dict[str, float]] = {}
        for lo in s.links:
            dumped = lo.model_dump(exclude={"src", "dst", "both_directions"})
            fields = {k: v for k, v in dumped.items() if v is not None}
            pairs = [(lo.src, lo.dst)] + ([(lo.dst, lo.src)] if lo.both_directions else [])
            for p in pairs:
                overrides.setdefault(p, {}).update(fields)
        return continental_backbone(
            regions, bandwidth_gbps=s.bandwidth_gbps, use_measured_rtt=s.measured_rtt, link_overrides=overrides
        )
    common = {"zones": s.zones, "bandwidth_gbps": s.bandwidth_gbps, "egress_usd_per_gb": s.egress_usd_per_gb}
    if isinstance(s, GridSpec):
        return grid(s.rows, s.cols, s.spacing_km, **common)
    if isinstance(s, RingSpec):
        return ring(s.n, s.spacing_km, **common)
    if isinstance(s, RandomGeometricSpec):
        r = s.seed if s.seed is not None else rng
        return random_geometric(s.n, s.radius, r, side_km=s.side_km, **common)
    raise InputError(f"fleet: unsupported spec {type(s).__name__}")  # pragma: no cover
