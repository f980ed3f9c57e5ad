"""The requests of a text-generation job: one row per outer call, upserted.

A part of ``RunStore`` (see ``store.py``). The job's writer (``writer.py``) sends a row
when a request starts (status 'running') and the full row when it ends; both go through
one upsert, so the last word wins and a job killed mid-request leaves its row
'running', which readers call unfinished.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from stepscope.store.db import Connection, Db

REQUEST_COLUMNS = (
    "run_id", "rank", "request", "step", "source", "status", "start_s", "end_s", "rows",
    "prompt_tokens", "new_tokens", "positions", "ttft_s", "prefill_s", "decode_s", "forwards",
    "peak_rss_bytes", "peak_cuda_bytes", "profiled", "tokens", "meta",
)  # fmt: skip
_JSON_COLUMNS = ("tokens", "meta")
_UPSERT = (
    f"INSERT INTO requests({', '.join(REQUEST_COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in REQUEST_COLUMNS)})"
    " ON CONFLICT(run_id, rank, request) DO UPDATE SET "
    + ", ".join(f"{c}=excluded.{c}" for c in REQUEST_COLUMNS[3:])
)


class RequestsTable:
    """Rows of the ``requests`` table (schema version 6)."""

    _db: Db

    def add_requests(
        self, run_id: int, rows: Iterable[dict[str, Any]], *, conn: Connection | None = None
    ) -> None:
        """Insert or replace request rows (keyed by rank and request index); ``conn``: a
        transaction already open that they join."""
        data = []
        for r in rows:
            values = []
            for column in REQUEST_COLUMNS:
                if column == "run_id":
                    values.append(run_id)
                elif column in _JSON_COLUMNS:
                    values.append(json.dumps(r.get(column) or ([] if column == "tokens" else {})))
                elif column == "profiled":
                    values.append(int(bool(r.get("profiled"))))
                else:
                    values.append(r.get(column, 0 if column == "rank" else None))
            data.append(tuple(values))
        if data:
            self._db.executemany(_UPSERT, data, conn=conn)

    def requests(self, run_id: int) -> pd.DataFrame:
        """The run's requests in order (``tokens`` and ``meta`` decoded from JSON)."""
        df = self._db.frame(
            "SELECT * FROM requests WHERE run_id=:run_id ORDER BY rank, request", run_id=run_id
        )
        for column in _JSON_COLUMNS:
            df[column] = df[column].map(json.loads)
        return df

    def request_count(self, run_id: int) -> int:
        return int(
            self._db.scalar("SELECT COUNT(*) FROM requests WHERE run_id=:run_id", run_id=run_id)
            or 0
        )
