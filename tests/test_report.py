"""The HTML report: self-contained (no external reference, plots embedded), every section present, one PNG per
plot, sentences instead of empty plots, and in a real headless Chromium every plot renders without errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fleetwise.errors import InputError
from fleetwise.experiments.report import SECTIONS, write_report
from fleetwise.experiments.runner import run_sweep
from fleetwise.experiments.spec import expand, parse_experiment
from fleetwise.experiments.store import Store

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[1]
SECTION_IDS = [k for k, _ in SECTIONS]

IMG = re.compile(r"<img\b[^>]*>")
PLOT_ID = re.compile(r'data-plot="([^"]+)"')


def _tiny_sweep(db: Path) -> Store:
    """3 routers (one learned) x 2 rates x 2 seeds with a timeline, a run that fails (KV cache too small), a
    learning curve."""
    store = Store(db)
    spec = parse_experiment({
        "name": "tiny", "scenarios": ["default"], "policies": {"router": ["round_robin", "least_outstanding_tokens", "learned"]},
        "grid": {"workload.rate_rps": [12, 24]}, "seeds": 2, "requests": 200, "timeline_bucket_s": 2.0})
    res = run_sweep(expand(spec), store, workers=2)
    assert (res.ok, res.failed) == (12, 0)
    failing = parse_experiment({
        "name": "tiny", "scenarios": ["default"], "policies": {"router": ["round_robin"]},
        "grid": {"deployments.0.gpu_memory_utilization": [0.1]}, "seeds": 1, "requests": 50})
    assert run_sweep(expand(failing), store, workers=1).failed == 1
    store.add_learning_curve("ppo_router", range(0, 100, 10), [-50 + 4 * i for i in range(10)], metric="return")
    return store


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    store = _tiny_sweep(tmp / "r.duckdb")
    index = write_report(store, tmp / "out")
    return index, index.read_text(encoding="utf-8")


def _declared(page: str) -> int:
    m = re.search(r'<main data-plots="(\d+)"', page)
    assert m, "the page does not declare its number of plots"
    return int(m.group(1))


def test_report_is_self_contained_with_every_section(report):
    index, page = report
    assert index.name == "index.html" and index.exists()
    # nothing the page loads or links to leaves the file: no http(s) src/href, no script, no CSS import
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page.lower() and "@import" not in page and "url(" not in page
    for key in SECTION_IDS:
        assert f'<section id="{key}">' in page, key
    imgs = IMG.findall(page)
    assert imgs and len(imgs) == _declared(page)
    ids = []
    for tag in imgs:
        assert 'class="plot"' in tag and re.search(r'alt="[^"]{10,}"', tag), tag[:200]
        assert 'src="data:image/png;base64,' in tag
        ids.append(PLOT_ID.search(tag).group(1))
    assert len(set(ids)) == len(ids)
    pngs = sorted(p.name for p in index.parent.glob("*.png"))
    assert pngs == sorted(f"{i}.png" for i in ids)
    for name in pngs:
        assert (index.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one plot of each kind for this store: CDFs, load curves, Pareto, timeline, learning curves
    for prefix in ("cdf-", "load-", "pareto-", "timeline-", "learning"):
        assert any(i.startswith(prefix) for i in ids), (prefix, ids)


def test_report_summary_baseline_and_failures(report):
    _, page = report
    summary = page.split('<section id="summary">')[1].split("</section>")[0]
    assert "12 ok" in summary and "1 failed" in summary
    assert "baseline router <b>round_robin</b>" in summary
    assert re.search(r"<td[^>]*>learned</td>", summary)  # the learned policy's row
    assert "least_outstanding_tokens" in summary and "±" in summary
    assert "does not fit" in summary  # the failed run's error is shown
    for label in ("TTFT p50", "TTFT p99", "TPOT p50", "E2E p99", "Goodput", "Output tokens/s", "GPU util", "Load CV",
                  "$/Mtok", "Slowdown p50"):
        assert label in summary, label
    assert re.search(r'class="chg[^"]*"[^>]*>[+−]\d', summary)  # paired changes against the baseline
    timeline = page.split('<section id="timeline">')[1].split("</section>")[0]
    assert "rate_rps=24" in timeline  # the highest load


def test_report_says_so_when_data_is_missing(tmp_path):
    """A store without grid, timeline or learning curves: sentences instead of empty plots."""
    store = Store(None)
    qs = [float(q) for q in range(101)]
    results = []
    for router in ("round_robin", "power_of_two"):
        for seed in (0, 1, 2):
            m = {"ttft_p50_s": 0.1 + 0.01 * seed, "ttft_p99_s": 0.9, "tpot_p50_s": 0.02, "e2e_p99_s": 10.0 + seed,
                 "goodput_rps": 5.0, "tokens_per_s": 900.0 + seed, "gpu_util": 0.8, "load_cv": 0.05,
                 "cost_per_mtok_usd": 0.4 + 0.01 * seed, "slowdown_p50": 1.3}
            results.append({
                "run_id": f"{router}-{seed}", "experiment": "flat", "scenario": "default", "params": "{}",
                "router": router, "router_label": router, "batcher": "sarathi", "batcher_label": "sarathi",
                "seed": seed, "status": "ok", "metrics": m,
                "quantiles": {"ttft_s": (qs, [0.01 * (1 + q) for q in qs]),
                              "e2e_s": (qs, [0.1 * (1 + q) for q in qs])}})
    store.write(results)
    index = write_report(store, tmp_path / "out")
    page = index.read_text()
    for key in SECTION_IDS:
        assert f'<section id="{key}">' in page
    assert "no numeric grid parameter" in page
    assert "stored no utilisation timeline" in page
    assert "No learned policies are in this store" in page
    assert "(in memory)" in page
    ids = PLOT_ID.findall(page)
    # (round_robin is the baseline: power_of_two's paired changes are drawn too)
    assert sorted(ids) == sorted(["cdf-flat-default", "changes-flat-default", "pareto-flat-default"]) == sorted(
        p.stem for p in index.parent.glob("*.png"))
    assert len(ids) == _declared(page)


def test_names_are_text_changes_are_intervals_and_the_baseline_is_marked(tmp_path):
    """A helper's audit (2026-12-07): a name with `$` went through matplotlib's TeX (`$\\badcmd$` failed the
    report, `$5 to $10` lost its signs); a paired change printed `± half-width` for a lopsided interval; no plot drew
    the paired changes; the baseline's line was hidden under a policy that follows it."""
    store = Store(None)
    qs = [float(q) for q in range(101)]
    name = "p99 $\\badcmd$ x, budget $5 to $10"
    results = []
    for router, f in (("round_robin", 1.0), ("power_of_two", 1.5)):
        for seed in (0, 1, 2):
            m = {"ttft_p50_s": 0.1, "ttft_p99_s": 0.9 * f * (1 + 0.3 * seed * seed), "e2e_p99_s": 10.0,
                 "goodput_rps": 5.0, "cost_per_mtok_usd": 0.4}
            results.append({
                "run_id": f"{router}-{seed}", "experiment": name, "scenario": "default", "params": "{}",
                "router": router, "router_label": router, "batcher": "sarathi", "batcher_label": "sarathi",
                "seed": seed, "status": "ok", "metrics": m,
                "quantiles": {"ttft_s": (qs, [0.01 * (1 + q) for q in qs]), "e2e_s": (qs, [0.1 * (1 + q) for q in qs])}})
    store.write(results)
    page = write_report(store, tmp_path / "out").read_text()
    assert "p99 $\\badcmd$ x, budget $5 to $10" in page  # (escaped for HTML, drawn as text)
    assert any(p.stem.startswith("changes-") for p in (tmp_path / "out").glob("*.png"))
    assert "+50.0% [" in page.replace("−", "-")  # the change's interval by its bounds, as the command line prints it
    assert "(baseline)" in page


def test_experiment_filter_baseline_and_stale_pngs(tmp_path):
    store = Store(None)
    rows = []
    for exp, rates in (("a", [1, 2]), ("b", [3])):
        for rate in rates:
            for router in ("x", "y"):
                for seed in (0, 1):
                    rows.append({
                        "run_id": f"{exp}{rate}{router}{seed}", "experiment": exp, "scenario": "s",
                        "params": json.dumps({"workload.rate_rps": rate}), "router": router, "router_label": router,
                        "batcher": "b", "batcher_label": "b", "seed": seed, "status": "ok",
                        "metrics": {"e2e_p99_s": rate + seed + (router == "y"), "ttft_p99_s": 0.5 + seed,
                                    "cost_per_mtok_usd": 1.0 / rate + 0.1 * seed, "goodput_rps": float(rate),
                                    "gpu_util": 0.5}})
    store.write(rows)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.png").write_bytes(b"not the report's")
    page = write_report(store, out).read_text()
    assert "Experiment a" in page and "Experiment b" in page
    assert "No baseline policy" in page  # no round_robin in these groups
    both = set(PLOT_ID.findall(page))
    assert "load-a-s-rate_rps" in both and "load-b-s-rate_rps" not in both  # b has a single rate

    page = write_report(store, out, experiment="b", baseline={"router": "y"}).read_text()
    assert "Experiment a" not in page and "Experiment b" in page
    assert "baseline router <b>y</b>" in page
    only_b = set(PLOT_ID.findall(page))
    assert only_b and all("-b-" in i for i in only_b)
    # PNGs of the earlier report that this one did not write are gone; files the report never wrote stay
    assert sorted(p.stem for p in out.glob("*.png")) == sorted(only_b | {"mine"})

    with pytest.raises(InputError, match="'nope' is not in the store"):
        write_report(store, out, experiment="nope")


# ------------------------------------------------------------------------------------------------ real browser
@pytest.mark.browser
def test_report_renders_in_headless_chromium(report, tmp_path):
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    index, page = report
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={profile}", "--window-size=1280,900"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)  # no selenium-manager download
    try:
        driver.set_page_load_timeout(60)
        driver.get(index.resolve().as_uri())
        state = driver.execute_script(
            "return {ready: document.readyState, title: document.title,"
            " declared: Number(document.querySelector('main').dataset.plots),"
            " sections: Array.from(document.querySelectorAll('section')).map(s => s.id),"
            " imgs: Array.from(document.querySelectorAll('img.plot')).map(i => ({id: i.dataset.plot, alt: i.alt,"
            "   complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,"
            "   shown: i.getBoundingClientRect().width}))}")
        assert state["ready"] == "complete" and state["title"].startswith("fleetwise report")
        assert state["sections"] == SECTION_IDS
        assert state["imgs"] and len(state["imgs"]) == state["declared"] == _declared(page)
        for img in state["imgs"]:
            assert img["complete"] and img["w"] > 0 and img["h"] > 0 and img["shown"] > 0, img
            assert img["alt"], img
        severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
        rows = driver.execute_script("return Array.from(document.querySelectorAll('#summary tr'))"
                                     ".map(r => r.innerText)")
        assert any(r.startswith("learned") for r in rows), rows  # the learned policy's row is on the page
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1280, min(int(height) + 200, 16000))  # the whole page in one screenshot
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
    finally:
        driver.quit()
    assert shot.stat().st_size > 10_000
    if os.environ.get("FLEETWISE_ARTIFACTS"):
        dest = REPO / "results" / "test-artifacts"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, dest / "report.png")


def test_report_reads_the_store_without_writing_it(tmp_path):
    """``fleetwise report`` opened its input for writing: it migrated a store from before the level/policy/scaler
    columns, took the writer's lock and rewrote the file (found by fuzzing, 2026-12-06). It now reads a read-only
    snapshot: the file's bytes stay as they were, missing columns read as NULL, missing tables as empty."""
    import hashlib
    import subprocess
    import sys

    import duckdb

    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    from fleetwise.experiments.store import ADDED_COLUMNS, ID_COLUMNS

    cols = ", ".join(f"{k} {t}" for k, t in ID_COLUMNS.items() if k not in ADDED_COLUMNS)
    con.execute(f"CREATE TABLE runs ({cols}, ttft_p50_s DOUBLE)")
    con.execute("INSERT INTO runs (run_id, experiment, scenario, params, router, router_label, batcher, "
                "batcher_label, seed, status, ttft_p50_s) VALUES ('a', 'old', 'default', '{}', 'round_robin', "
                "'round_robin', 'sarathi', 'sarathi', 0, 'ok', 0.1)")
    con.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    mtime = db.stat().st_mtime_ns
    store = Store(db, read_only=True)
    (row,) = store.runs()
    assert row["run_id"] == "a" and row["level"] is None
    os.chmod(db, 0o444)  # a store on read-only media reports too
    p = subprocess.run([sys.executable, "-m", "fleetwise", "report", "--db", str(db), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o" / "index.html").exists()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before and db.stat().st_mtime_ns == mtime
    assert not (tmp_path / "old.duckdb.wal").exists()
    with pytest.raises(InputError, match="not found"):
        Store(tmp_path / "nope.duckdb", read_only=True)


def test_a_reproductions_report_pairs_with_its_rule_and_shows_its_metrics(tmp_path):
    """A reproduction names its rule and headline metrics in the store (``store_meta``): the report's summary then
    shows those metrics first (requests within deadline, not only the sweep's columns) and pairs every policy with
    the rule, by segment; a learned policy's rows of several training seeds each pair with the rule's row of
    their segment, whether the training seed is a metric column (graph-marl) or a grid parameter (torta)."""
    from fleetwise.metrics.stats import aggregate
    from fleetwise.reproduce.common import store_meta, store_rows

    db = str(tmp_path / "r.duckdb")
    rule = [{"seed": s, "deadline_rps": 1.0, "ttft_p99_s": 8.0} for s in range(3)]
    learned = [{"seed": s, "train_seed": t, "deadline_rps": 1.0 + 0.1 * (t + 1), "ttft_p99_s": 8.0}
               for t in range(2) for s in range(3)]
    store_rows(db, "reproduce-x", "edge", "offload_greedy", rule, level="batcher")
    store_rows(db, "reproduce-x", "edge", "disppo", learned, level="batcher")
    store_meta(db, "reproduce-x", baseline="offload_greedy", level="batcher", metrics=("deadline_rps", "ttft_p99_s"))
    store = Store(db)
    assert store.meta()["reproduce-x"] == {"baseline": '{"batcher": "offload_greedy"}',
                                           "metrics": '["deadline_rps", "ttft_p99_s"]'}
    rows = {r["batcher"]: r for r in aggregate(store.runs(), ["deadline_rps"], {"batcher": "offload_greedy"})}
    ch = rows["disppo"]["vs_baseline"]["deadline_rps"]
    # 3 segments, each the mean of 2 training seeds (+10% and +20%): rows of one segment are not independent
    assert ch.n == 3 and ch.mean == pytest.approx(0.15)
    page = write_report(Store(db, read_only=True), tmp_path / "out").read_text(encoding="utf-8")
    summary = page[page.index('id="summary"'):page.index('id="cdf"')]
    head = re.search(r"<thead>(.*?)</thead>", summary).group(1)
    assert head.index("Within deadline") < head.index("TTFT p99") and "TPOT p50" not in head
    assert "offload_greedy <span class=\"pm\">(baseline)</span>" in summary
    assert "+15.0" in summary  # disppo's paired change against the rule
    assert "a paper reproduction stores its runs' summaries, not their distributions" in page

    # the training seed as a grid parameter (reproduce torta): each seed's rows pair with the rule's
    db2 = str(tmp_path / "t.duckdb")
    store_rows(db2, "reproduce-t", "ring", "least_loaded", [{"seed": s, "response_time_mean_s": 2.0} for s in range(3)],
               level="planner", params={"topology": "ring"})
    for t in range(2):
        store_rows(db2, "reproduce-t", "ring", "torta", [{"seed": s, "train_seed": t, "response_time_mean_s": 1.8}
                                                         for s in range(3)],
                   level="planner", params={"topology": "ring", "train_seed": t})
    rows = aggregate(Store(db2).runs(), ["response_time_mean_s"], {"router": "least_loaded"})
    changes = [r["vs_baseline"]["response_time_mean_s"] for r in rows if r["router"] == "torta"]
    assert len(changes) == 2 and all(c.n == 3 and c.mean == pytest.approx(-0.1) for c in changes)
    # a store without meta (a sweep, or written before the table existed) keeps the usual columns
    page = write_report(_tiny_sweep(tmp_path / "s.duckdb"), tmp_path / "out2").read_text(encoding="utf-8")
    assert "TPOT p50" in page and "Within deadline" not in page


def test_cdf_quantiles_carry_the_seeds_range():
    """The CDFs averaged each percentile over seeds and hid the spread: the query returns the seeds' range too."""
    from fleetwise.experiments.report import _query_quantiles

    store = Store(None)
    qs = [float(q) for q in range(101)]
    store.write([{"run_id": f"r{seed}", "experiment": "e", "scenario": "default", "params": "{}",
                  "router": "round_robin", "router_label": "round_robin", "batcher": "sarathi",
                  "batcher_label": "sarathi", "seed": seed, "status": "ok", "metrics": {"ttft_p99_s": 1.0},
                  "quantiles": {"ttft_s": (qs, [0.01 * (1 + q) * (1 + seed) for q in qs])}} for seed in (0, 1, 2)])
    (q, v, lo, hi), = _query_quantiles(store, ["e"])["e"].values()
    assert len(q) == 101 and np.allclose(lo, 0.01 * (1 + q)) and np.allclose(hi, 0.03 * (1 + q))
    assert np.allclose(v, 0.02 * (1 + q))



def test_long_policy_names_widen_the_changes_plots_left_margin(tmp_path, monkeypatch):
    """The paired-change plot's tick labels (policy names up to 22 characters, e.g. ``graph_marl+fallback``) fit:
    its left margin grows with the longest label instead of cutting the name off at the figure's edge."""
    from fleetwise.experiments import report as R
    from fleetwise.reproduce.common import store_meta, store_rows

    db = str(tmp_path / "r.duckdb")
    store_rows(db, "reproduce-x", "w", "least_loaded", [{"seed": s, "latency_p99_s": 1.0} for s in range(3)],
               level="multicloud")
    store_rows(db, "reproduce-x", "w", "graph_marl+fallback", [{"seed": s, "latency_p99_s": 0.8} for s in range(3)],
               level="multicloud")
    store_meta(db, "reproduce-x", baseline="least_loaded", level="multicloud", metrics=("latency_p99_s",))
    lefts = {}
    grid = R._Plots.grid

    def spy(self, nrows, ncols, width, ax_h, title, *a, **kw):
        fig, axes = grid(self, nrows, ncols, width, ax_h, title, *a, **kw)
        lefts[title.split(" ·")[0]] = fig.subplotpars.left * width
        return fig, axes

    monkeypatch.setattr(R._Plots, "grid", spy)
    write_report(Store(db, read_only=True), tmp_path / "out")
    assert lefts["Paired change vs least_loaded"] >= 0.065 * len("graph_marl+fallback") > R.M_LEFT
