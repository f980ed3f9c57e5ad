"""Profiler capture windows: K steps of torch.profiler (and a CUDA memory snapshot).

The step timer calls :meth:`CaptureController.on_boundary` between steps, on the
thread that runs the training loop, because torch.profiler and the CUDA memory
history must be started and stopped where the work happens. A window is opened by
``STEPSCOPE_PROFILE_AT``/``STEPSCOPE_PROFILE_STEPS`` (``auto``: once step times
settle, ``capture_auto.py``) or by a request file (``stepscope capture``). The trace is
written with the file naming of ``tensorboard_trace_handler`` so TensorBoard, HTA and
Perfetto open it unchanged.
Where an artifact location other than the run folder is set (``STEPSCOPE_ARTIFACTS``,
``store/artifacts.py``), each finished file is uploaded from a background thread and
recorded with its URI; a failed upload keeps the local file's row and says why in the
run's log.

The job's stderr stays the job's. torch's profiler writes lines of its own there
during a capture (torch 2.13): Kineto's ``USDT: ... profiler_start`` / ``profiler_stop``
markers on every capture, and c10's "Memory block of unknown size was allocated before
the profiling started" when a block allocated before the window is freed inside it
(``profile_memory=True``; printed on the first such free and every 1000th after). Both
are kept out without touching what the job writes:

* Kineto reads its log level once, from ``KINETO_LOG_LEVEL``, when the process's first
  profiler starts; torch's default (ERROR, 4) still prints the USDT markers (5). The
  variable is set to a level above all of Kineto's for that moment only, unless the
  user set it. (A job that used the profiler itself before has fixed Kineto's level
  already: its markers were there before stepscope's capture anyway.)
* c10's warning is printed on the first unknown free of the process: stepscope makes
  that free itself, in its own code between steps (a tensor allocated just before the
  profiler starts, freed just after), with c10's log level raised to ERROR for those
  microseconds only. The job's own c10 warnings, inside the window or not, still print.
  A job that frees more than 1000 such blocks in its windows (counted over the
  process) still sees the line once per 1000.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from stepscope.collectors.capture.capture_auto import (
    GENERATION_STEPS,
    WINDOW_BOUND_ENV,
    AutoTrigger,
    not_taken,
    window_bound,
)
from stepscope.collectors.capture.control import CapturePoller
from stepscope.collectors.capture.memory_timeline import (
    MEMORY_TIMELINE_SUFFIX,
    memory_timeline_wanted,
    save_memory_timeline,
    timeline_skipped,
)
from stepscope.collectors.capture.quiet_logs import (  # noqa: F401  # tests read them here
    C10_ERROR,
    KINETO_LOG_LEVEL_ENV,
    KINETO_QUIET_LEVEL,
    _c10_log_level,
    _quiet_c10_warnings,
    _quiet_kineto,
)
from stepscope.collectors.capture.trace_writer import TraceWriter, compress
from stepscope.collectors.facts.workers import claim_capture
from stepscope.errors import one_line_error
from stepscope.store.artifacts import (
    ArtifactError,
    BackgroundUploads,
    Location,
    artifact_location,
)

# torch is imported inside the methods, as in the step timer's modules: the controller
# is made from the bootstrap's torch import hook, and the module itself stays importable
# without torch.
MEMORY_HISTORY_ENTRIES = 100_000


class CaptureController:
    """Opens, advances and closes one capture window at a time; disables itself on error.

    ``writer`` is a zero-argument callable returning the run's BufferedWriter, so that
    processes which never reach a step never create one.
    """

    def __init__(
        self,
        writer: Callable[[], Any],
        run_dir: str | None,
        *,
        rank: int = 0,
        profile_at: int | None = None,
        profile_steps: int | None = None,
        poll: bool = True,
        auto: bool = False,
    ) -> None:
        self._writer = writer
        self.run_dir = run_dir
        self.rank = rank
        self.profile_at = profile_at
        self._scheduled_at = profile_at  # kept for rearm()
        self.profile_steps = max(1, int(profile_steps or 3))
        self.auto = AutoTrigger() if auto and profile_at is None else None
        self._auto_armed = self.auto is not None  # kept for rearm()
        self.generation = False  # set by the step timer: the steps are generate() requests
        self._discard = False
        self.poller = CapturePoller(run_dir) if (poll and run_dir) else None
        self.active = False
        self.disabled = run_dir is None
        self._prof: Any = None
        self._first = 0
        self._steps = 0
        self._reason = ""
        self._request_id: str | None = None
        self._memory_history = False
        self._said_cpu_memory = False
        self._stem = ""
        self._started = 0.0  # perf_counter when the window opened
        self._stopping = 0.0  # perf_counter when the window began to close (its stop)
        self._bounded = False  # the window is the default capture: WINDOW_BOUND_S holds
        self._claim = False  # this process holds its rank's scheduled capture
        try:
            self._location, self._location_error = artifact_location(), ""
        except ArtifactError as exc:  # said in the run's log at the first capture
            self._location, self._location_error = Location(), str(exc)
        self._uploads = None if self._location.is_default else BackgroundUploads(self._location)
        self._exports = TraceWriter()  # compression and rows, off the job's thread

    # -- called by the step timer between steps ---------------------------------------
    def on_boundary(self, next_step: int) -> bool:
        """Step ``next_step`` is about to start; returns True if slow work was done here.

        Slow work (starting the profiler, exporting a trace) is reported so the step
        timer can start the next step after it rather than charge it to the job.
        """
        if self.disabled:
            return False
        try:
            if self.active:
                done = next_step - self._first
                if done < self._steps and not self._past_bound(done):
                    self._prof.step()
                    return False
                self._finish(done)
                return True
            if self.profile_at is not None and next_step >= self.profile_at:
                self.profile_at = None  # fires once
                if not self._claimed():
                    return False
                self._start(next_step, self.profile_steps, "scheduled", None)
                return True
            if self.auto is not None and self.auto.due(next_step):
                auto, self.auto = self.auto, None  # fires once
                if not self._claimed():
                    return False
                steps = GENERATION_STEPS if self.generation else auto.steps(self.profile_steps)
                self._start(next_step, steps, auto.reason, None)
                self._bounded = True
                return True
            if self.poller is not None:
                request = self.poller.poll()
                if request is not None:
                    self.poller.served(request["id"])
                    self._start(next_step, request["steps"], "request", request["id"])
                    return True
        except Exception as exc:
            self._fail(exc)
            return True
        return False

    def _claimed(self) -> bool:
        """The rank's scheduled capture is this process's (a hogwild job's workers are
        one rank: the first to get here takes it; ``facts/workers.py``)."""
        if not self._claim:
            self._claim = claim_capture(self.run_dir, self.rank)
            if not self._claim:
                self._scheduled_at, self._auto_armed = None, False  # rearm() has none
        return self._claim

    def close(self, next_step: int | None = None) -> None:
        """End an open window early (job stopping): keep what was captured. A job that
        ended before its default capture says so in the run's log."""
        if self.auto is not None and not self.disabled and next_step:
            self.auto = None
            with contextlib.suppress(Exception):
                self._writer().log("info", "capture", not_taken(next_step))
        if self.active and not self.disabled:
            try:
                done = self._steps if next_step is None else next_step - self._first
                self._finish(max(0, min(done, self._steps)))
            except Exception as exc:
                self._fail(exc)
        if not self._exports.wait():
            self._warn("a trace was still being compressed at the job's end")
        if self._uploads is not None:
            self._uploads.wait()  # the job is ending: its traces' rows come first

    def rearm(self) -> None:
        """The steps counted so far were not the job's steps (evaluation forwards before
        training was seen): a window open on them is dropped unexported, and the
        scheduled one is due again, counted in the training steps. A window already
        exported stays (it is what the job ran then) and is not taken twice."""
        if self.disabled or (self.profile_at is None and self.auto is None and not self.active):
            return
        if self.active:
            prof, self._prof = self._prof, None
            self.active = False
            self._discard = True
            try:
                prof.__exit__(None, None, None)
            finally:
                self._discard = False
                if self._memory_history:
                    self._memory_history = False
                    import torch  # local: see the note on torch

                    torch.cuda.memory._record_memory_history(enabled=None)
        self.profile_at = self._scheduled_at
        if self._auto_armed:
            self.auto = self.auto or AutoTrigger()
            self.auto.reset()

    # -- internals ------------------------------------------------------------------
    def _start(self, first: int, steps: int, reason: str, request_id: str | None) -> None:
        # local: see the note on torch
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        # A schedule makes torch.profiler annotate steps (record_steps); "always
        # RECORD" plus stop() after K steps yields exactly K ProfilerStep# ranges,
        # where the stock RECORD_AND_SAVE schedule would open a (K+1)th empty one.
        prof = profile(
            activities=activities,
            schedule=lambda _step: ProfilerAction.RECORD,
            on_trace_ready=self._export,
            record_shapes=True,
            profile_memory=True,
            with_stack=True,
        )
        prof.step_num = first  # ProfilerStep#N then names the job's own step N
        self._stem = f"{socket.gethostname()}_{os.getpid()}.{int(time.time() * 1000)}"
        self._first, self._steps, self._reason, self._request_id = first, steps, reason, request_id
        if self._location_error:
            self._writer().log(
                "warning", "artifacts", f"{self._location_error}; artifacts stay in the run folder"
            )
            self._location_error = ""
        if self._uploads is not None:
            self._uploads.prepare()
        if cuda:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
            self._memory_history = True
        elif not self._said_cpu_memory:
            self._said_cpu_memory = True
            self._writer().log(
                "info",
                "capture",
                "no CUDA in use: no memory snapshot; the profiler's memory events "
                "(profile_memory=True) stand in for it",
            )
        self._prof = prof
        self.active = True
        self._started, self._bounded = time.perf_counter(), False
        # freed once the profiler records memory: c10's one-per-1000 warning is ours
        sentinel = torch.empty(1)
        with _quiet_kineto():
            prof.__enter__()
        with _quiet_c10_warnings():
            del sentinel

    def _past_bound(self, done: int) -> bool:
        """Has the default window run past WINDOW_BOUND_S with a step in it? It then ends
        here, with the steps it holds, and the run's log says so. A window the user asked
        for (``--profile-at``, ``stepscope capture``) covers the steps asked."""
        if not self._bounded or done < 1:  # a window asked for, or nothing in it yet
            return False
        elapsed = time.perf_counter() - self._started
        bound = window_bound()
        if elapsed < bound:
            return False
        self._writer().log(
            "info",
            "capture",
            f"capture ended after {done} of {self._steps} steps: the window had run "
            f"{elapsed:.1f} s (bound {bound:g} s, {WINDOW_BOUND_ENV}; --profile-at takes "
            "the steps asked)",
        )
        return True

    def _finish(self, steps_done: int) -> None:
        prof, self._prof = self._prof, None
        self.active = False
        self._steps_done = steps_done
        self._stopping = time.perf_counter()
        try:
            prof.__exit__(None, None, None)  # stop(): closes the last step, exports
        finally:
            if self._memory_history:
                self._dump_memory_snapshot()

    def _meta(self) -> dict[str, Any]:
        return {
            "first_step": self._first,
            "steps": getattr(self, "_steps_done", self._steps),
            "rank": self.rank,
            "reason": self._reason,
            "request_id": self._request_id,
        }

    def _export(self, prof: Any) -> None:
        """kineto's results written here, on the job's thread (torch's own work); the
        rest queued on the trace writer's thread (``trace_writer.py``)."""
        if self._discard:
            return
        stem, meta = self._stem, self._meta()
        final = os.path.join(str(self.run_dir), f"{stem}.pt.trace.json.gz")
        raw = final.removesuffix(".gz") + ".part"  # never read as a trace while written
        writing = time.perf_counter()
        prof.export_chrome_trace(raw)
        held = self._held(writing, time.perf_counter())
        self._exports.submit(lambda: self._compress_and_record(prof, raw, final, stem, meta, held))

    def _held(self, writing: float, written: float) -> dict[str, float]:
        """How long closing the window held the job's thread, in torch's two parts: its
        stop (kineto's buffers turned into events) and writing the trace. Both must run
        there; they are what the capture costs the loop beyond its profiled steps, so the
        run's log says them (``bench/capture_stall.py`` reads them from the trace's row)."""
        stop = writing - self._stopping if self._stopping else 0.0
        held = {"stop": round(stop, 3), "write": round(written - writing, 3)}
        with contextlib.suppress(Exception):
            self._writer().log(
                "info",
                "capture",
                f"closing the capture held the job {stop + held['write']:.2f} s: torch's "
                f"stop {held['stop']:.2f} s, writing the trace {held['write']:.2f} s "
                "(compressing it runs beside the job)",
            )
        return held

    def _compress_and_record(
        self,
        prof: Any,
        raw: str,
        final: str,
        stem: str,
        meta: dict[str, Any],
        held: dict[str, float],
    ) -> None:
        """On the trace writer's thread: gzip the trace (zlib lets the job's thread run)
        and its row; the memory timeline waits for the job's end (``TraceWriter.defer``).
        A failure is one line; the raw file stays."""
        try:
            compress(raw, final)
        except Exception as exc:
            self._warn(f"trace not compressed, kept as {raw}: {one_line_error(type(exc), exc)}")
            return
        with contextlib.suppress(Exception):
            self._record("trace", final, meta={**meta, "held_s": held})
        if not memory_timeline_wanted():
            return
        skipped = timeline_skipped(final)
        if skipped is not None:  # too big to walk: said now, and the profile is let go
            with contextlib.suppress(Exception):
                self._writer().log("info", "capture", skipped)
            return
        self._exports.defer(lambda: self._export_memory_timeline(prof, final, stem, meta))

    def _export_memory_timeline(
        self, prof: Any, trace_path: str, stem: str, meta: dict[str, Any]
    ) -> None:
        """torch's categorised memory timeline of the window, beside the trace
        (``memory_timeline.py``): never at the cost of the trace or the run."""
        path = os.path.join(str(self.run_dir), f"{stem}{MEMORY_TIMELINE_SUFFIX}")
        try:
            saved = save_memory_timeline(prof, path)
        except Exception as exc:
            self._warn(f"memory timeline not saved: {one_line_error(type(exc), exc)}")
            return
        self._record("memory_timeline", path, saved, meta=meta)

    def _warn(self, text: str) -> None:
        """One warning line in the run's log; a log that cannot be written is no error."""
        with contextlib.suppress(Exception):
            self._writer().log("warning", "capture", text)

    def _dump_memory_snapshot(self, extra: dict[str, Any] | None = None) -> str:
        """Dump the allocator's snapshot of the window and stop recording its history;
        ``extra``: more meta for its row (``reason: oom`` when the job ran out of memory
        inside the window). Returns the file's path."""
        import torch  # local: see the note on torch

        self._memory_history = False
        path = os.path.join(str(self.run_dir), f"{self._stem}.memory_snapshot.pickle")
        try:
            torch.cuda.memory._dump_snapshot(path)
            self._record("memory_snapshot", path, extra)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        return path

    def _record(
        self,
        kind: str,
        path: str,
        extra: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """The artifact's row: now with the local path, or once uploaded with its URI
        (``local_path`` in its meta); a failed upload logs one line and keeps the local row.
        ``meta``: the window's, taken when it closed (the writer's thread records later)."""
        meta = {**(meta or self._meta()), **(extra or {})}
        writer = self._writer()
        if self._uploads is None:
            writer.add_artifact(kind, path, meta)
            return

        def done(uri: str | None, error: str | None) -> None:
            if uri is None:
                writer.log("warning", "artifacts", f"{kind} kept in the run folder only: {error}")
                writer.add_artifact(kind, path, meta)
            else:
                writer.add_artifact(kind, uri, {**meta, "local_path": path})

        self._uploads.submit(path, writer.run_id, self.rank, kind, done)

    def _fail(self, exc: BaseException) -> None:
        self.disabled = True
        self.active = False
        prof, self._prof = self._prof, None
        if prof is not None:
            self._stopping = time.perf_counter()
            with contextlib.suppress(Exception):
                prof.__exit__(None, None, None)
        if self._memory_history:
            self._memory_history = False
            try:
                import torch  # local: see the note on torch

                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass
        with contextlib.suppress(Exception):
            self._writer().log("warning", "capture", f"profiler capture disabled: {exc!r}")
