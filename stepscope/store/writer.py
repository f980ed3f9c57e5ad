"""Buffered, background writer for code that runs inside the user's job.

The training loop must never wait on disk: collectors append rows to in-memory lists
(a list append is atomic under the GIL) and a daemon thread commits them about once a
second. A job killed with SIGKILL therefore loses at most the last interval.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from stepscope.store.store import RunStore

FLUSH_INTERVAL_S = 1.0


class BufferedWriter:
    """Collects steps, requests, samples, artifacts and log lines; commits them from a
    thread.

    ``before_flush`` callbacks run on the flush thread just before each commit; the
    step timer uses one to resolve CUDA events without synchronising the job.
    Failures to write are reported once on stderr and never raised into the job.
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None,
        run_id: int,
        *,
        interval_s: float = FLUSH_INTERVAL_S,
        rank: int = 0,
        url: str | None = None,
    ) -> None:
        self.home = home
        self.url = url  # None: $STEPSCOPE_STORE or the home's file, as RunStore resolves
        self.run_id = run_id
        self.rank = rank
        self.worker = 0  # a training process multiprocessing started (step_timer.py)
        self.interval_s = interval_s
        # deque.append/popleft are atomic, so producers never take a lock
        self._steps: deque[dict[str, Any]] = deque()
        self._samples: deque[tuple[float, str, str, float | None]] = deque()
        self._artifacts: deque[dict[str, Any]] = deque()
        self._events: deque[dict[str, Any]] = deque()
        self._run_updates: deque[tuple[str, dict[str, Any], tuple[str, ...]]] = deque()
        self._step_deletions: deque[int] = deque()  # from_step, applied after inserts
        self._ranks: deque[tuple[int, str, int | None]] = deque()
        self._requests: deque[dict[str, Any]] = deque()
        self._store: RunStore | None = None
        self.before_flush: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # serialises flushes, not appends
        self._stop = threading.Event()
        self._failed = False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="stepscope-writer", daemon=True)
        self._thread.start()

    # -- producers (called from the job's threads; cheap) -----------------------------
    def add_step(self, row: dict[str, Any]) -> None:
        row.setdefault("rank", self.rank)
        row.setdefault("worker", self.worker)
        self._steps.append(row)

    def add_request(self, row: dict[str, Any]) -> None:
        """A generation request's row (again when it ends: the later row replaces it)."""
        row.setdefault("rank", self.rank)
        self._requests.append(row)

    def delete_steps_from(self, from_step: int) -> None:
        """Drop this rank's rows from ``from_step`` on, after the buffered steps land."""
        self._step_deletions.append(from_step)

    def add_sample(self, t: float, scope: str, metric: str, value: float | None) -> None:
        self._samples.append((t, scope, metric, value))

    def add_artifact(self, kind: str, path: str, meta: dict[str, Any] | None = None) -> None:
        self._artifacts.append({"kind": kind, "path": path, "meta": meta or {}})

    def log(self, level: str, source: str, message: str) -> None:
        self._events.append(
            {"t": time.time(), "level": level, "source": source, "message": message}
        )

    def register_rank(self, rank: int, host: str, pid: int | None) -> None:
        """Record which process on which host is ``rank`` (a multi-node job's map)."""
        self._ranks.append((rank, host, pid))

    def merge_run_json(
        self, column: str, values: dict[str, Any], appended: tuple[str, ...] = ()
    ) -> None:
        """Merge keys into a JSON column of the run (env, device, config); the lists under
        ``appended`` keys are added to (``RunStore.merge_run_json``)."""
        self._run_updates.append((column, values, appended))

    def update_run(self, **fields: Any) -> None:
        """Set plain columns of the run, e.g. ``stop_reason='max_steps'`` or ``error=...``."""
        self._run_updates.append(("", fields, ()))

    # -- flushing ---------------------------------------------------------------------
    def _loop(self) -> None:
        # Open the store now rather than at the first flush: connecting (and, with a
        # server, the round trips of the first open) then does not eat into the first
        # interval, and the first rows land about a second after they were added.
        with self._lock, contextlib.suppress(Exception):  # flush() retries and reports
            if self._store is None:
                self._store = RunStore(self.home, url=self.url)
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        """Commit everything buffered so far. Safe to call from any thread."""
        if os.getpid() != self._pid:
            return  # a forked child (DataLoader worker) must not write the parent's rows
        with self._lock:
            for callback in list(self.before_flush):
                try:
                    callback()
                except Exception as exc:  # a collector bug must not stop the writer
                    self.log("warning", "writer", f"flush callback failed: {exc!r}")
            steps = _drain(self._steps)
            samples = _drain(self._samples)
            artifacts = _drain(self._artifacts)
            events = _drain(self._events)
            updates = _drain(self._run_updates)
            deletions = _drain(self._step_deletions)
            ranks = _drain(self._ranks)
            requests = _drain(self._requests)
            if not (
                steps or samples or artifacts or events or updates or deletions or ranks or requests
            ):
                return
            try:
                if self._store is None:
                    self._store = RunStore(self.home, url=self.url)
                store = self._store
                for rank, host, pid in ranks:
                    store.register_rank(self.run_id, rank, host, pid)
                store.add_steps(self.run_id, steps)
                store.add_requests(self.run_id, requests)
                for from_step in deletions:
                    store.delete_steps(self.run_id, self.rank, from_step, self.worker)
                store.add_samples(self.run_id, samples)
                for a in artifacts:
                    store.add_artifact(
                        self.run_id, a["kind"], a["path"], rank=self.rank, meta=a["meta"]
                    )
                for e in events:
                    store.log_event(
                        self.run_id, e["level"], e["source"], e["message"], rank=self.rank, t=e["t"]
                    )
                for column, values, appended in updates:
                    if column:
                        store.merge_run_json(self.run_id, column, values, appended)
                    else:
                        store.update_run(self.run_id, **values)
            except Exception as exc:
                if not self._failed:
                    self._failed = True
                    print(
                        f"stepscope: cannot write to the run store ({exc}); "
                        "recording continues in memory",
                        file=sys.stderr,
                    )
                # put the rows back so a later flush can retry
                self._steps.extendleft(reversed(steps))
                self._samples.extendleft(reversed(samples))
                self._artifacts.extendleft(reversed(artifacts))
                self._events.extendleft(reversed(events))
                self._run_updates.extendleft(reversed(updates))
                self._step_deletions.extendleft(reversed(deletions))
                self._ranks.extendleft(reversed(ranks))
                self._requests.extendleft(reversed(requests))
                if self._store is not None:
                    with contextlib.suppress(Exception):
                        self._store.close()
                self._store = None

    def close(self) -> None:
        """Stop the thread and commit what is left (called at interpreter exit)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self.flush()


def _drain(buffer: deque[Any]) -> list[Any]:
    """Pop what is there now; items appended meanwhile wait for the next flush."""
    out = []
    try:
        for _ in range(len(buffer)):
            out.append(buffer.popleft())
    except IndexError:
        pass
    return out
