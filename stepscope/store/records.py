"""What the collectors record while a run goes: steps, samples, stacks, artifacts, its log.

A part of ``RunStore`` (see ``store.py``): the methods here use the store's database
(``db.py``) and are called on the store itself. Writes come from inside the job (the
BufferedWriter's thread), from the system sampler and from ``stepscope attach``; the
reads return pandas DataFrames for the analyzers and the dashboard.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from stepscope.store.db import q

if TYPE_CHECKING:
    import pandas as pd

    from stepscope.store.db import Connection, Db

_STEP_COLUMNS = (
    "run_id", "rank", "worker", "step", "start_s", "end_s", "data_wait_s", "device_s", "batch_size",
    "loss", "kind", "profiled", "forward_s", "backward_s", "optimizer_s",
)  # fmt: skip
# A step written again (a late CUDA-event resolution) replaces the earlier row.
_INSERT_STEPS = (
    f"INSERT INTO steps({', '.join(_STEP_COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in _STEP_COLUMNS)})"
    " ON CONFLICT(run_id, rank, worker, step) DO UPDATE SET "
    + ", ".join(f"{c}=excluded.{c}" for c in _STEP_COLUMNS[4:])
)
# Samples, artifacts and events written twice (a retried flush whose commit went through
# but whose answer was lost) land once: each has a unique key (schema.INDEXES), and
# DO NOTHING, with no conflict target, serves expression keys on both backends.
_INSERT_SAMPLES = (
    "INSERT INTO samples(run_id, t, scope, metric, value, host) VALUES (?,?,?,?,?,?)"
    " ON CONFLICT DO NOTHING"
)

# Runs whose steps ``steps_of`` reads with one query: a list of ids within what both
# backends take in one statement, whatever their steps.
STEPS_OF_CHUNK = 500

# A run's artifacts and events: one query for the frame and for the plain rows.
_ARTIFACTS_SQL = "SELECT * FROM artifacts WHERE run_id=:run_id ORDER BY id"
_EVENTS_SQL = "SELECT * FROM events WHERE run_id=:run_id ORDER BY t"

# pandas is imported inside the read functions only: the writer runs inside every
# process of the user's job, where importing pandas would cost ~1 s and ~50 MB each.


class RunRecords:
    """Steps, samples, stack samples, artifacts and events of a run."""

    _db: Db

    def add_steps(
        self, run_id: int, rows: Iterable[dict[str, Any]], *, conn: Connection | None = None
    ) -> None:
        """Insert (or replace: a late CUDA-event resolution) step rows.

        The phase columns (``forward_s``, ``backward_s``, ``optimizer_s``) are NULL when a
        row does not have them (an attached process's steps): unknown, not zero.
        ``conn``, here and in the other writes: a transaction already open
        (``RunStore.transaction``) that the rows join.
        """
        data = [
            (
                run_id,
                r.get("rank", 0),
                r.get("worker", 0),
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
        ]  # in the order of _STEP_COLUMNS
        if not data:
            return
        self._db.executemany(_INSERT_STEPS, data, conn=conn)

    def delete_steps(
        self,
        run_id: int,
        rank: int,
        from_step: int,
        worker: int = 0,
        *,
        conn: Connection | None = None,
    ) -> None:
        """Remove a process's steps from ``from_step`` on (hook steps superseded by marks)."""
        self._db.execute(
            "DELETE FROM steps WHERE run_id=:run_id AND rank=:rank AND worker=:worker"
            " AND step>=:step",
            {"run_id": run_id, "rank": rank, "worker": worker, "step": from_step},
            conn=conn,
        )

    def add_samples(
        self,
        run_id: int,
        rows: Iterable[tuple[float, str, str, float | None]],
        host: str | None = None,
        *,
        conn: Connection | None = None,
    ) -> None:
        """Insert (t, scope, metric, value) samples; ``host``: where they were measured
        when not on the run's host (a node of a multi-node run). A sample already
        there (same time, scope, metric and host) is kept, not doubled."""
        data = [(run_id, t, scope, metric, value, host) for t, scope, metric, value in rows]
        if not data:
            return
        self._db.executemany(_INSERT_SAMPLES, data, conn=conn)

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
        with self._db.begin() as conn:
            q(
                conn,
                "INSERT INTO stacks(run_id, frames) VALUES (:run_id, :frames)"
                " ON CONFLICT(run_id, frames) DO NOTHING",
                [{"run_id": run_id, "frames": f} for f in {r[3] for r in rows}],
            )
            ids = dict(
                q(
                    conn, "SELECT frames, id FROM stacks WHERE run_id=:run_id", {"run_id": run_id}
                ).all()
            )
            q(
                conn,
                "INSERT INTO stack_samples(run_id, t_start, t_end, pid, tid, thread, stack_id,"
                " samples) VALUES (:run_id, :t_start, :t_end, :pid, :tid, :thread, :stack_id,"
                " :samples)",
                [
                    {"run_id": run_id, "t_start": t_start, "t_end": t_end, "pid": pid,
                     "tid": tid, "thread": thread, "stack_id": ids[frames], "samples": n}
                    for pid, tid, thread, frames, n in rows
                ],
            )  # fmt: skip
        return sum(n for *_, n in rows)

    def stack_samples(self, run_id: int) -> pd.DataFrame:
        """The run's stack samples, one row per window, thread and distinct stack."""
        return self._db.frame(
            "SELECT s.t_start, s.t_end, s.pid, s.tid, s.thread, k.frames, s.samples"
            " FROM stack_samples s JOIN stacks k ON k.id = s.stack_id"
            " WHERE s.run_id = :run_id ORDER BY s.t_start, s.pid, s.tid",
            run_id=run_id,
        )

    def add_artifact(
        self,
        run_id: int,
        kind: str,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        meta: dict[str, Any] | None = None,
        created_at: float | None = None,
        conn: Connection | None = None,
    ) -> None:
        """Record a file of the run. ``created_at``: when the collector made it (now by
        default); the writer stamps it when the row is added, so a retried row is the
        same row and lands once."""
        self._db.execute(
            "INSERT INTO artifacts(run_id, kind, path, rank, created_at, meta)"
            " VALUES (:run_id, :kind, :path, :rank, :t, :meta) ON CONFLICT DO NOTHING",
            {"run_id": run_id, "kind": kind, "path": str(path), "rank": rank,
             "t": created_at if created_at is not None else time.time(),
             "meta": json.dumps(meta or {})},
            conn=conn,
        )  # fmt: skip

    def log_event(
        self,
        run_id: int,
        level: str,
        source: str,
        message: str,
        *,
        rank: int | None = None,
        t: float | None = None,
        conn: Connection | None = None,
    ) -> None:
        """Append to the run's log: collectors say here when they disable themselves.
        The same line from the same rank and source at the same ``t`` is kept once."""
        self._db.execute(
            "INSERT INTO events(run_id, t, rank, level, source, message)"
            " VALUES (:run_id, :t, :rank, :level, :source, :message) ON CONFLICT DO NOTHING",
            {"run_id": run_id, "t": t if t is not None else time.time(), "rank": rank,
             "level": level, "source": source, "message": message},
            conn=conn,
        )  # fmt: skip

    def steps(self, run_id: int) -> pd.DataFrame:
        """Every column of the run's steps, phases included (NULL: not recorded)."""
        return self._db.frame(
            "SELECT * FROM steps WHERE run_id=:run_id ORDER BY rank, worker, step", run_id=run_id
        )

    def steps_of(self, run_ids: Iterable[int]) -> dict[int, pd.DataFrame]:
        """``steps(run_id)`` of each run, read with one query per ``STEPS_OF_CHUNK`` runs
        instead of one per run (the runs list computing the figures of thousands). Each
        frame is made from its rows the way ``read_sql_query`` makes ``steps``' (the rows
        as objects, each column's type inferred from its values), so the two are equal,
        dtypes included: a column NULL in every step of one run stays object there, as
        in ``steps``, where one frame of many runs would have made it float."""
        # local: pandas costs ~1 s and ~50 MB, and the writer opens the store inside
        # every process of the user's job
        import pandas as pd

        ids = sorted({int(i) for i in run_ids})
        grouped: dict[int, list[Any]] = {i: [] for i in ids}
        columns: list[str] = []
        with self._db.connect() as conn:
            for at in range(0, len(ids), STEPS_OF_CHUNK):
                chunk = ",".join(str(i) for i in ids[at : at + STEPS_OF_CHUNK])  # ints only
                result = conn.exec_driver_sql(
                    f"SELECT * FROM steps WHERE run_id IN ({chunk})"
                    " ORDER BY run_id, rank, worker, step"
                )
                columns = list(result.keys())
                at_id = columns.index("run_id")
                for row in result:
                    grouped[int(row[at_id])].append(tuple(row))
        if not columns:  # no run asked for
            return {}
        return {
            i: pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)
            for i, rows in grouped.items()
        }

    def step_count(self, run_id: int) -> tuple[int, int, int]:
        """(steps, ranks, workers) of the run: what the launcher's last line says, without
        pandas (importing it costs the launcher of every run a quarter of a second).
        ``workers``: the training processes multiprocessing started (worker > 0)."""
        row = self._db.row(
            "SELECT COUNT(*) AS n, COUNT(DISTINCT rank) AS ranks,"
            " COUNT(DISTINCT CASE WHEN worker > 0 THEN rank * 1000003 + worker END) AS workers"
            " FROM steps WHERE run_id=:run_id",
            run_id=run_id,
        )
        return (int(row["n"]), int(row["ranks"]), int(row["workers"])) if row else (0, 0, 0)

    def step_progress(self, run_id: int) -> tuple[int, bool]:
        """(steps, ending) for the launcher's poll: the steps recorded, and whether the job
        has said it is ending (its error or a stop reason is in its row), in one query."""
        row = self._db.row(
            "SELECT (SELECT COUNT(*) FROM steps WHERE run_id=:run_id) AS n,"
            " (SELECT COUNT(*) FROM runs WHERE id=:run_id"
            "  AND (error IS NOT NULL OR stop_reason IS NOT NULL)) AS ending",
            run_id=run_id,
        )
        return (int(row["n"]), bool(row["ending"])) if row else (0, False)

    def samples(self, run_id: int, wide: bool = False) -> pd.DataFrame:
        """Samples in long form (t, scope, metric, value, host), or wide: one column per
        scope.metric (host NULL: the run's host)."""
        df = self._db.frame(
            "SELECT t, scope, metric, value, host FROM samples WHERE run_id=:run_id ORDER BY t",
            run_id=run_id,
        )
        if not wide or df.empty:
            return df
        df["column"] = df["scope"] + "." + df["metric"]
        return df.pivot_table(index="t", columns="column", values="value", aggfunc="last")

    def artifacts(self, run_id: int) -> pd.DataFrame:
        df = self._db.frame(_ARTIFACTS_SQL, run_id=run_id)
        df["meta"] = df["meta"].map(json.loads)
        return df

    def artifact_rows(self, run_id: int) -> list[dict[str, Any]]:
        """``artifacts()`` as one dict per artifact (SQL NULL is None): `stepscope show`
        lists them without importing pandas."""
        rows = self._db.rows(_ARTIFACTS_SQL, run_id=run_id)
        for row in rows:
            row["meta"] = json.loads(row["meta"])
        return rows

    def events(self, run_id: int) -> pd.DataFrame:
        return self._db.frame(_EVENTS_SQL, run_id=run_id)

    def event_rows(self, run_id: int) -> list[dict[str, Any]]:
        """``events()`` as one dict per event (SQL NULL is None), for `show` (no pandas)."""
        return self._db.rows(_EVENTS_SQL, run_id=run_id)
