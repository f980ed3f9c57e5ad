"""A background attach, followed by whoever started it: did it start, and what became of it.

The dashboard's Attach button starts `stepscope attach` in a process of its own
(``attach.start_attach``), so the recording goes on when the page reloads. Until that
process has created its run there is nothing in the store to show, and if it fails
before that, only its log says why. This module keeps the processes it started (so
they are reaped when they end, not left as zombies for as long as the dashboard runs)
and answers, from the store and the process table, what became of one: it records
into a run, it failed (one line, from its log), or it is still starting. No widgets:
the Attach page draws what these functions say.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import psutil

from stepscope.collectors.attach.attach import attach_log, attach_run_of, start_attach
from stepscope.store import RunStore

#: after this long without a run, the attach is taken as failed (its log says why)
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PendingAttach:
    """An attach started here that has no run yet."""

    attacher: int  # pid of the background `stepscope attach`
    since: float  # when it was started (unix s): an older run of a reused pid is not it
    target: int  # the process it attaches to


class Attachers:
    """Attach processes started by this process (the dashboard), by pid.

    Kept so that they are reaped (``poll``) when they end, whoever looks next: an
    unreaped one would stay a zombie, which the store takes as alive no longer but which
    still clutters the process table for as long as the dashboard runs.
    """

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}

    def start(
        self, pid: int, duration_s: float, name: str | None, home: str | os.PathLike[str]
    ) -> PendingAttach:
        """Start an attach to ``pid``; AttachError (one line) when it cannot be."""
        since = time.time()
        proc = start_attach(pid, duration_s=duration_s, name=name, home=home)
        self._procs[proc.pid] = proc
        return PendingAttach(attacher=proc.pid, since=since, target=pid)

    def reap(self) -> None:
        for pid, proc in list(self._procs.items()):
            if proc.poll() is not None:
                self._procs.pop(pid, None)

    def ended(self, attacher: int) -> bool:
        """Whether the attach process is gone (ours: reaped; another's: not alive)."""
        proc = self._procs.get(attacher)
        return proc.poll() is not None if proc is not None else not process_alive(attacher)


def process_alive(pid: int | None, started_at: float | None = None) -> bool:
    """Whether a process runs (not a zombie, not a newer process under a reused pid)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(int(pid))
        if started_at is not None and abs(proc.create_time() - float(started_at)) > 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def last_log_line(home: str | os.PathLike[str], target: int) -> str:
    """The last line the attach wrote to its log (``attach.attach_log``)."""
    path = attach_log(home, target)
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return "it wrote no log"
    last = next((ln for ln in reversed(lines) if ln), "")
    return last.removeprefix("stepscope: ") or "it wrote nothing to its log"


def resolve(
    home: str | os.PathLike[str],
    pending: PendingAttach,
    attachers: Attachers,
    timeout_s: float = START_TIMEOUT_S,
) -> tuple[str, Any]:
    """What became of an attach started here: ('run', id) once it records, ('failed',
    one line) if it ended or never started, else ('waiting', None). Store errors raise."""
    with RunStore(home) as store:
        run_id = attach_run_of(store, pending.attacher, pending.since)
    if run_id is not None:
        return "run", run_id
    if attachers.ended(pending.attacher):
        with RunStore(home) as store:
            run_id = attach_run_of(store, pending.attacher, pending.since)
        if run_id is not None:  # it created its run just before ending
            return "run", run_id
        return (
            "failed",
            f"Attach to process {pending.target} failed: {last_log_line(home, pending.target)}",
        )
    if time.time() - pending.since > timeout_s:
        log = attach_log(home, pending.target)
        return "failed", (
            f"The attach to process {pending.target} did not start within "
            f"{timeout_s:.0f} s; its log: {log}"
        )
    return "waiting", None


__all__ = [
    "START_TIMEOUT_S",
    "Attachers",
    "PendingAttach",
    "last_log_line",
    "process_alive",
    "resolve",
]
