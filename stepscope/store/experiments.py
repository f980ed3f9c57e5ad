"""The experiments table (``optim_runner.experiment``): progress of a search over fixes.

An experiment outlives no single run: its process launches many. It is written by
that process only and polled by the dashboard, so progress goes through here.
A part of ``RunStore`` (see ``store.py``): the methods here use the store's one
connection and are called on the store itself.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from typing import Any

from stepscope.store.liveness import vanished

_EXPERIMENT_JSON = ("config", "progress", "result")
_EXPERIMENT_COLUMNS = frozenset(
    ("status", "error", "ended_at", "pid", "pid_started_at", *_EXPERIMENT_JSON)
)


class ExperimentNotFound(LookupError):
    """No experiment with that id."""


class ExperimentsTable:
    """Experiments: created, updated and finished by their own process."""

    _conn: sqlite3.Connection

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
        for row in vanished(self._conn, "experiments"):
            with self._conn:
                self._conn.execute(
                    "UPDATE experiments SET status='failed', ended_at=?,"
                    " error=COALESCE(error, 'the experiment process vanished (killed?)')"
                    " WHERE id=? AND status='running'",
                    (time.time(), row["id"]),
                )
            changed += 1
        return changed


def _decode_experiment(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for key in _EXPERIMENT_JSON:
        out[key] = json.loads(out[key]) if out[key] else {}
    return out
