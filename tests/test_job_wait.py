"""The launcher's wait: a job ends by itself, at its time limit, or when it stops stepping.

Real child processes; the step count is what the store would answer at each poll.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from stepscope.collectors.launch.job_wait import Progress, wait_for_job

SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, start_new_session=True)  # ended as a group


def _counts(*values: int, ending_from: int | None = None) -> Callable[[], Progress]:
    """Each poll gets the next step count; the last one repeats. From the poll that
    first reads ``ending_from`` steps on, the job says it is ending."""
    left = list(values)

    def poll() -> Progress:
        steps = left.pop(0) if len(left) > 1 else left[0]
        return Progress(steps, ending_from is not None and steps >= ending_from)

    return poll


def test_a_job_that_stops_stepping_is_ended_as_a_stall() -> None:
    child = _start(SLEEPER)
    started = time.monotonic()
    end = wait_for_job(child, timeout_s=120, stall_s=2, progress=_counts(0, 1, 2, 3))
    assert (end.ended_for, end.steps) == ("stall", 3)
    assert end.returncode < 0 and child.poll() is not None  # killed, not left behind
    assert time.monotonic() - started < 60  # long before the time limit


def test_a_job_that_said_it_is_ending_is_left_to_its_time_limit() -> None:
    # an error or the step limit is in its row: leaving the interpreter (torch's
    # teardown, the last flush) is not a stall, however long it takes on a busy machine
    child = _start(SLEEPER)
    end = wait_for_job(child, timeout_s=6, stall_s=1, progress=_counts(0, 1, 3, ending_from=3))
    assert (end.ended_for, end.steps) == ("timeout", 3)


def test_no_step_yet_is_start_up_not_a_stall() -> None:
    # a job still importing, loading data or compiling has recorded nothing: only the
    # time limit ends it
    child = _start(SLEEPER)
    end = wait_for_job(child, timeout_s=4, stall_s=1, progress=_counts(0))
    assert (end.ended_for, end.steps) == ("timeout", 0)


def test_a_job_that_keeps_stepping_or_ends_is_left_alone() -> None:
    steps = iter(range(1, 1000))
    child = _start([sys.executable, "-c", "import time; time.sleep(4)"])
    end = wait_for_job(child, timeout_s=120, stall_s=2, progress=lambda: Progress(next(steps)))
    assert (end.returncode, end.ended_for) == (0, None)


def test_a_failing_store_read_does_not_end_the_job() -> None:
    def broken() -> Progress:
        raise OSError("database is locked")

    child = _start([sys.executable, "-c", "raise SystemExit(3)"])
    end = wait_for_job(child, timeout_s=120, stall_s=1, progress=broken)
    assert (end.returncode, end.ended_for) == (3, None)
