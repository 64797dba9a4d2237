"""Issue 4: GPU-count × parallelism allocation env, tabular learners, allocator policies, CPU reader."""

import subprocess
import sys

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from fleetwise.envs.allocation import AllocationEnv  # noqa: E402
from fleetwise.errors import InputError  # noqa: E402
from fleetwise.learn import tabular  # noqa: E402
from fleetwise.policies.allocation_model import (  # noqa: E402
    ACTIONS,
    CANON,
    N_ACTIONS,
    AllocationConfig,
    Discretizer,
    synthetic_series,
    deployment,
    perf_table,
)
from fleetwise.policies.allocators import (  # noqa: E402
    Constant,
    FixedThreshold,
    Oracle,
    RandomAllocator,
)
from fleetwise.reproduce.allocation import classification_metrics, evaluate  # noqa: E402
from fleetwise.workload.cpu import parse_cpu_text, read_cpu_series, read_cpu_traces  # noqa: E402


def _series(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return [synthetic_series(rng) for _ in range(n)]


@pytest.fixture(scope="module")
def env():
    return AllocationEnv(AllocationConfig(), _series())


# ------------------------------------------------------------------------------------------ env
def test_check_env_and_registered_id():
    from gymnasium.utils.env_checker import check_env

    import fleetwise.envs  # noqa: F401  (registers the ids)

    e = gym.make("fleetwise/Allocation-v0", series=_series(3)).unwrapped
    check_env(e, skip_render_check=True)


def test_deployments_and_canonical_actions():
    assert deployment(8, "data") == (8, 1, 1) and deployment(8, "model") == (1, 8, 1)
    assert deployment(8, "hybrid") == (4, 2, 1) and deployment(2, "hybrid") == (1, 1, 2)
    assert CANON[0] == CANON[1] == CANON[2] == 0 and len(set(CANON.tolist())) == 10


def test_perf_table_follows_the_perf_model():
    tab = perf_table(AllocationConfig())
    assert tab.feasible.all()  # CodeLlama-34B fits one A100-80GB
    hi = len(tab.load_grid) - 1
    # at peak load one GPU serves a small share; 8 GPUs serve nearly all; more GPUs use more energy when idle
    assert tab.scores[1, 0, -1, hi] < 0.2 and tab.scores[1, ACTIONS.index((8, "hybrid")), -1, hi] > 0.7
    assert tab.energy_j[ACTIONS.index((8, "data")), -1, 0] > tab.energy_j[0, -1, 0]
    # data parallel uses no interconnect; tensor parallel uses more of it when bandwidth is scarce
    assert tab.bw_util[ACTIONS.index((4, "data"))].max() == 0
    m4 = ACTIONS.index((4, "model"))
    assert tab.bw_util[m4, 0, 60] > tab.bw_util[m4, -1, 60] > 0
    # Llama-2-70B does not fit one A100-80GB: data parallel and 1 GPU are infeasible
    t70 = perf_table(AllocationConfig(model="Llama-2-70B"))
    assert not t70.feasible[0] and not t70.feasible[ACTIONS.index((8, "data"))] and t70.feasible[ACTIONS.index((8, "model"))]


def test_same_seed_same_episode(env):
    def roll(seed):
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for t in range(50):
            obs, r, *_ = env.step(t % N_ACTIONS)
            out.append(np.append(obs, r))
        return out

    a, b = roll(7), roll(7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = roll(8)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_lean_path_matches_gym_step(env):
    """The tabular trainers' reward/next-state computation equals env.step's."""
    core = env.core
    obs, _ = env.reset(seed=3, options={"series": 2, "deployed": 4})
    ep, d = env._ep, 4
    disc = Discretizer()
    S = disc.episode_indices(ep)
    rng = np.random.default_rng(0)
    for t in range(ep.T):
        assert disc(obs) == S[t, d]
        a = int(rng.integers(N_ACTIONS))
        r_lean = ep.base[t, a] - ep.served_w[t, a] * core.table.lost_frac[d, a]
        obs, r, term, trunc, info = env.step(a)
        assert r == pytest.approx(r_lean, abs=1e-12)
        d = a
    assert term and not trunc


def test_oracle_policy_matches_labels(env):
    core = env.core
    res = evaluate(Oracle(env.cfg), core, _series(4, seed=5), seed=1)
    assert (res["y_true"] == res["y_pred"]).mean() > 0.99


def test_bad_config_is_input_error():
    with pytest.raises(InputError, match="weights"):
        AllocationConfig(weights=(1, 1))
    with pytest.raises(InputError, match="unknown model"):
        perf_table(AllocationConfig(model="gpt-17"))


# ------------------------------------------------------------------------------------------ learners
@pytest.fixture(scope="module")
def trained(env):
    args = tabular.TabularArgs(total_steps=150_000, seed=0)
    return {"q_learning": tabular.train(env, args, "q_learning"), "sarsa": tabular.train(env, args, "sarsa")}


def _score(policy, env, seed=11):
    res = evaluate(policy, env.core, _series(6, seed=99), seed=seed)
    m = classification_metrics(res["y_true"], res["y_pred"])
    return m["accuracy"], float(res["episode_rewards"].mean())


def test_tabular_learners_beat_random_and_constant(env, trained):
    acc_r, rew_r = _score(RandomAllocator(0), env)
    acc_c, rew_c = _score(Constant(1, "data"), env)
    for name, pol in trained.items():
        acc, rew = _score(pol, env)
        assert acc > 0.6 and acc > acc_r + 0.4 and rew > rew_r and rew > rew_c, name
        assert pol.curve and pol.curve[-1][1] > pol.curve[0][1]  # learning curve goes up


def test_tabular_is_deterministic_and_saves(env, trained, tmp_path):
    args = tabular.TabularArgs(total_steps=20_000, seed=4)
    a, b = tabular.train(env, args), tabular.train(env, args)
    assert np.array_equal(a.q, b.q)
    p = trained["q_learning"].save(tmp_path / "q")
    back = tabular.TabularPolicy.load(p)
    assert np.array_equal(back.q, trained["q_learning"].q) and back.disc == trained["q_learning"].disc
    from fleetwise.policies import make

    pol = make("allocator", "q_learning", {"path": str(p)})
    obs, _ = env.reset(seed=0)
    assert pol.allocate(obs) == trained["q_learning"].allocate(obs)
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(InputError, match="bad.npz"):
        tabular.TabularPolicy.load(tmp_path / "bad.npz")


class _Boom:
    def __reduce__(self):
        import os

        return (os.mkdir, ("/tmp/fleetwise-unpickled-by-a-q-table",))


def test_a_q_table_cannot_run_code_and_bad_metadata_is_one_line(tmp_path):
    """A crafted .npz: an object array (a pickle that would create a folder) is refused without being run;
    metadata with unknown discretizer fields is a one-line InputError, not a TypeError."""
    import json
    import os


    marker = "/tmp/fleetwise-unpickled-by-a-q-table"
    if os.path.isdir(marker):
        os.rmdir(marker)
    np.savez(tmp_path / "evil.npz", q=np.array([_Boom()], dtype=object), meta=np.array("{}"))
    from fleetwise.policies import make

    with pytest.raises(InputError, match="evil.npz: not a saved tabular policy"):
        make("allocator", "q_learning", {"path": str(tmp_path / "evil.npz")})
    assert not os.path.exists(marker)
    meta = {"name": "x", "discretizer": {"cpu_bins": 2, "os": "system"}, "curve": []}
    np.savez(tmp_path / "meta.npz", q=np.zeros((2, 12)), meta=np.array(json.dumps(meta)))
    with pytest.raises(InputError, match="meta.npz: not a saved tabular policy"):
        tabular.TabularPolicy.load(tmp_path / "meta.npz")
    # found by fuzzing, 2026-12-06: a FIFO hung np.load, an empty file was an EOFError, 0 bins loaded and failed at
    # the first decision, a NaN table chose action 0 everywhere
    os.mkfifo(tmp_path / "fifo.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    meta0 = {"name": "x", "discretizer": {"cpu_bins": 0, "bw_bins": 3, "deployed": False}, "curve": []}
    np.savez(tmp_path / "bins.npz", q=np.zeros((0, 12)), meta=np.array(json.dumps(meta0)))
    meta1 = {"name": "x", "discretizer": {"cpu_bins": 2, "bw_bins": 1, "deployed": False}, "curve": []}
    np.savez(tmp_path / "nan.npz", q=np.full((2, 12), np.nan), meta=np.array(json.dumps(meta1)))
    for name, needle in [("fifo", "not a regular file"), ("empty", "not a zip file"), ("bins", "cpu_bins 0"),
                         ("nan", "NaN or infinite")]:
        with pytest.raises(InputError, match=f"{name}.npz: .*{needle}"):
            tabular.TabularPolicy.load(tmp_path / f"{name}.npz")


def test_env_arguments_and_reset_options_are_checked():
    """Found by fuzzing, 2026-12-06: reset(options={"series": 1000}) and {"deployed": 99} were IndexErrors, -1
    wrapped around, 1.7 was truncated; a NaN series was taken as no demand, an empty one failed in numpy; a dict
    config was "unhashable"."""
    from fleetwise.envs.allocation import AllocationEnv

    env = AllocationEnv(series=[np.linspace(0.1, 0.9, 50)])
    env.reset(seed=0, options={"series": 0, "deployed": 3})
    for opts, needle in [({"series": 1}, "series"), ({"series": -1}, "series"), ({"deployed": 99}, "deployed"),
                         ({"deployed": 1.7}, "deployed")]:
        with pytest.raises(ValueError, match=needle):
            env.reset(seed=0, options=opts)
    for series in ([np.full(10, np.nan)], [np.array([])], [np.zeros((3, 3))], [0.5], [np.full(10, 2.0)]):
        with pytest.raises(InputError, match=r"series\[0\]"):
            AllocationEnv(series=series)
    with pytest.raises(InputError, match="config dict"):
        AllocationEnv(config={"a": 1})


def test_tabular_args_a_run_cannot_take_are_refused():
    """Found by fuzzing, 2026-12-06: gamma=NaN returned a NaN Q table, cpu_bins=0 was an IndexError, bw_bins=-1 a
    numpy shape error, total_steps=0 and epsilon_start=5 were taken."""
    for kw in (dict(gamma=float("nan")), dict(alpha=float("nan")), dict(cpu_bins=0), dict(bw_bins=-1),
               dict(total_steps=0), dict(epsilon_start=5.0), dict(alpha_omega=-1.0)):
        with pytest.raises(ValueError, match=f"TabularArgs.{next(iter(kw))}"):
            tabular.TabularArgs(**kw)


def test_fixed_rule_fit_and_registry(env):
    fx = FixedThreshold.fit(env.core, _series(4), np.random.default_rng(0), grid_step=0.2)
    assert fx.allocate(np.r_[0.0, np.zeros(17)]) in [ACTIONS.index((1, p)) for p in ("data", "model", "hybrid")]
    from fleetwise.policies import make, names

    assert {"fixed", "constant", "oracle", "random", "q_learning", "sarsa", "dqn"} <= set(names("allocator"))
    f = make("allocator", "fixed", {"thresholds": [0.3, 0.6, 0.9], "parallelism": "data"})
    assert [f.allocate(np.r_[u, np.zeros(17)]) for u in (0.1, 0.5, 0.7, 0.95)] == \
        [ACTIONS.index((n, "data")) for n in (1, 2, 4, 8)]
    with pytest.raises(InputError):
        make("allocator", "fixed", {"thresholds": [0.5, 0.2, 0.9]})
    # an observation that is not the env's was taken (found by fuzzing, 2026-12-06): a NaN CPU reading chose 8
    # GPUs in fixed, 5 was an IndexError in oracle, -0.5 wrapped to another state's row of a Q table
    from fleetwise.policies.allocators import Oracle

    for pol in (f, Oracle(env.cfg)):
        for bad in (np.r_[np.nan, np.zeros(17)], np.zeros(3), None):
            with pytest.raises(ValueError, match="observation"):
                pol.allocate(bad)
    assert Oracle(env.cfg).allocate(np.r_[5.0, np.zeros(17)]) == Oracle(env.cfg).allocate(np.r_[1.0, np.zeros(17)])


def test_dqn_trains_and_beats_random(env, tmp_path, monkeypatch):
    pytest.importorskip("stable_baselines3")
    import tempfile

    from fleetwise.learn import dqn

    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # (where SB3's default logger makes its folder)
    pol = dqn.train(env, dqn.DQNArgs(total_timesteps=4_000, learning_starts=500, seed=0, log_every=1000))
    assert not list(scratch.glob("SB3-*"))  # training left no SB3-<timestamp> folder behind (recipe.quiet_logger)
    acc, rew = _score(pol, env)
    acc_r, rew_r = _score(RandomAllocator(0), env)
    assert rew > rew_r and acc > acc_r
    p = pol.save(tmp_path / "dqn")
    back = dqn.DQNPolicy.load(p)
    obs, _ = env.reset(seed=1)
    assert back.allocate(obs) == pol.allocate(obs)


# ------------------------------------------------------------------------------------------ metrics
def test_weighted_metrics_match_sklearn_definition():
    yt = np.array([0, 0, 1, 1, 1, 2])
    yp = np.array([0, 1, 1, 1, 2, 2])
    m = classification_metrics(yt, yp)
    # per class precision (1, 2/3, 1/2), recall (1/2, 2/3, 1), support (2, 3, 1)
    p = (2 * 1 + 3 * 2 / 3 + 1 * 0.5) / 6
    r = (2 * 0.5 + 3 * 2 / 3 + 1 * 1) / 6
    f = (2 * (2 * 1 * .5 / 1.5) + 3 * (2 / 3) + 1 * (2 * .5 / 1.5)) / 6
    assert m["accuracy"] == pytest.approx(4 / 6) and m["recall"] == pytest.approx(r)
    assert m["precision"] == pytest.approx(p) and m["f1"] == pytest.approx(f)


# ------------------------------------------------------------------------------------------ CPU reader
def test_cpu_reader_formats(tmp_path):
    pl = tmp_path / "vm1"
    pl.write_text("24\n34\n0\n99\n")
    assert np.allclose(read_cpu_series(pl), [0.24, 0.34, 0.0, 0.99])
    one = tmp_path / "ones"
    one.write_text("0\n1\n1\n")  # integers: percent even if all <= 1
    assert np.allclose(read_cpu_series(one), [0, 0.01, 0.01])
    csvp = tmp_path / "a.csv"
    csvp.write_text("timestamp,CPU Util,mem\n0,0.5,1\n300,0.25,1\n")
    assert np.allclose(read_cpu_series(csvp), [0.5, 0.25])
    pc = tmp_path / "b.csv"
    pc.write_text("ts,cpu_percent\n0,0.5\n1,1\n")
    assert np.allclose(read_cpu_series(pc), [0.005, 0.01])
    az = tmp_path / "c.csv"
    az.write_text("time,avg cpu\n0,55.5\n1,12\n")
    assert np.allclose(read_cpu_series(az), [0.555, 0.12])
    d = read_cpu_traces(tmp_path)
    assert set(d) == {"vm1", "ones", "a.csv", "b.csv", "c.csv"}


@pytest.mark.parametrize("text,match", [
    ("", "empty file"),
    ("ts,mem\n0,1\n", "no CPU-utilisation column"),
    ("ts,cpu\n0,0.5\n1,abc\n", "row 2: cpu 'abc' is not a number"),
    ("ts,cpu\n0,50\n1,120\n", "row 2: CPU utilisation 120 is out of range"),
    ("10\n20\n-5\n", "row 3: CPU utilisation -5 is out of range"),
    ("10\n20,3\n", "row 2"),
    ("ts,cpu\n0,0.5\n1\n", "row 2: missing field cpu"),
])
def test_cpu_reader_errors_name_file_and_row(tmp_path, text, match):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(InputError, match=match) as ei:
        read_cpu_series(p)
    msg = str(ei.value)
    assert "bad.csv" in msg and "\n" not in msg
    assert parse_cpu_text("1\n2\n", "x").tolist() == [0.01, 0.02]


def test_cpu_reader_missing_path(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_cpu_traces(tmp_path / "nope")


def test_planetlab_archive_read_in_place(data_dir):
    from fleetwise.workload.cpu import planetlab_days

    d = planetlab_days(days=["20110303"], max_vms=3)
    s = next(iter(d["20110303"].values()))
    assert len(s) == 288 and 0 <= s.min() and s.max() <= 1
    unpacked = read_cpu_traces(data_dir / "planetlab-cpu-cloudsim" / "20110303", max_series=3)
    assert np.array_equal(next(iter(unpacked.values())), s)


def test_cli_eval_trace_error_exits_2(tmp_path):
    p = tmp_path / "broken.csv"
    p.write_text("ts,cpu\n0,0.5\n1,oops\n")
    r = subprocess.run([sys.executable, "-m", "fleetwise", "reproduce", "allocation", "--quick", "--eval-trace",
                        str(p), "--db", str(tmp_path / "x.duckdb")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "broken.csv" in (r.stdout + r.stderr) and "Traceback" not in r.stderr


def test_envs_refuse_actions_outside_their_space_and_steps_without_reset():
    """Found by fuzzing the Python API (2026-12-06): Allocation-v0 took -1 (wrapped to the last action), 1.7 and
    "3", and 12 was an IndexError in the step; Torta-v0 broadcast a wrong shape deep in the planner and took NaN;
    a step before reset() was an AttributeError, and one after the end an IndexError or a silent reward."""
    from fleetwise.envs.torta import TortaEnv

    env = AllocationEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    for bad in (12, -1, 1.7, "3", np.array([3]), True):
        with pytest.raises(ValueError, match="expected an integer in Discrete"):
            env.step(bad)
    env.step(np.int64(3))  # what a vectorised env passes
    t = TortaEnv()
    with pytest.raises(RuntimeError, match="reset"):
        t.step(t.action_space.sample())
    t.reset(seed=0)
    n = t.action_space.shape[0]
    for bad in (np.zeros(n - 1), np.full(n, np.nan), 0.0):
        with pytest.raises(ValueError, match="expected finite values in Box"):
            t.step(bad)
    t.step(np.zeros(n))


def test_a_failed_save_keeps_the_checkpoint_that_was_there(tmp_path):
    """save_policy replaced both files and then found the NaN weights on reading them back: the good checkpoint
    was gone. Now both are written under temporary names and read back before they replace anything."""
    from fleetwise.control.checkpoint import ActionSpec, CheckpointError, ModelCard, load_policy, save_policy

    kw = dict(level="router", algorithm="ppo", obs_low=-np.ones(4), obs_high=np.ones(4),
              action=ActionSpec("discrete", n=3), activation="tanh",
              card=ModelCard(level="router", policy="x", rule=None, training={}, validation=None))
    good = [(np.ones((8, 4)), np.zeros(8)), (np.ones((3, 8)), np.zeros(3))]
    p = save_policy(tmp_path / "mine.npz", layers=good, **kw)
    before = p.read_bytes()
    with pytest.raises(CheckpointError, match="NaN"):
        save_policy(tmp_path / "mine.npz", layers=[(np.full((8, 4), np.nan), np.zeros(8)), good[1]], **kw)
    assert p.read_bytes() == before and sorted(f.name for f in tmp_path.iterdir()) == ["mine.card.json", "mine.npz"]
    load_policy(p)


def test_allocation_and_autoscaling_configs_refuse_values_a_run_cannot_take():
    """Found by fuzzing the Python API (2026-12-06): window_s=0 divided by zero, a negative one put observations
    outside Box(0, 1), load_levels=0 failed in numpy; Autoscaling's train_fraction=0 failed in numpy and lam=inf or
    reward_scale=NaN gave NaN rewards."""
    from fleetwise.envs.autoscaling import AutoscalingConfig

    for kw in (dict(window_s=0.0), dict(window_s=-1.0), dict(load_levels=0), dict(bw_levels=0),
               dict(peak_rps=-5.0), dict(noise_sigma=-1.0), dict(episode_steps=0)):
        with pytest.raises(InputError, match=next(iter(kw))):
            AllocationConfig(**kw)
    for kw in (dict(train_fraction=0.0), dict(lam=float("inf")), dict(reward_scale=float("nan")),
               dict(slo_target=2.0)):
        with pytest.raises(InputError, match=f"AutoscalingConfig.{next(iter(kw))} = "):
            AutoscalingConfig(**kw)


def test_the_reproduction_stores_its_rows_so_the_report_tables_them(tmp_path):
    """Only the learning curves were stored, so `fleetwise report` of `reproduce allocation` said "0 runs" (a
    helper's audit, 2026-12-07): every policy's per-seed metrics are runs of `reproduce-allocation`, paired with
    `fixed`."""
    from fleetwise.experiments.report import write_report
    from fleetwise.experiments.store import Store
    from fleetwise.policies.allocation_model import N_ACTIONS
    from fleetwise.reproduce.allocation import METRICS, _write_outputs

    rng = np.random.default_rng(0)
    raw = {"per_seed": {n: {k: list(rng.uniform(0.2, 0.9, 3)) for k in METRICS} for n in ("fixed", "q_learning")},
           "curves": {"q_learning": [[(0, 1.0), (10, 2.0)]] * 3},
           "confusion": {n: np.eye(N_ACTIONS, dtype=np.int64) for n in ("fixed", "q_learning")}}
    db = tmp_path / "a.duckdb"
    _write_outputs(raw, str(db), "quick")
    runs = Store(db).runs()
    assert len(runs) == 6 and {r["experiment"] for r in runs} == {"reproduce-allocation"}
    assert {r["router"] for r in runs} == {"fixed", "q_learning"}
    page = write_report(Store(db, read_only=True), tmp_path / "report").read_text()
    assert "6 runs" in page and "Accuracy" in page and "changes-reproduce-allocation" in page
