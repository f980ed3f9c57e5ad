"""What the collectors record while a run goes: steps, samples, stacks, artifacts, its log.

A part of ``RunStore`` (see ``store.py``): the methods here use the store's one
connection and are called on the store itself. Writes come from inside the job (the
BufferedWriter's thread), from the system sampler and from ``stepscope attach``; the
reads return pandas DataFrames for the analyzers and the dashboard.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported inside the read functions only: the writer runs inside every
# process of the user's job, where importing pandas would cost ~1 s and ~50 MB each.


class RunRecords:
    """Steps, samples, stack samples, artifacts and events of a run."""

    _conn: sqlite3.Connection

    def add_steps(self, run_id: int, rows: Iterable[dict[str, Any]]) -> None:
        """Insert (or replace: a late CUDA-event resolution) step rows.

        The phase columns (``forward_s``, ``backward_s``, ``optimizer_s``) are NULL when a
        row does not have them (an attached process's steps): unknown, not zero.
        """
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
                r.get("forward_s"),
                r.get("backward_s"),
                r.get("optimizer_s"),
            )
            for r in rows
        ]
        if not data:
            return
        with self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO steps(run_id, rank, step, start_s, end_s, data_wait_s,"
                " device_s, batch_size, loss, kind, profiled, forward_s, backward_s,"
                " optimizer_s) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
        import pandas as pd  # local: see the note on pandas at the top

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
        """Every column of the run's steps, phases included (NULL: not recorded)."""
        import pandas as pd  # local: see the note on pandas at the top

        return pd.read_sql_query(
            "SELECT * FROM steps WHERE run_id=? ORDER BY rank, step", self._conn, params=(run_id,)
        )

    def samples(self, run_id: int, wide: bool = False) -> pd.DataFrame:
        """Samples in long form (t, scope, metric, value), or wide: one column per scope.metric."""
        import pandas as pd  # local: see the note on pandas at the top

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
        import pandas as pd  # local: see the note on pandas at the top

        df = pd.read_sql_query(
            "SELECT * FROM artifacts WHERE run_id=? ORDER BY id", self._conn, params=(run_id,)
        )
        df["meta"] = df["meta"].map(json.loads)
        return df

    def events(self, run_id: int) -> pd.DataFrame:
        import pandas as pd  # local: see the note on pandas at the top

        return pd.read_sql_query(
            "SELECT * FROM events WHERE run_id=? ORDER BY t", self._conn, params=(run_id,)
        )
