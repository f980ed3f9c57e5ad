"""The run_details table: what `stepscope show` computes of an ended run, kept.

A part of ``RunStore`` (see ``store.py``). `show` prints a run's step figures, its
samples' means and maxima, its requests and its memory breakdown; computing them reads
every step, sample and request of the run with pandas and the capture's files (about
0.7 s of a 0.9 s `show`, pandas' import most of it). They change only while the run
gets records, so those of an ended run are kept here with the state of the run they
were computed for (``record_state``: its status and end, and how many steps, samples,
requests and artifacts it had) and the version of the way they were computed;
``app/cli/show_kept.py`` decides when a kept row still holds. This module only stores
and reads them: it knows nothing of what they mean.

A shared store's rows are written by anyone who shows a run: they are data, read back
as a JSON object or nothing, shown and never executed; a row that is not one is as good
as absent, and is computed again.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.store.db import Db

_STATE_SQL = (
    "SELECT (SELECT COUNT(*) FROM steps WHERE run_id=:id) AS steps,"
    " (SELECT COUNT(*) FROM samples WHERE run_id=:id) AS samples,"
    " (SELECT COUNT(*) FROM requests WHERE run_id=:id) AS requests,"
    " (SELECT COUNT(*) FROM artifacts WHERE run_id=:id) AS artifacts,"
    " (SELECT MAX(id) FROM artifacts WHERE run_id=:id) AS last_artifact"
)
_UPSERT = (
    "INSERT INTO run_details(run_id, state, version, details, created_at)"
    " VALUES (:run_id, :state, :version, :details, :now) ON CONFLICT(run_id) DO UPDATE SET"
    " state=excluded.state, version=excluded.version, details=excluded.details,"
    " created_at=excluded.created_at"
)


class DetailsTable:
    """Kept details: one row per run, read and written one run at a time."""

    _db: Db

    def record_state(self, run_id: int) -> dict[str, int | None]:
        """How many steps, samples, requests and artifacts the run has, and its newest
        artifact's id: what of its records decides whether details kept for it hold
        (one query; each count reads the index of its table's key, which leads with the
        run)."""
        row = self._db.row(_STATE_SQL, id=int(run_id)) or {}
        return {
            name: None if row.get(name) is None else int(row[name])
            for name in ("steps", "samples", "requests", "artifacts", "last_artifact")
        }

    def kept_details(self, run_id: int) -> tuple[str, int, dict[str, Any]] | None:
        """(state, version, details) kept for the run; None if none is, or if what is
        kept is not a JSON object (a shared store is anyone's to write)."""
        row = self._db.row(
            "SELECT state, version, details FROM run_details WHERE run_id=:id", id=int(run_id)
        )
        if row is None:
            return None
        try:
            details = json.loads(row["details"])
            version = int(row["version"])
        except (TypeError, ValueError):
            return None
        if not isinstance(details, dict) or not isinstance(row["state"], str):
            return None
        return row["state"], version, details

    def keep_details(self, run_id: int, state: str, version: int, details: dict[str, Any]) -> None:
        """Write (or replace) the run's row: ``details`` must be JSON as it is (no NaN)."""
        self._db.execute(
            _UPSERT,
            {"run_id": int(run_id), "state": state, "version": int(version),
             "details": json.dumps(details, allow_nan=False), "now": time.time()},
        )  # fmt: skip
