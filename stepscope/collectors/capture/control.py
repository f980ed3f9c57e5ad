"""On-demand capture requests: a file in the run folder, read by the job at step boundaries.

A file (rather than a socket or a signal) because every rank of every host that sees
the run folder can read it, it needs no listener thread in the job, and a request made
while the job is between steps simply waits there. Each rank remembers the id of the
last request it served, so one request yields exactly one capture per rank.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from stepscope.collectors.launch.contract import CAPTURE_REQUEST_FILE, CONTROL_DIRNAME

POLL_INTERVAL_S = 0.25


def capture_request_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / CONTROL_DIRNAME / CAPTURE_REQUEST_FILE


def request_capture(run_dir: str | os.PathLike[str], steps: int) -> str:
    """Ask the job recorded in ``run_dir`` to profile its next ``steps`` steps; returns the id.

    Written to a temporary file and renamed, so a rank polling at that moment reads
    either the old request or the new one, never half of one.
    """
    if int(steps) < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    path = capture_request_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    request_id = uuid.uuid4().hex
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{request_id[:8]}.tmp")
    tmp.write_text(json.dumps({"id": request_id, "steps": int(steps), "t": time.time()}))
    os.replace(tmp, path)
    return request_id


class CapturePoller:
    """Cheap check for a new capture request, throttled for per-step use."""

    def __init__(self, run_dir: str | os.PathLike[str], interval_s: float = POLL_INTERVAL_S):
        self.path = capture_request_path(run_dir)
        self.interval_s = interval_s
        self.last_served: str | None = None
        self._next_check = 0.0
        self._last_mtime_ns: int | None = None

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        """Return a request not yet served, at most one check per interval."""
        now = time.monotonic() if now is None else now
        if now < self._next_check:
            return None
        self._next_check = now + self.interval_s
        try:
            mtime_ns = os.stat(self.path).st_mtime_ns
        except OSError:
            return None
        if mtime_ns == self._last_mtime_ns:
            return None  # already looked at this version of the file
        try:
            request = json.loads(self.path.read_text())
            request_id = str(request["id"])
            steps = int(request["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable: retry at the next interval
        self._last_mtime_ns = mtime_ns
        if request_id == self.last_served or steps < 1:
            return None
        return {"id": request_id, "steps": steps}

    def served(self, request_id: str) -> None:
        self.last_served = request_id
