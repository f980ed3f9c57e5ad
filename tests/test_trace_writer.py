"""The capture's background export (``collectors/capture/trace_writer.py``): work runs in
order off the caller's thread, ``wait`` returns once it is all done, a failing item does
not stop the next, and a compressed trace appears whole or not at all."""

from __future__ import annotations

import gzip
import os
import threading
import time
from pathlib import Path

import pytest

from stepscope.collectors.capture.trace_writer import TraceWriter, compress


def test_work_runs_in_order_on_another_thread_and_wait_sees_it_done() -> None:
    writer, done, threads = TraceWriter(), [], set()
    release = threading.Event()

    def item(i: int) -> None:
        release.wait(5)
        threads.add(threading.get_ident())
        done.append(i)

    for i in range(3):
        writer.submit(lambda i=i: item(i))
    assert done == []  # queued: the caller did not run them
    assert writer.wait(timeout=0.05) is False  # not yet: the first waits on the event
    release.set()
    assert writer.wait(timeout=10) is True
    assert done == [0, 1, 2] and threading.get_ident() not in threads


def test_a_failing_item_does_not_stop_the_next() -> None:
    writer, done = TraceWriter(), []

    def fail() -> None:
        raise OSError("disk full")

    writer.submit(fail)
    writer.submit(lambda: done.append("next"))
    assert writer.wait(timeout=10) and done == ["next"]


def test_deferred_work_waits_for_the_end_and_runs_on_the_writers_thread() -> None:
    """The memory timeline's export (``defer``) runs at the first ``wait`` (the job's
    end), after what was queued, on the writer's thread."""
    writer, done = TraceWriter(), []
    writer.defer(lambda: done.append(("deferred", threading.get_ident())))
    writer.submit(lambda: done.append(("queued", threading.get_ident())))
    writer.submit(lambda: time.sleep(0.2))
    time.sleep(0.5)
    assert [what for what, _ in done] == ["queued"]  # the deferred waits
    assert writer.wait(timeout=10) is True
    assert [what for what, _ in done] == ["queued", "deferred"]
    threads = {thread for _, thread in done}
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_work_deferred_by_a_queued_item_is_waited_for_too() -> None:
    """The trace's own item defers the timeline while the job's end already waits."""
    writer, done = TraceWriter(), []

    def trace() -> None:
        time.sleep(0.2)
        writer.defer(lambda: done.append("timeline"))

    writer.submit(trace)
    assert writer.wait(timeout=10) is True
    assert done == ["timeline"]


def test_wait_without_work_returns_at_once() -> None:
    started = time.perf_counter()
    assert TraceWriter().wait(timeout=5) is True
    assert time.perf_counter() - started < 1


def test_compress_writes_the_whole_trace_then_removes_the_raw_file(tmp_path: Path) -> None:
    raw = tmp_path / "a.pt.trace.json.part"
    body = b'{"traceEvents": [' + b",".join(b'{"name": "op"}' for _ in range(50_000)) + b"]}"
    raw.write_bytes(body)
    final = tmp_path / "a.pt.trace.json.gz"
    compress(str(raw), str(final))
    assert gzip.decompress(final.read_bytes()) == body
    assert sorted(os.listdir(tmp_path)) == ["a.pt.trace.json.gz"]


def test_a_failed_compression_leaves_no_trace_behind(tmp_path: Path) -> None:
    raw = tmp_path / "gone.pt.trace.json.part"  # never written
    final = tmp_path / "gone.pt.trace.json.gz"
    with pytest.raises(FileNotFoundError):
        compress(str(raw), str(final))
    assert not final.exists()
