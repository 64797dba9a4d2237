"""Tests for fleetwise.workload: readers on the real traces, malformed input, generators, default fit, spec."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pydantic
import pytest

from fleetwise.data import data_dir
from fleetwise.errors import InputError
from fleetwise.workload import (
    AZURE_CONV_LOGNORMAL,
    EmpiricalLengths,
    LognormalLengths,
    SLOClass,
    Workload,
    build_workload,
    clip_total_tokens,
    default_workload,
    diurnal_arrivals,
    fit_lognormal_lengths,
    gamma_arrivals,
    get_slo,
    load_trace,
    mmpp_arrivals,
    parse_workload_spec,
    poisson_arrivals,
    read_azure,
    read_burstgpt,
    read_plain,
    read_mooncake,
    read_servegen,
    read_vidur_lengths,
    replay,
    servegen_arrivals,
)

DATA = data_dir(required=False)


def _data(*parts: str) -> Path:
    if DATA is None:
        pytest.skip("real data folder not found (set FLEETWISE_DATA)")
    p = DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present")
    return p


AZ = ("azure-llm-inference-2023",)
CONV = AZ + ("AzureLLMInferenceTrace_conv.csv",)
CODE = AZ + ("AzureLLMInferenceTrace_code.csv",)
MOONCAKE = ("mooncake-fast25-traces", "synthetic_trace.jsonl")
ARXIV = ("vidur-arxiv-summarization-lengths", "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv")
SERVEGEN = ("servegen-alibaba-modelstudio",)


def _basic(w: Workload, n: int) -> None:
    assert len(w) == n
    assert w.arrival_s[0] == 0.0
    assert np.all(np.diff(w.arrival_s) >= 0)
    assert w.prompt_tokens.dtype == np.int64 and w.output_tokens.dtype == np.int64


# ----------------------------------------------------------------------------------------------------------------
# readers on the real files (numbers from each folder's PROVENANCE.md)


def test_azure_conv_real():
    p = _data(*CONV)
    w = read_azure(p)
    _basic(w, 19_366)
    assert w.prompt_tokens.mean() == pytest.approx(1154.7, abs=0.05)
    assert w.output_tokens.mean() == pytest.approx(211.1, abs=0.05)
    assert np.median(w.prompt_tokens) == 1020 and np.median(w.output_tokens) == 129
    assert (w.prompt_tokens.min(), w.prompt_tokens.max()) == (2, 14050)
    assert (w.output_tokens.min(), w.output_tokens.max()) == (7, 1000)
    # 18:15:46.68 -> 19:14:08.40 = 58 min 21.72 s
    assert w.arrival_s[-1] == pytest.approx(3501.72, abs=0.01)
    assert len(w) / w.arrival_s[-1] == pytest.approx(5.53, abs=0.01)


def test_azure_code_real():
    w = read_azure(_data(*CODE))
    _basic(w, 8_819)
    assert w.prompt_tokens.mean() == pytest.approx(2047.8, abs=0.05)
    assert w.output_tokens.mean() == pytest.approx(27.9, abs=0.05)
    assert len(w) / w.arrival_s[-1] == pytest.approx(2.57, abs=0.01)


def test_azure_limit():
    w = read_azure(_data(*CONV), limit=10)
    _basic(w, 10)
    assert w.prompt_tokens[0] == 374 and w.output_tokens[0] == 44
    assert w.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)


def test_mooncake_real():
    w = read_mooncake(_data(*MOONCAKE))
    _basic(w, 3_993)
    assert w.prompt_tokens.mean() == pytest.approx(15_325, abs=0.5)
    assert w.output_tokens.mean() == pytest.approx(149, abs=0.5)
    assert w.prompt_tokens.max() == 191_378
    assert w.arrival_s[-1] == pytest.approx(1022.025)
    assert w.has_prefix and w.block_tokens == 512
    assert len(w.prefix_blocks) == 121_877 and len(np.unique(w.prefix_blocks)) == 43_924
    assert list(w.prefix_of(0)) == list(range(79))
    # each request's blocks cover its prompt: ceil(input/512) blocks
    nblk = np.diff(w.prefix_offsets)
    assert np.all(nblk == -(-w.prompt_tokens // 512))
    r = w.request(1)
    assert r.prefix_block_ids[0] == 79


def test_vidur_arxiv_real():
    w = read_vidur_lengths(_data(*ARXIV))
    assert len(w) == 28_257
    assert np.all(w.arrival_s == 0)
    assert w.prompt_tokens.mean() == pytest.approx(2588, abs=0.5)
    assert w.output_tokens.mean() == pytest.approx(291, abs=0.5)
    assert np.median(w.prompt_tokens) == 2730 and np.median(w.output_tokens) == 167
    assert (w.prompt_tokens + w.output_tokens).max() == 4096


def test_servegen_real_deepseek():
    r = read_servegen(_data(*SERVEGEN), model="deepseek-r1")
    assert r.rate.shape == (73, 144)
    assert r.window_s == 600 and r.window_start_s[-1] == 85_800
    tot = r.total_rate
    assert tot.mean() == pytest.approx(16.0, abs=0.05)
    assert tot.min() == pytest.approx(4.3, abs=0.05) and tot.max() == pytest.approx(42.5, abs=0.05)
    # Gamma windows: the recorded CV is 1/sqrt(shape)
    g = r.pattern == 1
    assert np.allclose(r.cv[g], 1 / np.sqrt(r.shape[g]), rtol=1e-6)
    # inactive windows have zero rate
    assert np.all(r.rate[r.pattern == 0] == 0)


def test_servegen_model_dir_and_generation():
    d = _data(*SERVEGEN, "multimodal", "mm-image")
    r = read_servegen(d)
    assert r.rate.shape == (35, 144)
    assert r.total_rate.mean() == pytest.approx(9.5, abs=0.05)
    t, c = servegen_arrivals(r, np.random.default_rng(3), start_s=0, end_s=6 * 3600)
    assert np.all(np.diff(t) >= 0) and t[-1] < 6 * 3600
    expected = r.total_rate[:36].sum() * 600
    assert len(t) == pytest.approx(expected, rel=0.03)
    # per-client counts follow the per-client rates
    per_client = np.bincount(c, minlength=r.num_clients)
    exp_client = r.rate[:, :36].sum(axis=1) * 600
    big = exp_client > 5000
    assert np.allclose(per_client[big], exp_client[big], rtol=0.15)
    t2, _ = servegen_arrivals(r, np.random.default_rng(3), start_s=0, end_s=6 * 3600)
    assert np.array_equal(t, t2)


def test_load_trace_aliases_and_sniffing(tmp_path):
    _data(*CONV)
    assert len(load_trace("azure-code")) == 8_819
    assert len(load_trace("arxiv-summarization", limit=5)) == 5
    assert load_trace("mooncake", limit=3).has_prefix
    # format from the header, not the name
    src = _data(*CONV).read_text().splitlines()[:4]
    f = tmp_path / "mytrace.csv"
    f.write_text("\n".join(src) + "\n")
    assert len(load_trace(str(f))) == 3
    with pytest.raises(InputError, match="not a known alias"):
        load_trace("no-such-trace")


# ----------------------------------------------------------------------------------------------------------------
# malformed input


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_OK = "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n"


@pytest.mark.parametrize(
    "body, pattern",
    [
        (AZ_OK + "2023-11-16 18:17:05.0,abc,8\n", r"bad\.csv row 3: ContextTokens 'abc' is not an integer"),
        (AZ_OK + "2023-11-16 18:17:05.0,12,-4\n", r"bad\.csv row 3: GeneratedTokens '-4' is negative"),
        (AZ_OK + "2023-11-16 18:17:05.0,12.5,4\n", r"bad\.csv row 3: ContextTokens '12.5' is not an integer"),
        (AZ_OK + "not-a-date,12,4\n", r"bad\.csv row 3: TIMESTAMP 'not-a-date' is not a datetime"),
        (AZ_OK + "2023-11-16 18:17:05.0,12\n", r"bad\.csv row 3: missing field GeneratedTokens"),
        (AZ_OK + "2023-11-16 18:17:05.0,,4\n", r"bad\.csv row 3: ContextTokens '' is not an integer"),
    ],
)
def test_azure_malformed(tmp_path, body, pattern):
    f = tmp_path / "bad.csv"
    f.write_text(AZ_HEADER + body)
    with pytest.raises(InputError, match=pattern):
        read_azure(f)


def test_azure_missing_column_and_file(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9,12\n")
    with pytest.raises(InputError, match=r"bad\.csv header: missing column\(s\) GeneratedTokens"):
        read_azure(f)
    with pytest.raises(InputError, match=r"nope\.csv: file not found"):
        read_azure(tmp_path / "nope.csv")
    e = tmp_path / "empty.csv"
    e.write_text("")
    with pytest.raises(InputError, match="empty.csv: empty file"):
        read_azure(e)


def test_azure_unsorted_rows_are_sorted(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(AZ_HEADER + "2023-11-16 18:17:05.0,30,3\n2023-11-16 18:17:03.0,10,1\n2023-11-16 18:17:04.0,20,2\n")
    w = read_azure(f)
    assert list(w.arrival_s) == [0.0, 1.0, 2.0]
    assert list(w.prompt_tokens) == [10, 20, 30]


def _jl(tmp_path, lines):
    f = tmp_path / "mc.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


MC_OK = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'


@pytest.mark.parametrize(
    "line, pattern",
    [
        ('{"timestamp": 5, "input_length": "x", "output_length": 5, "hash_ids": []}', r"mc\.jsonl line 2: input_length 'x' is not an integer"),
        ('{"timestamp": 5, "input_length": 3, "output_length": -1, "hash_ids": []}', r"mc\.jsonl line 2: output_length -1 is negative"),
        ('{"timestamp": 5, "output_length": 1, "hash_ids": []}', r"mc\.jsonl line 2: missing field input_length"),
        ('{"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [1, "a"]}', r"mc\.jsonl line 2: hash_ids must be a list of integers"),
        ('{"timestamp": -5, "input_length": 3, "output_length": 1}', r"mc\.jsonl line 2: timestamp -5"),
        ('{"timestamp": 5, "input_length": 513, "output_length": 1, "hash_ids": [1, 2, 3]}',
         r"mc\.jsonl line 2: 3 hash_ids, more than the 2 blocks of 512 tokens that input_length 513 fills"),
        ('{"timestamp": 5, "input_length": 3', r"mc\.jsonl line 2: not valid JSON"),
    ],
)
def test_mooncake_malformed(tmp_path, line, pattern):
    with pytest.raises(InputError, match=pattern):
        read_mooncake(_jl(tmp_path, [MC_OK, line]))


def test_a_byte_order_mark_is_read_past(tmp_path):
    """A CSV saved by a spreadsheet tool starts with a byte-order mark; its first column was not found."""
    from fleetwise.workload import load_trace

    f = tmp_path / "bom.csv"
    f.write_bytes("\ufeffarrival_s,prompt_tokens,output_tokens\r\n0,10,5\r\n1.5,20,7\r\n".encode())
    w = load_trace(f)
    assert list(w.prompt_tokens) == [10, 20] and list(w.arrival_s) == [0.0, 1.5]
    m = _jl(tmp_path, [MC_OK])
    m.write_bytes("\ufeff".encode() + m.read_bytes())
    assert list(read_mooncake(m).prompt_tokens) == [600]


def test_mooncake_small_and_missing(tmp_path):
    f = _jl(tmp_path, [MC_OK, "", '{"timestamp": 2500, "input_length": 100, "output_length": 7, "hash_ids": [0]}'])
    w = read_mooncake(f)
    assert list(w.arrival_s) == [0.0, 2.5]
    assert list(w.prefix_offsets) == [0, 2, 3] and list(w.prefix_blocks) == [0, 1, 0]
    with pytest.raises(InputError, match="missing.jsonl: file not found"):
        read_mooncake(tmp_path / "missing.jsonl")


def test_vidur_malformed(tmp_path):
    f = tmp_path / "v.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n11,-2\n")
    with pytest.raises(InputError, match=r"v\.csv row 2: num_decode_tokens '-2' is negative"):
        read_vidur_lengths(f)
    f.write_text("num_prefill_tokens,decode\n10,5\n")
    with pytest.raises(InputError, match=r"v\.csv header: missing column\(s\) num_decode_tokens"):
        read_vidur_lengths(f)
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n100.5,10,5\n101.0,11,2\n")
    w = read_vidur_lengths(f)
    assert list(w.arrival_s) == [0.0, 0.5]


BG_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_burstgpt_small_file(tmp_path):
    f = tmp_path / "BurstGPT_1.csv"
    f.write_text(
        BG_HEADER
        + "5,ChatGPT,472,18,490,Conversation log\n"
        + "45,ChatGPT,1087,0,1087,Conversation log\n"  # failed request
        + "118,GPT-4,417,276,693,API log\n"
        + "130,ChatGPT,301,96,397,Conversation log\n"
    )
    w = read_burstgpt(f)
    assert len(w) == 3  # failed row dropped by default
    assert list(w.arrival_s) == [0.0, 113.0, 125.0]
    assert list(w.prompt_tokens) == [472, 417, 301]
    assert [w.models[m] for m in w.model] == ["ChatGPT", "GPT-4", "ChatGPT"]
    assert [w.tenants[t] for t in w.tenant] == ["Conversation log", "API log", "Conversation log"]
    assert w.request(1).model == "GPT-4"
    w2 = read_burstgpt(f, skip_failed=False)
    assert len(w2) == 4 and w2.output_tokens[1] == 0
    assert len(load_trace(str(f))) == 3  # sniffed from the name


@pytest.mark.parametrize(
    "row, pattern",
    [
        ("10,ChatGPT,abc,5,5,API log\n", r"b\.csv row 2: Request tokens 'abc' is not an integer"),
        ("10,ChatGPT,5,-5,0,API log\n", r"b\.csv row 2: Response tokens '-5' is negative"),
        ("ten,ChatGPT,5,5,10,API log\n", r"b\.csv row 2: Timestamp 'ten' is not a number"),
        ("10,ChatGPT,5,5,11,API log\n", r"b\.csv row 2: Total tokens 11 != Request tokens 5 \+ Response tokens 5"),
    ],
)
def test_burstgpt_malformed(tmp_path, row, pattern):
    f = tmp_path / "b.csv"
    f.write_text(BG_HEADER + "5,ChatGPT,472,18,490,Conversation log\n" + row)
    with pytest.raises(InputError, match=pattern):
        read_burstgpt(f)


def test_burstgpt_missing_column(tmp_path):
    f = tmp_path / "b.csv"
    f.write_text("Timestamp,Model,Request tokens\n1,ChatGPT,4\n")
    with pytest.raises(InputError, match=r"b\.csv header: missing column\(s\) Response tokens"):
        read_burstgpt(f)


def test_plain_trace_small_file_sorted_and_sniffed(tmp_path):
    """A user's own trace in the workload's columns: times shifted to 0 and sorted (stable), optional model and
    tenant names, other columns ignored; load_trace tells the layout from the header."""
    f = tmp_path / "mine.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens,model,note\n"
                 "12.5,100,20,big,x\n10,50,0,small,y\n11,70,5,,z\n")
    w = read_plain(f)
    assert list(w.arrival_s) == [0.0, 1.0, 2.5]
    assert list(w.prompt_tokens) == [50, 70, 100] and list(w.output_tokens) == [0, 5, 20]
    assert [w.models[m] for m in w.model] == ["small", "default", "big"]
    assert w.tenants == ["default"] and set(w.tenant.tolist()) == {0}
    w2 = load_trace(str(f))
    assert list(w2.prompt_tokens) == [50, 70, 100] and w2.name == "mine"
    assert len(read_plain(f, limit=2)) == 2


@pytest.mark.parametrize(
    "row, pattern",
    [
        ("1,abc,5\n", r"p\.csv row 2: prompt_tokens 'abc' is not an integer"),
        ("1,0,5\n", r"p\.csv row 2: prompt_tokens is 0"),
        ("1,5,-1\n", r"p\.csv row 2: output_tokens '-1' is negative"),
        ("-1,5,5\n", r"p\.csv row 2: arrival_s '-1' is negative"),
        ("nan,5,5\n", r"p\.csv row 2: arrival_s 'nan' is not a finite number"),
        ("1,5\n", r"p\.csv row 2: missing field output_tokens"),
        ("1,1e30,5\n", r"p\.csv row 2: prompt_tokens 1e30 is above the limit"),
    ],
)
def test_plain_trace_malformed(tmp_path, row, pattern):
    f = tmp_path / "p.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,10\n" + row)
    with pytest.raises(InputError, match=pattern):
        read_plain(f)
    with pytest.raises(InputError, match=pattern):
        load_trace(str(f))


def test_unknown_csv_header_names_the_plain_layout(tmp_path):
    f = tmp_path / "q.csv"
    f.write_text("t,prompt,output\n0,1,1\n")
    with pytest.raises(InputError, match=r"q\.csv: cannot tell the trace format .*arrival_s, prompt_tokens, "
                                         r"output_tokens"):
        load_trace(str(f))


def test_servegen_malformed(tmp_path):
    d = tmp_path / "m-test"
    d.mkdir()
    (d / "chunk-0-trace.csv").write_text("0,0,0,,0,0\n600,0.5,1.2,Gamma,0.69,2.9\n")
    with gzip.open(d / "chunk-1-trace.csv.gz", "wt") as g:
        g.write("0,1,1,Weibull,1,1\n600,x,1,Gamma,1,1\n")
    with pytest.raises(InputError, match=r"chunk-1-trace\.csv\.gz row 2: rate 'x' is not a number"):
        read_servegen(d)
    with gzip.open(d / "chunk-1-trace.csv.gz", "wt") as g:
        g.write("0,1,1,Poisson,1,1\n600,1,1,Gamma,1,1\n")
    with pytest.raises(InputError, match=r"chunk-1-trace\.csv\.gz row 1: pattern 'Poisson'"):
        read_servegen(d)
    with gzip.open(d / "chunk-1-trace.csv.gz", "wt") as g:
        g.write("0,1,1,Weibull,1,1\n600,0.2,1,Gamma,1,5\n")
    r = read_servegen(d)
    assert r.clients == ["chunk-0", "chunk-1"] and r.pattern.tolist() == [[0, 1], [2, 1]]
    with pytest.raises(InputError, match="folder not found"):
        read_servegen(tmp_path / "nothing")


# ----------------------------------------------------------------------------------------------------------------
# synthetic arrivals


def test_poisson_rate_and_exponential_gaps():
    t = poisson_arrivals(np.random.default_rng(0), 5.0, num_requests=20_000)
    assert len(t) == 20_000 and np.all(np.diff(t) > 0)
    assert len(t) / t[-1] == pytest.approx(5.0, rel=0.03)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)
    td = poisson_arrivals(np.random.default_rng(0), 5.0, duration_s=4000)
    assert td[-1] < 4000 and len(td) == pytest.approx(20_000, rel=0.03)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv(cv):
    t = gamma_arrivals(np.random.default_rng(1), 10.0, cv, num_requests=50_000)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05 if cv < 3 else 0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06 if cv < 3 else 0.12)


def test_mmpp_mean_rate_and_burstiness():
    rng = np.random.default_rng(2)
    t = mmpp_arrivals(rng, 2.0, 20.0, mean_base_s=60.0, mean_burst_s=10.0, duration_s=200_000)
    expected = (2 * 60 + 20 * 10) / 70
    assert len(t) / 200_000 == pytest.approx(expected, rel=0.05)
    counts = np.bincount((t // 10).astype(int))
    # index of dispersion of 10 s counts well above Poisson's 1
    assert counts.var() / counts.mean() > 5
    n = mmpp_arrivals(np.random.default_rng(2), 2.0, 20.0, 60.0, 10.0, num_requests=1234)
    assert len(n) == 1234 and np.all(np.diff(n) >= 0)


@pytest.mark.parametrize("offset, peak_local", [(0.0, 14.0), (-5.0, 14.0), (8.0, 20.0)])
def test_diurnal_peak_at_local_hour(offset, peak_local):
    t = diurnal_arrivals(
        np.random.default_rng(4), 2.0, peak_to_trough=4.0, peak_hour_local=peak_local, utc_offset_h=offset,
        duration_s=10 * 86400,
    )
    assert len(t) / (10 * 86400) == pytest.approx(2.0, rel=0.03)
    hour_utc = ((t / 3600.0) % 24).astype(int)
    counts = np.bincount(hour_utc, minlength=24)
    peak_utc = int(np.argmax(counts))
    expected_utc = (peak_local - offset) % 24
    # the bin [h, h+1) centred at h+0.5: the peak hour is within one bin of the expected one
    assert min((peak_utc - expected_utc) % 24, (expected_utc - peak_utc) % 24) <= 1
    trough_utc = int(np.argmin(counts))
    assert min((trough_utc - expected_utc - 12) % 24, (expected_utc + 12 - trough_utc) % 24) <= 1
    assert counts.max() / counts.min() == pytest.approx(4.0, rel=0.2)


def test_same_seed_same_arrays():
    for f in (
        lambda r: poisson_arrivals(r, 3.0, num_requests=1000),
        lambda r: gamma_arrivals(r, 3.0, 2.0, num_requests=1000),
        lambda r: mmpp_arrivals(r, 1.0, 10.0, 30.0, 5.0, num_requests=1000),
        lambda r: diurnal_arrivals(r, 3.0, 2.0, num_requests=1000),
    ):
        a, b = f(np.random.default_rng(7)), f(np.random.default_rng(7))
        assert np.array_equal(a, b)
        assert not np.array_equal(a, f(np.random.default_rng(8)))
    w1 = default_workload(500, 2.0, np.random.default_rng(9))
    w2 = default_workload(500, 2.0, np.random.default_rng(9))
    assert np.array_equal(w1.arrival_s, w2.arrival_s) and np.array_equal(w1.prompt_tokens, w2.prompt_tokens)


def test_bad_generator_args():
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="rate_rps"):
        poisson_arrivals(rng, -1.0, num_requests=10)
    with pytest.raises(InputError, match="exactly one"):
        poisson_arrivals(rng, 1.0)
    with pytest.raises(InputError, match="cv"):
        gamma_arrivals(rng, 1.0, 0.0, num_requests=10)
    with pytest.raises(InputError, match="peak_to_trough"):
        diurnal_arrivals(rng, 1.0, 0.5, duration_s=10)


def test_replay_time_scaling():
    w = Workload(arrival_s=np.array([0.0, 1.0, 3.0, 4.0]), prompt_tokens=[1, 2, 3, 4], output_tokens=[1, 1, 1, 1])
    assert list(replay(w, speedup=2.0).arrival_s) == [0.0, 0.5, 1.5, 2.0]
    r = replay(w, target_rate_rps=3.0)
    assert (len(r) - 1) / r.arrival_s[-1] == pytest.approx(3.0)
    assert list(w.arrival_s) == [0.0, 1.0, 3.0, 4.0]  # input untouched


# ----------------------------------------------------------------------------------------------------------------
# lengths and clipping


def test_empirical_lengths_keep_pairs():
    w = Workload(arrival_s=np.zeros(3), prompt_tokens=[10, 200, 3000], output_tokens=[1, 20, 300])
    p, o = EmpiricalLengths.from_workload(w).sample(np.random.default_rng(0), 1000)
    assert np.all(o * 10 == p)  # pairs never mixed
    assert set(p.tolist()) == {10, 200, 3000}


def test_lognormal_lengths_fit_and_clip():
    ln = LognormalLengths(6.0, 1.0, 4.0, 0.5, rho=0.6, prompt_max=2000, output_min=5)
    p, o = ln.sample(np.random.default_rng(0), 50_000)
    assert p.max() == 2000 and o.min() >= 5
    assert np.median(p) == pytest.approx(math.exp(6.0), rel=0.03)
    lp, lo = np.log(p[p < 2000]), np.log(o)[p < 2000]
    assert np.corrcoef(np.log(p), np.log(o))[0, 1] == pytest.approx(0.6, abs=0.05)
    assert lp.size > 0 and lo.size > 0


def test_clip_total_tokens_prompt_mode():
    p, o = clip_total_tokens(np.array([3000, 100, 5000, 10]), np.array([2000, 50, 5000, 0]), 4096)
    assert list(p) == [2096, 100, 1, 10] and list(o) == [2000, 50, 4095, 1]
    assert np.all(p + o <= 4096) and np.all(p >= 1) and np.all(o >= 1)


def test_clip_total_tokens_proportional_mode():
    rng = np.random.default_rng(0)
    p0, o0 = rng.integers(0, 9000, 10_000), rng.integers(0, 9000, 10_000)
    p, o = clip_total_tokens(p0, o0, 4096, mode="proportional")
    assert np.all(p + o <= 4096) and np.all(p >= 1) and np.all(o >= 1)
    fits = (np.maximum(p0, 1) + np.maximum(o0, 1)) <= 4096
    assert np.array_equal(p[fits], np.maximum(p0, 1)[fits])
    pp, oo = clip_total_tokens(np.array([3000]), np.array([3000]), 4096, mode="proportional")
    assert (pp[0], oo[0]) == (2048, 2048)


def test_clip_on_arxiv_is_noop_at_4096():
    w = read_vidur_lengths(_data(*ARXIV))
    p, o = clip_total_tokens(w.prompt_tokens, w.output_tokens, 4096)
    assert np.array_equal(p, w.prompt_tokens) and np.array_equal(o, w.output_tokens)
    p, o = clip_total_tokens(w.prompt_tokens, w.output_tokens, 2048)
    assert (p + o).max() == 2048 and np.array_equal(o, np.minimum(w.output_tokens, 2047))


# ----------------------------------------------------------------------------------------------------------------
# default workload


def test_default_constants_refit_on_azure_conv():
    fit = fit_lognormal_lengths(read_azure(_data(*CONV)))
    for k, v in AZURE_CONV_LOGNORMAL.items():
        assert fit[k] == pytest.approx(v, abs=1e-5), k


def test_default_workload_shape():
    w = default_workload(20_000, 4.0, np.random.default_rng(0))
    assert len(w) == 20_000 and w.name == "default"
    assert len(w) / w.arrival_s[-1] == pytest.approx(4.0, rel=0.03)
    # geometric means reproduce the fit
    assert np.exp(np.log(w.prompt_tokens).mean()) == pytest.approx(math.exp(AZURE_CONV_LOGNORMAL["prompt_mu"]), rel=0.03)
    assert np.exp(np.log(w.output_tokens).mean()) == pytest.approx(math.exp(AZURE_CONV_LOGNORMAL["output_mu"]), rel=0.03)
    assert w.output_tokens.max() <= 1000 and w.prompt_tokens.max() <= 14050


# ----------------------------------------------------------------------------------------------------------------
# SLO classes


def test_slo_classes():
    s = get_slo("interactive")
    assert isinstance(s, SLOClass) and s.ttft_s < get_slo("standard").ttft_s < get_slo("batch").ttft_s
    assert s.priority > get_slo("batch").priority
    with pytest.raises(Exception):
        s.ttft_s = 3.0  # frozen
    with pytest.raises(InputError, match="unknown"):
        get_slo("gold")
    assert s.e2e_deadline_s(11) == pytest.approx(0.5 + 10 * 0.05)


# ----------------------------------------------------------------------------------------------------------------
# spec


def test_spec_validation_errors():
    with pytest.raises(pydantic.ValidationError, match="extra"):
        parse_workload_spec({"kind": "poisson", "rate_rps": 1.0, "rate": 2.0})
    with pytest.raises(pydantic.ValidationError, match="greater than 0"):
        parse_workload_spec({"kind": "poisson", "rate_rps": -1.0})
    with pytest.raises(pydantic.ValidationError):
        parse_workload_spec({"kind": "zipf", "rate_rps": 1.0})
    with pytest.raises(pydantic.ValidationError, match="not both"):
        parse_workload_spec({"kind": "poisson", "rate_rps": 1.0, "num_requests": 5, "duration_s": 5})
    with pytest.raises(pydantic.ValidationError, match="unknown slo_class"):
        parse_workload_spec({"kind": "default", "rate_rps": 1.0, "slo_class": "gold"})
    with pytest.raises(pydantic.ValidationError, match="extra"):
        parse_workload_spec({"kind": "gamma", "rate_rps": 1.0, "cv": 2, "lengths": {"kind": "lognormal", "prompt_mu": 1,
                             "prompt_sigma": 1, "output_mu": 1, "output_sigma": 1, "mean": 3}})
    with pytest.raises(pydantic.ValidationError):
        parse_workload_spec({"kind": "trace", "path": "azure-conv", "time_scale": 0})
    with pytest.raises(pydantic.ValidationError):
        parse_workload_spec({"kind": "default", "rate_rps": 1, "origin": [{"region": "a", "weight": -1}]})


def test_build_default_and_determinism():
    spec = {"kind": "default", "rate_rps": 4.0, "num_requests": 300, "slo_class": "interactive", "model": "llama-70b",
            "origin": [{"region": "us", "weight": 3}, {"region": "eu", "weight": 1}]}
    a = build_workload(spec, np.random.default_rng(5))
    b = build_workload(spec, np.random.default_rng(5))
    assert len(a) == 300
    for col in ("arrival_s", "prompt_tokens", "output_tokens", "origin"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert a.origins == ["us", "eu"] and 0.6 < np.mean(a.origin == 0) < 0.9
    r = a.request(0)
    assert r.slo_class == "interactive" and r.priority == 2 and r.model == "llama-70b"


def test_build_generated_kinds():
    rng = np.random.default_rng(0)
    w = build_workload({"kind": "gamma", "rate_rps": 10, "cv": 2, "num_requests": 400, "max_total_tokens": 1024,
                        "lengths": {"kind": "lognormal", "prompt_mu": 6.5, "prompt_sigma": 1, "output_mu": 5,
                                    "output_sigma": 1}}, rng)
    assert len(w) == 400 and (w.prompt_tokens + w.output_tokens).max() <= 1024
    w = build_workload({"kind": "mmpp", "base_rate_rps": 1, "burst_rate_rps": 10, "mean_base_s": 20,
                        "mean_burst_s": 5, "duration_s": 600}, rng)
    assert w.arrival_s[-1] < 600
    w = build_workload({"kind": "diurnal", "mean_rate_rps": 0.2, "duration_s": 4 * 86400, "peak_to_trough": 5,
                        "origin": [{"region": "us-east", "weight": 1, "utc_offset_h": -5},
                                   {"region": "ap-se", "weight": 1, "utc_offset_h": 8}]}, rng)
    for k, off in ((0, -5), (1, 8)):
        h = ((w.arrival_s[w.origin == k] / 3600 + off) % 24).astype(int)  # local hour
        peak = int(np.argmax(np.bincount(h, minlength=24)))
        assert abs(peak - 14) <= 2, (k, peak)


def test_build_trace_kinds():
    _data(*CONV)
    rng = np.random.default_rng(0)
    w = build_workload({"kind": "trace", "path": "azure-conv", "time_scale": 0.5, "resample": "none"}, rng)
    assert len(w) == 19_366 and w.arrival_s[-1] == pytest.approx(3501.72 / 2, abs=0.01)
    w = build_workload({"kind": "trace", "path": "azure-conv", "time_scale": 0.5}, rng)  # default: block bootstrap
    assert abs(len(w) - 19_366) < 0.2 * 19_366 and w.arrival_s[-1] == pytest.approx(3501.72 / 2, rel=0.05)
    w = build_workload({"kind": "trace", "format": "azure", "path": "azure-code", "target_rate_rps": 10,
                        "num_requests": 1001}, rng)
    assert len(w) == 1001 and 1000 / w.arrival_s[-1] == pytest.approx(10)
    w = build_workload({"kind": "poisson", "rate_rps": 3, "num_requests": 2000, "max_total_tokens": 2048,
                        "lengths": {"kind": "trace", "trace": "arxiv-summarization"}}, rng)
    assert (w.prompt_tokens + w.output_tokens).max() <= 2048
    w = build_workload({"kind": "trace", "path": "mooncake", "num_requests": 50}, rng)
    assert w.has_prefix and len(w) == 50
    with pytest.raises(InputError, match="not a known alias"):
        build_workload({"kind": "trace", "path": "/nonexistent/x.csv"}, rng)


def test_build_servegen():
    _data(*SERVEGEN)
    w = build_workload({"kind": "servegen", "servegen_model": "deepseek-r1", "end_s": 1200, "rate_scale": 0.5},
                       np.random.default_rng(0))
    assert w.arrival_s[-1] < 1200 and len(w.tenants) == 73
    r = read_servegen(_data(*SERVEGEN), model="deepseek-r1")
    assert len(w) == pytest.approx(0.5 * r.total_rate[:2].sum() * 600, rel=0.1)
