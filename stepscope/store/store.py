"""The one read/write API of the run store.

Every stage goes through this module rather than writing SQL of its own, so that the
schema can change in one place. Reads return pandas DataFrames (or plain dicts for one
row); writes are small transactions so that a job killed at any moment loses at most
what its writer had buffered.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.store.schema import DDL, MIGRATIONS, SCHEMA_VERSION
from stepscope.types import Finding

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported inside the read functions only: the writer runs inside every
# process of the user's job, where importing pandas would cost ~1 s and ~50 MB each.

_JSON_COLUMNS = ("command", "env", "device", "config", "facts")
BUSY_TIMEOUT_MS = 10_000


class StoreError(RuntimeError):
    """The store cannot be opened or read: locked, corrupt, or from a newer stepscope."""


class RunNotFound(LookupError):
    """No run matches what the user typed."""


class ExperimentNotFound(LookupError):
    """No experiment with that id."""


def default_home() -> Path:
    return Path(os.environ.get("STEPSCOPE_HOME") or Path.home() / ".stepscope").expanduser()


class RunStore:
    """Handle on one store directory: ``stepscope.db`` plus ``runs/<id>/`` folders.

    A RunStore holds one sqlite3 connection and is meant for one thread, unless
    ``threadsafe`` (the caller then serialises use itself, as the writer does).
    """

    def __init__(
        self, home: str | os.PathLike[str] | None = None, *, threadsafe: bool = False
    ) -> None:
        self.home = Path(home).expanduser() if home is not None else default_home()
        self.db_path = self.home / "stepscope.db"
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                self.db_path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=not threadsafe
            )
            self._conn.row_factory = sqlite3.Row
            self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.db_path}: cannot open the run store ({exc})") from exc

    # -- lifecycle ---------------------------------------------------------------
    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self._conn:
            self._conn.executescript(DDL)
            row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.db_path}: schema version {version} is newer than this stepscope "
                    f"understands ({SCHEMA_VERSION}); upgrade stepscope"
                )
            # A new database (version 0) was just created at the latest schema by the DDL.
            for v in range(version + 1 if version else SCHEMA_VERSION + 1, SCHEMA_VERSION + 1):
                self._conn.executescript(MIGRATIONS[v])
            self._conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )

    # -- runs ----------------------------------------------------------------------
    def run_dir(self, run_id: int) -> Path:
        """Folder for a run's artifacts (traces, snapshots, control files)."""
        path = self.home / "runs" / str(run_id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def create_run(
        self,
        command: Sequence[str],
        *,
        name: str | None = None,
        cwd: str | None = None,
        pid: int | None = None,
        pid_started_at: float | None = None,
        max_steps: int | None = None,
        env: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        parent_run_id: int | None = None,
        status: str = "running",
    ) -> int:
        """Insert a run in status ``running`` and create its folder; returns its id."""
        cmd = list(command)
        with self._conn:
            cur = self._conn.execute(
                "INSERT INTO runs(name, command, cwd, status, started_at, host, pid, pid_started_at,"
                " max_steps, env, config, parent_run_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    name or _default_name(cmd),
                    json.dumps(cmd),
                    cwd or os.getcwd(),
                    status,
                    time.time(),
                    socket.gethostname(),
                    pid,
                    pid_started_at,
                    max_steps,
                    json.dumps(env or {}),
                    json.dumps(config or {}),
                    parent_run_id,
                ),
            )
        run_id = int(cur.lastrowid)
        self.run_dir(run_id)
        return run_id

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set columns of a run; JSON columns accept dicts/lists."""
        if not fields:
            return
        cols, vals = [], []
        for key, value in fields.items():
            if key in _JSON_COLUMNS and not isinstance(value, str):
                value = json.dumps(value)
            cols.append(f"{key}=?")
            vals.append(value)
        with self._conn:
            self._conn.execute(f"UPDATE runs SET {', '.join(cols)} WHERE id=?", (*vals, run_id))

    def merge_run_json(self, run_id: int, column: str, values: dict[str, Any]) -> None:
        """Merge keys into a JSON column (each rank adds what it learned about its device)."""
        if column not in _JSON_COLUMNS:
            raise ValueError(f"{column} is not a JSON column")
        with self._conn:
            row = self._conn.execute(f"SELECT {column} FROM runs WHERE id=?", (run_id,)).fetchone()
            current = json.loads(row[0]) if row and row[0] else {}
            current.update(values)
            self._conn.execute(
                f"UPDATE runs SET {column}=? WHERE id=?", (json.dumps(current), run_id)
            )

    def finish_run(
        self,
        run_id: int,
        status: str,
        exit_code: int | None = None,
        error: str | None = None,
    ) -> None:
        """Move a run to a final status; an error already recorded by the job is kept."""
        with self._conn:
            self._conn.execute(
                "UPDATE runs SET status=?, exit_code=?, error=COALESCE(?, error), ended_at=?"
                " WHERE id=?",
                (status, exit_code, error, time.time(), run_id),
            )

    def reconcile(self) -> int:
        """Mark runs whose launcher is gone as ``lost``; returns how many changed.

        A launcher killed with SIGKILL cannot finalise its run, so every read checks
        liveness instead of trusting ``status='running'`` forever.
        """
        changed = 0
        for row in self._vanished("runs"):
            last = self._conn.execute(
                "SELECT MAX(end_s) FROM steps WHERE run_id=?", (row["id"],)
            ).fetchone()[0]
            with self._conn:
                self._conn.execute(
                    "UPDATE runs SET status='lost', ended_at=COALESCE(?, started_at),"
                    " error=COALESCE(error, 'the launcher vanished (killed?) before finalising')"
                    " WHERE id=? AND status='running'",
                    (last, row["id"]),
                )
            changed += 1
        return changed

    def _vanished(self, table: str) -> list[sqlite3.Row]:
        """Rows of ``table`` still 'running' whose process on this host is gone."""
        import psutil

        host = socket.gethostname()
        rows = self._conn.execute(
            f"SELECT id, pid, pid_started_at, host FROM {table} WHERE status='running'"
        ).fetchall()
        return [
            row
            for row in rows
            if row["host"] == host
            and row["pid"] is not None
            and not _process_alive(row["pid"], row["pid_started_at"], psutil)
        ]

    def runs(self) -> pd.DataFrame:
        """All runs, newest first, with their step counts."""
        import pandas as pd

        self.reconcile()
        df = pd.read_sql_query(
            "SELECT r.*, (SELECT COUNT(*) FROM steps s WHERE s.run_id=r.id) AS steps"
            " FROM runs r ORDER BY r.id DESC",
            self._conn,
        )
        return _decode_json(df)

    def run(self, run_id: int) -> dict[str, Any]:
        self.reconcile()
        row = self._conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        out = dict(row)
        for key in _JSON_COLUMNS:
            out[key] = json.loads(out[key]) if out[key] else {}
        return out

    def resolve_run(self, ref: str | int) -> int:
        """Turn what a user typed (an id, a name, or 'last') into a run id."""
        text = str(ref).strip()
        if text in ("last", "latest"):
            row = self._conn.execute("SELECT MAX(id) FROM runs").fetchone()
            if row[0] is None:
                raise RunNotFound("the store has no runs yet")
            return int(row[0])
        if (
            text.isdigit()
            and self._conn.execute("SELECT 1 FROM runs WHERE id=?", (int(text),)).fetchone()
        ):
            return int(text)
        rows = self._conn.execute(
            "SELECT id FROM runs WHERE name=? ORDER BY id DESC", (text,)
        ).fetchall()
        if rows:
            return int(rows[0][0])
        raise RunNotFound(f"no run with id or name {text!r} in {self.db_path}")

    # -- steps, samples, artifacts, events -----------------------------------------
    def add_steps(self, run_id: int, rows: Iterable[dict[str, Any]]) -> None:
        """Insert (or replace: a late CUDA-event resolution) step rows."""
        data = [
            (
                run_id,
                r.get("rank", 0),
                r["step"],
                r["start_s"],
                r["end_s"],
                r.get("data_wait_s", 0.0),
                r.get("device_s"),
                r.get("batch_size"),
                r.get("loss"),
                r.get("kind", "optimizer"),
                int(bool(r.get("profiled", False))),
            )
            for r in rows
        ]
        if not data:
            return
        with self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO steps(run_id, rank, step, start_s, end_s, data_wait_s,"
                " device_s, batch_size, loss, kind, profiled) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                data,
            )

    def delete_steps(self, run_id: int, rank: int, from_step: int) -> None:
        """Remove a rank's steps from ``from_step`` on (hook steps superseded by marks)."""
        with self._conn:
            self._conn.execute(
                "DELETE FROM steps WHERE run_id=? AND rank=? AND step>=?", (run_id, rank, from_step)
            )

    def add_samples(
        self, run_id: int, rows: Iterable[tuple[float, str, str, float | None]]
    ) -> None:
        """Insert (t, scope, metric, value) samples."""
        data = [(run_id, t, scope, metric, value) for t, scope, metric, value in rows]
        if not data:
            return
        with self._conn:
            self._conn.executemany(
                "INSERT INTO samples(run_id, t, scope, metric, value) VALUES (?,?,?,?,?)", data
            )

    def add_stack_samples(
        self,
        run_id: int,
        t_start: float,
        t_end: float,
        rows: Iterable[tuple[int, int, str, str, int]],
    ) -> int:
        """One sampling window's (pid, tid, thread, frames, samples); returns samples added."""
        rows = list(rows)
        if not rows:
            return 0
        with self._conn:
            self._conn.executemany(
                "INSERT OR IGNORE INTO stacks(run_id, frames) VALUES (?, ?)",
                [(run_id, frames) for _, _, _, frames, _ in rows],
            )
            self._conn.executemany(
                "INSERT INTO stack_samples(run_id, t_start, t_end, pid, tid, thread, stack_id,"
                " samples) SELECT ?, ?, ?, ?, ?, ?, id, ? FROM stacks"
                " WHERE run_id = ? AND frames = ?",
                [
                    (run_id, t_start, t_end, pid, tid, thread, n, run_id, frames)
                    for pid, tid, thread, frames, n in rows
                ],
            )
        return sum(n for *_, n in rows)

    def stack_samples(self, run_id: int) -> pd.DataFrame:
        """The run's stack samples, one row per window, thread and distinct stack."""
        import pandas as pd

        return pd.read_sql_query(
            "SELECT s.t_start, s.t_end, s.pid, s.tid, s.thread, k.frames, s.samples"
            " FROM stack_samples s JOIN stacks k ON k.id = s.stack_id"
            " WHERE s.run_id = ? ORDER BY s.t_start, s.pid, s.tid",
            self._conn,
            params=(run_id,),
        )

    def add_artifact(
        self,
        run_id: int,
        kind: str,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        with self._conn:
            self._conn.execute(
                "INSERT INTO artifacts(run_id, kind, path, rank, created_at, meta)"
                " VALUES (?,?,?,?,?,?)",
                (run_id, kind, str(path), rank, time.time(), json.dumps(meta or {})),
            )

    def log_event(
        self,
        run_id: int,
        level: str,
        source: str,
        message: str,
        *,
        rank: int | None = None,
        t: float | None = None,
    ) -> None:
        """Append to the run's log: collectors say here when they disable themselves."""
        with self._conn:
            self._conn.execute(
                "INSERT INTO events(run_id, t, rank, level, source, message) VALUES (?,?,?,?,?,?)",
                (run_id, t if t is not None else time.time(), rank, level, source, message),
            )

    def steps(self, run_id: int) -> pd.DataFrame:
        import pandas as pd

        return pd.read_sql_query(
            "SELECT * FROM steps WHERE run_id=? ORDER BY rank, step", self._conn, params=(run_id,)
        )

    def samples(self, run_id: int, wide: bool = False) -> pd.DataFrame:
        """Samples in long form (t, scope, metric, value), or wide: one column per scope.metric."""
        import pandas as pd

        df = pd.read_sql_query(
            "SELECT t, scope, metric, value FROM samples WHERE run_id=? ORDER BY t",
            self._conn,
            params=(run_id,),
        )
        if not wide or df.empty:
            return df
        df["column"] = df["scope"] + "." + df["metric"]
        return df.pivot_table(index="t", columns="column", values="value", aggfunc="last")

    def artifacts(self, run_id: int) -> pd.DataFrame:
        import pandas as pd

        df = pd.read_sql_query(
            "SELECT * FROM artifacts WHERE run_id=? ORDER BY id", self._conn, params=(run_id,)
        )
        df["meta"] = df["meta"].map(json.loads)
        return df

    def events(self, run_id: int) -> pd.DataFrame:
        import pandas as pd

        return pd.read_sql_query(
            "SELECT * FROM events WHERE run_id=? ORDER BY t", self._conn, params=(run_id,)
        )

    # -- findings ----------------------------------------------------------------------
    def save_findings(self, run_id: int, findings: Sequence[Finding]) -> None:
        """Replace the run's findings (each with its ``level``: the evidence it rests on)."""
        now = time.time()
        rows = [
            (
                run_id,
                i,
                f.klass.value,
                f.subtype,
                f.title,
                None if f.share is None else round(f.share, 4),
                round(float(f.confidence), 2),
                f.level or "none",
                json.dumps([e.to_json() for e in f.evidence]),
                json.dumps([x.to_json() for x in f.fixes]),
                now,
            )
            for i, f in enumerate(findings)
        ]
        with self._conn:
            self._conn.execute("DELETE FROM findings WHERE run_id=?", (run_id,))
            self._conn.executemany(
                "INSERT INTO findings(run_id, position, class, subtype, title, share, confidence,"
                " level, evidence, fixes, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                rows,
            )

    def findings(self, run_id: int) -> list[Finding]:
        """The run's findings, most costly first; [] when it was never diagnosed."""
        rows = self._conn.execute(
            "SELECT * FROM findings WHERE run_id=? ORDER BY position", (run_id,)
        ).fetchall()
        return [_finding(row) for row in rows]

    def top_findings(self) -> dict[int, Finding]:
        """run id -> its first finding: the runs table."""
        rows = self._conn.execute("SELECT * FROM findings WHERE position=0").fetchall()
        return {int(r["run_id"]): _finding(r) for r in rows}

    # -- experiments (optim_runner.experiment) -------------------------------------------
    # An experiment outlives no single run: its process launches many. It is written by
    # that process only and polled by the dashboard, so progress goes through here.

    def create_experiment(
        self,
        baseline_run_id: int,
        config: dict[str, Any] | None = None,
        *,
        pid: int | None = None,
        pid_started_at: float | None = None,
    ) -> int:
        """Insert an experiment in status ``running``; returns its id."""
        with self._conn:
            cur = self._conn.execute(
                "INSERT INTO experiments(baseline_run_id, status, created_at, host, pid,"
                " pid_started_at, config) VALUES (?, 'running', ?, ?, ?, ?, ?)",
                (
                    baseline_run_id,
                    time.time(),
                    socket.gethostname(),
                    pid,
                    pid_started_at,
                    json.dumps(config or {}),
                ),
            )
        return int(cur.lastrowid)

    def update_experiment(self, experiment_id: int, **fields: Any) -> None:
        """Set columns of an experiment; config/progress/result accept dicts."""
        if not fields:
            return
        cols, vals = [], []
        for key, value in fields.items():
            if key not in _EXPERIMENT_COLUMNS:
                raise ValueError(f"{key} is not a column of experiments")
            if key in _EXPERIMENT_JSON and not isinstance(value, str):
                value = json.dumps(value)
            cols.append(f"{key}=?")
            vals.append(value)
        with self._conn:
            self._conn.execute(
                f"UPDATE experiments SET {', '.join(cols)} WHERE id=?", (*vals, experiment_id)
            )

    def experiment(self, experiment_id: int) -> dict[str, Any]:
        """One experiment with its JSON columns decoded; ExperimentNotFound when none."""
        self.reconcile_experiments()
        row = self._conn.execute(
            "SELECT * FROM experiments WHERE id=?", (experiment_id,)
        ).fetchone()
        if row is None:
            raise ExperimentNotFound(f"no experiment with id {experiment_id}")
        return _decode_experiment(row)

    def experiments(self, baseline_run_id: int | None = None) -> list[dict[str, Any]]:
        """All experiments (or those of one baseline run), newest first."""
        self.reconcile_experiments()
        if baseline_run_id is None:
            rows = self._conn.execute("SELECT * FROM experiments ORDER BY id DESC").fetchall()
        else:
            rows = self._conn.execute(
                "SELECT * FROM experiments WHERE baseline_run_id=? ORDER BY id DESC",
                (baseline_run_id,),
            ).fetchall()
        return [_decode_experiment(r) for r in rows]

    def reconcile_experiments(self) -> int:
        """Fail running experiments whose process is gone; returns how many changed.

        Same reasoning as ``reconcile``: a killed process cannot say it stopped, and a
        dashboard polling its progress would otherwise wait forever.
        """
        changed = 0
        for row in self._vanished("experiments"):
            with self._conn:
                self._conn.execute(
                    "UPDATE experiments SET status='failed', ended_at=?,"
                    " error=COALESCE(error, 'the experiment process vanished (killed?)')"
                    " WHERE id=? AND status='running'",
                    (time.time(), row["id"]),
                )
            changed += 1
        return changed


_EXPERIMENT_JSON = ("config", "progress", "result")
_EXPERIMENT_COLUMNS = frozenset(
    ("status", "error", "ended_at", "pid", "pid_started_at", *_EXPERIMENT_JSON)
)


def _decode_experiment(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for key in _EXPERIMENT_JSON:
        out[key] = json.loads(out[key]) if out[key] else {}
    return out


def _default_name(command: list[str]) -> str:
    """A readable default: the script or module the command runs."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command):
            return command[i + 1]
        if arg.endswith(".py"):
            return Path(arg).stem
    return Path(command[0]).name if command else "run"


def _process_alive(pid: int, started_at: float | None, psutil: Any) -> bool:
    try:
        proc = psutil.Process(pid)
        if started_at is not None and abs(proc.create_time() - started_at) > 1.0:
            return False  # the pid was reused by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True  # it exists, it is just not ours to inspect
    except psutil.NoSuchProcess:
        return False


def _decode_json(df: pd.DataFrame) -> pd.DataFrame:
    for col in _JSON_COLUMNS:
        if col in df:
            df[col] = df[col].map(lambda s: json.loads(s) if s else {})
    return df


def _finding(row: Any) -> Finding:
    d = dict(row)
    d["evidence"] = json.loads(d["evidence"])
    d["fixes"] = json.loads(d["fixes"])
    return Finding.from_json(d)
