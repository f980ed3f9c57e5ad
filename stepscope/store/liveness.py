"""Whether the process behind a row still 'running' (a run's launcher, an experiment) lives.

A process killed with SIGKILL cannot say it stopped, so the readers of runs and of
experiments ask this instead of trusting ``status='running'`` forever.
"""

from __future__ import annotations

import socket
import sqlite3
from typing import Any


def vanished(conn: sqlite3.Connection, table: str) -> list[sqlite3.Row]:
    """Rows of ``table`` still 'running' whose process on this host is gone."""
    # local: only readers check liveness; the writer inside every process of the job
    # opens the store too and has no use for psutil
    import psutil

    host = socket.gethostname()
    rows = conn.execute(
        f"SELECT id, pid, pid_started_at, host FROM {table} WHERE status='running'"
    ).fetchall()
    return [
        row
        for row in rows
        if row["host"] == host
        and row["pid"] is not None
        and not _process_alive(row["pid"], row["pid_started_at"], psutil)
    ]


def _process_alive(pid: int, started_at: float | None, psutil: Any) -> bool:
    try:
        proc = psutil.Process(pid)
        if started_at is not None and abs(proc.create_time() - started_at) > 1.0:
            return False  # the pid was reused by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True  # it exists, it is just not ours to inspect
    except psutil.NoSuchProcess:
        return False
