"""The findings table: a run's diagnosis, kept so that lists and pages need not redo it.

A part of ``RunStore`` (see ``store.py``): the methods here use the store's database
(``db.py``) and are called on the store itself. Findings go in and come out as
``stepscope.types.Finding``; their evidence and fixes are stored as JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from stepscope.store.db import int_list, q
from stepscope.types import Finding

if TYPE_CHECKING:
    from stepscope.store.db import Db


class FindingsTable:
    """Each run's findings, in the order of their cost."""

    _db: Db

    def save_findings(self, run_id: int, findings: Sequence[Finding]) -> None:
        """Replace the run's findings (each with its ``level``: the evidence it rests on)."""
        now = time.time()
        rows = [
            {
                "run_id": run_id,
                "position": i,
                "class": f.klass.value,
                "subtype": f.subtype,
                "title": f.title,
                "share": None if f.share is None else round(f.share, 4),
                "confidence": round(float(f.confidence), 2),
                "level": f.level or "none",
                "evidence": json.dumps([e.to_json() for e in f.evidence]),
                "fixes": json.dumps([x.to_json() for x in f.fixes]),
                "phase": f.phase,
                "created_at": now,
            }
            for i, f in enumerate(findings)
        ]
        with self._db.begin() as conn:
            q(conn, "DELETE FROM findings WHERE run_id=:run_id", {"run_id": run_id})
            if rows:
                q(
                    conn,
                    "INSERT INTO findings(run_id, position, class, subtype, title, share,"
                    " confidence, level, evidence, fixes, phase, created_at) VALUES (:run_id,"
                    " :position, :class, :subtype, :title, :share, :confidence, :level,"
                    " :evidence, :fixes, :phase, :created_at)",
                    rows,
                )

    def findings(self, run_id: int) -> list[Finding]:
        """The run's findings, most costly first; [] when it was never diagnosed."""
        rows = self._db.rows(
            "SELECT * FROM findings WHERE run_id=:run_id ORDER BY position", run_id=run_id
        )
        return [_finding(row) for row in rows]

    def top_findings(self, run_ids: Collection[int] | None = None) -> dict[int, Finding]:
        """run id -> its first finding: the runs table (of every run, or of ``run_ids``)."""
        sql = "SELECT * FROM findings WHERE position=0"
        if run_ids is not None:
            if not run_ids:
                return {}
            sql += f" AND run_id IN ({int_list(run_ids)})"
        rows = self._db.rows(sql)
        return {int(r["run_id"]): _finding(r) for r in rows}


def _finding(row: dict[str, Any]) -> Finding:
    d = dict(row)
    d["evidence"] = json.loads(d["evidence"])
    d["fixes"] = json.loads(d["fixes"])
    return Finding.from_json(d)
