"""Eight jobs writing to one store at once, one of them killed with SIGKILL.

Every other job's steps must all be there; the killed one's up to about a second
before the kill (the writer commits about once a second: that is the promise). Real
processes, each with its own BufferedWriter, as the ranks of jobs on several hosts
would write to a shared PostgreSQL store (and, for comparison, to one SQLite file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "jobs" / "record_steps.py"
JOBS = 8
STEPS = 300  # at 10 ms each: about 3 s of steps per job
KILL_AFTER_S = 1.5  # after the victim's first commit
FLUSH_SLACK_S = 1.5  # the writer's interval (1 s) plus a loaded machine's lag


def test_eight_writers_one_killed(tmp_path: Path, store_backend: str) -> None:
    home = tmp_path / "h"
    with RunStore(home) as store:
        runs = [
            store.create_run(["python", "record_steps.py"], name=f"job{i}") for i in range(JOBS)
        ]
    victim_at = 3
    procs = [
        subprocess.Popen(
            # the victim would go on for minutes: it ends by the kill
            [
                sys.executable,
                str(JOB),
                str(home),
                str(run_id),
                "0",
                str(STEPS * 100 if i == victim_at else STEPS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for i, run_id in enumerate(runs)
    ]
    victim = procs[victim_at]
    with RunStore(home) as store:
        # the promise holds once the job's writer is up: wait for its first commit
        deadline = time.monotonic() + 60
        while store.steps(runs[victim_at]).empty and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(KILL_AFTER_S)
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    outputs = [p.communicate(timeout=120) for p in procs]

    assert victim.returncode == -signal.SIGKILL
    with RunStore(home) as store:
        for i, (proc, (out, err), run_id) in enumerate(zip(procs, outputs, runs, strict=True)):
            steps = store.steps(run_id)
            if proc is victim:
                assert steps["step"].tolist() == list(range(len(steps)))  # no gaps
                assert steps["end_s"].max() <= killed_at
                lost_s = killed_at - steps["end_s"].max()
                assert lost_s <= FLUSH_SLACK_S, f"the killed job lost its last {lost_s:.2f} s"
            else:
                assert proc.returncode == 0, err
                assert "done" in out and "cannot write" not in err, (i, err)
                assert steps["step"].tolist() == list(range(STEPS)), i
                assert steps["loss"].iloc[-1] == 1.0 / STEPS
