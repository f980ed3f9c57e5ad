"""Device time and loss values of steps on CUDA, read without synchronising the job.

Each step row gets a CUDA event recorded at its end (and the previous step's event as
its start); the row waits in a queue until the BufferedWriter's thread finds the event
complete (``event.query()`` never blocks), then gets its ``device_s`` and its loss and
is written. A row whose event is still pending after CUDA_WAIT_S is written without
``device_s`` rather than held, so the store stays within a couple of seconds of the job.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from stepscope.collectors.steps.step_row import public, sum_or_none

# A step row waits this long for its CUDA event before it is written without device_s.
CUDA_WAIT_S = 2.0


class CudaTiming:
    """The CUDA events of the step timer's rows, and the rows that wait for them."""

    def __init__(self) -> None:
        self.torch: Any = None  # set when the timer installs (torch is imported by then)
        self.rows: deque[dict[str, Any]] = deque()
        self.last_event: Any = None
        self._side_streams: dict[int, Any] = {}

    def in_use(self) -> bool:
        cuda = self.torch.cuda
        return cuda.is_initialized()

    def mark_start(self) -> None:
        """An event at a step's start, for the device time of the first step of a run."""
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        self.last_event = event

    def queue(self, row: dict[str, Any]) -> None:
        """The row's step ends now on the device: it waits for its event to complete."""
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        row["_ev_prev"], row["_ev"] = self.last_event, event
        self.last_event = event
        self.rows.append(row)

    def forget(self) -> None:
        """The steps were taken back: their rows and the last event are not wanted."""
        self.rows.clear()
        self.last_event = None

    def resolve(self, writer: Callable[[], Any], final: bool) -> None:
        """Write the rows whose events have completed, in order (see the module's
        docstring); ``final``: the job is over, nothing waits any longer."""
        rows = self.rows
        if not rows:
            return
        out = writer()
        now = time.time()
        while rows:
            row = rows[0]
            event = row["_ev"]
            done = event.query()
            if not done and not final and now - row["end_s"] < CUDA_WAIT_S:
                break
            rows.popleft()
            if done:
                prev = row.get("_ev_prev")
                if prev is not None and prev.query():
                    with contextlib.suppress(Exception):
                        row["device_s"] = prev.elapsed_time(event) / 1000.0
                if row["_losses"]:
                    row["loss"] = sum_or_none(self._read_losses(row["_losses"]))
            out.add_step(public(row))

    def _read_losses(self, losses: list[Any]) -> list[float]:
        """Read completed loss tensors on a side stream, so the copy does not queue
        behind the job's work on its own stream."""
        torch = self.torch
        values = []
        for t in losses:
            if t.is_cpu:
                values.append(t.item())
                continue
            index = t.device.index or 0
            stream = self._side_streams.get(index)
            if stream is None:
                stream = self._side_streams[index] = torch.cuda.Stream(device=t.device)
            with torch.cuda.device(t.device), torch.cuda.stream(stream):
                values.append(t.item())
        return values
