"""The run store: WAL, run lifecycle, reference resolution, liveness, corruption, writer."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from stepscope.store import BufferedWriter, RunNotFound, RunStore, StoreError
from stepscope.store.schema import SCHEMA_VERSION
from stepscope.types import Finding


def _dead_pid() -> tuple[int, float]:
    """A pid and create time of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, started


def test_database_is_in_wal_mode(_isolated_store: Path) -> None:
    with RunStore() as store:
        store.create_run(["python", "train.py"])
        db = store.db_path
    assert db == _isolated_store / "stepscope.db"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert int(version[0]) == SCHEMA_VERSION
    finally:
        conn.close()


def test_create_finish_and_resolve(tmp_path: Path, store_backend: str) -> None:
    with RunStore(tmp_path / "h") as store:
        first = store.create_run(["python", "train.py", "--lr", "0.1"], env={"python": "3.11"})
        second = store.create_run(["python", "-m", "pkg.main"], name="exp-b", max_steps=7)
        run = store.run(first)
        assert run["status"] == "running"
        assert run["name"] == "train"  # default name: the script
        assert run["command"] == ["python", "train.py", "--lr", "0.1"]
        assert run["env"] == {"python": "3.11"}
        assert (tmp_path / "h" / "runs" / str(first)).is_dir()
        assert store.run(second)["name"] == "exp-b"
        assert store.run(second)["max_steps"] == 7

        store.update_run(first, error="ValueError: boom")
        store.finish_run(first, "failed", exit_code=1)
        done = store.run(first)
        assert (done["status"], done["exit_code"]) == ("failed", 1)
        assert done["error"] == "ValueError: boom"  # kept: the job's own error line
        assert done["ended_at"] >= done["started_at"]

        assert store.resolve_run(str(first)) == first
        assert store.resolve_run(first) == first
        assert store.resolve_run("exp-b") == second
        assert store.resolve_run("last") == second
        third = store.create_run(["python", "-m", "pkg.main"])
        assert store.resolve_run(" pkg.main ") == third  # default name: the -m module
        assert store.resolve_run("latest") == third
        with pytest.raises(RunNotFound):
            store.resolve_run("nope")
        with pytest.raises(RunNotFound):
            store.resolve_run("999")

        listed = store.runs()
        assert list(listed["id"]) == [third, second, first]  # newest first
        assert list(listed["steps"]) == [0, 0, 0]


def test_resolve_last_on_empty_store(tmp_path: Path, store_backend: str) -> None:
    with RunStore(tmp_path / "h") as store, pytest.raises(RunNotFound):
        store.resolve_run("last")


def test_reconcile_marks_run_of_dead_launcher_lost(tmp_path: Path, store_backend: str) -> None:
    pid, started = _dead_pid()
    me = psutil.Process()
    with RunStore(tmp_path / "h") as store:
        dead = store.create_run(["python", "a.py"], pid=pid, pid_started_at=started)
        store.add_steps(dead, [{"step": 0, "start_s": 10.0, "end_s": 11.5}])
        alive = store.create_run(["python", "b.py"], pid=me.pid, pid_started_at=me.create_time())
        # our own pid, but another process's create time: a reused pid is not our launcher
        reused = store.create_run(["python", "c.py"], pid=me.pid, pid_started_at=1000.0)

        runs = store.runs().set_index("id")
        assert runs.loc[dead, "status"] == "lost"
        assert runs.loc[dead, "ended_at"] == 11.5  # the last recorded step
        assert "launcher vanished" in runs.loc[dead, "error"]
        assert runs.loc[alive, "status"] == "running"
        assert runs.loc[reused, "status"] == "lost"
        assert store.reconcile() == 0  # idempotent


def test_corrupt_database_gives_store_error_naming_the_file(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    db = home / "stepscope.db"
    db.write_bytes(b"this is not a sqlite database, just junk" * 100)
    with pytest.raises(StoreError) as err:
        RunStore(home)
    assert str(db) in str(err.value)


def test_newer_schema_is_refused(tmp_path: Path, store_backend: str) -> None:
    home = tmp_path / "h"
    with RunStore(home) as store:
        store._db.execute(
            "UPDATE meta SET value=:v WHERE key='schema_version'", {"v": str(SCHEMA_VERSION + 1)}
        )
    with pytest.raises(StoreError, match="newer"):
        RunStore(home)


def test_writer_flushes_within_a_second_from_another_thread(
    tmp_path: Path, store_backend: str
) -> None:
    home = tmp_path / "h"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "t.py"])
    writer = BufferedWriter(home, run_id)  # default interval: about once a second
    try:
        added = time.time()

        def produce() -> None:
            for i in range(5):
                writer.add_step({"step": i, "start_s": added + i, "end_s": added + i + 1})
            writer.add_sample(added, "proc", "cpu_percent", 50.0)
            writer.log("info", "test", "hello")
            writer.update_run(stop_reason="max_steps")

        t = threading.Thread(target=produce)
        t.start()
        t.join()
        with RunStore(home) as reader:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and len(reader.steps(run_id)) < 5:
                time.sleep(0.05)
            seen_after = time.time() - added
            assert len(reader.steps(run_id)) == 5
            assert seen_after < 2.5, f"rows took {seen_after:.2f}s to reach the store"
            assert len(reader.samples(run_id)) == 1
            assert list(reader.events(run_id)["message"]) == ["hello"]
            assert reader.run(run_id)["stop_reason"] == "max_steps"
    finally:
        writer.close()


def test_writer_close_commits_the_rest(tmp_path: Path, store_backend: str) -> None:
    home = tmp_path / "h"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "t.py"])
    writer = BufferedWriter(home, run_id, interval_s=60.0)  # the thread will not flush
    writer.add_step({"step": 0, "start_s": 1.0, "end_s": 2.0, "loss": 0.5})
    writer.close()
    with RunStore(home) as reader:
        steps = reader.steps(run_id)
    assert list(steps["loss"]) == [0.5]


def test_samples_wide_has_one_column_per_scope_metric(tmp_path: Path, store_backend: str) -> None:
    with RunStore(tmp_path / "h") as store:
        run_id = store.create_run(["x"])
        store.add_samples(
            run_id,
            [
                (1.0, "proc", "cpu_percent", 90.0),
                (1.0, "system", "cpu_percent", 50.0),
                (2.0, "proc", "cpu_percent", 80.0),
            ],
        )
        wide = store.samples(run_id, wide=True)
    assert sorted(wide.columns) == ["proc.cpu_percent", "system.cpu_percent"]
    assert wide.loc[2.0, "proc.cpu_percent"] == 80.0


# Lines of the DDL that version 4 added (the phases of a step, a finding's phase).
V4_LINES = ("forward_s", "backward_s", "optimizer_s", "phase ", "-- phases,", "-- recorded (a")
# ... and version 5 (who started a run, its group, a sample's host; the new tables are
# created by the DDL whatever the version, so they may stay).
V5_LINES = ('"user"', "run_group", "-- shared key", "host    TEXT")
# ... and version 7 (a step's worker, in the steps' primary key).
V7_LINES = ("worker       INTEGER", "-- 0: the rank's own process", "-- (a hogwild worker")
# ... and version 9 (a run's signature).
V9_LINES = ("signature", "-- (app/trust.py)")


def _v6_steps(ddl: str) -> str:
    """The steps table as versions up to 6 keyed it: one row per (run, rank, step)."""
    return ddl.replace(
        "PRIMARY KEY (run_id, rank, worker, step)", "PRIMARY KEY (run_id, rank, step)"
    )


def _old_ddl(*added: str, upto: str | None = None) -> str:
    """The DDL as an older release wrote it: without the lines that start with ``added``
    (and only up to ``upto``), and without the comma left before a table's end."""
    from stepscope.store.schema import DDL

    text = _v6_steps(DDL.split(upto)[0] if upto else DDL)
    added = (*added, *V7_LINES, *V9_LINES)
    kept = "\n".join(ln for ln in text.splitlines() if not ln.strip().startswith(added))
    return re.sub(r",((?:\s*--[^\n]*)*\n\))", r"\1", kept)


def test_version_1_store_is_migrated(tmp_path: Path) -> None:
    """A store written by the first release gains the facts column and findings table."""
    v1_ddl = _old_ddl(
        "facts", "-- optimizer, model", *V4_LINES, *V5_LINES, upto="-- The diagnosis of a run"
    )
    assert " facts " not in v1_ddl and "forward_s" not in v1_ddl
    tmp_path.mkdir(exist_ok=True)
    with sqlite3.connect(tmp_path / "stepscope.db") as conn:
        conn.executescript(v1_ddl)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute(
            "INSERT INTO runs(name, command, cwd, started_at, host) VALUES ('old', '[]', '/', 1, 'h')"
        )
    with RunStore(tmp_path) as store:
        run = store.run(1)
        assert run["facts"] == {}
        store.merge_run_json(1, "facts", {"dataloader": {"num_workers": 0}})
        store.save_findings(
            1,
            [
                Finding.from_json(
                    {
                        "class": "io",
                        "subtype": "input_pipeline",
                        "title": "t",
                        "share": 0.4,
                        "confidence": 0.9,
                        "evidence": [{"text": "x"}],
                        "fixes": [{"id": "f"}],
                        "level": "steps",
                    }
                )
            ],
        )
        assert store.run(1)["facts"]["dataloader"]["num_workers"] == 0
        (found,) = store.findings(1)
        assert [e.text for e in found.evidence] == ["x"] and found.level == "steps"
        assert store.top_findings()[1].subtype == "input_pipeline"
        # v3: the stack tables of `stepscope attach`
        store.add_stack_samples(1, 0.0, 5.0, [(7, 7, "MainThread", "main (t.py:1)", 3)])
        assert store.stack_samples(1)["samples"].tolist() == [3]
        # v4: the phases of a step, a finding's phase
        store.add_steps(1, [{"step": 0, "start_s": 0.0, "end_s": 1.0, "forward_s": 0.25}])
        row = store.steps(1).iloc[0]
        assert row["forward_s"] == 0.25 and pd.isna(row["backward_s"])  # not given: NULL


def test_version_3_store_is_migrated(tmp_path: Path) -> None:
    """Steps recorded before the phases were keep NULL phases (unknown, not 0); new steps
    get theirs; findings keep their rows and gain the ``phase`` column."""
    v3_ddl = _old_ddl(*V4_LINES, *V5_LINES)
    assert "forward_s" not in v3_ddl and "phase " not in v3_ddl
    tmp_path.mkdir(exist_ok=True)
    with sqlite3.connect(tmp_path / "stepscope.db") as conn:
        conn.executescript(v3_ddl)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '3')")
        conn.execute(
            "INSERT INTO runs(name, command, cwd, started_at, host) VALUES ('old', '[]', '/', 1, 'h')"
        )
        conn.execute(
            "INSERT INTO steps(run_id, step, start_s, end_s, kind) VALUES (1, 0, 0, 1, 'optimizer')"
        )
        conn.execute(
            "INSERT INTO findings(run_id, position, class, subtype, title, share, confidence,"
            " level, created_at) VALUES (1, 0, 'io', 'input_pipeline', 'old', 0.4, 0.9,"
            " 'steps', 1)"
        )
    with RunStore(tmp_path) as store:
        store.add_steps(
            1,
            [
                {"step": 1, "start_s": 1.0, "end_s": 2.0, "data_wait_s": 0.1, "forward_s": 0.2,
                 "backward_s": 0.3, "optimizer_s": 0.25, "kind": "optimizer"},
            ],
        )  # fmt: skip
        steps = store.steps(1)
        assert steps[["forward_s", "backward_s", "optimizer_s"]].iloc[0].isna().all()
        assert steps[["forward_s", "backward_s", "optimizer_s"]].iloc[1].tolist() == [
            0.2,
            0.3,
            0.25,
        ]
        (found,) = store.findings(1)
        assert found.title == "old" and found.share == 0.4
    with sqlite3.connect(tmp_path / "stepscope.db") as conn:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(findings)")]
        assert columns[-1] == "phase"
        assert conn.execute("SELECT phase FROM findings").fetchall() == [(None,)]
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert int(version[0]) == SCHEMA_VERSION


def test_version_4_store_is_migrated(tmp_path: Path) -> None:
    """Version 5: runs gain their user and group, samples their host, and the members
    and ranks tables appear; the rows already there keep their values (NULL: unknown)."""
    v4_ddl = _old_ddl(*V5_LINES, upto="-- The launchers of one run")
    assert "run_group" not in v4_ddl and '"user"' not in v4_ddl
    tmp_path.mkdir(exist_ok=True)
    with sqlite3.connect(tmp_path / "stepscope.db") as conn:
        conn.executescript(v4_ddl)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '4')")
        conn.execute(
            "INSERT INTO runs(name, command, cwd, started_at, host) VALUES ('old', '[]', '/', 1, 'h')"
        )
        conn.execute(
            "INSERT INTO samples(run_id, t, scope, metric, value) VALUES (1, 1, 'p', 'm', 2)"
        )
    with RunStore(tmp_path) as store:
        old = store.run(1)
        assert old["user"] is None and old["run_group"] is None and old["name"] == "old"
        assert store.samples(1)["host"].isna().all()
        new = store.create_run(["python", "t.py"], run_group="job-7")
        assert store.run(new)["run_group"] == "job-7" and store.run(new)["user"]
        member = store.add_member(new, host="node-b", pid=1, pid_started_at=1.0, node_rank=1)
        assert store.members(new)["id"].tolist() == [member]
        store.register_rank(new, 3, "node-b", 42)
        assert store.ranks(new)[["rank", "host", "pid"]].values.tolist() == [[3, "node-b", 42]]
        # the partial unique index exists after the migration: one running run per group
        assert store.join_or_create_run(["python", "t.py"], run_group="job-7") == (new, False)
    with sqlite3.connect(tmp_path / "stepscope.db") as conn:
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert int(version[0]) == SCHEMA_VERSION
        indexes = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")]
        assert "runs_group_running" in indexes


def test_version_6_store_is_migrated(tmp_path: Path) -> None:
    """Version 7: steps gain their worker (0 for the rows already there) and the key
    holds it, so two training processes of one rank keep a step 0 each."""
    v6_ddl = _old_ddl()
    assert " worker " not in v6_ddl and "PRIMARY KEY (run_id, rank, step)" in v6_ddl
    tmp_path.mkdir(exist_ok=True)
    with sqlite3.connect(tmp_path / "stepscope.db") as conn:
        conn.executescript(v6_ddl)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '6')")
        conn.execute(
            "INSERT INTO runs(name, command, cwd, started_at, host) VALUES ('old', '[]', '/', 1, 'h')"
        )
        conn.execute(
            "INSERT INTO steps(run_id, step, start_s, end_s, kind, forward_s)"
            " VALUES (1, 0, 0, 1, 'optimizer', 0.5)"
        )
    with RunStore(tmp_path) as store:
        store.add_steps(
            1,
            [
                {"step": 0, "worker": 1, "start_s": 1.0, "end_s": 2.0},
                {"step": 0, "worker": 2, "start_s": 1.0, "end_s": 3.0},
            ],
        )
        store.add_steps(1, [{"step": 0, "worker": 2, "start_s": 1.0, "end_s": 2.5}])  # replaced
        store.delete_steps(1, 0, 0, worker=1)
        steps = store.steps(1)
        assert steps[["worker", "step", "end_s"]].values.tolist() == [[0, 0, 1.0], [2, 0, 2.5]]
        assert steps["forward_s"].iloc[0] == 0.5
        assert store.step_count(1) == (2, 1, 1)
    with sqlite3.connect(tmp_path / "stepscope.db") as conn:
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert int(version[0]) == SCHEMA_VERSION
