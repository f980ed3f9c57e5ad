"""Buffered, background writer for code that runs inside the user's job.

The training loop must never wait on disk: collectors append rows to in-memory buffers
(a deque append is atomic under the GIL) and a daemon thread commits them about once a
second. A job killed with SIGKILL therefore loses at most the last interval.

Each flush is one transaction: every row it holds lands, or none does and all are
written again at the next flush. Rows written twice (a commit that went through but
whose answer was lost) land once: steps, requests and ranks are upserted on their keys,
samples, events and artifacts have unique keys their inserts leave alone
(``schema.INDEXES``). While the store is away the buffers are bounded
(``row_buffer.py``): past a cap the oldest rows of that kind go, and once the store
answers the run's log says for how long it was away and what was dropped.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stepscope.store.db import error_text
from stepscope.store.row_buffer import RowBuffer, drop_message
from stepscope.store.store import RunStore

FLUSH_INTERVAL_S = 1.0

# The most rows of each kind kept for the store while it is away. Steps are what every
# analysis reads: the largest cap (a step's row is about 1 kB, so at most ~50 MB; a job
# of 100 steps a second keeps eight minutes of them). Samples (the system sampler
# writes its own; these are a job's extras) are dropped first.
MAX_BUFFERED_STEPS = 50_000
MAX_BUFFERED_REQUESTS = 10_000
MAX_BUFFERED_ARTIFACTS = 10_000
MAX_BUFFERED_EVENTS = 10_000
MAX_BUFFERED_RUN_UPDATES = 10_000
MAX_BUFFERED_STEP_DELETIONS = 10_000
MAX_BUFFERED_RANKS = 1_000
MAX_BUFFERED_SAMPLES = 5_000


class BufferedWriter:
    """Collects steps, requests, samples, artifacts and log lines; commits them from a
    thread.

    ``before_flush`` callbacks run on the flush thread just before each commit; the
    step timer uses one to resolve CUDA events without synchronising the job.
    Failures to write are reported once on stderr and never raised into the job; what
    an outage cost goes to the run's log (source "writer") once the store answers.
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
        # deque.append/popleft are atomic, so producers never take a lock; written in
        # this order, one transaction per flush
        self._ranks = RowBuffer("rank registrations", MAX_BUFFERED_RANKS)
        self._steps = RowBuffer("steps", MAX_BUFFERED_STEPS)
        self._requests = RowBuffer("requests", MAX_BUFFERED_REQUESTS)
        self._step_deletions = RowBuffer("step deletions", MAX_BUFFERED_STEP_DELETIONS)
        self._samples = RowBuffer("samples", MAX_BUFFERED_SAMPLES)
        self._artifacts = RowBuffer("artifacts", MAX_BUFFERED_ARTIFACTS)
        self._events = RowBuffer("events", MAX_BUFFERED_EVENTS)
        self._run_updates = RowBuffer("run updates", MAX_BUFFERED_RUN_UPDATES)
        self._buffers = (
            self._ranks, self._steps, self._requests, self._step_deletions, self._samples,
            self._artifacts, self._events, self._run_updates,
        )  # fmt: skip
        self._away_since: float | None = None  # monotonic: the first failed flush since
        self._reported: dict[str, int] = {}  # drops already told in the run's log
        self._last_log_t = 0.0
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
        # stamped now, not at insert: a retried row is the same row (its unique key)
        self._artifacts.append({"kind": kind, "path": path, "meta": meta or {}, "t": time.time()})

    def log(self, level: str, source: str, message: str) -> None:
        # later than the line before: unix seconds as a float move every ~0.24 µs, and
        # the same line logged twice in one tick would be one row under the events' key
        t = max(time.time(), math.nextafter(self._last_log_t, math.inf))
        self._last_log_t = t
        self._events.append({"t": t, "level": level, "source": source, "message": message})

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
        """Commit everything buffered so far, in one transaction. Safe to call from any
        thread."""
        if os.getpid() != self._pid:
            return  # a forked child (DataLoader worker) must not write the parent's rows
        with self._lock:
            for callback in list(self.before_flush):
                try:
                    callback()
                except Exception as exc:  # a collector bug must not stop the writer
                    self.log("warning", "writer", f"flush callback failed: {exc!r}")
            batch = [buffer.take() for buffer in self._buffers]
            dropped = {buffer.name: buffer.dropped for buffer in self._buffers}
            report = self._drop_report(dropped)
            if report is None and not any(batch):
                return
            try:
                self._write(*batch, report)
            except Exception as exc:
                self._refused(exc)
                for buffer, rows in zip(self._buffers, batch, strict=True):
                    buffer.put_back(rows)  # the report is made again, with the new counts
                return
            self._away_since = None
            self._reported = dropped

    def _write(
        self,
        ranks: list[tuple[int, str, int | None]],
        steps: list[dict[str, Any]],
        requests: list[dict[str, Any]],
        deletions: list[int],
        samples: list[tuple[float, str, str, float | None]],
        artifacts: list[dict[str, Any]],
        events: list[dict[str, Any]],
        updates: list[tuple[str, dict[str, Any], tuple[str, ...]]],
        report: dict[str, Any] | None,
    ) -> None:
        if self._store is None:
            self._store = RunStore(self.home, url=self.url)
        store, run_id = self._store, self.run_id
        with store.transaction() as conn:
            for rank, host, pid in ranks:
                store.register_rank(run_id, rank, host, pid, conn=conn)
            store.add_steps(run_id, steps, conn=conn)
            store.add_requests(run_id, requests, conn=conn)
            for from_step in deletions:
                store.delete_steps(run_id, self.rank, from_step, self.worker, conn=conn)
            store.add_samples(run_id, samples, conn=conn)
            for a in artifacts:
                store.add_artifact(
                    run_id, a["kind"], a["path"], rank=self.rank, meta=a["meta"],
                    created_at=a["t"], conn=conn,
                )  # fmt: skip
            for e in [*events, report] if report is not None else events:
                store.log_event(
                    run_id, e["level"], e["source"], e["message"], rank=self.rank, t=e["t"],
                    conn=conn,
                )  # fmt: skip
            for column, values, appended in updates:
                if column:
                    store.merge_run_json(run_id, column, values, appended, conn=conn)
                else:
                    store.update_run(run_id, conn=conn, **values)

    def _drop_report(self, dropped: dict[str, int]) -> dict[str, Any] | None:
        """The run's log line about an outage that is ending (if this flush lands) or rows
        dropped since the last report; None when there is nothing to tell."""
        new = {name: n - self._reported.get(name, 0) for name, n in dropped.items()}
        if self._away_since is None and not any(new.values()):
            return None
        away_s = None if self._away_since is None else time.monotonic() - self._away_since
        return {
            "t": time.time(),
            "level": "warning",
            "source": "writer",
            "message": drop_message(away_s, new),
        }

    def _refused(self, exc: Exception) -> None:
        """The store did not take a flush: say so once, drop the handle (the next flush
        opens the store again) and remember when the outage began."""
        if self._away_since is None:
            self._away_since = time.monotonic()
        if not self._failed:
            self._failed = True
            print(
                f"stepscope: cannot write to the run store ({error_text(exc)});"
                " recording continues in memory",
                file=sys.stderr,
            )
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
