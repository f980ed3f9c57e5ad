"""A SQLite store's own engine (``store/sqlite_engine.py``): what the store used of
SQLAlchemy's, kept as it behaved.

Rows read by position, by name and as pairs; transactions committed or rolled back;
readers that never keep a transaction open; a pool that keeps two idle connections and
stays usable after ``dispose``; the frames ``Db.frame`` makes equal to those SQLAlchemy's
connection made, dtypes included; constraint errors that ``integrity_errors`` names.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from stepscope.store import RunStore
from stepscope.store.db import Db, integrity_errors, q
from stepscope.store.sqlite_engine import POOL_SIZE, SqliteEngine
from stepscope.store.url import resolve_store_url


def _engine(tmp_path: Path) -> SqliteEngine:
    engine = SqliteEngine(tmp_path / "t.db", timeout_s=1.0, on_connect=lambda c: None)
    with engine.begin() as conn:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, x REAL)")
    return engine


def test_rows_read_by_position_by_name_and_as_pairs(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    with engine.begin() as conn:
        new = q(conn, "INSERT INTO t(name, x) VALUES (:n, :x) RETURNING id", {"n": "a", "x": 1.5})
        assert new.scalar_one() == 1
        q(
            conn,
            "INSERT INTO t(name, x) VALUES (:n, :x)",
            [{"n": "b", "x": None}, {"n": "c", "x": 3}],
        )
    with engine.connect() as conn:
        rows = q(conn, "SELECT name, x FROM t ORDER BY id").all()
        assert [tuple(r) for r in rows] == [("a", 1.5), ("b", None), ("c", 3.0)]
        assert (
            rows[0].name == "a"
            and rows[0][1] == 1.5
            and rows[0]._mapping == {"name": "a", "x": 1.5}
        )
        assert dict(q(conn, "SELECT name, id FROM t").all()) == {"a": 1, "b": 2, "c": 3}
        assert q(conn, "SELECT name FROM t WHERE id=:i", {"i": 9}).scalar() is None
        assert q(conn, "SELECT * FROM t WHERE id=2").mappings().first() == {
            "id": 2, "name": "b", "x": None,
        }  # fmt: skip
        assert [m["name"] for m in q(conn, "SELECT name FROM t ORDER BY id").mappings()] == [
            "a", "b", "c",
        ]  # fmt: skip
        result = conn.exec_driver_sql("SELECT id, name FROM t WHERE id > ?", (1,))
        assert list(result.keys()) == ["id", "name"] and [r.id for r in result] == [2, 3]
        with pytest.raises(AttributeError):
            _ = rows[0].missing
    with engine.begin() as conn:
        changed = q(conn, "UPDATE t SET x = 0 WHERE id > :i", {"i": 1})
        assert changed.rowcount == 2 and not changed.returns_rows


def test_a_block_commits_at_its_end_and_rolls_back_on_error(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute("INSERT INTO t(name) VALUES ('lost')")
        raise RuntimeError("the block fails")
    with engine.connect() as conn:  # a reader's write is rolled back when it goes back
        conn.execute("INSERT INTO t(name) VALUES ('not committed')")
    with engine.begin() as conn:
        conn.execute("INSERT INTO t(name) VALUES ('kept')")
    other = sqlite3.connect(tmp_path / "t.db")
    assert other.execute("SELECT name FROM t").fetchall() == [("kept",)]
    other.close()


def test_the_pool_keeps_two_idle_connections_and_outlives_dispose(tmp_path: Path) -> None:
    opened: list[sqlite3.Connection] = []
    engine = SqliteEngine(tmp_path / "t.db", timeout_s=1.0, on_connect=opened.append)
    with engine.connect(), engine.connect(), engine.connect():  # three at once
        pass
    assert len(opened) == 3 and len(engine._idle) == POOL_SIZE
    with engine.connect() as conn:  # reused, not opened again
        assert conn.dbapi in opened
    engine.dispose()
    assert engine._idle == []
    with engine.connect() as conn:
        assert conn.execute("SELECT 1").scalar() == 1
    assert len(opened) == 4


def test_frames_are_those_sqlalchemy_made(tmp_path: Path) -> None:
    sa = pytest.importorskip("sqlalchemy")
    with RunStore(tmp_path / "home") as store:
        run_id = store.create_run(["python", "train.py"], name="t", status="completed")
        steps = [{"step": s, "start_s": 1.0 + s, "end_s": 1.5 + s, "loss": None if s else 2.0}
                 for s in range(4)]  # fmt: skip
        store.add_steps(run_id, steps)
        ours = store.steps(run_id)
        path = store.db_path
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        theirs = pd.read_sql_query(
            sa.text("SELECT * FROM steps WHERE run_id=:run_id ORDER BY rank, worker, step"),
            conn,
            params={"run_id": run_id},
        )
    engine.dispose()
    pd.testing.assert_frame_equal(ours, theirs)  # dtypes too: a column NULL in every row
    assert ours["device_s"].dtype == object and ours["loss"].dtype == float


def test_a_constraint_error_is_named_by_integrity_errors(tmp_path: Path) -> None:
    db = Db(resolve_store_url(tmp_path, tmp_path / "t.db"))
    db.execute("CREATE TABLE u (k TEXT PRIMARY KEY)")
    db.execute("INSERT INTO u VALUES (:k)", {"k": "a"})
    with pytest.raises(integrity_errors()):
        db.execute("INSERT INTO u VALUES (:k)", {"k": "a"})
    assert db.scalar("SELECT COUNT(*) FROM u") == 1
    db.close()
