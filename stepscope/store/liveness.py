"""Whether the process behind a row still 'running' (a run's launcher, an experiment) lives.

A process killed with SIGKILL cannot say it stopped, so the readers of runs and of
experiments ask this instead of trusting ``status='running'`` forever. Only processes
on this host can be asked: a shared store (PostgreSQL) is read from many hosts, and a
row written by another host is never judged from here.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from stepscope.store.db import q

if TYPE_CHECKING:
    from stepscope.store.db import Db


def vanished(db: Db, table: str) -> list[dict[str, Any]]:
    """Rows of ``table`` still 'running' whose process on this host is gone."""
    rows = db.rows(f"SELECT id, pid, pid_started_at, host FROM {table} WHERE status='running'")
    return _dead_here(rows)


def lost_runs(db: Db) -> list[int]:
    """Ids of running runs whose launchers are all gone.

    A run without members has one launcher (``runs.pid``). A run with members (a
    multi-node job) is lost only when every member on this host is gone and no member
    elsewhere still runs; members found dead here are marked ``lost`` on the way.
    """
    running = db.rows("SELECT id, pid, pid_started_at, host FROM runs WHERE status='running'")
    if not running:
        return []
    members = db.rows(
        "SELECT m.id, m.run_id, m.pid, m.pid_started_at, m.host FROM run_members m"
        " JOIN runs r ON r.id = m.run_id WHERE r.status='running' AND m.status='running'"
    )
    has_members = {
        r["run_id"]
        for r in db.rows(
            "SELECT DISTINCT m.run_id FROM run_members m JOIN runs r ON r.id = m.run_id"
            " WHERE r.status='running'"
        )
    }
    dead_members = _dead_here(members)
    if dead_members:
        with db.begin() as conn:
            for m in dead_members:
                q(
                    conn,
                    "UPDATE run_members SET status='lost', ended_at=:t,"
                    " error=COALESCE(error, 'the launcher vanished (killed?)')"
                    " WHERE id=:id AND status='running'",
                    {"t": time.time(), "id": m["id"]},
                )
    dead_ids = {m["id"] for m in dead_members}
    still_running = {m["run_id"] for m in members if m["id"] not in dead_ids}
    lost = [r["id"] for r in _dead_here([r for r in running if r["id"] not in has_members])]
    lost += [rid for rid in sorted(has_members) if rid not in still_running]
    return lost


# How stepscope starts the processes it may signal: an argument of their command line.
EXPERIMENT_PROCESS = ("stepscope.optim_runner.background", "optimize", "demo")
ATTACH_PROCESS = ("attach",)


def signalable_pid(row: dict[str, Any], started_as: tuple[str, ...]) -> int | None:
    """The pid of a row's process (an experiment, an attach) when it is, by everything
    the row recorded, the process stepscope started; else None.

    A row of a shared store is anyone's to write, and a pid is reused: the process must
    run on this host as this user, have been created when the row says (a row without
    that time is never signalled), and be a stepscope command started as ``started_as``
    says (one of those words an argument of its command line).
    """
    # local: as in _dead_here
    import psutil

    pid, created = row.get("pid"), row.get("pid_started_at")
    if pid is None or created is None or created != created:  # NULL; NaN from pandas
        return None
    if row.get("host") != socket.gethostname():
        return None
    try:
        proc = psutil.Process(int(pid))
        if abs(proc.create_time() - float(created)) > 1.0:
            return None  # the pid was reused by another process
        if hasattr(os, "getuid") and proc.uids().real != os.getuid():
            return None
        args = proc.cmdline()
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except (psutil.Error, OSError, ValueError):
        return None
    ours = any("stepscope" in a for a in args) and any(a in started_as for a in args)
    return int(pid) if ours else None


def _dead_here(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # local: only readers check liveness; the writer inside every process of the job
    # opens the store too and has no use for psutil
    import psutil

    host = socket.gethostname()
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
