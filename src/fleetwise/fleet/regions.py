"""Built-in catalog of real cloud regions (aws, gcp, azure) with their grid zones and 2023 economics.

Each region sits at the metro of its provider's region name (coordinates of the city, rounded; exact data-centre
sites are not public), with that place's standard-time UTC offset. ``grid_zone`` is the carbon zone and
``price_zone`` the electricity-price zone from the 2023 dataset (``multiregion-carbon-price-network-greendcc``);
the region's ``electricity_usd_per_kwh`` and ``carbon_g_per_kwh`` are those zones' 2023 annual means
(constants in :mod:`.zones`, recomputed from the files by :func:`region_means_from_data`).

The dataset has 16 carbon zones and 22 price zones. Where a region's own grid has no series, the nearest grid
with one is used and ``Region.note`` says so (e.g. Oregon's hydro-heavy BPA grid -> California's CISO: the
stand-in is dirtier than the real grid).
"""

from __future__ import annotations

from fleetwise.errors import InputError
from fleetwise.fleet import zones as _z
from fleetwise.fleet.types import Region

_NEAREST = "nearest grid with 2023 data"

# (name, cloud, grid_zone, price_zone or None (= grid_zone), lat, lon, utc_offset_h, note)
_ROWS: list[tuple[str, str, str, str | None, float, float, float, str]] = [
    # ---- AWS -----------------------------------------------------------------------------------------------
    ("us-east-1", "aws", "US-MIDA-PJM", None, 39.04, -77.49, -5, "N. Virginia (Ashburn), PJM"),
    ("us-east-2", "aws", "US-MIDA-PJM", None, 39.96, -83.00, -5, "Ohio (Columbus), PJM"),
    ("us-west-1", "aws", "US-CAL-CISO", None, 37.35, -121.96, -8, "N. California (Bay Area), CAISO"),
    ("us-west-2", "aws", "US-CAL-CISO", None, 45.84, -119.70, -8,
     f"Oregon (Boardman); real grid BPA (hydro) has no series: CAISO is the {_NEAREST}"),
    ("ca-central-1", "aws", "CA-ON", None, 45.50, -73.57, -5,
     f"Montreal; real grid Hydro-Quebec has no series: Ontario (IESO) is the {_NEAREST}"),
    ("eu-west-1", "aws", "GB", "NL", 53.35, -6.26, 0,
     f"Dublin; Ireland has no series: carbon GB, price NL are the {_NEAREST}"),
    ("eu-west-2", "aws", "GB", "BE", 51.51, -0.13, 0, f"London; GB has no price series: BE is the {_NEAREST}"),
    ("eu-west-3", "aws", "GB", "FR", 48.86, 2.35, 1,
     f"Paris; France has no carbon series: GB is the {_NEAREST} (real FR grid is cleaner, nuclear)"),
    ("eu-central-1", "aws", "DE-LU", None, 50.11, 8.68, 1, "Frankfurt"),
    ("eu-central-2", "aws", "DE-LU", "CH", 47.37, 8.54, 1,
     f"Zurich; Switzerland has no carbon series: DE-LU is the {_NEAREST}"),
    ("ap-northeast-1", "aws", "JP-TK", None, 35.68, 139.69, 9, "Tokyo (carbon series estimated)"),
    ("ap-northeast-2", "aws", "KR", None, 37.57, 126.98, 9, "Seoul"),
    ("ap-southeast-1", "aws", "SG", None, 1.35, 103.82, 8, "Singapore"),
    ("ap-southeast-2", "aws", "AU-NSW", None, -33.87, 151.21, 10, "Sydney"),
    ("ap-south-1", "aws", "IN-WE", None, 19.08, 72.88, 5.5, "Mumbai (carbon series estimated)"),
    ("sa-east-1", "aws", "BR-SP", None, -23.55, -46.63, -3, "Sao Paulo"),
    ("af-south-1", "aws", "ZA", None, -33.92, 18.42, 2, "Cape Town"),
    # ---- GCP -----------------------------------------------------------------------------------------------
    ("us-central1", "gcp", "US-MIDA-PJM", None, 41.26, -95.86, -6,
     f"Council Bluffs, Iowa; real grid MISO has no series: PJM is the {_NEAREST}"),
    ("us-east1", "gcp", "US-MIDA-PJM", None, 33.20, -80.01, -5,
     f"Moncks Corner, S. Carolina; real grid (SC) has no series: PJM is the {_NEAREST}"),
    ("us-west1", "gcp", "US-CAL-CISO", None, 45.59, -121.18, -8,
     f"The Dalles, Oregon; real grid BPA (hydro) has no series: CAISO is the {_NEAREST}"),
    ("europe-west1", "gcp", "DE-LU", "BE", 50.45, 3.82, 1,
     f"St. Ghislain, Belgium; Belgium has no carbon series: DE-LU is the {_NEAREST}"),
    ("europe-west4", "gcp", "DE-LU", "NL", 53.44, 6.83, 1,
     f"Eemshaven, Netherlands; NL has no carbon series: DE-LU is the {_NEAREST}"),
    ("asia-northeast1", "gcp", "JP-TK", None, 35.68, 139.69, 9, "Tokyo (carbon series estimated)"),
    ("asia-northeast3", "gcp", "KR", None, 37.57, 126.98, 9, "Seoul; egress from asia-northeast1's matrix row"),
    ("asia-south1", "gcp", "IN-WE", None, 19.08, 72.88, 5.5, "Mumbai (carbon series estimated)"),
    ("asia-southeast1", "gcp", "SG", None, 1.34, 103.71, 8, "Singapore (Jurong West)"),
    ("australia-southeast1", "gcp", "AU-NSW", None, -33.87, 151.21, 10, "Sydney"),
    ("southamerica-east1", "gcp", "BR-SP", None, -23.53, -46.79, -3, "Sao Paulo (Osasco)"),
    ("africa-south1", "gcp", "ZA", None, -26.20, 28.05, 2, "Johannesburg"),
    # ---- Azure ---------------------------------------------------------------------------------------------
    ("eastus", "azure", "US-MIDA-PJM", None, 37.37, -79.82, -5, "Virginia, PJM"),
    ("eastus2", "azure", "US-MIDA-PJM", None, 36.67, -78.39, -5, "Virginia (Boydton), PJM"),
    ("westus", "azure", "US-CAL-CISO", None, 37.78, -122.42, -8, "California (San Francisco)"),
    ("southcentralus", "azure", "US-TEX-ERCO", None, 29.42, -98.49, -6, "Texas (San Antonio), ERCOT"),
    ("canadacentral", "azure", "CA-ON", None, 43.65, -79.38, -5, "Toronto"),
    ("westeurope", "azure", "DE-LU", "NL", 52.37, 4.90, 1,
     f"Amsterdam; NL has no carbon series: DE-LU is the {_NEAREST}"),
    ("northeurope", "azure", "GB", "NL", 53.35, -6.26, 0,
     f"Dublin; Ireland has no series: carbon GB, price NL are the {_NEAREST}"),
    ("francecentral", "azure", "GB", "FR", 48.86, 2.35, 1,
     f"Paris; France has no carbon series: GB is the {_NEAREST} (real FR grid is cleaner, nuclear)"),
    ("germanywestcentral", "azure", "DE-LU", None, 50.11, 8.68, 1, "Frankfurt"),
    ("switzerlandnorth", "azure", "DE-LU", "CH", 47.45, 8.56, 1,
     f"Zurich; Switzerland has no carbon series: DE-LU is the {_NEAREST}"),
    ("spaincentral", "azure", "GB", "ES", 40.42, -3.70, 1,
     f"Madrid; Spain has no carbon series: GB is the {_NEAREST}"),
    ("japaneast", "azure", "JP-TK", None, 35.68, 139.77, 9, "Tokyo (carbon series estimated)"),
    ("koreacentral", "azure", "KR", None, 37.57, 126.98, 9, "Seoul"),
    ("centralindia", "azure", "IN-WE", None, 18.58, 73.92, 5.5, "Pune (carbon series estimated)"),
    ("southeastasia", "azure", "SG", None, 1.28, 103.83, 8, "Singapore"),
    ("australiaeast", "azure", "AU-NSW", None, -33.86, 151.21, 10, "New South Wales (Sydney)"),
    ("australiasoutheast", "azure", "AU-VIC", None, -37.81, 144.96, 10, "Victoria (Melbourne)"),
    ("brazilsouth", "azure", "BR-SP", None, -23.55, -46.63, -3, "Sao Paulo"),
    ("southafricanorth", "azure", "ZA", None, -25.73, 28.22, 2, "Johannesburg"),
]  # fmt: skip

CATALOG: dict[str, Region] = {
    name: Region(
        name=name, cloud=cloud, grid_zone=gz, lat=lat, lon=lon, utc_offset_h=utc, price_zone=pz, note=note
    )
    for name, cloud, gz, pz, lat, lon, utc, note in _ROWS
}
CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")

# The default continental backbone: 14 regions on 6 continents, 3 clouds.
DEFAULT_BACKBONE: tuple[str, ...] = (
    "us-east-1", "us-west-2", "ca-central-1", "sa-east-1", "eu-central-1", "ap-northeast-1", "ap-southeast-1",
    "ap-south-1", "us-central1", "europe-west4", "asia-northeast3", "eastus", "westeurope", "australiaeast",
)  # fmt: skip


def region_names(cloud: str | None = None) -> tuple[str, ...]:
    """Catalog region names, optionally of one cloud."""
    return tuple(n for n, r in CATALOG.items() if cloud is None or r.cloud == cloud)


def get_region(name: str, where: str = "region") -> Region:
    """The catalog region ``name`` (``cloud:name`` / ``cloud/name`` also accepted); a clear error if unknown."""
    key = name
    for sep in (":", "/"):
        if isinstance(name, str) and sep in name:
            cloud, _, rest = name.partition(sep)
            if cloud in CLOUDS:
                key = rest
                if key in CATALOG and CATALOG[key].cloud != cloud:
                    raise InputError(f"{where}: {name!r}: region {key!r} belongs to {CATALOG[key].cloud}, not {cloud}")
    if key not in CATALOG:
        listing = "; ".join(f"{c}: {', '.join(region_names(c))}" for c in CLOUDS)
        raise InputError(f"{where}: unknown region {name!r}; valid regions are {listing}")
    return CATALOG[key]


def region_means_from_data() -> dict[str, tuple[float, float]]:
    """{catalog name: (electricity USD/kWh, carbon gCO2/kWh)}: 2023 means recomputed from the hourly files."""
    out: dict[str, tuple[float, float]] = {}
    for name, r in CATALOG.items():
        price = float(_z.load_price_series(r.price_zone).mean()) / 1000.0  # type: ignore[arg-type]
        carbon = float(_z.load_carbon_series(r.grid_zone).mean())
        out[name] = (price, carbon)
    return out
