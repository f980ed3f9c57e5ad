"""The one read/write API of the run store: ``RunStore``.

Every stage goes through this class rather than writing SQL of its own, so that the
schema can change in one place. Reads return pandas DataFrames (or plain dicts for one
row, ``Finding``s for findings); writes are small transactions so that a job killed at
any moment loses at most what its writer had buffered.

``RunStore`` is one class made of one part per group of tables (``runs.py``,
``members.py``, ``records.py``, ``requests.py``, ``findings.py``, ``experiments.py``,
``tags.py``, ``summaries.py``, ``details.py``) over one database
(``db.py``: SQLite by default, or PostgreSQL, chosen by the store URL, ``url.py``):
callers keep one handle with the API they always had and each part reads alone.
This module owns the database: opening it, migrating the schema, closing it.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from stepscope.store.db import Db, db_errors, error_text, q
from stepscope.store.details import DetailsTable
from stepscope.store.experiments import ExperimentsTable
from stepscope.store.findings import FindingsTable
from stepscope.store.members import MembersTable
from stepscope.store.records import RunRecords
from stepscope.store.requests import RequestsTable
from stepscope.store.runs import RunsTable
from stepscope.store.schema import DDL, INDEXES, MIGRATIONS, SCHEMA_VERSION, ddl_for
from stepscope.store.summaries import SummariesTable
from stepscope.store.tags import TagsTable
from stepscope.store.url import StoreError, resolve_store_url

if TYPE_CHECKING:
    from stepscope.store.db import Connection

__all__ = ["RunStore", "StoreError", "default_home"]

# A constant key for PostgreSQL's advisory lock: two processes creating or migrating
# the schema at once would otherwise collide in CREATE TABLE IF NOT EXISTS.
_MIGRATION_LOCK = 0x5732_5C0F


def default_home() -> Path:
    return Path(os.environ.get("STEPSCOPE_HOME") or Path.home() / ".stepscope").expanduser()


class RunStore(
    RunsTable,
    MembersTable,
    RunRecords,
    RequestsTable,
    FindingsTable,
    ExperimentsTable,
    TagsTable,
    SummariesTable,
    DetailsTable,
):
    """Handle on one store: its database plus the local ``runs/<id>/`` folders.

    ``home`` is the local folder (run folders, control files); ``url`` (or
    ``$STEPSCOPE_STORE``) chooses the database, ``<home>/stepscope.db`` by default.
    Attributes: ``url`` (printable, password redacted), ``backend`` ('sqlite' |
    'postgresql'), ``db_path`` (the SQLite file; None on PostgreSQL). A store may be
    used from several threads (each call takes its own pooled connection);
    ``threadsafe`` is accepted for the callers that asked for it before that was so.
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        *,
        url: str | os.PathLike[str] | None = None,
        threadsafe: bool = False,
    ) -> None:
        del threadsafe  # every store is: see the class docstring
        self.home = Path(home).expanduser() if home is not None else default_home()
        resolved = resolve_store_url(self.home, url)
        self.url = resolved.display
        self.backend = resolved.backend
        self.db_path: Path | None = resolved.path
        self.location = resolved.display  # what messages call this store
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            if self.db_path is not None:
                self.db_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.location}: cannot open the run store ({exc})") from exc
        self._db = Db(resolved)
        self._conn = self._db  # the name older callers (and tests) reach for
        try:
            self._migrate()
        except StoreError as exc:
            self._db.close()
            if exc.__cause__ is None:  # ours (a newer schema): already says it all
                raise
            raise StoreError(
                f"{self.location}: cannot open the run store "
                f"({resolved.hide(error_text(exc.__cause__))})"
            ) from exc.__cause__
        except db_errors() as exc:
            self._db.close()
            raise StoreError(
                f"{self.location}: cannot open the run store ({resolved.hide(error_text(exc))})"
            ) from exc

    # -- lifecycle ---------------------------------------------------------------
    @property
    def where(self) -> str:
        """Where the runs are, for messages: the home folder on SQLite (the database and
        the run folders are both there), the redacted URL on a server."""
        return str(self.home) if self.backend == "sqlite" else self.url

    def close(self) -> None:
        self._db.close()

    def transaction(self) -> AbstractContextManager[Connection]:
        """One transaction for several writes, each given it as ``conn=``: all of them
        are committed at the end of the block, or none (the in-job writer's flush)."""
        return self._db.begin()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _version(self, conn: Connection) -> int:
        if not self._db.has_table(conn, "meta"):
            return 0
        value = q(conn, "SELECT value FROM meta WHERE key='schema_version'").scalar()
        if value is None:
            return 0
        try:
            return int(value)
        except (TypeError, ValueError):  # written by hand or by something else: no guess
            raise StoreError(
                f"{self.location}: its meta table's schema_version is {value!r}, not a "
                "version number; this is not a store stepscope can read"
            ) from None

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.location}: schema version {version} is newer than this stepscope "
                f"understands ({SCHEMA_VERSION}); upgrade stepscope"
            )

    def _migrate(self) -> None:
        """Create or upgrade the schema; a store already at this version is only read
        (opening a store must not take the write lock: every job process opens one)."""
        with self._db.begin() as conn:
            version = self._version(conn)
        self._check_not_newer(version)
        if version == SCHEMA_VERSION:
            return
        with self._db.begin() as conn:
            # One process migrates, the others wait and then find the work done.
            if self.backend == "postgresql":
                q(conn, "SELECT pg_advisory_xact_lock(:k)", {"k": _MIGRATION_LOCK})
            else:  # the write lock now, and the DDL inside the transaction
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            self._db.script(conn, ddl_for(self.backend, DDL))
            version = self._version(conn)  # again: another process may have migrated
            self._check_not_newer(version)
            # A new database (version 0) was just created at the latest schema by the DDL.
            for v in range(version + 1 if version else SCHEMA_VERSION + 1, SCHEMA_VERSION + 1):
                self._db.script(conn, ddl_for(self.backend, MIGRATIONS[v]))
            self._db.script(conn, INDEXES)
            q(
                conn,
                "INSERT INTO meta(key, value) VALUES ('schema_version', :v)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                {"v": str(SCHEMA_VERSION)},
            )
