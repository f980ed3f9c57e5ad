"""The findings table: a run's diagnosis, kept so that lists and pages need not redo it.

A part of ``RunStore`` (see ``store.py``): the methods here use the store's one
connection and are called on the store itself. Findings go in and come out as
``stepscope.types.Finding``; their evidence and fixes are stored as JSON.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from stepscope.types import Finding


class FindingsTable:
    """Each run's findings, in the order of their cost."""

    _conn: sqlite3.Connection

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
                f.phase,
                now,
            )
            for i, f in enumerate(findings)
        ]
        with self._conn:
            self._conn.execute("DELETE FROM findings WHERE run_id=?", (run_id,))
            self._conn.executemany(
                "INSERT INTO findings(run_id, position, class, subtype, title, share, confidence,"
                " level, evidence, fixes, phase, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
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


def _finding(row: Any) -> Finding:
    d = dict(row)
    d["evidence"] = json.loads(d["evidence"])
    d["fixes"] = json.loads(d["fixes"])
    return Finding.from_json(d)
