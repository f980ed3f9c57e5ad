"""24 jobs recording at once into one store, through the real bootstrap (``launch_run``
of a small torch job, ``tests/jobs/count_steps.py``): one is SIGKILLed mid-run and one
loses its store for a while. Every step, sample and artifact each job says it made is in
the store exactly once; the killed job keeps everything it had committed.

How the store goes away: on PostgreSQL, that one job reaches the server through a TCP
proxy that is cut for 10 s (the other jobs, and its launcher, keep their own way in).
On SQLite there is no server to lose: the test holds the file's write lock for 15 s,
as a long write by another process would (a backup, a migration). Every job's writer
waits its 10 s busy timeout and fails, so all 24 lose their store, not one; the lock is
held past that timeout so that the failure, not only the wait, is exercised.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from tcp_proxy import TcpProxy

from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "jobs" / "count_steps.py"
JOBS = 24
VICTIM, AWAY = 3, 7  # the job killed, the job whose store goes away
OUTAGE_S = 10.0  # PostgreSQL: the proxy is cut this long
SQLITE_LOCK_S = 15.0  # past the writers' 10 s busy timeout (db.BUSY_TIMEOUT_MS)
START_TIMEOUT_S = 600  # 24 torch imports on a 2-core machine
# One launcher: the job under the real bootstrap, its store URL replaced for one job;
# the system sampler every 5 s (24 of them sample the machine too).
LAUNCH = """
import sys
from stepscope.collectors.launch.launcher import launch_run
job, out, name, store = sys.argv[1:5]
launch_run([sys.executable, job, out, name], name=name, quiet=True, sample_interval=5.0,
           extra_env={"STEPSCOPE_STORE": store} if store else None)
"""


def _recording(home: Path, names: list[str]) -> dict[str, int]:
    """Wait until every job has committed a step; the run id of each."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with RunStore(home) as store:
        while True:
            rows = store._db.rows(
                "SELECT r.name, r.id, (SELECT COUNT(*) FROM steps s WHERE s.run_id = r.id) AS n"
                " FROM runs r"
            )
            if sum(1 for r in rows if r["n"] > 0) == len(names):
                return {r["name"]: int(r["id"]) for r in rows}
            assert time.monotonic() < deadline, f"jobs not recording: {rows}"
            time.sleep(0.5)


def _store_away(backend: str, home: Path, proxy: TcpProxy | None) -> None:
    if proxy is not None:
        proxy.cut()
        time.sleep(OUTAGE_S)
        proxy.restore()
        return
    conn = sqlite3.connect(home / "stepscope.db", isolation_level=None, timeout=60)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        time.sleep(SQLITE_LOCK_S)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _writer_lines(store: RunStore, run_id: int) -> list[str]:
    events = store.events(run_id)
    return events[events["source"] == "writer"]["message"].tolist()


def _wait_for_writer_line(home: Path, run_ids: list[int]) -> None:
    """A job whose store went away has written again (its writer's report landed)."""
    deadline = time.monotonic() + 120
    with RunStore(home) as store:
        while not any(_writer_lines(store, run_id) for run_id in run_ids):
            assert time.monotonic() < deadline, "no writer came back"
            time.sleep(0.5)


@pytest.mark.slow
def test_24_jobs_record_every_row_exactly_once(
    tmp_path: Path, store_backend: str, _isolated_store: Path
) -> None:
    home, out = _isolated_store, tmp_path / "out"
    out.mkdir()
    names = [f"job{i:02d}" for i in range(JOBS)]
    proxy = None
    if store_backend == "postgresql":
        url = os.environ["STEPSCOPE_STORE"]
        proxy = TcpProxy(urlsplit(url).port or 5432).start()
    launchers = {
        name: subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(JOB), str(out), name,
             proxy.url(url) if proxy is not None and i == AWAY else ""],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )
        for i, name in enumerate(names)
    }  # fmt: skip
    victim, away = names[VICTIM], names[AWAY]
    try:
        runs = _recording(home, names)
        with RunStore(home) as store:
            committed = store.step_count(runs[victim])[0]
        os.kill(int((out / f"{victim}.pid").read_text()), signal.SIGKILL)
        launchers[victim].wait(timeout=120)  # the run is finalised before the outage
        _store_away(store_backend, home, proxy)
        _wait_for_writer_line(home, [runs[away]] if proxy else list(runs.values()))
    finally:
        (out / "stop").touch()
        outputs = {name: p.communicate(timeout=300) for name, p in launchers.items()}
        if proxy is not None:
            proxy.close()

    reported = 0
    with RunStore(home) as store:
        for name in names:
            run_id, (_, err) = runs[name], outputs[name]
            run = store.run(run_id)
            steps = store.steps(run_id)["step"].tolist()
            samples = store.samples(run_id)
            values = sorted(samples[samples["scope"] == "job"]["value"].astype(int))
            artifacts = store.artifacts(run_id)
            notes = artifacts[artifacts["kind"] == "job_note"]
            noted = sorted(m["step"] for m in notes["meta"])
            writer_lines = _writer_lines(store, run_id)
            reported += len(writer_lines)
            if name == victim:
                assert run["status"] == "killed", (name, run["status"], err)
                assert len(steps) >= committed  # nothing committed was lost
                assert steps == list(range(len(steps)))  # each step once, no gaps
                assert values == list(range(len(values)))  # each sample once, no gaps
                assert noted == list(range(0, len(noted) * 10, 10))
                continue
            said = json.loads((out / f"{name}.json").read_text())
            assert launchers[name].returncode == 0 and "Traceback" not in err, (name, err)
            assert run["status"] == "completed", (name, run["status"])
            assert steps == list(range(said["steps"])), name
            assert values == list(range(said["samples"])), name
            assert noted == list(range(0, said["artifacts"] * 10, 10)), name
            assert notes["path"].is_unique and len(notes) == said["artifacts"]
            assert len(writer_lines) <= 1, (name, writer_lines)
            for line in writer_lines:  # the store came back before any buffer was full
                assert line.startswith("the store was unreachable for "), line
                assert line.endswith(": nothing was dropped"), line
            if name == away or store_backend == "sqlite":
                assert err.count("cannot write to the run store") == len(writer_lines), err
            if name == away:
                assert len(writer_lines) == 1
            elif store_backend == "postgresql":
                assert writer_lines == [], name  # the others never lost their store
    assert reported >= 1  # the outage was real: a writer failed and said so
