"""The experiments table (``optim_runner.experiment.experiment``): progress of a search over fixes.

An experiment outlives no single run: its process launches many. It is written by
that process only and polled by the dashboard, so progress goes through here.
A part of ``RunStore`` (see ``store.py``): the methods here use the store's database
(``db.py``) and are called on the store itself.
"""

from __future__ import annotations

import json
import socket
import time
from typing import TYPE_CHECKING, Any

from stepscope.store.db import q
from stepscope.store.liveness import vanished

if TYPE_CHECKING:
    from stepscope.store.db import Db

_EXPERIMENT_JSON = ("config", "progress", "result")
_EXPERIMENT_COLUMNS = frozenset(
    ("status", "error", "ended_at", "pid", "pid_started_at", *_EXPERIMENT_JSON)
)


class ExperimentNotFound(LookupError):
    """No experiment with that id."""


class ExperimentsTable:
    """Experiments: created, updated and finished by their own process."""

    _db: Db

    def create_experiment(
        self,
        baseline_run_id: int,
        config: dict[str, Any] | None = None,
        *,
        pid: int | None = None,
        pid_started_at: float | None = None,
    ) -> int:
        """Insert an experiment in status ``running``; returns its id."""
        with self._db.begin() as conn:
            new_id = q(
                conn,
                "INSERT INTO experiments(baseline_run_id, status, created_at, host, pid,"
                " pid_started_at, config) VALUES (:baseline, 'running', :t, :host, :pid,"
                " :pid_started_at, :config) RETURNING id",
                {
                    "baseline": baseline_run_id,
                    "t": time.time(),
                    "host": socket.gethostname(),
                    "pid": pid,
                    "pid_started_at": pid_started_at,
                    "config": json.dumps(config or {}),
                },
            ).scalar_one()
        return int(new_id)

    def update_experiment(self, experiment_id: int, **fields: Any) -> None:
        """Set columns of an experiment; config/progress/result accept dicts."""
        if not fields:
            return
        cols, vals = [], {"id": experiment_id}
        for key, value in fields.items():
            if key not in _EXPERIMENT_COLUMNS:
                raise ValueError(f"{key} is not a column of experiments")
            if key in _EXPERIMENT_JSON and not isinstance(value, str):
                value = json.dumps(value)
            cols.append(f"{key}=:{key}")
            vals[key] = value
        self._db.execute(f"UPDATE experiments SET {', '.join(cols)} WHERE id=:id", vals)

    def experiment(self, experiment_id: int) -> dict[str, Any]:
        """One experiment with its JSON columns decoded; ExperimentNotFound when none."""
        self.reconcile_experiments()
        row = self._db.row("SELECT * FROM experiments WHERE id=:id", id=experiment_id)
        if row is None:
            raise ExperimentNotFound(f"no experiment with id {experiment_id}")
        return _decode_experiment(row)

    def experiments(self, baseline_run_id: int | None = None) -> list[dict[str, Any]]:
        """All experiments (or those of one baseline run), newest first."""
        self.reconcile_experiments()
        if baseline_run_id is None:
            rows = self._db.rows("SELECT * FROM experiments ORDER BY id DESC")
        else:
            rows = self._db.rows(
                "SELECT * FROM experiments WHERE baseline_run_id=:b ORDER BY id DESC",
                b=baseline_run_id,
            )
        return [_decode_experiment(r) for r in rows]

    def reconcile_experiments(self) -> int:
        """Fail running experiments whose process is gone; returns how many changed.

        Same reasoning as ``reconcile``: a killed process cannot say it stopped, and a
        dashboard polling its progress would otherwise wait forever.
        """
        changed = 0
        for row in vanished(self._db, "experiments"):
            changed += self._db.execute(
                "UPDATE experiments SET status='failed', ended_at=:t,"
                " error=COALESCE(error, 'the experiment process vanished (killed?)')"
                " WHERE id=:id AND status='running'",
                {"t": time.time(), "id": row["id"]},
            ).rowcount
        return changed


def _decode_experiment(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in _EXPERIMENT_JSON:
        out[key] = json.loads(out[key]) if out[key] else {}
    return out
