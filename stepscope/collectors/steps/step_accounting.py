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

``StepAccounting`` works on the timer's shared ``StepState`` (``step_state.py``); the
step detectors get it passed in and call it to take, hold, release and write rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

from stepscope.collectors.facts.workers import training_worker
from stepscope.collectors.steps.step_row import add_phases, public, sum_or_none
from stepscope.collectors.steps.step_state import StepState

# Steps right after a capture window run slow (the profiler's teardown, cold caches):
# flagged like the captured ones and left out of the step-time figures.
AFTER_CAPTURE_STEPS = 2
# Bookkeeping between two steps longer than this (first-step set-up, a capture) is
# left out of the next step rather than charged to it.
OWN_WORK_GAP_S = 0.001

# The phases, as the timer's per-thread stack holds them: FORWARD, BACKWARD and
# OPTIMIZER index ``StepState.phase_s`` (minus 1, in the order of PHASE_COLUMNS);
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
    """Rows made, numbered, written; captures and the limit between steps; failures.

    ``finalize`` (the job's end: ``StepTimer.finalize``) and the forward detector's
    ``remove_global_hooks`` and ``remove_outer_hooks`` are given by the timer once its
    parts exist: the step limit ends the job, a failure or a worker takes the hooks off.
    """

    def __init__(
        self,
        state: StepState,
        *,
        rank_known: bool,
        on_first_step: Callable[[], None] | None,
    ) -> None:
        self.state = state
        self._rank_known = rank_known  # False: ask torch.distributed at the first row
        self._on_first_step = on_first_step  # the bootstrap's device info, at the first row
        self.finalize: Callable[[], None] = _nothing
        self.remove_global_hooks: Callable[[], None] = _nothing
        self.remove_outer_hooks: Callable[[], None] = _nothing

    # -- failure containment --------------------------------------------------------------
    def disable(self, what: str, exc: BaseException) -> None:
        """A collector failed: switch it off, say so in the run's log, never raise."""
        state = self.state
        if what in state.disabled:
            return
        state.disabled.add(what)
        if what == "step timer":
            state.inert = True
            with contextlib.suppress(Exception):
                self.remove_global_hooks()
                self.remove_outer_hooks()
        with contextlib.suppress(Exception):
            state.writer().log("warning", "step_timer", f"{what} disabled: {exc!r}")

    # -- the first activity ---------------------------------------------------------------
    def activity(self, t: float | None = None) -> None:
        """First sign of work: step 0 starts now (and maybe a capture window with it)."""
        state = self.state
        if state.start_s is not None:
            return
        if state.torch.utils.data.get_worker_info() is not None:
            # A spawned DataLoader worker (forked ones are caught at fork): its
            # transforms may call modules, but it is not the rank and records nothing.
            state.inert = True
            self.remove_global_hooks()
            return
        state.start_s = state.first_activity_s = time.time() if t is None else t
        try:
            if state.capture is not None and state.capture.on_boundary(state.step):
                state.start_s = time.time()  # the capture's start-up is not the job's
            state.profiled = bool(state.capture is not None and state.capture.active)
        except Exception as exc:
            self.disable("capture", exc)
        # a zero_grad() before the loop is set-up, not the first step's optimizer phase
        state.phase_s = [0.0, 0.0, 0.0]
        self.phase_skip()
        self.record_cuda_marker()

    # -- phases -------------------------------------------------------------------------
    def phase_enter(self, phase: int) -> None:
        """A phase begins: the one it interrupts stops accruing until it ends."""
        tls = self.state.tls
        now = perf_counter()
        stack = getattr(tls, "phases", None)
        if stack is None:
            stack = tls.phases = []
        elif stack:
            self._charge(stack[-1], now - tls.phase_t0)
        stack.append(phase)
        tls.phase_t0 = now

    def phase_exit(self, phase: int) -> None:
        """The innermost open ``phase`` ends; phases opened inside it and never closed
        (an exception skipped their end) are closed with it."""
        tls = self.state.tls
        stack = getattr(tls, "phases", None)
        if not stack or phase not in stack:
            return
        now = perf_counter()
        self._charge(stack[-1], now - tls.phase_t0)
        while stack.pop() != phase:
            pass
        tls.phase_t0 = now

    def phase_flush(self) -> None:
        """A step ends inside a phase: its time so far belongs to the step ending."""
        tls = self.state.tls
        stack = getattr(tls, "phases", None)
        if stack:
            now = perf_counter()
            self._charge(stack[-1], now - tls.phase_t0)
            tls.phase_t0 = now

    def phase_skip(self) -> None:
        """Time only stepscope spent (a capture starting) is nobody's phase."""
        tls = self.state.tls
        if getattr(tls, "phases", None):
            tls.phase_t0 = perf_counter()

    def _charge(self, phase: int, seconds: float) -> None:
        if phase == DATA:
            self.state.data_wait += seconds
        elif phase != OTHER:
            self.state.phase_s[phase - 1] += seconds

    # -- rows -------------------------------------------------------------------------
    def take_row(self, kind: str, end_s: float) -> dict[str, Any]:
        """Snapshot the accumulators into a row (no step index yet) and reset them."""
        state = self.state
        self.phase_flush()
        samples, batches, last_batch = state.batch_counter.take()
        row: dict[str, Any] = {
            "rank": state.rank,
            "start_s": state.start_s if state.start_s is not None else state.installed_at,
            "end_s": end_s,
            "data_wait_s": state.data_wait,
            "forward_s": state.phase_s[FORWARD - 1],
            "backward_s": state.phase_s[BACKWARD - 1],
            "optimizer_s": state.phase_s[OPTIMIZER - 1],
            "batch_size": (state.batch + samples) or None,
            "kind": kind,
            "profiled": state.profiled,
            "_losses": state.anchor_losses + state.losses,
            "_batches": state.batches + batches,
            "_last_batch": last_batch,
        }
        state.data_wait = 0.0
        state.phase_s = [0.0, 0.0, 0.0]
        state.batch = 0
        state.batches = 0
        state.losses = []
        state.anchor_losses = []
        return row

    def merge_row(self, row: dict[str, Any]) -> None:
        """A row held back is part of the step under way after all: its start, phases,
        samples and capture flag go back into the accumulators (not its losses)."""
        state = self.state
        state.start_s = row["start_s"]
        state.data_wait += row["data_wait_s"]
        state.phase_s = add_phases(state.phase_s, row)
        state.batch += row["batch_size"] or 0
        state.batches += row["_batches"]
        state.profiled = state.profiled or row["profiled"]

    def end_step(self, kind: str) -> None:
        end = time.time()
        row = self.take_row(kind, end)
        self.emit(row)
        self.after_emit(end)

    def release(self, rows: list[dict[str, Any]]) -> None:
        """Write rows held back earlier, checking the limit and captures after each.

        The step under way keeps its start: only the job ran since these rows ended.
        """
        state = self.state
        start, profiled = state.start_s, state.profiled
        for row in rows:
            self.emit(row)
            self.between_steps()
        state.start_s = start
        state.profiled = profiled or state.profiled

    def emit(self, row: dict[str, Any]) -> None:
        """Give the row its index and hand it to the writer (or to the CUDA queue)."""
        state = self.state
        if not self._rank_known:
            self._rank_known = True
            state.rank = self._dist_rank()
            if state.capture is not None:
                state.capture.rank = state.rank
        if state.worker is None:
            state.worker = training_worker(state.torch)
        row["rank"], row["worker"] = state.rank, state.worker
        row["step"] = state.step
        state.step += 1
        if row.get("kind") == "generate" and state.capture is not None:
            state.capture.generation = True  # the default capture takes one request
        state.emitted_data_wait += row["data_wait_s"]
        state.emitted_phases = add_phases(state.emitted_phases, row)
        state.emitted_batch += row["batch_size"] or 0
        if self._on_first_step is not None:
            callback, self._on_first_step = self._on_first_step, None
            try:
                callback()
            except Exception as exc:
                self.disable("device info", exc)
            self.write_facts()
        corrected = state.batch_counter.check_look_ahead(row)
        if corrected is not None:
            # step 0 may be written already (or, on CUDA, wait for its event): write the
            # corrected row now, which replaces it; a later CUDA write carries it too
            state.writer().add_step(public(corrected))
        losses = row["_losses"]
        if "cuda" not in state.disabled and state.cuda.in_use():
            try:
                state.cuda.queue(row)
                return
            except Exception as exc:
                self.disable("cuda", exc)
        if losses:
            row["loss"] = sum_or_none([t.item() for t in losses if t.is_cpu])
        state.writer().add_step(public(row))

    def after_emit(self, end: float) -> None:
        """Right after a step ended: the next step's start, captures, the limit."""
        state = self.state
        slow = self.between_steps(stop=False)
        now = time.time()
        if slow or now - end > OWN_WORK_GAP_S:
            # Only stepscope ran since `end` (starting the writer, a capture): that
            # time is ours, so the next step starts after it instead of paying for it.
            state.start_s = now
            self.phase_skip()
            state.cuda.last_event = None
            self.record_cuda_marker()
        else:
            state.start_s = end
        if state.max_steps is not None and state.step >= state.max_steps:
            self.stop_job()

    def between_steps(self, stop: bool = True) -> bool:
        """Capture windows and (``stop``) the step limit at the boundary before
        ``state.step``; True when slow work (a capture starting or ending) was done."""
        state = self.state
        slow = False
        if state.after_capture:
            state.after_capture -= 1
        if state.capture is not None and "capture" not in state.disabled:
            try:
                was_active = state.capture.active
                slow = state.capture.on_boundary(state.step)
                if was_active and not state.capture.active:
                    state.after_capture = AFTER_CAPTURE_STEPS
            except Exception as exc:
                self.disable("capture", exc)
        active = bool(state.capture is not None and state.capture.active)
        state.profiled = active or state.after_capture > 0
        if stop and state.max_steps is not None and state.step >= state.max_steps:
            self.stop_job()
        return slow

    def record_cuda_marker(self) -> None:
        """An event at a step's start, for the device time of the first step of a run."""
        state = self.state
        if "cuda" in state.disabled or not state.cuda.in_use():
            return
        try:
            state.cuda.mark_start()
        except Exception as exc:
            self.disable("cuda", exc)

    def write_facts(self) -> None:
        """Rank 0 speaks for the job: ranks run the same script with the same settings."""
        state = self.state
        if state.rank != 0 or "facts" in state.disabled:
            return
        try:
            facts = state.facts.take_if_changed()
            if facts:
                state.writer().merge_run_json("facts", facts)
        except Exception as exc:
            self.disable("facts", exc)

    def stop_job(self) -> None:
        state = self.state
        writer = state.writer()
        # said first, and committed: the launcher's stall limit stops at it, so the
        # slow work of ending (a capture's export, the last flushes) is not a hang
        writer.update_run(stop_reason="max_steps")
        writer.flush()
        self.finalize()
        writer.log("info", "step_timer", f"stopping the job after {state.step} steps (max_steps)")
        writer.flush()
        raise StepLimitReached(state.step)

    def _dist_rank(self) -> int:
        try:
            dist = self.state.torch.distributed
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:
            pass
        return 0


def _nothing() -> None:
    pass
