"""The results store: one embedded DuckDB file (default ``results/fleetwise.duckdb``), Parquet export.

Tables
- ``runs``: one row per run: identity (run_id, experiment, scenario, scenario_hash, params, policies, seed),
  provenance (code_version, wall_s, finished_at), status ('ok' / 'failed' with its error), and one DOUBLE
  column per summary metric (columns are added as new metrics appear).
- ``quantiles``: (run_id, metric, q, value) for the latency distributions (TTFT, TPOT, E2E), 0..100 percentiles.
- ``timeline``: (run_id, replica, t_s, util) per-replica GPU-busy fraction over time.
- ``learning``: (run_id, policy, step, metric, value) training curves of learned policies.
- ``meta``: (experiment, key, value) what an experiment says about itself for the report: a reproduction's
  ``baseline`` (its rule, JSON ``{level column: name}``) and ``metrics`` (its headline metrics, a JSON list).

Writes open the file, insert in one transaction and close it again, retrying while another process holds
the lock, so several sweeps may write to one file at once without losing or duplicating rows
(``run_id`` is the primary key; a run stored as 'ok' is never written twice).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from fleetwise.errors import InputError, not_a_file, with_article

DEFAULT_DB = Path("results") / "fleetwise.duckdb"
# no extension is installed or loaded behind the user's back (a SQLite file given as --db made DuckDB reach for
# extensions.duckdb.org to read it)
OFFLINE = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}

ID_COLUMNS = {
    "run_id": "VARCHAR PRIMARY KEY", "experiment": "VARCHAR", "scenario": "VARCHAR", "scenario_hash": "VARCHAR",
    "params": "VARCHAR", "router": "VARCHAR", "router_params": "VARCHAR", "batcher": "VARCHAR",
    "batcher_params": "VARCHAR", "router_label": "VARCHAR", "batcher_label": "VARCHAR", "seed": "BIGINT",
    "requests": "BIGINT", "code_version": "VARCHAR", "wall_s": "DOUBLE", "status": "VARCHAR", "error": "VARCHAR",
    "finished_at": "DOUBLE",
    # which decision level the compared policy acts at (router, batcher, scaler, planner, allocator, batch
    # scheduler, multicloud) and its name; a sweep's runs also keep the scaler the scenario ran with
    "level": "VARCHAR", "policy": "VARCHAR", "scaler": "VARCHAR",
}
ADDED_COLUMNS = ("level", "policy", "scaler")  # a store written before these existed gets them (NULL) on open
CORE_COLUMNS = {"run_id", "experiment", "scenario", "status", "seed"}  # what a store's runs table has had always
SCHEMA = [
    "CREATE TABLE IF NOT EXISTS runs (" + ", ".join(f"{k} {t}" for k, t in ID_COLUMNS.items()) + ")",
    *(f"ALTER TABLE runs ADD COLUMN IF NOT EXISTS {c} {ID_COLUMNS[c]}" for c in ADDED_COLUMNS),
    "CREATE TABLE IF NOT EXISTS quantiles (run_id VARCHAR, metric VARCHAR, q DOUBLE, value DOUBLE)",
    "CREATE TABLE IF NOT EXISTS timeline (run_id VARCHAR, replica INTEGER, t_s DOUBLE, util DOUBLE)",
    "CREATE TABLE IF NOT EXISTS learning (run_id VARCHAR, policy VARCHAR, step BIGINT, metric VARCHAR, value DOUBLE)",
    "CREATE TABLE IF NOT EXISTS meta (experiment VARCHAR, key VARCHAR, value VARCHAR)",
]


def check_writable_file(path: str | Path, what: str = "file") -> None:
    """Before any work: ``path`` can be created or written (not a folder, not under a file, a writable folder).
    Writes nothing."""
    import os

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a folder, expected {with_article(what)} file")
    if p.exists():
        if not p.is_file():  # (a database written into /dev/sda would be written into the disk)
            raise InputError(f"{p}: not a regular file (a device, a pipe or a socket), expected "
                             f"{with_article(what)} file")
        if not os.access(p, os.W_OK):
            raise InputError(f"{p}: {what} is not writable")
        return
    check_writable_dir(p.parent, f"folder of the {what}")


def check_store_file(path: str | Path, what: str = "results store (--db)") -> None:
    """Before any work: ``path`` can be written (``check_writable_file``) and, if it exists, is a fleetwise
    results store, or an empty database, that this version reads (not a file of another kind, found only when the
    results are written at the end). Writes nothing."""
    check_writable_file(path, what)
    p = Path(path)
    if p.is_file():
        Store(p, read_only=True)


def check_writable_dir(path: str | Path, what: str = "output folder") -> None:
    """Before any work: ``path`` is a writable folder or can be created as one. Leaves nothing behind: where the
    permissions allow, an empty file is made and removed in the nearest existing folder, as ``os.access`` says
    yes to root for /proc and /sys, where nothing can be made."""
    import os
    import tempfile

    p = Path(path)
    for q in [p, *p.parents]:
        if q.exists():
            if not q.is_dir():
                raise InputError(f"{path}: cannot be the {what}: {q} is a file")
            if not os.access(q, os.W_OK | os.X_OK):
                raise InputError(f"{path}: cannot be the {what}: {q} is not writable")
            try:
                fd, probe = tempfile.mkstemp(prefix=".fleetwise-probe-", dir=q)
            except OSError as e:
                raise InputError(f"{path}: cannot be the {what}: nothing can be written in {q} "
                                 f"({e.strerror or e})") from None
            os.close(fd)
            os.unlink(probe)
            return


def _safe_col(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"bad metric name {name!r}")
    return name


class Store:
    """``Store(path)`` for a file; ``Store(None)`` for an in-memory store (one process, e.g. ``compare``);
    ``Store(path, read_only=True)`` reads an existing file and never writes it (``fleetwise report``): no file
    lock for writing, no schema migration (a store from before a column was added reads it as NULL)."""

    def __init__(self, path: str | Path | None = DEFAULT_DB, lock_timeout_s: float = 120.0, read_only: bool = False):
        import duckdb  # noqa: F401  (fail early with a clear message if missing)

        if path is not None and not isinstance(path, (str, Path)):  # (123 was pathlib's TypeError)
            raise InputError(f"Store path {path!r:.60}: expected a file path or None (in memory)")
        if (isinstance(lock_timeout_s, bool) or not isinstance(lock_timeout_s, (int, float))
                or not 0 <= lock_timeout_s <= 86_400):  # (-1 was taken)
            raise InputError(f"Store lock_timeout_s {lock_timeout_s!r}: expected 0 to 86,400 seconds")
        self.path = None if path is None else Path(path)
        self.lock_timeout_s = lock_timeout_s
        self.read_only = read_only
        self._mem = None
        if self.path is None:
            self._mem = duckdb.connect(":memory:", config=OFFLINE)
        elif read_only:
            if not self.path.is_file():
                raise InputError(f"{self.path}: {not_a_file(self.path, 'results store')}")
            self._with(lambda con: None)  # opens now: a file that is not a store fails here, in one line
            return
        else:
            check_writable_file(self.path, "results store")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise InputError(f"{self.path}: cannot create the results store's folder ({e.strerror or e})") from None
            if not self.path.exists():
                self._create()
            else:
                self._with(self._check_foreign)
        self._with(lambda con: [con.execute(s) for s in SCHEMA])

    def _check_foreign(self, con, catalog: str | None = None) -> None:
        """An existing file must be a fleetwise store (or an empty database) before the schema's migrations touch
        it: a DuckDB file with other tables had columns and tables added, then failed with a traceback. (Read
        only, the file is attached as ``catalog``: a foreign database read as an empty store, and the report of
        a database that was not a store was written as if it were.)"""
        cat = "" if catalog is None else f" AND table_catalog = '{catalog}'"
        tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables "
                                            f"WHERE table_schema = 'main'{cat}").fetchall()}
        if not tables:
            return
        cols = {c for (c,) in con.execute("SELECT column_name FROM information_schema.columns WHERE "
                                          f"table_schema = 'main' AND table_name = 'runs'{cat}").fetchall()}
        if cols & CORE_COLUMNS and not CORE_COLUMNS <= cols:  # (a store with a column dropped)
            raise InputError(f"{self.path}: not a results store this version can read (its runs table has no "
                             f"{sorted(CORE_COLUMNS - cols)[0]!r} column); it was left as it is")
        if not CORE_COLUMNS <= cols:
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise InputError(f"{self.path}: a DuckDB database that is not a fleetwise results store (tables: "
                             f"{shown}); it was left as it is")

    def _create(self) -> None:
        """A new store file appears whole: it is built under a temporary name and linked into place, so another
        process opening (or creating) it at the same moment never sees a half-written file."""
        import os

        import duckdb

        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            con = duckdb.connect(str(tmp), config=OFFLINE)
            try:
                for sql in SCHEMA:
                    con.execute(sql)
            finally:
                con.close()
            try:
                os.link(tmp, self.path)  # atomic, and fails if another process got there first: then its file is used
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links
                if not self.path.exists():
                    os.replace(tmp, self.path)
        except (OSError, duckdb.Error) as e:
            msg = getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
            raise InputError(f"{self.path}: cannot create the results store ({msg})") from None
        finally:
            for f in (tmp, tmp.with_name(tmp.name + ".wal")):
                f.unlink(missing_ok=True)

    # ------------------------------------------------------------------ connections
    def _connect(self, read_only: bool = False):
        import duckdb

        if self._mem is not None:
            return self._mem
        deadline = time.monotonic() + self.lock_timeout_s
        delay = 0.02
        while True:
            try:
                if self.read_only:
                    return self._snapshot()
                if read_only and self.path.exists():
                    return duckdb.connect(str(self.path), read_only=True, config=OFFLINE)
                return duckdb.connect(str(self.path), config=OFFLINE)
            except duckdb.IOException as e:  # another process holds the file lock
                if "lock" not in str(e).lower() or time.monotonic() > deadline:
                    raise InputError(f"{self.path}: cannot open results store: {str(e).splitlines()[0]}") from None
            except duckdb.Error as e:  # (a corrupt file: a checksum error was a 48-line traceback)
                first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                raise InputError(f"{self.path}: cannot open results store: {first}") from None
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)

    def _snapshot(self):
        """An in-memory connection that reads the file (attached read-only) through views named as the store's
        tables, with the columns and tables a current store has: those the file lacks read as NULL or empty."""
        import duckdb

        con = duckdb.connect(":memory:", config=OFFLINE)
        try:
            con.execute("ATTACH '" + str(self.path).replace("'", "''") + "' AS src (READ_ONLY)")
            self._check_foreign(con, "src")
            have: dict[str, set[str]] = {}
            for t, c in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                    "WHERE table_catalog = 'src' AND table_schema = 'main'").fetchall():
                have.setdefault(t, set()).add(c)
            for sql in SCHEMA:
                if not sql.startswith("CREATE TABLE"):
                    continue
                table = sql.split()[5]
                if table not in have:
                    con.execute(sql.replace(" PRIMARY KEY", ""))  # (empty, in memory)
                    continue
                extra = [f"NULL::{ID_COLUMNS[c].split()[0]} AS {c}" for c in ADDED_COLUMNS
                         if table == "runs" and c not in have[table]]
                con.execute(f"CREATE VIEW {table} AS SELECT *{''.join(', ' + e for e in extra)} FROM src.{table}")
            return con
        except BaseException:
            con.close()
            raise

    def _with(self, fn, read_only: bool = False):
        import duckdb

        con = self._connect(read_only)
        try:
            return fn(con)
        except duckdb.InterruptException:  # Ctrl-C while a query ran: a Ctrl-C, not a traceback (the transaction
            raise KeyboardInterrupt from None  # was rolled back; a sweep stores the batch again on its way out)
        except RuntimeError as e:
            if str(e).strip() == "Query interrupted":  # (how some DuckDB builds report it)
                raise KeyboardInterrupt from None
            raise
        except duckdb.Error as e:
            # a full disk, a read-only file system, a file that is not a DuckDB database: one line with the cause
            # (what was committed before stays intact: every write is one transaction)
            if not isinstance(e, (duckdb.IOException, duckdb.TransactionException, duckdb.PermissionException,
                                  duckdb.FatalException)):
                raise
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InputError(f"{self.path or ':memory:'}: results store: {msg}") from None
        finally:
            if con is not self._mem:
                con.close()

    # ------------------------------------------------------------------ writing
    def done_ids(self) -> set[str]:
        """The ids of the runs stored with status ``ok`` (a sweep skips them)."""
        return {r[0] for r in self._with(lambda c: c.execute("SELECT run_id FROM runs WHERE status = 'ok'").fetchall())}

    def _transaction(self, fn):
        """``fn(con)`` in one transaction on a fresh connection (``_with``): committed, or rolled back on any error,
        which is raised as it was."""

        def tx(con):
            con.execute("BEGIN TRANSACTION")
            try:
                out = fn(con)
                con.execute("COMMIT")
                return out
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - a failed COMMIT has already ended the transaction
                    pass
                raise  # the original error (e.g. "No space left on device"), not the rollback's

        return self._with(tx)

    def write(self, results: Iterable[dict], replace: bool = False) -> int:
        """Store finished runs (the dicts ``runner.execute_run`` returns); returns rows written. A run already
        stored as ``ok`` is kept (a resumed sweep never duplicates one), unless ``replace``: then the new result
        replaces it (a reproduction run again, whose rows are its latest results; ``reproduce.common.store_rows``)."""
        results = list(results)
        if not results:
            return 0

        def tx(con) -> int:
            existing = {r[1] for r in con.execute("PRAGMA table_info('runs')").fetchall()}
            n = 0
            for res in results:
                metrics = {k: v for k, v in res.get("metrics", {}).items() if isinstance(v, (int, float))}
                for k in metrics:
                    if k not in existing and k not in ID_COLUMNS:
                        con.execute(f"ALTER TABLE runs ADD COLUMN {_safe_col(k)} DOUBLE")
                        existing.add(k)
                rid = res["run_id"]
                old = con.execute("SELECT status FROM runs WHERE run_id = ?", [rid]).fetchone()
                if old is not None and old[0] == "ok" and not replace:
                    continue  # already stored: never a duplicate
                if old is not None:  # a failed attempt, now run again (or a result replaced)
                    for t in ("runs", "quantiles", "timeline", "learning"):
                        con.execute(f"DELETE FROM {t} WHERE run_id = ?", [rid])
                row = {k: res.get(k) for k in ID_COLUMNS}
                row.update({k: (None if isinstance(v, float) and math.isnan(v) else float(v))
                            for k, v in metrics.items()})
                cols = list(row)
                con.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            [row[c] for c in cols])
                q = res.get("quantiles") or {}
                rows = [(rid, m, float(qq), float(v)) for m, (qs, vs) in q.items() for qq, v in zip(qs, vs)
                        if not math.isnan(v)]
                if rows:
                    con.executemany("INSERT INTO quantiles VALUES (?, ?, ?, ?)", rows)
                tl = res.get("timeline")
                if tl:
                    w, util = tl
                    rows = [(rid, i, (j + 0.5) * w, float(u)) for i, r in enumerate(util) for j, u in enumerate(r)]
                    if rows:  # (a run that served nothing has no bucket; DuckDB refuses an empty executemany)
                        con.executemany("INSERT INTO timeline VALUES (?, ?, ?, ?)", rows)
                lc = res.get("learning") or []
                if lc:
                    con.executemany("INSERT INTO learning VALUES (?, ?, ?, ?, ?)",
                                    [(rid, p, int(s), m, float(v)) for p, s, m, v in lc])
                n += 1
            return n

        return self._transaction(tx)

    def add_learning_curve(self, policy: str, steps: Iterable[int], values: Iterable[float], metric: str = "return",
                           run_id: str = "") -> None:
        """Store one learning curve, replacing any stored under the same ``(run_id, policy, metric)``: a training
        run again (or resumed) supersedes its curve; appending gave the report duplicated, or mixed, points."""
        rows = [(run_id, policy, int(s), metric, float(v)) for s, v in zip(steps, values)]

        def tx(con) -> None:
            con.execute("DELETE FROM learning WHERE run_id = ? AND policy = ? AND metric = ?", [run_id, policy, metric])
            if rows:
                con.executemany("INSERT INTO learning VALUES (?, ?, ?, ?, ?)", rows)

        self._transaction(tx)

    def set_meta(self, experiment: str, values: dict[str, str]) -> None:
        """Set what ``experiment`` says about itself, ``{key: value}`` in one transaction (one value per key; the
        last write wins)."""

        def tx(con) -> None:
            for key, value in values.items():
                con.execute("DELETE FROM meta WHERE experiment = ? AND key = ?", [experiment, key])
                con.execute("INSERT INTO meta VALUES (?, ?, ?)", [experiment, key, value])

        self._transaction(tx)

    # ------------------------------------------------------------------ reading
    def meta(self) -> dict[str, dict[str, str]]:
        """``{experiment: {key: value}}`` (empty for a store written before the table existed)."""
        out: dict[str, dict[str, str]] = {}
        for e, k, v in self._with(lambda c: c.execute("SELECT experiment, key, value FROM meta").fetchall(),
                                  read_only=True):
            out.setdefault(str(e), {})[str(k)] = str(v)
        return out

    def query(self, sql: str, params: list | None = None) -> dict[str, np.ndarray]:
        """Columns of a query result as numpy arrays."""

        def q(con):
            cur = con.execute(sql, params or [])
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
            return {c: np.array([r[i] for r in rows], dtype=object) for i, c in enumerate(cols)}

        return self._with(q, read_only=True)

    def runs(self, where: str = "status = 'ok'") -> list[dict[str, Any]]:
        """The stored runs as dicts (every column), ordered; ``where`` is a SQL condition written by fleetwise's
        own code, never by a client."""
        def q(con):
            cur = con.execute(f"SELECT * FROM runs WHERE {where} ORDER BY experiment, scenario, router_label, "
                              "batcher_label, params, seed")
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

        out = self._with(q, read_only=True)
        for r in out:
            for k in ("params", "router_params", "batcher_params"):
                r[k] = json.loads(r[k]) if r.get(k) else {}
        return out

    def count(self, where: str = "TRUE") -> int:
        """How many runs match ``where`` (a SQL condition written by fleetwise's own code)."""
        return int(self._with(lambda c: c.execute(f"SELECT count(*) FROM runs WHERE {where}").fetchone()[0],
                              read_only=True))

    def export_parquet(self, out_dir: str | Path) -> list[Path]:
        """Write the store's tables as Parquet files into ``out_dir`` (created); returns their paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = []
        for t in ("runs", "quantiles", "timeline", "learning", "meta"):
            f = out / f"{t}.parquet"
            self._with(lambda c, t=t, f=f: c.execute(f"COPY {t} TO '{f}' (FORMAT PARQUET)"))
            files.append(f)
        return files
