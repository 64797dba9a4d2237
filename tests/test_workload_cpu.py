"""CPU traces as users have them (issue 16 §5): the real PlanetLab series re-delimited into the Bitbrains and
Alibaba 2018 layouts, gzip, folders of month folders, headerless files with a column index."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from fleetwise.errors import InputError
from fleetwise.workload.cpu import parse_cpu_table, read_cpu_series, read_cpu_traces

BITBRAINS_HEADER = ("Timestamp [ms];\tCPU cores;\tCPU capacity provisioned [MHZ];\tCPU usage [MHZ];\tCPU usage [%];\t"
                    "Memory capacity provisioned [KB];\tMemory usage [KB];\tDisk read throughput [KB/s];\t"
                    "Disk write throughput [KB/s];\tNetwork received throughput [KB/s];\t"
                    "Network transmitted throughput [KB/s]")


@pytest.fixture(scope="module")
def planetlab(data_dir):
    """Three real PlanetLab VM-day series (percent integers) and their fractions."""
    folder = data_dir / "planetlab-cpu-cloudsim" / "20110303"
    files = sorted(folder.iterdir())[:3]
    raw = [np.array([int(x) for x in f.read_text().split()]) for f in files]
    return raw


def _bitbrains(series: np.ndarray) -> str:
    rows = [BITBRAINS_HEADER]
    cap = 2 * 2926.0
    for i, v in enumerate(series):
        rows.append(";\t".join([str(1376314846000 + 300_000 * i), "2", f"{cap:.6f}", f"{cap * v / 100:.6f}",
                                f"{float(v):.6f}", "8388608.0", "1234.5", "0.0", "3.2", "1.5", "0.7"]))
    return "\n".join(rows) + "\n"


def test_bitbrains_layout_folder_of_months_and_gzip(tmp_path, planetlab):
    (tmp_path / "2013-7").mkdir()
    (tmp_path / "2013-8").mkdir()
    (tmp_path / "2013-7" / "1.csv").write_text(_bitbrains(planetlab[0]))
    (tmp_path / "2013-8" / "2.csv.gz").write_bytes(gzip.compress(_bitbrains(planetlab[1]).encode()))
    (tmp_path / "2013-8" / ".hidden").write_text("junk")
    d = read_cpu_traces(tmp_path)
    assert list(d) == ["2013-7/1.csv", "2013-8/2.csv.gz"]
    assert np.allclose(d["2013-7/1.csv"], planetlab[0] / 100)  # the [%] column, not the MHz one
    assert np.allclose(d["2013-8/2.csv.gz"], planetlab[1] / 100)
    assert np.allclose(read_cpu_series(tmp_path / "2013-8" / "2.csv.gz"), planetlab[1] / 100)


def _alibaba_rows(series: list[np.ndarray], sample_s: int = 10) -> list[str]:
    """machine_usage.csv rows (no header): each 300 s window of a series as 300/sample_s samples."""
    rows = []
    for m, s in enumerate(series):
        for w, v in enumerate(s):
            for k in range(300 // sample_s):
                t = 86400 + 300 * w + sample_s * k
                rows.append(f"m_{1932 + m},{t},{int(v)},{50 + m},,,43.51,35.09,4")
    return rows


def test_alibaba_2018_machine_usage_per_machine_split(tmp_path, planetlab):
    rows = _alibaba_rows(planetlab, sample_s=60)
    rng = np.random.default_rng(0)
    rng.shuffle(rows)  # the split sorts each machine's samples by time_stamp
    p = tmp_path / "machine_usage.csv.gz"
    p.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    d = read_cpu_traces(p, window_s=300)
    assert sorted(d) == [f"machine_usage.csv.gz:m_{1932 + m}" for m in range(3)]
    for m in range(3):
        assert np.allclose(d[f"machine_usage.csv.gz:m_{1932 + m}"], planetlab[m] / 100)
    raw = read_cpu_traces(p)  # no windows: every sample
    assert len(raw["machine_usage.csv.gz:m_1932"]) == 5 * len(planetlab[0])
    # mem_util_percent instead, by its documented name
    mem = read_cpu_traces(p, column="mem_util_percent", window_s=300)
    assert np.allclose(mem["machine_usage.csv.gz:m_1933"], 0.51)


def test_header_aliases_and_machine_column(tmp_path, planetlab):
    rows = ["machine_id,time_stamp,cpu_util_percent,mem_util_percent"]
    for m, s in enumerate(planetlab[:2]):
        rows += [f"vm{m},{300 * i},{v},10" for i, v in enumerate(s)]
    p = tmp_path / "usage.csv"
    p.write_text("\n".join(rows) + "\n")
    d = read_cpu_traces(p)
    assert np.allclose(d["usage.csv:vm1"], planetlab[1] / 100)


def test_headerless_columns_need_column_and_errors_name_the_delimiter(tmp_path, planetlab):
    p = tmp_path / "series.tsv"
    p.write_text("".join(f"{300 * i}\t{v / 100:.4f}\t0.5\n" for i, v in enumerate(planetlab[2])))
    with pytest.raises(InputError, match=r"series.tsv row 1: 3 fields \(read as tab-separated\).*column=N"):
        read_cpu_traces(p)
    assert np.allclose(read_cpu_traces(p, column=2)["series.tsv"], planetlab[2] / 100, atol=1e-4)
    assert np.allclose(read_cpu_series(p, column="2"), planetlab[2] / 100, atol=1e-4)
    with pytest.raises(InputError, match="column 7 .*past the last of 3 fields"):
        read_cpu_series(p, column=7)
    with pytest.raises(InputError, match="column '\u00b2'"):  # '²': a digit to str.isdigit, not to int()
        read_cpu_series(p, column="\u00b2")
    bad = tmp_path / "pipes.csv"
    bad.write_text("Timestamp [ms]|CPU usage [%]\n0|5\n")
    with pytest.raises(InputError, match="no comma, semicolon or tab delimiter found") as ei:
        read_cpu_series(bad)
    assert "\n" not in str(ei.value)
    semi = tmp_path / "semi.csv"
    semi.write_text("ts;mem\n0;1\n")
    with pytest.raises(InputError, match=r"no CPU-utilisation column \(found ts, mem \(read as semicolon-separated\)"):
        read_cpu_series(semi)


def test_ragged_and_empty_fields(tmp_path):
    with pytest.raises(InputError, match=r"x row 2: 2 fields \(read as comma-separated\), but row 1 has 3"):
        parse_cpu_table("1,2,3\n4,5\n", "x", column=1)
    with pytest.raises(InputError, match="row 1: cpu is empty"):
        parse_cpu_table("ts;cpu\n0;\n", "x")
    with pytest.raises(InputError, match="cannot decompress as gzip"):
        p = tmp_path / "trunc.csv.gz"
        p.write_bytes(gzip.compress(b"1\n2\n" * 100)[:20])
        read_cpu_series(p)


def test_value_column_with_container_ids_and_anonymised_timestamps(tmp_path, planetlab):
    """The Alibaba GenAI-serving layout (value, timestamp_anon, container_ip), here with PlanetLab values."""
    rows = ["value,timestamp_anon,container_ip"]
    for m, s in enumerate(planetlab):
        rows += [f"{float(v)},{1662858720.0 + 57.0 * i},ip{m}" for i, v in enumerate(s)]
    p = tmp_path / "duty.csv"
    p.write_text("\n".join(rows[:1] + rows[:0:-1]) + "\n")  # newest first: the timestamps order the samples
    d = read_cpu_traces(p, column="value")
    assert sorted(d) == ["duty.csv:ip0", "duty.csv:ip1", "duty.csv:ip2"]
    assert np.allclose(d["duty.csv:ip2"], planetlab[2] / 100)
    with pytest.raises(InputError, match="no CPU-utilisation column"):
        read_cpu_traces(p)
