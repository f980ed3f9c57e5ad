"""The runs table: a run's row, its folder, its lifecycle, and finding a run by name.

A part of ``RunStore`` (see ``store.py``): the methods here use the store's database
(``db.py``) and are called on the store itself.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.store.db import q
from stepscope.store.identity import current_user
from stepscope.store.liveness import lost_runs
from stepscope.store.signing import sign, signed_values
from stepscope.store.tags import tagged_run
from stepscope.store.url import redacted
from stepscope.store.user_key import KeyFileError

if TYPE_CHECKING:
    import pandas as pd

    from stepscope.store.db import Connection, Db

_JSON_COLUMNS = ("command", "env", "device", "config", "facts")
#: the columns of ``run_list``: what the runs list and the pickers read
LIST_COLUMNS = (
    "id", "name", "command", "status", "exit_code", "error", "stop_reason", "started_at",
    "ended_at", "host", "user", "parent_run_id",
)  # fmt: skip


class RunNotFound(LookupError):
    """No run matches what the user typed."""


class RunsTable:
    """Runs: created by the launcher, updated by the job and finalised by the launcher."""

    home: Path
    location: str
    _db: Db

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
        run_group: str | None = None,
    ) -> int:
        """Insert a run in status ``running`` and create its folder; returns its id.

        ``run_group`` ties the launchers of one multi-node job to one run (see
        ``join_or_create_run``); at most one running run per group can exist.
        """
        cmd = list(command)
        row = {
            "name": name or _default_name(cmd),
            "command": cmd,
            "cwd": cwd or os.getcwd(),
            "status": status,
            "started_at": time.time(),
            "host": socket.gethostname(),
            "pid": pid,
            "pid_started_at": pid_started_at,
            "max_steps": max_steps,
            "env": env or {},
            "config": config or {},
            "parent_run_id": parent_run_id,
            "user": current_user(),
            "run_group": run_group,
        }
        unsigned: str | None = None
        with self._db.begin() as conn:
            run_id = int(
                q(
                    conn,
                    "INSERT INTO runs(name, command, cwd, status, started_at, host, pid,"
                    ' pid_started_at, max_steps, env, config, parent_run_id, "user", run_group)'
                    " VALUES (:name, :command, :cwd, :status, :started_at, :host, :pid,"
                    " :pid_started_at, :max_steps, :env, :config, :parent_run_id, :user,"
                    " :run_group) RETURNING id",
                    {k: json.dumps(v) if k in _JSON_COLUMNS else v for k, v in row.items()},
                ).scalar_one()
            )
            try:  # in the same transaction: no reader ever sees the row unsigned
                signature = sign(run_id, signed_values({**row, "id": run_id}))
            except KeyFileError as exc:
                unsigned = str(exc)
            else:
                q(conn, "UPDATE runs SET signature=:s WHERE id=:id", {"s": signature, "id": run_id})
        if unsigned is not None:  # recorded all the same: only its replay is refused
            self.log_event(run_id, "warning", "store", f"run not signed: {unsigned}")
        self.run_dir(run_id)
        return run_id

    def update_run(self, run_id: int, *, conn: Connection | None = None, **fields: Any) -> None:
        """Set columns of a run; JSON columns accept dicts/lists. ``conn``: a transaction
        already open that the change joins (the writer's flush)."""
        if not fields:
            return
        cols, vals = [], {"id": run_id}
        for i, (key, value) in enumerate(fields.items()):
            if key in _JSON_COLUMNS and not isinstance(value, str):
                value = json.dumps(value)
            cols.append(f'"{key}"=:v{i}')
            vals[f"v{i}"] = value
        with self._db.within(conn) as c:
            q(c, f"UPDATE runs SET {', '.join(cols)} WHERE id=:id", vals)

    def merge_run_json(
        self,
        run_id: int,
        column: str,
        values: dict[str, Any],
        appended: Sequence[str] = (),
        *,
        conn: Connection | None = None,
    ) -> None:
        """Merge keys into a JSON column (each rank adds what it learned about its device).

        The lists under ``appended`` keys grow instead of being replaced: several processes
        of one job (ranks, or a helper that imports torch, such as inductor's compile
        workers) each add their own items, and none erases another's.
        """
        if column not in _JSON_COLUMNS:
            raise ValueError(f"{column} is not a JSON column")
        with self._db.within(conn) as conn:
            lock_run(conn, run_id)  # ranks merge at once: read and write under one lock
            text = q(conn, f"SELECT {column} FROM runs WHERE id=:id", {"id": run_id}).scalar()
            current = json.loads(text) if text else {}
            for key, value in values.items():
                old = current.get(key)
                if key in appended and isinstance(old, list):
                    current[key] = old + list(value)
                else:
                    current[key] = value
            q(
                conn,
                f"UPDATE runs SET {column}=:v WHERE id=:id",
                {"v": json.dumps(current), "id": run_id},
            )

    def finish_run(
        self,
        run_id: int,
        status: str,
        exit_code: int | None = None,
        error: str | None = None,
    ) -> None:
        """Move a run to a final status; an error already recorded by the job is kept."""
        self._db.execute(
            "UPDATE runs SET status=:status, exit_code=:exit_code, error=COALESCE(:error, error),"
            " ended_at=:t WHERE id=:id",
            {
                "status": status,
                "exit_code": exit_code,
                "error": error,
                "t": time.time(),
                "id": run_id,
            },
        )

    def reconcile(self) -> int:
        """Mark runs whose launcher is gone as ``lost``; returns how many changed.

        A launcher killed with SIGKILL cannot finalise its run, so every read checks
        liveness instead of trusting ``status='running'`` forever. Only processes on
        this host can be checked: a run of another host (a shared store) is left alone,
        and a run with members is lost only when none of them is running anywhere.
        """
        changed = 0
        for run_id in lost_runs(self._db):
            with self._db.begin() as conn:
                last = q(
                    conn, "SELECT MAX(end_s) FROM steps WHERE run_id=:id", {"id": run_id}
                ).scalar()
                n = q(
                    conn,
                    "UPDATE runs SET status='lost', ended_at=COALESCE(:last, started_at),"
                    " error=COALESCE(error, 'the launcher vanished (killed?) before finalising')"
                    " WHERE id=:id AND status='running'",
                    {"last": last, "id": run_id},
                ).rowcount
            changed += n
        return changed

    def runs(self) -> pd.DataFrame:
        """All runs, newest first, with their step counts."""
        self.reconcile()
        df = self._db.frame(
            "SELECT r.*, (SELECT COUNT(*) FROM steps s WHERE s.run_id=r.id) AS steps"
            " FROM runs r ORDER BY r.id DESC"
        )
        return _decode_json(df)

    def run_list(self, *extra: str) -> pd.DataFrame:
        """All runs, newest first, with their step counts and the columns a list of runs
        reads (``LIST_COLUMNS``, and the columns ``extra`` names): ``runs()`` without the
        JSON of each run's environment, device, facts and config, whose decoding was most
        of its time on a store of 10,000 runs."""
        self.reconcile()
        return _decode_json(self._db.frame(_list_sql(extra)))

    def run_rows(self, *extra: str, limit: int | None = None) -> list[dict[str, Any]]:
        """``run_list()`` as one dict per run (SQL NULL is None), the newest ``limit``
        only if given, for the callers that need no frame: `stepscope runs` answers
        without importing pandas (0.6 s)."""
        self.reconcile()
        sql = _list_sql(extra)
        rows = self._db.rows(sql if limit is None else f"{sql} LIMIT {int(limit)}")
        for row in rows:
            for col in _JSON_COLUMNS:
                if col in row:
                    row[col] = json.loads(row[col]) if row[col] else {}
            if "env" in row:
                row["env"] = _without_password(row["env"])
        return rows

    def run_count(self) -> int:
        """How many runs the store holds."""
        return int(self._db.scalar("SELECT COUNT(*) FROM runs"))

    def run(self, run_id: int) -> dict[str, Any]:
        self.reconcile()
        out = self._db.row("SELECT * FROM runs WHERE id=:id", id=run_id)
        if out is None:
            raise RunNotFound(f"no run with id {run_id}")
        for key in _JSON_COLUMNS:
            out[key] = json.loads(out[key]) if out[key] else {}
        out["env"] = _without_password(out["env"])
        return out

    def resolve_run(self, ref: str | int) -> int:
        """Turn what a user typed (an id, 'last', a tag or a name) into a run id.

        A tag comes before a name: it was set to mean one run (``stepscope tag``), where
        a name means the newest of the runs that share it. Tag names cannot look like an
        id or 'last' (``tags.check_tag_name``), so the order is only ever tag over name.
        """
        text = str(ref).strip()
        if text in ("last", "latest"):
            last = self._db.scalar("SELECT MAX(id) FROM runs")
            if last is None:
                raise RunNotFound("the store has no runs yet")
            return int(last)
        if text.isdigit() and self._db.scalar("SELECT 1 FROM runs WHERE id=:id", id=int(text)):
            return int(text)
        with self._db.connect() as conn:
            tagged = tagged_run(conn, text)
        if tagged is not None:
            return tagged
        found = self._db.scalar(
            "SELECT id FROM runs WHERE name=:name ORDER BY id DESC LIMIT 1", name=text
        )
        if found is not None:
            return int(found)
        raise RunNotFound(f"no run with id or name {text!r}, nor a tag, in {self.location}")


def lock_run(conn: Connection, run_id: int) -> None:
    """Take the run's row lock (PostgreSQL) or the write lock (SQLite) before a
    read-modify-write, so that two processes finalising or merging at once serialise.
    A no-op UPDATE is the one statement both backends lock on."""
    q(conn, "UPDATE runs SET status=status WHERE id=:id", {"id": run_id})


def _default_name(command: list[str]) -> str:
    """A readable default: the script or module the command runs."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command):
            return command[i + 1]
        if arg.endswith(".py"):
            return Path(arg).stem
    return Path(command[0]).name if command else "run"


def _list_sql(extra: Sequence[str]) -> str:
    """The query of ``run_list`` and ``run_rows``: LIST_COLUMNS, ``extra``, step counts."""
    columns = ", ".join(f'r."{c}"' for c in (*LIST_COLUMNS, *extra))
    return (
        f"SELECT {columns}, (SELECT COUNT(*) FROM steps s WHERE s.run_id=r.id) AS steps"
        " FROM runs r ORDER BY r.id DESC"
    )


def _decode_json(df: pd.DataFrame) -> pd.DataFrame:
    for col in _JSON_COLUMNS:
        if col in df:
            df[col] = df[col].map(lambda s: json.loads(s) if s else {})
    if "env" in df:
        df["env"] = df["env"].map(_without_password)
    return df


def _without_password(env: Any) -> Any:
    """A run's ``env`` as shown: a store URL recorded before passwords were hidden
    everywhere (a raw ``/`` in one) is hidden when read."""
    if isinstance(env, dict) and isinstance(env.get("store"), str):
        return {**env, "store": redacted(env["store"])}
    return env
