"""The runs table: a run's row, its folder, its lifecycle, and finding a run by name.

A part of ``RunStore`` (see ``store.py``): the methods here use the store's one
connection and are called on the store itself.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.store.liveness import vanished

if TYPE_CHECKING:
    import pandas as pd

_JSON_COLUMNS = ("command", "env", "device", "config", "facts")


class RunNotFound(LookupError):
    """No run matches what the user typed."""


class RunsTable:
    """Runs: created by the launcher, updated by the job and finalised by the launcher."""

    home: Path
    db_path: Path
    _conn: sqlite3.Connection

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
        for row in vanished(self._conn, "runs"):
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

    def runs(self) -> pd.DataFrame:
        """All runs, newest first, with their step counts."""
        # local: pandas costs ~1 s and ~50 MB, and the writer opens the store inside
        # every process of the user's job
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


def _default_name(command: list[str]) -> str:
    """A readable default: the script or module the command runs."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command):
            return command[i + 1]
        if arg.endswith(".py"):
            return Path(arg).stem
    return Path(command[0]).name if command else "run"


def _decode_json(df: pd.DataFrame) -> pd.DataFrame:
    for col in _JSON_COLUMNS:
        if col in df:
            df[col] = df[col].map(lambda s: json.loads(s) if s else {})
    return df
