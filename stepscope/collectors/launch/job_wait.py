"""Waiting for the job: to its end, its time limit, or the moment it stops stepping.

A hung trial used to cost its whole time limit (by default five times the baseline's
trial): for a job of 10-minute trials that hangs at step 3, most of an hour. A job that
has recorded steps and then records none for ``stall_s`` is stuck in a way its time
limit only finds late; it is ended as a hang at once. The clock starts at the first
recorded step, so start-up (imports, data, compiling) is left to the time limit alone,
and it stops once the job has said it is ending (its own error, or stepscope's step
limit, in the store): leaving the interpreter (torch's teardown, the last flush) can take
many seconds on a loaded machine, and a job that ran out of memory at step 3 must be
recorded as out of memory, not as hung (two CI runs read a 10-step trial's exit so).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from stepscope.collectors.launch.job_signals import end_group

# How often the store is asked for the job's step count: one small query a second. The
# job's writer flushes its steps about once a second too, so a stall limit well above
# both (``MIN_STALL_S``) never mistakes a flush for a stall.
POLL_S = 1.0
MIN_STALL_S = 5.0


@dataclass(frozen=True)
class Progress:
    """What the store says of the job at one poll: the steps it recorded, and whether
    it has said it is ending (its error or a stop reason is in its run row)."""

    steps: int
    ending: bool = False


@dataclass
class JobEnd:
    """How the wait ended: the job's return code, and why stepscope ended it (None: it
    ended by itself; 'timeout'; 'stall', after ``steps`` recorded steps)."""

    returncode: int
    ended_for: str | None = None
    steps: int = 0


def wait_for_job(
    child: subprocess.Popen[bytes],
    timeout_s: float | None,
    stall_s: float | None,
    progress: Callable[[], Progress],
) -> JobEnd:
    """Wait for ``child``; end its process group at ``timeout_s`` of wall time, or after
    ``stall_s`` (the launcher keeps it at least ``MIN_STALL_S``) without a new step once
    it has recorded one and until it says it is ending (``progress``: what the store
    holds for the run so far)."""
    if stall_s is None:
        try:
            return JobEnd(child.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            return JobEnd(end_group(child), "timeout")
    started = time.monotonic()
    steps, progressed = 0, None  # progressed: when the step count last went up
    while True:
        now = time.monotonic()
        wait = POLL_S if timeout_s is None else min(POLL_S, max(0.0, started + timeout_s - now))
        try:
            return JobEnd(child.wait(timeout=wait), steps=steps)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if timeout_s is not None and now - started >= timeout_s:
            return JobEnd(end_group(child), "timeout", steps)
        try:
            seen = progress()
        except Exception:  # a store that fails a read must not end the job: next poll
            continue
        if seen.ending:
            progressed = None  # leaving: only the time limit ends it now
        if seen.steps > steps:
            steps, progressed = seen.steps, (None if seen.ending else now)
        elif progressed is not None and now - progressed >= stall_s:
            return JobEnd(end_group(child), "stall", steps)


__all__ = ["MIN_STALL_S", "JobEnd", "Progress", "wait_for_job"]
