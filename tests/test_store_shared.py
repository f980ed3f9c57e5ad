"""The store URL and what a store shared by many hosts needs: one run per multi-node
job (members, ranks, a race to create it), liveness judged only on the own host, and
PostgreSQL's types (unix seconds kept to the microsecond)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stepscope.store import RunStore, StoreError, redacted, resolve_store_url

REPO = Path(__file__).resolve().parents[1]


# -- the URL ---------------------------------------------------------------------------
def test_store_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    default = resolve_store_url(home)
    assert (default.backend, default.path) == ("sqlite", home / "stepscope.db")

    (tmp_path / "shared").mkdir()
    folder = resolve_store_url(home, tmp_path / "shared")  # a folder: its stepscope.db
    assert folder.path == tmp_path / "shared" / "stepscope.db"
    file_url = resolve_store_url(home, f"sqlite:///{tmp_path}/x.db")
    assert file_url.backend == "sqlite" and file_url.path == tmp_path / "x.db"

    pg = resolve_store_url(home, "postgres://ann:s3cret@db.example:5433/runs")
    assert pg.backend == "postgresql" and pg.path is None
    assert pg.sqlalchemy == "postgresql+psycopg://ann:s3cret@db.example:5433/runs"
    assert pg.display == "postgresql://ann:***@db.example:5433/runs"

    monkeypatch.setenv("STEPSCOPE_STORE", "postgresql://bob@h/db")
    assert resolve_store_url(home).display == "postgresql://bob@h/db"  # the env var
    assert resolve_store_url(home, "sqlite:///a.db").backend == "sqlite"  # url= wins


def test_redacted_hides_passwords_only() -> None:
    assert redacted("postgresql://u:pw@h:5/db?sslmode=require") == (
        "postgresql://u:***@h:5/db?sslmode=require"
    )
    assert redacted("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redacted("/home/u/.stepscope/stepscope.db") == "/home/u/.stepscope/stepscope.db"
    assert redacted("postgresql://u:p%40ss@h/db") == "postgresql://u:***@h/db"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mysql://u@h/db", "unknown scheme 'mysql'"),
        ("postgresql://u:topsecret@h", "name the database"),
        ("sqlite://", "give a file"),
    ],
)
def test_bad_store_url_is_one_line(tmp_path: Path, url: str, problem: str) -> None:
    with pytest.raises(StoreError) as err:
        RunStore(tmp_path, url=url)
    message = str(err.value)
    assert problem in message and "\n" not in message and "topsecret" not in message


def test_unreachable_server_is_one_line_without_password(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once released
    started = time.monotonic()
    with pytest.raises(StoreError) as err:
        RunStore(tmp_path, url=f"postgresql://u:topsecret@127.0.0.1:{port}/db")
    message = str(err.value)
    assert message.startswith(f"postgresql://u:***@127.0.0.1:{port}/db: cannot open the run store")
    assert "\n" not in message and "topsecret" not in message
    assert time.monotonic() - started < 15  # the connect timeout, not TCP's minutes


def test_postgresql_store_keeps_types(tmp_path: Path, pg_url: str) -> None:
    """Unix seconds survive to the microsecond (REAL would be float4 on PostgreSQL)."""
    t = 1_790_000_000.123456
    with RunStore(tmp_path, url=pg_url) as store:
        assert store.backend == "postgresql" and store.db_path is None
        run_id = store.create_run(["python", "t.py"], pid_started_at=t)
        store.add_steps(run_id, [{"step": 0, "start_s": t, "end_s": t + 0.000_5, "loss": 0.25}])
        store.add_samples(run_id, [(t, "proc", "rss_bytes", 12_345_678_901.0)], host="node-b")
        assert store.run(run_id)["pid_started_at"] == t
        step = store.steps(run_id).iloc[0]
        assert (step["start_s"], step["end_s"], step["loss"]) == (t, t + 0.000_5, 0.25)
        sample = store.samples(run_id).iloc[0]
        assert (sample["t"], sample["value"], sample["host"]) == (t, 12_345_678_901.0, "node-b")


def test_postgresql_version_6_store_is_migrated(tmp_path: Path, pg_url: str) -> None:
    """Version 7 rebuilds the steps table (the worker joins its key) on PostgreSQL too:
    rows kept, unix seconds still double precision, two workers' step 0 side by side."""
    from stepscope.store.schema import DDL, ddl_for

    t = 1_790_000_000.123456
    v6_steps = re.search(r"CREATE TABLE IF NOT EXISTS steps \(.*?\n\);", DDL, re.S).group(0)
    v6_steps = v6_steps.replace("(run_id, rank, worker, step)", "(run_id, rank, step)")
    v6_steps = "\n".join(
        ln
        for ln in v6_steps.splitlines()
        if not ln.strip().startswith(("worker", "-- 0:", "-- (a"))
    )
    with RunStore(tmp_path, url=pg_url) as store:
        run_id = store.create_run(["python", "t.py"])
        with store._db.begin() as conn:
            store._db.script(conn, "DROP TABLE steps;\n" + ddl_for("postgresql", v6_steps))
            store._db.script(conn, "ALTER TABLE runs DROP COLUMN signature;")  # version 9's
            store._db.script(conn, "UPDATE meta SET value='6' WHERE key='schema_version';")
            store._db.script(
                conn,
                "INSERT INTO steps(run_id, step, start_s, end_s, kind)"
                f" VALUES ({run_id}, 0, {t!r}, {t + 1!r}, 'optimizer');",
            )
    with RunStore(tmp_path, url=pg_url) as store:
        store.add_steps(run_id, [{"step": 0, "worker": 1, "start_s": t, "end_s": t + 0.5}])
        steps = store.steps(run_id)
        assert steps[["worker", "step"]].values.tolist() == [[0, 0], [1, 0]]
        assert steps["start_s"].tolist() == [t, t]


# -- members and ranks -------------------------------------------------------------------
def test_last_member_finalises_the_run_with_the_worst_status(
    tmp_path: Path, store_backend: str
) -> None:
    with RunStore(tmp_path) as store:
        run_id, created = store.join_or_create_run(["torchrun", "t.py"], run_group="job-1")
        assert created and store.run(run_id)["run_group"] == "job-1"
        assert store.join_or_create_run(["torchrun", "t.py"], run_group="job-1") == (
            run_id,
            False,
        )
        a = store.add_member(run_id, host="node-a", pid=11, pid_started_at=1.0, node_rank=0)
        b = store.add_member(run_id, host="node-b", pid=12, pid_started_at=1.0, node_rank=1)
        c = store.add_member(run_id, host="node-c", pid=13, pid_started_at=1.0, node_rank=2)
        assert store.finish_member(b, "failed", exit_code=3, error="RuntimeError: boom") is False
        assert store.run(run_id)["status"] == "running"
        assert store.finish_member(a, "completed", exit_code=0) is False
        assert store.finish_member(c, "killed", exit_code=-9) is True
        run = store.run(run_id)
        assert (run["status"], run["exit_code"], run["error"]) == (
            "failed",
            3,
            "RuntimeError: boom",
        )
        assert store.finish_member(c, "completed") is False  # already finished: no change
        members = store.members(run_id)
        assert members["node_rank"].tolist() == [0, 1, 2]
        assert members["status"].tolist() == ["completed", "failed", "killed"]
        # a finished group starts afresh: the next job of that key is a new run
        assert store.join_or_create_run(["torchrun", "t.py"], run_group="job-1")[1] is True


def test_ranks_are_upserted(tmp_path: Path, store_backend: str) -> None:
    with RunStore(tmp_path) as store:
        run_id = store.create_run(["x"])
        store.register_rank(run_id, 1, "node-b", 100)
        store.register_rank(run_id, 0, "node-a", 200)
        store.register_rank(run_id, 1, "node-c", 300)  # rank 1 restarted elsewhere
        ranks = store.ranks(run_id)
    assert ranks[["rank", "host", "pid"]].values.tolist() == [
        [0, "node-a", 200],
        [1, "node-c", 300],
    ]


_RACER = """
import json, sys, time
from stepscope.store import RunStore
start = float(sys.argv[1])
with RunStore(sys.argv[2]) as store:
    time.sleep(max(0.0, start - time.time()))
    print(json.dumps([
        store.join_or_create_run(["torchrun", "t.py"], run_group=f"race-{i}")
        for i in range(int(sys.argv[3]))
    ]))
"""


def test_launchers_racing_end_in_one_run(tmp_path: Path, store_backend: str) -> None:
    """Processes (separate connections, as on separate nodes) ask for the runs of the
    same groups at the same instant: for each group one creates it, all get it."""
    home = tmp_path / "h"
    groups = 40
    RunStore(home).close()  # the schema exists, as when the first node got there
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, repr(start), str(home), str(groups)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(4)
    ]
    answers = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    for group in range(groups):
        runs = {answer[group][0] for answer in answers}
        created = sorted(answer[group][1] for answer in answers)
        assert len(runs) == 1 and created == [False, False, False, True], group
    with RunStore(home) as store:
        assert len(store.runs()) == groups


_HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("CREATE TABLE IF NOT EXISTS other(x)")  # the file exists, not yet in WAL mode
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(1.0)
db.execute("COMMIT")
"""


def test_a_new_sqlite_store_locked_by_another_process_is_waited_for(tmp_path: Path) -> None:
    """Another process holds a write lock on a store file that is not in WAL mode yet
    (two launchers opening a new store together: the first is creating it). SQLite
    answers the switch to WAL with "database is locked" at once, without the busy
    handler; the store waits for the lock as it waits for any other, then opens."""
    home = tmp_path / "h"
    home.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(home / "stepscope.db")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with RunStore(home) as store:  # before the fix: StoreError "database is locked"
            store.create_run(["python", "t.py"])
            assert len(store.runs()) == 1
    finally:
        holder.wait(timeout=30)
    assert holder.returncode == 0


def _dead_pid() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, started


def test_liveness_is_judged_only_on_the_own_host(tmp_path: Path, store_backend: str) -> None:
    """A shared store is read from many hosts: rows of another host are never lost here;
    a run with members is lost when its members here are gone and none runs elsewhere."""
    dead, dead_started = _dead_pid()
    here = socket.gethostname()
    with RunStore(tmp_path) as store:
        elsewhere = store.create_run(["a"], pid=dead, pid_started_at=dead_started)
        store.update_run(elsewhere, host="another-host")
        mixed, _ = store.join_or_create_run(["b"], run_group="mixed")
        m_here = store.add_member(mixed, host=here, pid=dead, pid_started_at=dead_started)
        store.add_member(mixed, host="another-host", pid=dead, pid_started_at=dead_started)
        local, _ = store.join_or_create_run(["c"], run_group="local")
        store.add_member(local, host=here, pid=dead, pid_started_at=dead_started)
        store.add_member(local, host=here, pid=dead, pid_started_at=dead_started)

        runs = store.runs().set_index("id")
        assert runs.loc[elsewhere, "status"] == "running"
        assert runs.loc[mixed, "status"] == "running"  # its other member may still run
        assert runs.loc[local, "status"] == "lost"
        members = store.members(mixed).set_index("id")
        assert members.loc[m_here, "status"] == "lost"  # judged here: its process is gone
        assert (members["host"] == "another-host").sum() == 1
        assert members[members["host"] == "another-host"]["status"].tolist() == ["running"]
        assert store.reconcile() == 0


def test_experiment_of_another_host_is_not_failed(tmp_path: Path, store_backend: str) -> None:
    dead, dead_started = _dead_pid()
    with RunStore(tmp_path) as store:
        run_id = store.create_run(["x"])
        mine = store.create_experiment(run_id, pid=dead, pid_started_at=dead_started)
        theirs = store.create_experiment(run_id, pid=dead, pid_started_at=dead_started)
        store._db.execute("UPDATE experiments SET host='another-host' WHERE id=:i", {"i": theirs})
        assert store.experiment(mine)["status"] == "failed"
        assert store.experiment(theirs)["status"] == "running"


def test_store_env_var_reaches_a_child_process(tmp_path: Path, pg_url: str) -> None:
    """A job's writer finds the store through $STEPSCOPE_STORE, as `--store` sets it."""
    code = (
        "from stepscope.store import BufferedWriter, RunStore\n"
        "import sys\n"
        "with RunStore(sys.argv[1]) as s:\n"
        "    rid = s.create_run(['child'])\n"
        "w = BufferedWriter(sys.argv[1], rid)\n"
        "w.add_step({'step': 0, 'start_s': 1.0, 'end_s': 2.0})\n"
        "w.register_rank(0, 'node-a', 7)\n"
        "w.close()\n"
        "print(rid)\n"
    )
    env = {**os.environ, "STEPSCOPE_STORE": pg_url}
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "h")],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    with RunStore(tmp_path / "other-home", url=pg_url) as store:
        run_id = int(res.stdout)
        assert store.run(run_id)["name"] == "child"
        assert len(store.steps(run_id)) == 1
        assert store.ranks(run_id)["host"].tolist() == ["node-a"]
    assert not (tmp_path / "h" / "stepscope.db").exists()  # the home stays files only


@pytest.mark.slow
def test_cli_store_option_records_and_lists_without_the_password(
    tmp_path: Path, pg_url: str
) -> None:
    """`stepscope --store URL run` records into the server (the job's writer and sampler
    inherit the URL), `runs` and `show` read it back, and the password (the test server
    trusts any) is in no output and no row."""
    url = pg_url.replace("postgres@", "postgres:topsecret@")
    job = tmp_path / "train.py"
    job.write_text(
        "import torch\nm = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(5):\n    opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
    )
    cli = [sys.executable, "-m", "stepscope.app.cli", "--store", url]
    outputs = []
    for args in (["run", "--", sys.executable, str(job)], ["runs"], ["show", "last"]):
        res = subprocess.run([*cli, *args], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert res.returncode == 0, res.stderr
        outputs.append(res.stdout + res.stderr)
    assert "train" in outputs[1] and "completed" in outputs[1]
    assert "completed" in outputs[2]
    assert all("topsecret" not in out for out in outputs)
    with RunStore(tmp_path / "h", url=pg_url) as store:
        run = store.run(store.resolve_run("last"))
        assert len(store.steps(run["id"])) == 5
        assert run["env"]["store"] == url.replace("topsecret", "***")
        dump = json.dumps(store.runs().astype(str).to_dict()) + store.events(run["id"]).to_json()
    assert "topsecret" not in dump
    assert not (tmp_path / "h" / "stepscope.db").exists()
