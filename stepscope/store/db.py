"""The store's database connection on either backend: SQLite (the default) or PostgreSQL.

One engine per ``RunStore``: SQLAlchemy's on PostgreSQL, and on SQLite the few parts of
it the store used, on Python's own sqlite3 (``sqlite_engine.py``: importing SQLAlchemy
cost every command and every job process 0.35 s). SQL is written once, with ``:name``
parameters, in the subset both backends speak (``INSERT ... ON CONFLICT``,
``RETURNING``). Each call checks a connection out of the engine's small pool and gives
it back at the end of its transaction, so no reader sits on an open transaction (a
pinned WAL snapshot on SQLite, an "idle in transaction" session on PostgreSQL) between
calls, and one store can serve several threads (the pool hands each its own connection).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

from stepscope.store.sqlite_engine import SqliteConnection, SqliteEngine
from stepscope.store.url import StoreError, StoreUrl

if TYPE_CHECKING:
    import pandas as pd
    import sqlalchemy as sa

    #: a connection of either engine, as ``connect``, ``begin`` and ``within`` give it
    Connection: TypeAlias = sa.Connection | SqliteConnection

# SQLAlchemy (PostgreSQL stores only) is imported when a store is first opened, not with
# the package: the writer's module is imported on the job's main thread at start-up, and
# the writer opens its store from its own thread. Those imports (about 0.2 s of Python,
# holding the GIL) must not land in the job's first steps: ``preload`` runs them earlier.

BUSY_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_S = 10

Params = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


def preload() -> None:
    """Import SQLAlchemy and the store's dialect now, on the caller's thread, for a
    PostgreSQL store (a SQLite store's sqlite3 is imported with this module).

    Called by the bootstrap when the job imports torch, before the job's own set-up goes
    on. Left to the writer's first open, these imports would run beside the job's first
    steps and stretch them by their whole cost: on a job of 3 ms steps, a third step of
    250 ms, past the warm-up, read by the diagnosis as the job's own time. They are not
    run on a thread of their own: a job that forks while they run (``mp.Process`` with
    fork, as in mnist_hogwild) leaves its child with the module locks that thread held,
    and the child's first store write waited on them for ever. About 0.16 s once, at
    start-up. Any failure is left to the store's open to report.
    """
    if not (os.environ.get("STEPSCOPE_STORE") or "").startswith("postgres"):
        return
    with contextlib.suppress(Exception):
        import sqlalchemy
        import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

        sqlalchemy.make_url("postgresql+psycopg://preload")  # compiles its regex


class Db:
    """An engine plus the few ways the store tables use it."""

    engine: Any  # SqliteEngine, or SQLAlchemy's Engine on PostgreSQL

    def __init__(self, url: StoreUrl) -> None:
        self.url = url
        self.backend = url.backend
        #: what a database that cannot be reached raises: turned into StoreError
        self._unreachable: tuple[type[BaseException], ...]
        if url.backend == "sqlite":
            assert url.path is not None  # resolve_store_url gives SQLite a file
            self.engine = SqliteEngine(
                url.path, timeout_s=BUSY_TIMEOUT_MS / 1000, on_connect=_sqlite_pragmas
            )
            self._unreachable = (sqlite3.OperationalError, sqlite3.InterfaceError)
        else:
            import sqlalchemy as sa
            from sqlalchemy.exc import InterfaceError, OperationalError

            self._unreachable = (OperationalError, InterfaceError)
            self.engine = sa.create_engine(
                url.sqlalchemy,
                connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
                pool_size=2,
                max_overflow=8,
                # a pooled connection the server dropped (a restart, a proxy's cut) is
                # replaced before use, instead of failing the next call once
                pool_pre_ping=True,
            )

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A pooled connection for reads; the store's own error for a failing database."""
        try:
            with self.engine.connect() as conn:
                yield conn
        except self._unreachable as exc:
            raise StoreError(f"{self.url.display}: {self.url.hide(error_text(exc))}") from exc

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """One transaction: committed at the end of the block, rolled back on error.

        A database that fails (locked past the busy timeout, server gone) raises
        StoreError naming the store in one line; constraint violations (IntegrityError)
        and SQL errors (bugs) pass through as they are.
        """
        try:
            with self.engine.begin() as conn:
                yield conn
        except self._unreachable as exc:
            raise StoreError(f"{self.url.display}: {self.url.hide(error_text(exc))}") from exc

    @contextmanager
    def within(self, conn: Connection | None) -> Iterator[Connection]:
        """``conn``, a transaction the caller holds open (``RunStore.transaction``: the
        writer's flush commits all its rows at once, or none), else one of its own."""
        if conn is not None:
            yield conn
            return
        with self.begin() as own:
            yield own

    def execute(
        self, sql: str, params: Params = None, *, conn: Connection | None = None
    ) -> Buffered:
        """Run one statement (a list of parameter dicts: executemany) in its own
        transaction, or in ``conn``'s; the result is buffered, readable after the
        connection went back."""
        with self.within(conn) as c:
            result = q(c, sql, params)
            rows = result.all() if result.returns_rows else []
            return Buffered(rows, result.rowcount)

    def executemany(
        self, sql: str, rows: Sequence[Sequence[Any]], *, conn: Connection | None = None
    ) -> None:
        """Insert many rows of positional values (``?`` placeholders) in one transaction
        (or ``conn``'s), straight to the driver: the hot path of the writer (steps,
        samples), where SQLAlchemy's per-row handling of named parameters would triple
        the cost."""
        if self.backend != "sqlite":
            sql = sql.replace("?", "%s")  # psycopg's placeholder (no literal % in our SQL)
        with self.within(conn) as c:
            c.exec_driver_sql(sql, list(rows))

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return [dict(r) for r in q(conn, sql, params).mappings()]

    def row(self, sql: str, **params: Any) -> dict[str, Any] | None:
        with self.connect() as conn:
            found = q(conn, sql, params).mappings().first()
        return dict(found) if found is not None else None

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.connect() as conn:
            return q(conn, sql, params).scalar()

    def frame(self, sql: str, **params: Any) -> pd.DataFrame:
        # local: pandas costs ~1 s and ~50 MB, and the writer opens the store inside
        # every process of the user's job
        import pandas as pd

        with self.connect() as conn:
            if isinstance(conn, SqliteConnection):
                return _sqlite_frame(pd, conn, sql, params)
            from sqlalchemy import text  # loaded with the PostgreSQL engine

            return pd.read_sql_query(text(sql), conn, params=params)

    def script(self, conn: Connection, sql: str) -> None:
        """Run a script of statements (DDL, migrations) on ``conn``, one at a time:
        neither driver takes several statements with one call in a transaction."""
        for statement in split_statements(sql):
            conn.exec_driver_sql(statement)

    def has_table(self, conn: Connection, name: str) -> bool:
        """One catalog query (SQLAlchemy's inspector makes several: an open per job
        process adds up on a shared server)."""
        if self.backend == "sqlite":
            sql = "SELECT 1 FROM sqlite_master WHERE type='table' AND name=:n"
        else:
            sql = "SELECT 1 WHERE to_regclass(:n) IS NOT NULL"
        return q(conn, sql, {"n": name}).scalar() is not None


class Buffered:
    """What ``Db.execute`` returns: the rows (if any) and the row count."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return list(self.rows)


def q(conn: Connection, sql: str, params: Params = None) -> Any:
    """Execute ``sql`` (named parameters) on a connection inside a ``Db.begin`` block;
    the result reads as SQLAlchemy's on either engine (``sqlite_engine.Result``)."""
    if isinstance(conn, SqliteConnection):
        return conn.execute(sql, params)
    from sqlalchemy import text  # a module already loaded: see the note at the top

    return conn.execute(text(sql), params)


def _sqlite_frame(
    pd: Any, conn: SqliteConnection, sql: str, params: Mapping[str, Any]
) -> pd.DataFrame:
    """``read_sql_query`` on the sqlite3 connection itself (a frame made as SQLAlchemy's
    connection made it: the same rows, the same dtypes); a failing query raises
    sqlite3's error, which pandas wraps in its own, so that ``Db`` says it as before."""
    try:
        return pd.read_sql_query(sql, conn.dbapi, params=params)
    except pd.errors.DatabaseError as exc:
        if isinstance(exc.__cause__, sqlite3.Error):
            raise exc.__cause__ from None
        raise


def int_list(ids: Iterable[int]) -> str:
    """``1,2,3`` for an ``IN (...)`` clause: each cast to int, so nothing but digits (a
    list of ids has no one bound parameter on both backends)."""
    return ",".join(str(int(i)) for i in ids)


def split_statements(sql: str) -> list[str]:
    """Statements of a script: ``--`` comments dropped, split at ``;`` (the store's DDL
    has no semicolons inside literals)."""
    text = re.sub(r"--[^\n]*", "", sql)
    return [s.strip() for s in text.split(";") if s.strip()]


def error_text(error: BaseException) -> str:
    """The driver's own message, first line only: SQLAlchemy's wrapper adds the SQL and
    a link, which have no place in a one-line error."""
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


def db_errors() -> tuple[type[BaseException], ...]:
    """What a failing database raises: sqlite3's errors, and SQLAlchemy's where it is
    loaded (a PostgreSQL store's; a process that never loaded it cannot get them)."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    return (sqlite3.Error,) if sa_exc is None else (sqlite3.Error, sa_exc.SQLAlchemyError)


def integrity_errors() -> tuple[type[BaseException], ...]:
    """What a violated constraint raises (a unique key another process took first), on
    either engine."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None:
        return (sqlite3.IntegrityError,)
    return (sqlite3.IntegrityError, sa_exc.IntegrityError)


def _sqlite_pragmas(dbapi_conn: sqlite3.Connection) -> None:
    """The settings every SQLite connection of the store has had since the first release:
    WAL (readers never block the writer), a busy timeout, and enforced foreign keys."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        _wal(cur)
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
    finally:
        cur.close()


def _wal(cur: Any) -> None:
    """Switch to WAL, waiting as the busy timeout would.

    A new store's file changes its journal mode once, under an exclusive lock, and
    SQLite answers "database is locked" at once instead of calling the busy handler
    when another process holds a lock meanwhile: two launchers opening a new store
    together (a multi-node job's, two jobs started at once) would fail one of them.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
