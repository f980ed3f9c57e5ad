"""Steps from the step timer's accumulators to the store, and the step limit.

Whatever ends a step (an optimizer step, a forward, a mark), the row is made here: the
accumulators since the previous step are taken into a row, the row gets its index and
goes to the writer, or first waits for its CUDA event (``cuda_timing.py``). After each
step the capture schedule and the step limit are checked; at the end of the job the
rows still held back are written.

A step spans [end of the previous step, end of this one]; the first one starts at the
first sign of activity (DataLoader, a forward, a backward). Time only stepscope spent
between two steps (a capture starting) is not charged to the next one.

The phases of a step (``data_wait_s``, ``forward_s``, ``backward_s``, ``optimizer_s``)
are host-clock times inside the DataLoader, the outermost module calls, backward and
the optimizer's ``step``/``zero_grad``. They are *exclusive*: the entry points push a
phase on a per-thread stack and the time always goes to the phase on top, so a
closure's forward and backward run inside ``optimizer.step(closure)`` (Lightning) count
as forward and backward, and a fetch inside a forward as data wait. The rest of the step
(the loop's own Python, ``.item()``, logging, a hand-written update) is nobody's phase:
the analysis calls it "other". Each entry or exit costs one ``perf_counter`` and a few
list operations, once per phase call, never per submodule.

Methods of ``StepTimer`` (``step_timer.py``), kept apart from the ways steps are
found; the state they use is set up in ``StepTimer.__init__``.
"""

from __future__ import annotations

import contextlib
import time
from time import perf_counter
from typing import Any

from stepscope.collectors.step_row import add_phases, public, sum_or_none
from stepscope.collectors.workers import training_worker

# Steps right after a capture window run slow (the profiler's teardown, cold caches):
# flagged like the captured ones and left out of the step-time figures.
AFTER_CAPTURE_STEPS = 2
# Bookkeeping between two steps longer than this (first-step set-up, a capture) is
# left out of the next step rather than charged to it.
OWN_WORK_GAP_S = 0.001

# The phases, as the timer's per-thread stack holds them: FORWARD, BACKWARD and
# OPTIMIZER index ``StepTimer.phase_s`` (minus 1, in the order of PHASE_COLUMNS);
# OTHER is charged to nobody (a closure's own work: it pauses the optimizer phase).
DATA, FORWARD, BACKWARD, OPTIMIZER, OTHER = 0, 1, 2, 3, 4


class StepLimitReached(SystemExit):
    """Raised in the job after ``STEPSCOPE_MAX_STEPS`` steps: exits with code 0.

    A SystemExit so that ``except Exception`` in the user's loop cannot swallow it,
    and so that atexit handlers (our final flush) still run.
    """

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


class StepAccounting:
    """Rows made, numbered, written; captures and the limit between steps; the end."""

    # -- phases -------------------------------------------------------------------------
    def _phase_enter(self, phase: int) -> None:
        """A phase begins: the one it interrupts stops accruing until it ends."""
        tls = self._tls
        now = perf_counter()
        stack = getattr(tls, "phases", None)
        if stack is None:
            stack = tls.phases = []
        elif stack:
            self._charge(stack[-1], now - tls.phase_t0)
        stack.append(phase)
        tls.phase_t0 = now

    def _phase_exit(self, phase: int) -> None:
        """The innermost open ``phase`` ends; phases opened inside it and never closed
        (an exception skipped their end) are closed with it."""
        tls = self._tls
        stack = getattr(tls, "phases", None)
        if not stack or phase not in stack:
            return
        now = perf_counter()
        self._charge(stack[-1], now - tls.phase_t0)
        while stack.pop() != phase:
            pass
        tls.phase_t0 = now

    def _phase_flush(self) -> None:
        """A step ends inside a phase: its time so far belongs to the step ending."""
        tls = self._tls
        stack = getattr(tls, "phases", None)
        if stack:
            now = perf_counter()
            self._charge(stack[-1], now - tls.phase_t0)
            tls.phase_t0 = now

    def _phase_skip(self) -> None:
        """Time only stepscope spent (a capture starting) is nobody's phase."""
        tls = self._tls
        if getattr(tls, "phases", None):
            tls.phase_t0 = perf_counter()

    def _charge(self, phase: int, seconds: float) -> None:
        if phase == DATA:
            self.data_wait += seconds
        elif phase != OTHER:
            self.phase_s[phase - 1] += seconds

    # -- rows -------------------------------------------------------------------------
    def _take_row(self, kind: str, end_s: float) -> dict[str, Any]:
        """Snapshot the accumulators into a row (no step index yet) and reset them."""
        self._phase_flush()
        samples, batches, last_batch = self.batch_counter.take()
        row: dict[str, Any] = {
            "rank": self.rank,
            "start_s": self.start_s if self.start_s is not None else self.installed_at,
            "end_s": end_s,
            "data_wait_s": self.data_wait,
            "forward_s": self.phase_s[FORWARD - 1],
            "backward_s": self.phase_s[BACKWARD - 1],
            "optimizer_s": self.phase_s[OPTIMIZER - 1],
            "batch_size": (self.batch + samples) or None,
            "kind": kind,
            "profiled": self.profiled,
            "_losses": self._anchor_losses + self.losses,
            "_batches": self.batches + batches,
            "_last_batch": last_batch,
        }
        self.data_wait = 0.0
        self.phase_s = [0.0, 0.0, 0.0]
        self.batch = 0
        self.batches = 0
        self.losses = []
        self._anchor_losses = []
        return row

    def _end_step(self, kind: str) -> None:
        end = time.time()
        row = self._take_row(kind, end)
        self._emit(row)
        self._after_emit(end)

    def _release(self, rows: list[dict[str, Any]]) -> None:
        """Write rows held back earlier, checking the limit and captures after each.

        The step under way keeps its start: only the job ran since these rows ended.
        """
        start, profiled = self.start_s, self.profiled
        for row in rows:
            self._emit(row)
            self._between_steps()
        self.start_s = start
        self.profiled = profiled or self.profiled

    def _emit(self, row: dict[str, Any]) -> None:
        """Give the row its index and hand it to the writer (or to the CUDA queue)."""
        if not self._rank_known:
            self._rank_known = True
            self.rank = self._dist_rank()
            if self.capture is not None:
                self.capture.rank = self.rank
        if self.worker is None:
            self.worker = training_worker(self._torch)
        row["rank"], row["worker"] = self.rank, self.worker
        row["step"] = self.step
        self.step += 1
        if row.get("kind") == "generate" and self.capture is not None:
            self.capture.generation = True  # the default capture takes one request
        self._emitted_data_wait += row["data_wait_s"]
        self._emitted_phases = add_phases(self._emitted_phases, row)
        self._emitted_batch += row["batch_size"] or 0
        if self._on_first_step is not None:
            callback, self._on_first_step = self._on_first_step, None
            try:
                callback()
            except Exception as exc:
                self._disable("device info", exc)
            self._write_facts()
        corrected = self.batch_counter.check_look_ahead(row)
        if corrected is not None:
            # step 0 may be written already (or, on CUDA, wait for its event): write the
            # corrected row now, which replaces it; a later CUDA write carries it too
            self._writer().add_step(public(corrected))
        losses = row["_losses"]
        if "cuda" not in self._disabled and self.cuda.in_use():
            try:
                self.cuda.queue(row)
                return
            except Exception as exc:
                self._disable("cuda", exc)
        if losses:
            row["loss"] = sum_or_none([t.item() for t in losses if t.is_cpu])
        self._writer().add_step(public(row))

    def _after_emit(self, end: float) -> None:
        """Right after a step ended: the next step's start, captures, the limit."""
        slow = self._between_steps(stop=False)
        now = time.time()
        if slow or now - end > OWN_WORK_GAP_S:
            # Only stepscope ran since `end` (starting the writer, a capture): that
            # time is ours, so the next step starts after it instead of paying for it.
            self.start_s = now
            self._phase_skip()
            self.cuda.last_event = None
            self._record_cuda_marker()
        else:
            self.start_s = end
        if self.max_steps is not None and self.step >= self.max_steps:
            self._stop_job()

    def _between_steps(self, stop: bool = True) -> bool:
        """Capture windows and (``stop``) the step limit at the boundary before
        ``self.step``; True when slow work (a capture starting or ending) was done."""
        slow = False
        if self._after_capture:
            self._after_capture -= 1
        if self.capture is not None and "capture" not in self._disabled:
            try:
                was_active = self.capture.active
                slow = self.capture.on_boundary(self.step)
                if was_active and not self.capture.active:
                    self._after_capture = AFTER_CAPTURE_STEPS
            except Exception as exc:
                self._disable("capture", exc)
        active = bool(self.capture is not None and self.capture.active)
        self.profiled = active or self._after_capture > 0
        if stop and self.max_steps is not None and self.step >= self.max_steps:
            self._stop_job()
        return slow

    def _record_cuda_marker(self) -> None:
        """An event at a step's start, for the device time of the first step of a run."""
        if "cuda" in self._disabled or not self.cuda.in_use():
            return
        try:
            self.cuda.mark_start()
        except Exception as exc:
            self._disable("cuda", exc)

    def resolve_pending(self) -> None:
        """Writer ``before_flush`` callback: write CUDA rows whose events have completed.

        Runs on the writer's thread. ``event.query()`` never blocks; a row whose event
        is still pending after ``cuda_timing.CUDA_WAIT_S`` is written without device_s rather than
        held, so the store stays within a couple of seconds of the job.
        """
        self.cuda.resolve(self._writer, final=self._final)

    def finalize(self) -> None:
        """At exit or at the step limit: write everything still held back."""
        if self._final:
            return
        if not self.inert:
            self._finalize_generation()
        try:
            pending = self._fwd_since_boundary or self._pending_fwd
            if pending and self._updates_by_hand() and not self.inert:
                # the last iteration of a job that updates by hand ends with its backward
                self._fwd_since_boundary = False
                snapshot = self._at_backward_end
                if snapshot is not None and snapshot[0] == self.step:
                    # the row ends there: the evaluation after it is not in its phases
                    self.data_wait, self.phase_s = snapshot[1], list(snapshot[2])
                    self._phase_skip()
                self._absorb_pending()
                self._emit(self._take_row("forward", self._last_backward_end or time.time()))
            if self._held is not None and not self.inert:
                held, self._held = self._held, None  # a job that ended in its first cycle
                self._emit(held)
            if self._pending_fwd and not self.inert:
                self._fwd_confirmed = True
                pending, self._pending_fwd = self._pending_fwd, []
                for row in pending:
                    self._emit(row)
        except Exception as exc:
            self._disable("step timer", exc)
        self._final = True
        self.inert = True
        self._write_facts()
        if self.mode == "mark" and self._taken_back > self.step:
            with contextlib.suppress(Exception):
                self._writer().delete_steps_from(self.step)
        if self.capture is not None:
            self.capture.close(self.step)
        if self.cuda.rows:
            with contextlib.suppress(Exception):
                self._torch.cuda.synchronize()  # the job is over: waiting is free now

    def _write_facts(self) -> None:
        """Rank 0 speaks for the job: ranks run the same script with the same settings."""
        if self.rank != 0 or "facts" in self._disabled:
            return
        try:
            facts = self.facts.take_if_changed()
            if facts:
                self._writer().merge_run_json("facts", facts)
        except Exception as exc:
            self._disable("facts", exc)

    def _stop_job(self) -> None:
        writer = self._writer()
        self.finalize()
        writer.update_run(stop_reason="max_steps")
        writer.log("info", "step_timer", f"stopping the job after {self.step} steps (max_steps)")
        writer.flush()
        raise StepLimitReached(self.step)
