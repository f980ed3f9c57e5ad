"""The one read/write API of the run store: ``RunStore``.

Every stage goes through this class rather than writing SQL of its own, so that the
schema can change in one place. Reads return pandas DataFrames (or plain dicts for one
row, ``Finding``s for findings); writes are small transactions so that a job killed at
any moment loses at most what its writer had buffered.

``RunStore`` is one class made of one part per group of tables (``runs.py``,
``records.py``, ``findings.py``, ``experiments.py``) over a single sqlite3 connection:
callers keep one handle with the API they always had, the connection's rules (one
thread, one transaction at a time) stay in one place, and each part reads alone.
This module owns the connection: opening it, migrating the schema, closing it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from stepscope.store.experiments import ExperimentsTable
from stepscope.store.findings import FindingsTable
from stepscope.store.records import RunRecords
from stepscope.store.runs import RunsTable
from stepscope.store.schema import DDL, MIGRATIONS, SCHEMA_VERSION

BUSY_TIMEOUT_MS = 10_000


class StoreError(RuntimeError):
    """The store cannot be opened or read: locked, corrupt, or from a newer stepscope."""


def default_home() -> Path:
    return Path(os.environ.get("STEPSCOPE_HOME") or Path.home() / ".stepscope").expanduser()


class RunStore(RunsTable, RunRecords, FindingsTable, ExperimentsTable):
    """Handle on one store directory: ``stepscope.db`` plus ``runs/<id>/`` folders.

    A RunStore holds one sqlite3 connection and is meant for one thread, unless
    ``threadsafe`` (the caller then serialises use itself, as the writer does).
    """

    def __init__(
        self, home: str | os.PathLike[str] | None = None, *, threadsafe: bool = False
    ) -> None:
        self.home = Path(home).expanduser() if home is not None else default_home()
        self.db_path = self.home / "stepscope.db"
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                self.db_path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=not threadsafe
            )
            self._conn.row_factory = sqlite3.Row
            self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.db_path}: cannot open the run store ({exc})") from exc

    # -- lifecycle ---------------------------------------------------------------
    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self._conn:
            self._conn.executescript(DDL)
            row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.db_path}: schema version {version} is newer than this stepscope "
                    f"understands ({SCHEMA_VERSION}); upgrade stepscope"
                )
            # A new database (version 0) was just created at the latest schema by the DDL.
            for v in range(version + 1 if version else SCHEMA_VERSION + 1, SCHEMA_VERSION + 1):
                self._conn.executescript(MIGRATIONS[v])
            self._conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
