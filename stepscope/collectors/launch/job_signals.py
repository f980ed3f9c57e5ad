"""Signals between the launcher and the job it started.

Why they are handled this way:

* Ctrl-C: the terminal sends SIGINT to the whole foreground process group, so the job
  gets it directly. The launcher only notes it (a Python handler, installed before
  the child starts; exec resets Python handlers to the default in the child, whereas
  SIG_IGN would be inherited and make the job immune to Ctrl-C) and goes on waiting
  so it can finalise the run. It does not forward SIGINT: the job would get it twice.
* SIGTERM and SIGHUP to the launcher (a scheduler stopping it, a closed terminal) are
  forwarded to the job, which would otherwise be orphaned and keep running.
* A job with a timeout (an experiment's trial) runs in its own session, so that
  killing its process group also kills its DataLoader workers; it then no longer gets
  Ctrl-C from the terminal, so the launcher forwards SIGINT itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import Any

TERM_GRACE_S = 5.0  # a timed-out job's group gets this long after SIGTERM, then SIGKILL


class SignalState:
    """What the launcher was told while the job ran, and the handlers that record it.

    ``own_group``: the job runs in its own session (see ``launcher._JobOptions``), so Ctrl-C
    does not reach it from the terminal and is forwarded like SIGTERM, to its group.
    """

    FORWARDED = ("SIGTERM", "SIGHUP")

    def __init__(self, own_group: bool = False) -> None:
        self.own_group = own_group
        self.received: int | None = None
        self.child: subprocess.Popen | None = None
        self.forward_pending: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        sigs = [signal.SIGINT] + [getattr(signal, n) for n in self.FORWARDED if hasattr(signal, n)]
        for sig in sigs:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None or signum != signal.SIGINT:
            self.received = signum
        if signum == signal.SIGINT and not self.own_group:
            return  # the terminal delivered it to the job as well
        if self.child is None:
            self.forward_pending = signum
        else:
            forward(self.child, signum, self.own_group)


def forward(child: subprocess.Popen, signum: int, group: bool = False) -> None:
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(child.pid, signum)
        else:
            os.kill(child.pid, signum)


def end_group(child: subprocess.Popen) -> int:
    """Stop a job that outlived its timeout: SIGTERM to its group, SIGKILL if it lingers.

    The group, not the process: a hung job's DataLoader workers would otherwise be left
    holding cores (and shared memory) for the rest of the experiment.
    """
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)
        try:
            return child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
