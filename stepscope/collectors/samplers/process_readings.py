"""What the system sampler reads of one process from the OS, each reading on its own.

psutil's counters (I/O, per-thread CPU) and Linux's per-thread run-queue delay
(``/proc/<pid>/task/<tid>/schedstat``). Each returns None or an empty mapping where the
platform or the process's owner does not let it be read: the metric is then left out of
that tick, and the sampler goes on with the others.
"""

from __future__ import annotations

import os

import psutil


def io(proc: psutil.Process) -> tuple[float, float, float, float] | None:
    """Read/write bytes at the storage layer and in syscalls (Linux), where readable."""
    if not hasattr(proc, "io_counters"):
        return None  # macOS has no per-process I/O counters
    try:
        io = proc.io_counters()
    except (psutil.AccessDenied, NotImplementedError, OSError):
        # Another user's process, or a platform/kernel without per-process I/O
        # accounting: no reading this tick, and the I/O metrics are left out.
        return None
    return (
        float(io.read_bytes),
        float(io.write_bytes),
        float(getattr(io, "read_chars", io.read_bytes)),
        float(getattr(io, "write_chars", io.write_bytes)),
    )


def thread_times(proc: psutil.Process) -> dict[int, float]:
    """Per-thread CPU seconds: shows a Python main thread pinned at 100 % among idle ones."""
    try:
        return {th.id: th.user_time + th.system_time for th in proc.threads()}
    except (psutil.AccessDenied, NotImplementedError, OSError):
        # Not readable for this process or platform: the busiest-thread metric is
        # skipped (its absence is the reading), the other metrics go on.
        return {}


def run_queue_waits(pid: int) -> dict[int, float] | None:
    """Seconds each thread of ``pid`` has spent ready to run while waiting for a core
    (the second field of Linux's schedstat); None where the kernel does not say."""
    waits: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                waits[int(tid)] = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return waits or None


__all__ = ["io", "run_queue_waits", "thread_times"]
