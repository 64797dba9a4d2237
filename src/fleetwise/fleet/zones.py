"""Grid zones: 2023 annual means as constants, and loaders for the hourly series they come from.

All numbers come from the dataset folder ``multiregion-carbon-price-network-greendcc`` (see its PROVENANCE.md;
public source: the ``HewlettPackard/green-dcc`` repository):

* ``carbon_intensity_2023/<ZONE>_2023_hourly.csv.gz``: hourly 2023 grid carbon intensity of 16 zones. We use the
  ``Carbon Intensity gCO₂eq/kWh (direct)`` column (operational emissions; the file also has an LCA column).
* ``electricity_prices_2023_standardized/<ZONE>_electricity_prices_2023.csv.gz``: hourly 2023 wholesale prices of
  22 zones, USD/MWh (can be negative). IN-WE is stamped on the half hour; it is put in the hour it starts in.

Hour-of-year is counted in UTC from 2023-01-01 00:00 UTC (0 .. 8759). The constants below are the plain means of
the 8,760 hourly values; :func:`zone_means_from_data` recomputes them and the tests compare the two.
"""

from __future__ import annotations

import csv
import gzip
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np

from fleetwise.data import data_dir, data_path
from fleetwise.errors import InputError

DATASET = "multiregion-carbon-price-network-greendcc"
CARBON_DIR = "carbon_intensity_2023"
PRICE_DIR = "electricity_prices_2023_standardized"
NETWORK_DIR = "network_cost"
HOURS_PER_YEAR = 8760
_YEAR_START = datetime(2023, 1, 1, tzinfo=timezone.utc)
CARBON_COLUMN = "Carbon Intensity gCO₂eq/kWh (direct)"
PRICE_COLUMN = "Price (USD/MWh)"
TIME_COLUMN = "Datetime (UTC)"

# Mean 2023 direct carbon intensity, gCO2eq/kWh, of carbon_intensity_2023/<ZONE>_2023_hourly.csv.gz (8,760 rows each).
ZONE_CARBON_G_PER_KWH: dict[str, float] = {
    "AU-NSW": 502.101,
    "AU-VIC": 458.214,
    "BR-SP": 56.120,
    "CA-ON": 46.938,
    "CL-SIC": 220.627,
    "DE-LU": 307.662,
    "GB": 128.565,
    "IN-WE": 691.123,  # all rows flagged estimated by Electricity Maps (PROVENANCE.md)
    "JP-TK": 449.853,  # all rows flagged estimated by Electricity Maps (PROVENANCE.md)
    "KR": 378.209,
    "SG": 369.200,
    "US-CAL-CISO": 193.956,
    "US-MIDA-PJM": 321.816,
    "US-NY-NYIS": 209.680,
    "US-TEX-ERCO": 316.722,
    "ZA": 644.536,
}

# Mean 2023 wholesale price, USD/MWh, of electricity_prices_2023_standardized/<ZONE>_electricity_prices_2023.csv.gz.
ZONE_PRICE_USD_PER_MWH: dict[str, float] = {
    "AT": 110.077,
    "AU-NSW": 95.952,
    "AU-VIC": 54.819,
    "BE": 104.823,
    "BR-SP": 12.619,
    "CA-ON": 20.011,
    "CH": 115.815,
    "CL-SIC": 126.409,
    "DE-LU": 102.567,
    "ES": 93.866,
    "FR": 104.221,
    "IN-WE": 61.851,
    "JP-TK": 89.276,
    "KR": 110.981,
    "NL": 103.311,
    "PT": 95.120,
    "SG": 184.901,
    "US-CAL-CISO": 61.523,
    "US-MIDA-PJM": 35.739,
    "US-NY-NYIS": 36.388,
    "US-TEX-ERCO": 55.935,
    "ZA": 72.219,
}

# Standard-time UTC offset of each zone, hours (no daylight saving). Common knowledge, not from the dataset.
ZONE_UTC_OFFSET_H: dict[str, float] = {
    "AT": 1, "AU-NSW": 10, "AU-VIC": 10, "BE": 1, "BR-SP": -3, "CA-ON": -5, "CH": 1, "CL-SIC": -4, "DE-LU": 1,
    "ES": 1, "FR": 1, "GB": 0, "IN-WE": 5.5, "JP-TK": 9, "KR": 9, "NL": 1, "PT": 0, "SG": 8, "US-CAL-CISO": -8,
    "US-MIDA-PJM": -5, "US-NY-NYIS": -5, "US-TEX-ERCO": -6, "ZA": 2,
}  # fmt: skip

# A representative city (lat, lon) per zone, for regions placed "in a zone" without a location (single_region).
ZONE_REFERENCE_LATLON: dict[str, tuple[float, float]] = {
    "AT": (48.21, 16.37), "AU-NSW": (-33.87, 151.21), "AU-VIC": (-37.81, 144.96), "BE": (50.85, 4.35),
    "BR-SP": (-23.55, -46.63), "CA-ON": (43.65, -79.38), "CH": (47.37, 8.54), "CL-SIC": (-33.45, -70.67),
    "DE-LU": (50.11, 8.68), "ES": (40.42, -3.70), "FR": (48.86, 2.35), "GB": (51.51, -0.13), "IN-WE": (19.08, 72.88),
    "JP-TK": (35.68, 139.69), "KR": (37.57, 126.98), "NL": (52.37, 4.90), "PT": (38.72, -9.14), "SG": (1.35, 103.82),
    "US-CAL-CISO": (37.35, -121.96), "US-MIDA-PJM": (39.04, -77.49), "US-NY-NYIS": (40.71, -74.01),
    "US-TEX-ERCO": (30.27, -97.74), "ZA": (-26.20, 28.05),
}  # fmt: skip

CARBON_ZONES: tuple[str, ...] = tuple(sorted(ZONE_CARBON_G_PER_KWH))
PRICE_ZONES: tuple[str, ...] = tuple(sorted(ZONE_PRICE_USD_PER_MWH))
# Zones with both an hourly carbon and an hourly price series: the 15 that synthetic topologies cycle through.
ECONOMIC_ZONES: tuple[str, ...] = tuple(z for z in CARBON_ZONES if z in ZONE_PRICE_USD_PER_MWH)


def dataset_dir() -> Path:
    """The dataset folder; :class:`InputError` if the real data is not installed."""
    return data_path(DATASET)


def data_available() -> bool:
    """True when the dataset folder can be found (tests skip otherwise)."""
    root = data_dir(required=False)
    return root is not None and (root / DATASET).is_dir()


def _hour_of_year(stamp: str, path: Path, row: int) -> int:
    try:
        dt = datetime.fromisoformat(stamp)
    except ValueError:
        raise InputError(f"{path}: row {row}: '{TIME_COLUMN}' = {stamp!r} is not a timestamp") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int((dt - _YEAR_START).total_seconds() // 3600)


def _read_hourly(path: Path, column: str) -> np.ndarray:
    """Read one hourly CSV(.gz) into an array indexed by UTC hour of 2023; every hour must be present once."""
    out = np.full(HOURS_PER_YEAR, np.nan)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        for col in (TIME_COLUMN, column):
            if col not in fields:
                raise InputError(f"{path}: missing column {col!r} (has {fields})")
        for row_no, row in enumerate(reader, start=2):
            h = _hour_of_year(row[TIME_COLUMN], path, row_no)
            if not 0 <= h < HOURS_PER_YEAR:
                raise InputError(f"{path}: row {row_no}: {row[TIME_COLUMN]} is outside 2023")
            try:
                out[h] = float(row[column])
            except ValueError:
                raise InputError(f"{path}: row {row_no}: {column!r} = {row[column]!r} is not a number") from None
    missing = int(np.isnan(out).sum())
    if missing:
        raise InputError(f"{path}: {missing} of {HOURS_PER_YEAR} hours of 2023 missing")
    out.setflags(write=False)
    return out


def carbon_file(zone: str) -> Path:
    return dataset_dir() / CARBON_DIR / f"{zone}_2023_hourly.csv.gz"


def price_file(zone: str) -> Path:
    return dataset_dir() / PRICE_DIR / f"{zone}_electricity_prices_2023.csv.gz"


@lru_cache(maxsize=None)
def load_carbon_series(zone: str) -> np.ndarray:
    """Hourly 2023 direct carbon intensity of ``zone``, gCO2eq/kWh, shape (8760,), read-only, UTC hour index."""
    if zone not in ZONE_CARBON_G_PER_KWH:
        raise InputError(f"grid zone {zone!r}: no carbon series; zones with one: {', '.join(CARBON_ZONES)}")
    p = carbon_file(zone)
    if not p.exists():
        raise InputError(f"{p}: file not found")
    return _read_hourly(p, CARBON_COLUMN)


@lru_cache(maxsize=None)
def load_price_series(zone: str) -> np.ndarray:
    """Hourly 2023 wholesale electricity price of ``zone``, USD/MWh, shape (8760,), read-only, UTC hour index."""
    if zone not in ZONE_PRICE_USD_PER_MWH:
        raise InputError(f"price zone {zone!r}: no price series; zones with one: {', '.join(PRICE_ZONES)}")
    p = price_file(zone)
    if not p.exists():
        raise InputError(f"{p}: file not found")
    return _read_hourly(p, PRICE_COLUMN)


def zones_in_data() -> tuple[list[str], list[str]]:
    """(carbon zones, price zones) found as files in the dataset folder."""
    root = dataset_dir()
    carbon = sorted(p.name.split("_2023_hourly")[0] for p in (root / CARBON_DIR).glob("*_2023_hourly.csv.gz"))
    price = sorted(
        p.name.split("_electricity_prices")[0] for p in (root / PRICE_DIR).glob("*_electricity_prices_2023.csv.gz")
    )
    return carbon, price


def zone_means_from_data() -> tuple[dict[str, float], dict[str, float]]:
    """Recompute ({zone: mean gCO2/kWh}, {zone: mean USD/MWh}) from every file found (source of the constants)."""
    carbon, price = zones_in_data()
    def c(z: str) -> np.ndarray:
        return load_carbon_series(z) if z in ZONE_CARBON_G_PER_KWH else _read_hourly(carbon_file(z), CARBON_COLUMN)

    def p(z: str) -> np.ndarray:
        return load_price_series(z) if z in ZONE_PRICE_USD_PER_MWH else _read_hourly(price_file(z), PRICE_COLUMN)

    return {z: float(c(z).mean()) for z in carbon}, {z: float(p(z).mean()) for z in price}


@lru_cache(maxsize=None)
def load_transfer_cost_matrix(cloud: str) -> tuple[tuple[str, ...], np.ndarray]:
    """(region names, square matrix USD/GB) of ``network_cost/<cloud>_transmission_cost_matrix.csv``; row = source."""
    if cloud not in ("aws", "azure", "gcp"):
        raise InputError(f"cloud {cloud!r}: no transfer cost matrix; expected one of aws, azure, gcp")
    p = dataset_dir() / NETWORK_DIR / f"{cloud}_transmission_cost_matrix.csv"
    if not p.exists():
        raise InputError(f"{p}: file not found")
    with open(p, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    header = tuple(rows[0][1:])
    names = tuple(r[0] for r in rows[1:])
    if header != names:
        raise InputError(f"{p}: row names {names} differ from column names {header}")
    try:
        m = np.array([[float(x) for x in r[1:]] for r in rows[1:]])
    except ValueError as e:
        raise InputError(f"{p}: non-numeric cell ({e})") from None
    if m.shape != (len(names), len(names)):
        raise InputError(f"{p}: expected a {len(names)}x{len(names)} matrix, got {m.shape}")
    m.setflags(write=False)
    return names, m
