"""The in-job writer on a bad day: a flush the database refuses half-way, a commit whose
answer is lost, a store that is away while the job goes on. Every row lands exactly
once, or is dropped past its buffer's cap and counted in the run's log. Real SQLite and
PostgreSQL stores; the failures are the database's own (a trigger that refuses, a lock
held, a server cut off by a proxy), except the lost answer, which only a network can
lose and is played by raising after the commit."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tcp_proxy import TcpProxy

from stepscope.store import BufferedWriter, RunStore, StoreError
from stepscope.store import db as db_module
from stepscope.store import writer as writer_module
from stepscope.store.schema import SCHEMA_VERSION

NEVER_S = 3600.0  # the writer's thread never flushes by itself: the test does
STEPS = 5


def _refuse_events(store: RunStore) -> None:
    """A trigger that fails every insert into events: the flush's seventh statement."""
    with store.transaction() as conn:
        if store.backend == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON events"
                " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON events"
                " FOR EACH ROW EXECUTE FUNCTION refuse()"
            )


def _allow_events(store: RunStore) -> None:
    store._db.execute("DROP TRIGGER refuse" + ("" if store.backend == "sqlite" else " ON events"))


def _record(writer: BufferedWriter, steps: range) -> None:
    """What a job's collectors add in a second: a rank, steps, a sample per step, an
    artifact, log lines, a request, and run updates (a plain column and a JSON merge)."""
    writer.register_rank(0, "node-a", 4242)
    for i in steps:
        writer.add_step({"step": i, "start_s": float(i), "end_s": i + 0.5, "loss": 1.0 / (i + 1)})
        writer.add_sample(1000.0 + i, "job", "step", float(i))
    writer.add_request({"request": 0, "source": "loop", "status": "done", "start_s": 1.0})
    writer.add_artifact("trace", "/runs/7/trace_rank0.json", {"steps": [2, 3]})
    writer.log("info", "capture", "profiler capture at step 2")
    writer.log("info", "capture", "profiler capture at step 2")  # said twice, at two times
    writer.update_run(stop_reason="max_steps")
    writer.merge_run_json("facts", {"optimizer": {"name": "SGD"}})


def _assert_recorded_once(store: RunStore, run_id: int) -> None:
    steps = store.steps(run_id)
    assert steps["step"].tolist() == list(range(STEPS))
    samples = store.samples(run_id)
    assert sorted(samples["value"]) == [float(i) for i in range(STEPS)]
    artifacts = store.artifacts(run_id)
    assert artifacts["path"].tolist() == ["/runs/7/trace_rank0.json"]
    assert artifacts["meta"].tolist() == [{"steps": [2, 3]}]
    events = store.events(run_id)
    assert (
        events[events["source"] == "capture"]["message"].tolist()
        == ["profiler capture at step 2"] * 2
    )
    assert store.request_count(run_id) == 1
    assert store.ranks(run_id)[["rank", "host", "pid"]].values.tolist() == [[0, "node-a", 4242]]
    run = store.run(run_id)
    assert run["stop_reason"] == "max_steps" and run["facts"] == {"optimizer": {"name": "SGD"}}


def _writer_events(store: RunStore, run_id: int) -> list[tuple[str, str]]:
    events = store.events(run_id)
    mine = events[events["source"] == "writer"]
    return list(zip(mine["level"], mine["message"], strict=True))


@pytest.fixture
def writer_for() -> Iterator[Any]:
    """``writer_for(home, run_id, url=None)``: a writer closed at the test's end."""
    made: list[BufferedWriter] = []

    def make(home: Path, run_id: int, url: str | None = None) -> BufferedWriter:
        made.append(BufferedWriter(home, run_id, interval_s=NEVER_S, url=url))
        return made[-1]

    yield make
    for writer in made:
        writer.close()


def test_a_flush_refused_half_way_commits_nothing_and_its_retry_lands_once(
    tmp_path: Path, store_backend: str, writer_for: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "h"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"])
        _refuse_events(store)
    writer = writer_for(home, run_id)
    _record(writer, range(STEPS))
    writer.flush()  # ranks, steps, requests, samples and artifacts went in; events refused

    with RunStore(home) as store:
        assert store.steps(run_id).empty and store.samples(run_id).empty
        assert store.artifacts(run_id).empty and store.events(run_id).empty
        assert store.request_count(run_id) == 0 and store.ranks(run_id).empty
        run = store.run(run_id)
        assert run["stop_reason"] is None and run["facts"] == {}
        _allow_events(store)
    writer.flush()
    writer.flush()  # nothing left: nothing written again

    with RunStore(home) as store:
        _assert_recorded_once(store, run_id)
        ((level, message),) = _writer_events(store, run_id)
        assert level == "warning"
        assert re.fullmatch(r"the store was unreachable for \d+ s: nothing was dropped", message)
    err = capsys.readouterr().err
    assert err.count("cannot write to the run store") == 1
    assert "refused by the test" in err and len(err.strip().splitlines()) == 1


def test_a_commit_whose_answer_was_lost_is_written_again_and_lands_once(
    tmp_path: Path, store_backend: str, writer_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RunStore.transaction
    lost: list[bool] = []

    @contextlib.contextmanager
    def answer_lost(self: RunStore) -> Iterator[Any]:
        with real(self) as conn:
            yield conn
        if not lost:  # committed; the network then drops the server's answer
            lost.append(True)
            raise StoreError("server closed the connection unexpectedly")

    monkeypatch.setattr(RunStore, "transaction", answer_lost)
    home = tmp_path / "h"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"])
    writer = writer_for(home, run_id)
    _record(writer, range(STEPS))
    writer.flush()
    assert lost == [True]
    writer.flush()  # every row again, in one transaction

    with RunStore(home) as store:
        _assert_recorded_once(store, run_id)
        assert len(_writer_events(store, run_id)) == 1


def test_the_same_rows_written_twice_land_once(tmp_path: Path, store_backend: str) -> None:
    with RunStore(tmp_path / "h") as store:
        run_id = store.create_run(["python", "train.py"])
        for _ in range(2):
            store.add_samples(run_id, [(1.0, "proc", "cpu_percent", 50.0)])  # host NULL
            store.add_samples(run_id, [(1.0, "proc", "cpu_percent", 50.0)], host="node-b")
            store.log_event(run_id, "info", "launcher", "started", t=2.0)  # rank NULL
            store.log_event(run_id, "info", "launcher", "started", rank=1, t=2.0)
            store.add_artifact(run_id, "trace", "/t.json", meta={"a": 1}, created_at=3.0)
            store.add_artifact(run_id, "trace", "/t.json", rank=1, created_at=3.0)
        store.add_artifact(run_id, "trace", "/t.json", meta={"a": 1}, created_at=4.0)  # again
        store.log_event(run_id, "info", "launcher", "x" * 300 + "a", t=5.0)  # long lines
        store.log_event(run_id, "info", "launcher", "x" * 300 + "a", t=5.0)

        samples = store.samples(run_id)
        assert samples["host"].fillna("").tolist() == ["", "node-b"]
        events = store.events(run_id)
        assert sorted(events["rank"].fillna(-1).tolist()) == [-1, -1, 1]
        artifacts = store.artifacts(run_id)
        assert artifacts[["rank", "created_at"]].values.tolist() == [[0, 3.0], [1, 3.0], [0, 4.0]]


class _LockedFile:
    """A SQLite store that does not answer: another process holds its write lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = None  # the writer opens the home's file
        self._conn: sqlite3.Connection | None = None

    def cut(self) -> None:
        self._conn = sqlite3.connect(self.path, isolation_level=None)
        self._conn.execute("BEGIN EXCLUSIVE")

    def restore(self) -> None:
        if self._conn is not None:
            self._conn.execute("COMMIT")
            self._conn.close()
            self._conn = None

    close = restore


@pytest.fixture
def outage(store_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """How this backend's store goes away and comes back, for a writer given its ``url``:
    PostgreSQL through a proxy that is cut; SQLite with its write lock held, the busy
    timeout shortened so that a flush gives up in 0.2 s, not 10."""
    if store_backend == "sqlite":
        monkeypatch.setattr(db_module, "BUSY_TIMEOUT_MS", 200)
        away: Any = _LockedFile(tmp_path / "h" / "stepscope.db")
    else:
        with RunStore(tmp_path / "h") as store:
            port = store._db.engine.url.port
        away = TcpProxy(port).start()
        away.url = away.url(os.environ["STEPSCOPE_STORE"])
    yield away
    away.close()


def test_buffers_are_bounded_while_the_store_is_away_and_the_log_says_what_was_lost(
    tmp_path: Path,
    outage: Any,
    writer_for: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(writer_module, "MAX_BUFFERED_SAMPLES", 10)
    home = tmp_path / "h"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"])
    writer = writer_for(home, run_id, url=outage.url)
    writer.add_step({"step": 0, "start_s": 0.0, "end_s": 1.0})
    writer.flush()  # the store answers

    outage.cut()
    for i in range(25):
        writer.add_sample(100.0 + i, "job", "n", float(i))
    writer.add_step({"step": 1, "start_s": 1.0, "end_s": 2.0})
    writer.flush()  # refused: kept in memory
    for i in range(25, 30):
        writer.add_sample(100.0 + i, "job", "n", float(i))
    writer.add_step({"step": 2, "start_s": 2.0, "end_s": 3.0})
    writer.flush()  # refused again; the oldest samples past the cap are dropped
    with RunStore(home) as store:
        assert store.step_count(run_id)[0] == 1 and store.samples(run_id).empty
    outage.restore()
    writer.flush()
    writer.flush()  # nothing new to say

    with RunStore(home) as store:
        assert store.steps(run_id)["step"].tolist() == [0, 1, 2]
        assert store.samples(run_id)["value"].tolist() == [float(i) for i in range(20, 30)]
        ((level, message),) = _writer_events(store, run_id)
    assert level == "warning"
    assert re.fullmatch(
        r"the store was unreachable for \d+ s: 20 samples and 0 steps dropped \(buffers full\)",
        message,
    ), message
    assert capsys.readouterr().err.count("cannot write to the run store") == 1


def test_rows_past_a_full_buffer_are_counted_without_an_outage(
    tmp_path: Path, writer_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that adds more rows between two flushes than a buffer holds: the oldest go,
    and the next flush says how many."""
    monkeypatch.setattr(writer_module, "MAX_BUFFERED_SAMPLES", 10)
    monkeypatch.setattr(writer_module, "MAX_BUFFERED_EVENTS", 3)
    home = tmp_path / "h"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"])
    writer = writer_for(home, run_id)
    for i in range(15):
        writer.add_sample(100.0 + i, "job", "n", float(i))
    for i in range(5):
        writer.log("info", "job", f"line {i}")
    writer.flush()
    with RunStore(home) as store:
        assert store.samples(run_id)["value"].tolist() == [float(i) for i in range(5, 15)]
        events = store.events(run_id)
        assert events[events["source"] == "job"]["message"].tolist() == [
            "line 2",
            "line 3",
            "line 4",
        ]
        assert _writer_events(store, run_id) == [
            ("warning", "5 samples, 2 events and 0 steps dropped (buffers full)")
        ]


def test_a_version_8_store_loses_its_duplicate_rows_and_gains_the_keys(
    tmp_path: Path, store_backend: str
) -> None:
    """Rows an older writer wrote twice are removed by the migration (else its unique
    keys could not be made), and from then on a row written twice lands once."""
    home = tmp_path / "h"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"])
        for index in ("samples_key", "events_key", "artifacts_key"):
            store._db.execute(f"DROP INDEX {index}")
        store._db.execute("ALTER TABLE runs DROP COLUMN signature")
        store._db.execute("UPDATE meta SET value='8' WHERE key='schema_version'")
        old_rows = {
            "samples(run_id, t, scope, metric, value, host)": [
                (run_id, 1.0, "proc", "rss_bytes", 5.0, None),
                (run_id, 1.0, "proc", "rss_bytes", 5.0, None),  # a retried flush's copy
                (run_id, 1.0, "proc", "rss_bytes", 6.0, "node-b"),  # another host's
            ],
            "events(run_id, t, rank, level, source, message)": [
                (run_id, 2.0, None, "info", "launcher", "started"),
                (run_id, 2.0, None, "info", "launcher", "started"),
                (run_id, 3.0, 0, "info", "capture", "captured"),
                (run_id, 3.0, 0, "info", "capture", "captured"),
                (run_id, 3.0, 1, "info", "capture", "captured"),  # another rank's
            ],
            # the old writer stamped created_at at insert: its copy has a later time
            "artifacts(run_id, kind, path, rank, created_at, meta)": [
                (run_id, "trace", "/a.json", 0, 4.0, '{"steps": [1]}'),
                (run_id, "trace", "/a.json", 0, 5.0, '{"steps": [1]}'),
                (run_id, "trace", "/a.json", 0, 6.0, '{"steps": [9]}'),  # captured again
                (run_id, "trace", "/b.json", 0, 4.0, "{}"),
            ],
        }
        for table, rows in old_rows.items():
            marks = ", ".join("?" * len(rows[0]))
            store._db.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)

    with RunStore(home) as store:
        version = store._db.scalar("SELECT value FROM meta WHERE key='schema_version'")
        assert version == str(SCHEMA_VERSION)
        assert store._db.scalar("SELECT COUNT(*) FROM runs WHERE signature IS NULL") == 1
        samples = store.samples(run_id)
        assert sorted(samples[["value", "host"]].fillna("-").values.tolist()) == [
            [5.0, "-"],
            [6.0, "node-b"],
        ]
        events = store.events(run_id)
        assert sorted(events["rank"].fillna(-1).tolist()) == [-1, 0, 1]
        artifacts = store.artifacts(run_id)
        assert artifacts[["path", "created_at"]].values.tolist() == [
            ["/a.json", 4.0],
            ["/a.json", 6.0],
            ["/b.json", 4.0],
        ]
        # the keys hold from now on
        store.add_samples(run_id, [(1.0, "proc", "rss_bytes", 5.0)])
        store.log_event(run_id, "info", "launcher", "started", t=2.0)
        store.add_artifact(run_id, "trace", "/b.json", created_at=4.0)
        assert len(store.samples(run_id)) == 2 and len(store.events(run_id)) == 3
        assert len(store.artifacts(run_id)) == 3
