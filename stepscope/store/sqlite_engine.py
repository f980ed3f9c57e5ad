"""A SQLite store's connections on Python's own ``sqlite3``, without SQLAlchemy.

Importing SQLAlchemy costs about 0.35 s of CPU on a 2-core VM: more than `stepscope
runs` may take as a whole (issue 41), and every process of a recorded job paid it for
its writer. On SQLite, SQLAlchemy only handed the store's ``text()`` SQL to sqlite3 (its
pysqlite dialect does no type processing for ``text()``), and sqlite3 reads ``:name``
parameters itself, so this module hands it over directly. PostgreSQL stores keep
SQLAlchemy and psycopg (``db.py``).

What ``db.Db`` and the store's tables used of SQLAlchemy's engine, kept as it behaved:

* a pool per engine: each call checks a connection out and gives it back; 2 idle ones
  are kept and at most 10 are open (SQLAlchemy's ``pool_size=2, max_overflow=8``); a
  new connection gets ``on_connect`` (the store's pragmas), as SQLAlchemy's ``connect``
  event gave it;
* transactions as the pysqlite dialect left them to sqlite3 (its default, deferred
  mode: a transaction begins before the first write): ``begin()`` commits at the end of
  its block and rolls back on an error; every connection is rolled back when it goes
  back to the pool (SQLAlchemy's reset on return), so no reader keeps a snapshot;
* results: ``scalar``, ``scalar_one``, ``first``, ``all``, ``mappings``, ``keys``,
  ``rowcount``, ``returns_rows``, and rows read by position, by name as an attribute
  (``row.status``) or as pairs (``dict(result.all())``);
* errors: sqlite3's own. SQLAlchemy wrapped them in classes of the same names, and
  ``db.Db`` turns the same two (``OperationalError``, ``InterfaceError``) into
  ``StoreError``; ``error_text`` reads the same driver message from either.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

#: idle connections kept, and connections open at once (SQLAlchemy's QueuePool settings)
POOL_SIZE = 2
MAX_OPEN = 10
#: seconds a caller waits for a connection when MAX_OPEN are checked out (as QueuePool)
POOL_TIMEOUT_S = 30.0


class Row(tuple[Any, ...]):
    """One row: a tuple whose columns are also attributes (``_keys``: name -> index, set
    on the subclass each result makes)."""

    __slots__ = ()
    _keys: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._keys[name]]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._keys, self, strict=True))


class Result:
    """A statement's cursor, read the ways the store reads SQLAlchemy's results."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor
        self.returns_rows = cursor.description is not None
        self._names = [d[0] for d in cursor.description or ()]
        keys = {name: i for i, name in enumerate(self._names)}
        self._row = type("Row", (Row,), {"__slots__": (), "_keys": keys})

    @property
    def rowcount(self) -> int:
        """Rows a write changed (-1 for a read), as the driver counts them."""
        return self._cursor.rowcount

    def keys(self) -> list[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[Row]:
        row = self._row
        for values in self._cursor:
            yield row(values)

    def all(self) -> list[Row]:
        row = self._row
        return [row(values) for values in self._cursor.fetchall()]

    def first(self) -> Row | None:
        values = self._cursor.fetchone()
        self._cursor.close()
        return None if values is None else self._row(values)

    def scalar(self) -> Any:
        found = self.first()
        return None if found is None else found[0]

    def scalar_one(self) -> Any:
        rows = self.all()
        if len(rows) != 1:
            raise sqlite3.ProgrammingError(f"one row expected, {len(rows)} returned")
        return rows[0][0]

    def mappings(self) -> Mappings:
        return Mappings(self)


class Mappings:
    """``Result.mappings()``: each row as a dict of its columns."""

    def __init__(self, result: Result) -> None:
        self._result = result

    def __iter__(self) -> Iterator[dict[str, Any]]:
        names = self._result.keys()
        for values in self._result._cursor:
            yield dict(zip(names, values, strict=True))

    def all(self) -> list[dict[str, Any]]:
        return list(self)

    def first(self) -> dict[str, Any] | None:
        found = self._result.first()
        return None if found is None else found._mapping


class SqliteConnection:
    """A pooled sqlite3 connection, with the two ways the store runs SQL on one."""

    def __init__(self, dbapi: sqlite3.Connection) -> None:
        self.dbapi = dbapi

    def execute(self, sql: str, params: Any = None) -> Result:
        """``sql`` with ``:name`` parameters: a mapping, or a list of them (executemany;
        an empty list runs it once without parameters, as SQLAlchemy did)."""
        if params is None or (isinstance(params, Sequence) and not params):
            return Result(self.dbapi.execute(sql))
        if isinstance(params, Mapping):
            return Result(self.dbapi.execute(sql, params))
        return Result(self.dbapi.executemany(sql, params))

    def exec_driver_sql(self, sql: str, params: Sequence[Any] | None = None) -> Result:
        """``sql`` as the driver takes it (``?`` parameters): a list of rows runs it once a
        row (one row: once, as SQLAlchemy did), a tuple once."""
        if not params:
            return Result(self.dbapi.execute(sql))
        if isinstance(params, list):
            if len(params) == 1:
                return Result(self.dbapi.execute(sql, params[0]))
            return Result(self.dbapi.executemany(sql, params))
        return Result(self.dbapi.execute(sql, params))


class SqliteEngine:
    """The connections of one SQLite file: a small pool, ``connect`` and ``begin``."""

    def __init__(
        self,
        path: Path,
        *,
        timeout_s: float,
        on_connect: Callable[[sqlite3.Connection], None],
    ) -> None:
        self.path = path
        self._timeout_s = timeout_s
        self._on_connect = on_connect
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_OPEN)
        self._generation = 0  # dispose() starts a new one: older connections are closed

    @contextmanager
    def connect(self) -> Iterator[SqliteConnection]:
        """A connection for reads; rolled back when it goes back to the pool."""
        dbapi, generation = self._checkout()
        try:
            yield SqliteConnection(dbapi)
        finally:
            self._checkin(dbapi, generation)

    @contextmanager
    def begin(self) -> Iterator[SqliteConnection]:
        """One transaction: committed at the end of the block, rolled back on error."""
        dbapi, generation = self._checkout()
        try:
            yield SqliteConnection(dbapi)
            dbapi.commit()
        finally:
            self._checkin(dbapi, generation)

    def dispose(self) -> None:
        """Close the idle connections; those checked out are closed when they come back.
        The engine stays usable: a later call opens new ones (as SQLAlchemy's does)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for dbapi in idle:
            with suppress(sqlite3.Error):
                dbapi.close()

    def _checkout(self) -> tuple[sqlite3.Connection, int]:
        if not self._slots.acquire(timeout=POOL_TIMEOUT_S):
            raise sqlite3.OperationalError(
                f"no connection free after {POOL_TIMEOUT_S:g} s ({MAX_OPEN} open at most)"
            )
        try:
            with self._lock:
                generation = self._generation
                if self._idle:
                    return self._idle.pop(), generation
            dbapi = sqlite3.connect(self.path, timeout=self._timeout_s, check_same_thread=False)
            try:
                self._on_connect(dbapi)
            except BaseException:
                dbapi.close()
                raise
            return dbapi, generation
        except BaseException:
            self._slots.release()
            raise

    def _checkin(self, dbapi: sqlite3.Connection, generation: int) -> None:
        try:
            try:
                dbapi.rollback()
            except sqlite3.Error:  # a broken connection is not given out again
                with suppress(sqlite3.Error):
                    dbapi.close()
                return
            with self._lock:
                if generation == self._generation and len(self._idle) < POOL_SIZE:
                    self._idle.append(dbapi)
                    return
            with suppress(sqlite3.Error):
                dbapi.close()
        finally:
            self._slots.release()
