"""The part of a capture's export the training thread need not wait for, on a thread of
its own: compressing the trace, its artifact row, the memory timeline.

torch.profiler must stop on the job's thread, and kineto's results are written there
(``export_chrome_trace`` to a plain JSON file: C++, holding the GIL, about a second for
200 MiB). Compressing that file is the longer part, and zlib releases the GIL while it
deflates: done here, it runs on another core while the job trains on. On a time-series
LBFGS job (one step of thousands of tiny operators, a 150 MiB trace) the capture held the
job's thread for about 30 s, most of it in torch's line-by-line gzip.

One thread, one export at a time, in order. The job's end waits for what is queued
(``wait``, from the capture's ``close``), so a job that ends right after a capture keeps
its trace; a thread is not started in a forked child that inherited a parent's queue.

Work that holds the GIL for long (torch's memory timeline: pure Python, ~1 s per 10 k
events) is ``defer``-red to the job's end: on any thread, it takes the interpreter from
the job's, and a compute-bound 30-step job on 2 cores lost 0.8 s of its 3 s loop to it
in the steps after the capture (``bench/capture_stall.py --job dense_compute``).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable

from stepscope.store.artifacts import before_thread_pools_close

#: the longest the job's end waits for its queued exports (a trace of GBs compresses in
#: minutes; a job is not held longer than this for it: the raw file stays, said)
WAIT_S = 600.0
#: bytes read and deflated at a time: large enough that zlib's GIL-free deflate is most of it
COPY_CHUNK = 1 << 20
#: zlib's level: 6 (gzip's default) made a 150 MiB trace 12 MiB; 9 costs twice the time
COMPRESS_LEVEL = 6


def compress(raw: str, final: str) -> None:
    """``raw`` gzipped into ``final``, then removed; ``final`` appears whole or not at all
    (written beside it, then renamed), so no reader meets half a trace."""
    partial = final + ".part"
    with open(raw, "rb") as src, gzip.open(partial, "wb", compresslevel=COMPRESS_LEVEL) as dst:
        shutil.copyfileobj(src, dst, COPY_CHUNK)
    os.replace(partial, final)
    os.remove(raw)


class TraceWriter:
    """Runs export work items on one background thread, in order."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._idle = threading.Condition()
        self._pending = 0
        self._deferred: list[Callable[[], None]] = []

    def submit(self, work: Callable[[], None]) -> None:
        """Queue ``work`` (it must not raise: its failures are its own lines)."""
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._queue = queue.Queue()
            self._pending = 0
            self._thread = threading.Thread(target=self._loop, name="stepscope-trace", daemon=True)
            try:
                self._thread.start()
                # when the main thread ends, before the uploads' own hook (hooks run last
                # registered first): a trace compressed after it was never uploaded
                before_thread_pools_close(self.wait)
            except RuntimeError:  # the interpreter is exiting: no new threads, do it here
                self._thread = None
                work()
                return
        with self._idle:
            self._pending += 1
        self._queue.put(work)

    def defer(self, work: Callable[[], None]) -> None:
        """Queue ``work`` at the job's end (the first ``wait``), not now: see above."""
        with self._idle:
            self._deferred.append(work)

    def wait(self, timeout: float = WAIT_S) -> bool:
        """Queue the deferred work, then block until every export is done (work that a
        queued item deferred included); False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while True:
            with self._idle:
                deferred, self._deferred = self._deferred, []
            for work in deferred:
                self.submit(work)
            if self._thread is None or self._pid != os.getpid():
                return True
            with self._idle:
                left = deadline - time.monotonic()
                if not self._idle.wait_for(lambda: self._pending == 0, timeout=max(0.0, left)):
                    return False
                if not self._deferred:
                    return True

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            try:
                with contextlib.suppress(Exception):
                    work()
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
