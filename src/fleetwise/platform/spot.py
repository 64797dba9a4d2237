"""Spot capacity from the real availability and preemption traces of ``spot-availability-multiregion``.

The dataset folder (see its PROVENANCE.md) holds 40 JSON files from two public sources:

* ``skypilot-spot-traces/{availability,preemption}/<N>-node/<cloud>-<date>/<zone>_<instance>.json`` (SkyPilot,
  ``skypilot-org/spot-traces``; Wu et al., NSDI'24): AWS and GCP zones, 1-, 4- and 16-node experiments;
* ``spothedge-gcp1/<zone>_a100_40gb_8.json`` (SpotHedge artifact ``MaoZiming/spothedge_ae``, EuroSys'25): a 3-day
  trace of GCP ``a2-ultragpu`` spot VMs in 6 zones, 0..4 instances.

Every file is ``{"metadata": {"gap_seconds": g}, "data": [c0, c1, ...]}``: ``c_k`` spot instances available
(availability traces) or still running (preemption traces; the experiment relaunches after a preemption) during
tick ``k``, which starts ``k * g`` seconds after the unstated trace start. Both kinds are read the same way here:
the count is the spot capacity obtainable during the tick, and every drop of the count is a preemption.

A trace is named ``<date folder>/<file stem>`` (``aws-02-15-2023/us-east-1a_v100_1``) or
``spothedge-gcp1/<file stem>``. Its *nominal* node count (``max_count``) is the experiment's size: 1, 4 or 16 from
the ``<N>-node`` folder, and 4 for SpotHedge GCP1 (the largest count in any of its files). A simulated spot pool
of ``capacity`` replicas has ``round(count / max_count * capacity)`` replicas available (half up): a 0/1 trace
gives 0 or ``capacity``. The nominal count, not each file's own maximum, is the scale: a zone that never
reached the full size (SpotHedge us-west1-b peaks at 3 of 4, us-east1-b is always 0) keeps that shortfall.
(``fleetwise.envs.graph_marl`` scales by each file's own maximum instead, so there SpotHedge asia-northeast1-a,
which never holds more than 1 of 4, counts as 96% available; here it is 24%.)

:data:`SPOT_TRACES` lists every trace with its shape and mean availability, so that names can be chosen
(:func:`spot_trace_for_zone`) without the data; :func:`spot_traces_from_data` recomputes the table and a test
compares the two.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from fleetwise.data import data_dir, data_path
from fleetwise.errors import InputError

DATASET = "spot-availability-multiregion"
SKYPILOT_DIR = "skypilot-spot-traces"
SPOTHEDGE_DIR = "spothedge-gcp1"
SPOTHEDGE_NODES = 4  # SpotHedge GCP1 files have no node count in their path; 4 is the largest count in any of them

# Notice a spot VM gets before the cloud takes it back, seconds.
# AWS: "A Spot Instance interruption notice is a warning that is issued two minutes before Amazon EC2 stops or
# terminates your Spot Instance" (EC2 User Guide, "Spot Instance interruption notices",
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
AWS_INTERRUPTION_NOTICE_S = 120.0
# GCP: on preemption Compute Engine sends an ACPI G2 soft-off signal and, if the VM has not stopped after
# 30 seconds, a G3 mechanical-off (Compute Engine docs, "Spot VMs", preemption process,
# https://cloud.google.com/compute/docs/instances/spot#preemption-process).
GCP_PREEMPTION_NOTICE_S = 30.0
# Azure: Spot VMs are evicted with a "Preempt" Scheduled Event whose minimum notice is 30 seconds
# (https://learn.microsoft.com/azure/virtual-machines/spot-vms and
# https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events).
AZURE_EVICTION_NOTICE_S = 30.0
PREEMPTION_NOTICE_S: dict[str, float] = {
    "aws": AWS_INTERRUPTION_NOTICE_S,
    "gcp": GCP_PREEMPTION_NOTICE_S,
    "azure": AZURE_EVICTION_NOTICE_S,
}

# Every trace of the dataset: name -> (kind, nominal nodes, gap_s, ticks, mean availability = mean count / nodes).
# Recomputed from the files by spot_traces_from_data() (tests/test_spot.py compares).
SPOT_TRACES: dict[str, tuple[str, int, int, int, float]] = {
    "aws-02-15-2023/us-east-1a_v100_1": ("availability", 1, 195, 20158, 0.16668),
    "aws-02-15-2023/us-east-1c_v100_1": ("availability", 1, 195, 20158, 0.46651),
    "aws-02-15-2023/us-east-1d_v100_1": ("availability", 1, 195, 20158, 0.44727),
    "aws-02-15-2023/us-east-1f_v100_1": ("availability", 1, 195, 20158, 0.59118),
    "aws-02-15-2023/us-east-2a_v100_1": ("availability", 1, 195, 20158, 0.75930),
    "aws-02-15-2023/us-east-2b_v100_1": ("availability", 1, 195, 20158, 0.68221),
    "aws-02-15-2023/us-west-2a_v100_1": ("availability", 1, 195, 20158, 0.88307),
    "aws-02-15-2023/us-west-2b_v100_1": ("availability", 1, 195, 20158, 0.90495),
    "aws-02-15-2023/us-west-2c_v100_1": ("availability", 1, 195, 20158, 0.89131),
    "aws-04-19-2023/us-east-1b_intel_64": ("preemption", 1, 34, 16090, 0.85053),
    "aws-04-19-2023/us-east-1c_intel_64": ("preemption", 1, 34, 16090, 0.63934),
    "aws-04-19-2023/us-east-1d_intel_64": ("preemption", 1, 34, 16090, 0.93996),
    "aws-04-22-2023/us-east-1c_v100_1": ("preemption", 1, 32, 19961, 0.31431),
    "aws-04-22-2023/us-east-1f_v100_1": ("preemption", 1, 32, 19961, 0.59200),
    "aws-04-22-2023/us-west-2b_v100_1": ("preemption", 1, 32, 19961, 0.79280),
    "aws-04-22-2023/us-west-2c_v100_1": ("preemption", 1, 32, 19961, 0.73098),
    "aws-08-03-2023/us-east-1f_v100_1": ("preemption", 4, 300, 3664, 0.34389),
    "aws-08-03-2023/us-east-2a_v100_1": ("preemption", 4, 300, 5131, 0.73090),
    "aws-08-03-2023/us-west-2c_v100_1": ("preemption", 4, 300, 5131, 0.81612),
    "aws-08-27-2023/us-east-2b_v100_1": ("availability", 16, 300, 3247, 0.54737),
    "aws-08-27-2023/us-west-2a_v100_1": ("availability", 16, 300, 4736, 0.43117),
    "aws-08-27-2023/us-west-2c_v100_1": ("availability", 16, 300, 4736, 0.42701),
    "aws-10-26-2022/us-west-2a_k80_1": ("availability", 1, 600, 3895, 0.89268),
    "aws-10-26-2022/us-west-2a_k80_8": ("availability", 1, 600, 3895, 0.32632),
    "aws-10-26-2022/us-west-2a_v100_1": ("availability", 1, 600, 3895, 0.79255),
    "aws-10-26-2022/us-west-2a_v100_8": ("availability", 1, 600, 3895, 0.47985),
    "aws-10-26-2022/us-west-2b_k80_1": ("availability", 1, 600, 3895, 0.11656),
    "aws-10-26-2022/us-west-2b_k80_8": ("availability", 1, 600, 3895, 0.40796),
    "aws-10-26-2022/us-west-2b_v100_1": ("availability", 1, 600, 3895, 0.71579),
    "aws-10-26-2022/us-west-2b_v100_8": ("availability", 1, 600, 3895, 0.46573),
    "gcp-04-30-2023/us-central1-a_c3-88": ("preemption", 1, 30, 5476, 0.99982),
    "gcp-04-30-2023/us-central1-b_c3-88": ("preemption", 1, 30, 5476, 0.99982),
    "gcp-04-30-2023/us-central1-c_c3-88": ("preemption", 1, 30, 5476, 0.99982),
    "gcp-04-30-2023/us-east1-b_c3-88": ("preemption", 1, 30, 5476, 0.95435),
    "spothedge-gcp1/asia-northeast1-a_a100_40gb_8": ("availability", 4, 150, 770, 0.23961),
    "spothedge-gcp1/europe-west4-a_a100_40gb_8": ("availability", 4, 150, 770, 0.98766),
    "spothedge-gcp1/us-central1-a_a100_40gb_8": ("availability", 4, 150, 770, 0.52565),
    "spothedge-gcp1/us-central1-b_a100_40gb_8": ("availability", 4, 150, 770, 0.74870),
    "spothedge-gcp1/us-east1-b_a100_40gb_8": ("availability", 4, 150, 770, 0.00000),
    "spothedge-gcp1/us-west1-b_a100_40gb_8": ("availability", 4, 150, 770, 0.15325),
}  # fmt: skip

# Which trace a zone gets by default (spot_trace_for_zone): GPU traces before CPU ones, the longest first.
_SOURCE_PREFERENCE = ("aws-02-15-2023", "spothedge-gcp1", "aws-08-27-2023", "aws-08-03-2023", "aws-04-22-2023",
                      "aws-10-26-2022", "gcp-04-30-2023", "aws-04-19-2023")
_INSTANCE_PREFERENCE = ("v100_1", "a100_40gb_8", "v100_8", "k80_1", "k80_8")


# ---------------------------------------------------------------------------------------------------- names
def _split_name(name: str) -> tuple[str, str, str]:
    """(source folder, zone, instance) of a trace name; InputError if it is not ``<folder>/<zone>_<instance>``."""
    folder, sep, stem = name.partition("/")
    zone, sep2, instance = stem.partition("_")
    if not sep or not sep2 or not folder or not zone or not instance or "/" in stem:
        raise InputError(f"spot trace {name!r}: expected '<date folder>/<zone>_<instance>', "
                         f"e.g. 'aws-02-15-2023/us-east-1a_v100_1'")
    return folder, zone, instance


def _cloud_of(folder: str) -> str:
    return "gcp" if folder == SPOTHEDGE_DIR else folder.split("-", 1)[0]


def region_of_zone(zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1`` (AWS), ``us-central1-a`` -> ``us-central1`` (GCP); else ``zone`` itself."""
    m = re.fullmatch(r"(.*-[a-z]+\d+)-([a-z])", zone) or re.fullmatch(r"(.*-\d+)([a-z])", zone)
    return m.group(1) if m else zone


# ---------------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class SpotTraceInfo:
    """One trace file: what it measures and its shape."""

    name: str  # "aws-02-15-2023/us-east-1a_v100_1" or "spothedge-gcp1/us-central1-a_a100_40gb_8"
    zone: str
    cloud: str  # "aws" | "gcp"
    kind: str  # "availability" | "preemption"
    nodes: int  # nominal node count: a count of `nodes` is full availability
    instance: str  # file-name part after the zone: "v100_1", "a100_40gb_8", "intel_64", "c3-88"
    gap_s: int
    ticks: int
    mean_availability: float  # mean count / nodes
    path: Path

    @property
    def region(self) -> str:
        return region_of_zone(self.zone)

    @property
    def duration_h(self) -> float:
        return self.gap_s * self.ticks / 3600.0


def data_available() -> bool:
    """True when the dataset folder can be found (tests skip otherwise)."""
    root = data_dir(required=False)
    return root is not None and (root / DATASET).is_dir()


def dataset_dir() -> Path:
    """The dataset folder; :class:`InputError` if the real data is not installed."""
    return data_path(DATASET)


def _read_file(path: Path) -> tuple[int, np.ndarray]:
    """(gap_seconds, counts) of one trace file, validated; InputError naming the file otherwise."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"{path}: cannot read spot trace ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise InputError(f"{path}: not JSON (nested too deeply)") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    if not isinstance(d, dict) or not isinstance(d.get("metadata"), dict) or "data" not in d:
        raise InputError(f"{path}: expected {{'metadata': {{'gap_seconds': ...}}, 'data': [...]}}")
    gap = d["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 < gap < 1e9 or gap != int(gap):
        raise InputError(f"{path}: metadata.gap_seconds = {gap!r}, expected a positive whole number of seconds")
    data = d["data"]
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: 'data' must be a non-empty list of counts")
    for k, c in enumerate(data):
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < 2**63:
            raise InputError(f"{path}: data[{k}] = {c!r}, expected a count >= 0")
    counts = np.asarray(data, dtype=np.int64)
    counts.setflags(write=False)
    return int(gap), counts


def _trace_files(root: Path) -> dict[str, tuple[Path, str, int]]:
    """name -> (path, kind, nominal nodes) for every JSON file of the dataset folder ``root``."""
    out: dict[str, tuple[Path, str, int]] = {}
    for p in sorted((root / SKYPILOT_DIR).glob("*/*-node/*/*.json")):
        kind, nodes_dir, folder = p.parts[-4], p.parts[-3], p.parts[-2]
        out[f"{folder}/{p.stem}"] = (p, kind, int(nodes_dir.split("-")[0]))
    for p in sorted((root / SPOTHEDGE_DIR).glob("*.json")):
        out[f"{SPOTHEDGE_DIR}/{p.stem}"] = (p, "availability", SPOTHEDGE_NODES)
    return out


@lru_cache(maxsize=4)
def _files_at(root: Path) -> dict[str, tuple[Path, str, int]]:
    files = _trace_files(root)
    if not files:
        raise InputError(f"{root}: no spot trace files (expected {SKYPILOT_DIR}/ and {SPOTHEDGE_DIR}/ JSON files)")
    return files


def _files() -> dict[str, tuple[Path, str, int]]:
    return _files_at(dataset_dir())


@lru_cache(maxsize=64)
def _load(path: Path) -> tuple[int, np.ndarray]:
    return _read_file(path)


def list_spot_traces() -> list[SpotTraceInfo]:
    """Every trace of the dataset folder, sorted by name (reads all 40 files, ~2 MB, once)."""
    out = []
    for name, (path, kind, nodes) in _files().items():
        folder, zone, instance = _split_name(name)
        gap, counts = _load(path)
        full = max(nodes, int(counts.max()))
        out.append(SpotTraceInfo(name=name, zone=zone, cloud=_cloud_of(folder), kind=kind, nodes=full,
                                 instance=instance, gap_s=gap, ticks=len(counts),
                                 mean_availability=float(counts.mean() / full), path=path))
    return sorted(out, key=lambda i: i.name)


def spot_traces_from_data() -> dict[str, tuple[str, int, int, int, float]]:
    """Recompute :data:`SPOT_TRACES` from the files (mean availability rounded to 5 decimals)."""
    return {i.name: (i.kind, i.nodes, i.gap_s, i.ticks, round(i.mean_availability, 5)) for i in list_spot_traces()}


def _unknown(name: str, names: list[str]) -> InputError:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    shown = close or names[:3]
    return InputError(f"spot trace {name!r}: unknown; {'did you mean' if close else 'e.g.'} "
                      f"{', '.join(shown)} ({len(names)} traces: fleetwise.platform.spot.list_spot_traces())")


def load_spot_trace(name: str) -> SpotTrace:
    """The trace ``name`` (see :data:`SPOT_TRACES`); InputError for an unknown name or a missing dataset."""
    name = name.removesuffix(".json")
    _split_name(name)
    files = _files()
    if name not in files:
        raise _unknown(name, sorted(files))
    path, kind, nodes = files[name]
    folder, zone, instance = _split_name(name)
    gap, counts = _load(path)
    return SpotTrace(name=name, zone=zone, cloud=_cloud_of(folder), kind=kind, instance=instance, gap_s=float(gap),
                     counts=counts, max_count=max(nodes, int(counts.max())))


# ---------------------------------------------------------------------------------------------------- a trace
@dataclass(frozen=True, eq=False)
class SpotTrace:
    """Spot counts per tick; ``available``/``changes`` scale them to a pool of ``capacity`` replicas.

    Simulated time ``t`` reads the trace at ``u = t + offset_s``: tick ``floor(u / gap_s)``. With ``loop`` the
    trace repeats (period ``duration_s``; a negative ``u`` wraps too); without, times before the start read the
    first tick and times after the end the last one.
    """

    name: str
    zone: str
    cloud: str
    kind: str
    instance: str
    gap_s: float
    counts: np.ndarray  # int64, read-only
    max_count: int  # the count that means "all `capacity` replicas available"
    _scaled: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ticks(self) -> int:
        return len(self.counts)

    @property
    def times_s(self) -> np.ndarray:
        """Start of each tick, seconds from the trace start."""
        return np.arange(self.ticks, dtype=float) * self.gap_s

    @property
    def duration_s(self) -> float:
        return self.ticks * self.gap_s

    @property
    def region(self) -> str:
        return region_of_zone(self.zone)

    @property
    def fraction(self) -> np.ndarray:
        """Counts as a fraction of ``max_count`` (0 .. 1)."""
        return self.counts / self.max_count if self.max_count else np.zeros(self.ticks)

    @property
    def notice_s(self) -> float:
        """The cloud's preemption notice (:data:`PREEMPTION_NOTICE_S`)."""
        return PREEMPTION_NOTICE_S[self.cloud]

    def scaled(self, capacity: int) -> np.ndarray:
        """Replicas available per tick for a pool of ``capacity``: round(count / max_count * capacity), half up."""
        if capacity < 0 or int(capacity) != capacity:
            raise InputError(f"spot capacity {capacity!r}: expected a whole number >= 0")
        capacity = int(capacity)
        s = self._scaled.get(capacity)
        if s is None:
            if self.max_count == 0 or capacity == 0:
                s = np.zeros(self.ticks, dtype=np.int64)
            else:
                s = np.floor(self.counts * (capacity / self.max_count) + 0.5).astype(np.int64)
                np.minimum(s, capacity, out=s)
            s.setflags(write=False)
            self._scaled[capacity] = s
        return s

    def _tick(self, t_s: float, offset_s: float, loop: bool) -> int:
        k = math.floor((t_s + offset_s) / self.gap_s + 1e-9)  # a change time computed by changes() reads its tick
        return k % self.ticks if loop else min(max(k, 0), self.ticks - 1)

    def available(self, t_s: float, capacity: int, offset_s: float = 0.0, loop: bool = True) -> int:
        """Spot replicas available at simulated time ``t_s`` for a pool of ``capacity`` replicas."""
        return int(self.scaled(capacity)[self._tick(t_s, offset_s, loop)])

    def changes(self, start_s: float, end_s: float, capacity: int, offset_s: float = 0.0,
                loop: bool = True) -> list[tuple[float, int]]:
        """The step changes ``(t, available from t on)`` with ``start_s < t <= end_s``, in time order.

        ``available(start_s, ...)`` is the value before the first change; each change is a tick boundary where
        the scaled count differs from the tick before (with ``loop``, also the wrap from the last tick to the
        first). A drop is a preemption of that many replicas, a rise is capacity coming back.
        """
        s = self.scaled(capacity)
        if end_s <= start_s:
            return []
        idx = np.flatnonzero(s[1:] != s[:-1]) + 1  # tick indices where the value changes
        if loop and self.ticks > 1 and s[0] != s[-1]:
            idx = np.concatenate(([0], idx))
        if not len(idx):
            return []
        u0, u1 = start_s + offset_s, end_s + offset_s
        eps = 1e-9 * self.gap_s
        if loop:
            period = self.duration_s
            m = np.arange(math.floor(u0 / period), math.floor(u1 / period) + 1, dtype=float)
            u = (m[:, None] * period + idx[None, :] * self.gap_s).ravel()
            vals = np.broadcast_to(s[idx], (len(m), len(idx))).ravel()
        else:
            u, vals = idx * self.gap_s, s[idx]
        keep = (u > u0 + eps) & (u <= u1 + eps)
        return [(float(t) - offset_s, int(v)) for t, v in zip(u[keep], vals[keep])]


# ---------------------------------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class PreemptionStats:
    duration_h: float
    mean_availability: float  # mean count / max_count
    preemption_events: int  # ticks whose count is below the tick before
    preempted_nodes: int  # sum of those drops
    preemptions_per_hour: float  # preemption events per hour of trace
    preempted_nodes_per_hour: float
    preemptions_per_node_hour: float  # preempted nodes per node-hour available: a running node's hazard rate
    mean_time_between_preemptions_h: float  # duration / preemption events (inf if none)


def preemption_stats(trace: SpotTrace) -> PreemptionStats:
    """Preemption statistics of one trace, computed from its counts (no wrap-around drop counted)."""
    c = trace.counts
    drops = -np.diff(c)
    drops = drops[drops > 0]
    dur_h = trace.duration_s / 3600.0
    events, nodes = len(drops), int(drops.sum())
    node_h = float(c.sum()) * trace.gap_s / 3600.0
    return PreemptionStats(
        duration_h=dur_h,
        mean_availability=float(c.mean() / trace.max_count) if trace.max_count else 0.0,
        preemption_events=events,
        preempted_nodes=nodes,
        preemptions_per_hour=events / dur_h,
        preempted_nodes_per_hour=nodes / dur_h,
        preemptions_per_node_hour=nodes / node_h if node_h else math.nan,
        mean_time_between_preemptions_h=dur_h / events if events else math.inf,
    )


# ---------------------------------------------------------------------------------------------------- defaults
def _preference(name: str) -> tuple[int, int, str]:
    folder, _, instance = _split_name(name)
    src = _SOURCE_PREFERENCE.index(folder) if folder in _SOURCE_PREFERENCE else len(_SOURCE_PREFERENCE)
    ins = _INSTANCE_PREFERENCE.index(instance) if instance in _INSTANCE_PREFERENCE else len(_INSTANCE_PREFERENCE)
    return src, ins, name


def spot_trace_for_zone(zone: str) -> str | None:
    """A default trace for a real zone (or region), or None if the dataset has none for it. Needs no data.

    A trace of that very zone is preferred, in the order GPU before CPU and longest first (AWS zones get an
    ``aws-02-15-2023`` V100 availability trace where there is one, GCP zones a SpotHedge A100 trace). A region
    name (``us-east-1``, ``us-central1``) gets the preferred trace of any of its zones.
    """
    z = zone.strip().lower()
    exact = [n for n in SPOT_TRACES if _split_name(n)[1] == z]
    if exact:
        return min(exact, key=_preference)
    in_region = [n for n in SPOT_TRACES if region_of_zone(_split_name(n)[1]) == z]
    if in_region:
        return min(in_region, key=_preference)
    return None


def spot_zones() -> list[str]:
    """Zones with at least one trace (from :data:`SPOT_TRACES`)."""
    return sorted({_split_name(n)[1] for n in SPOT_TRACES})
