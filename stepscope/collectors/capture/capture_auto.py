"""When the default capture of ``stepscope run`` starts: once step times have settled.

A user who runs ``stepscope run -- python train.py`` without ``--profile-at`` came for a
diagnosis, and a diagnosis from a trace is worth more than one from steps and samples
alone; but the first steps are the wrong ones to trace (the allocator growing, cuDNN's
autotuning, lazy initialisation, ``torch.compile``). So the capture waits for the warm-up
(``FIRST_STEP``) and for the last few step times to agree (``SETTLED``), and starts at
``LAST_STEP`` at the latest, so a job whose steps never settle still gets one. A job that
ends before ``FIRST_STEP`` gets none, and its run's log says so.

Long steps (``LONG_STEP_S`` and more: an LBFGS step of twenty closures, a step of a long
sequence) are captured one at a time: one whole step is what the diagnosis needs, and
three steps of thousands of tiny operators each made a 38 MB trace whose export held the
job for 100 s. ``profiler_capture`` also ends any window at its first step boundary past
``WINDOW_BOUND_S``, and says so.

The times are measured between boundaries (one step's end to the next's), which is what
the step timer's step times are too, without asking the timer for them.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque

FIRST_STEP = 3  # the earliest step the capture starts at: a short job gets one too
LAST_STEP = 20  # the latest: settled or not
WINDOW = 2  # the last step times that must agree (step 0, the warm-up, is left out)
SETTLED = 0.25  # each within 25 % of their median
GENERATION_STEPS = 1  # a generation job's steps are requests: one is thousands of forwards
# A default window still open after this long ends at the next step boundary (once it holds
# a step): every step of a long window adds to the trace the job waits for while it is
# written. ``STEPSCOPE_CAPTURE_BOUND_S`` sets another bound.
WINDOW_BOUND_S = 10.0
WINDOW_BOUND_ENV = "STEPSCOPE_CAPTURE_BOUND_S"
LONG_STEP_S = 1.0  # steps this long (their median) are captured one: a whole step is enough


class AutoTrigger:
    """Decides, at each step boundary, whether the default capture starts now."""

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=WINDOW)
        self._last: float | None = None
        self.reason = ""

    def due(self, next_step: int) -> bool:
        now = time.perf_counter()
        if self._last is not None:
            self._times.append(now - self._last)
        self._last = now
        if next_step < FIRST_STEP:
            return False
        if next_step >= LAST_STEP:
            self.reason = f"automatic: step times had not settled by step {LAST_STEP}"
            return True
        if len(self._times) < WINDOW:
            return False
        median = statistics.median(self._times)
        if median <= 0 or max(abs(t - median) for t in self._times) > SETTLED * median:
            return False
        self.reason = (
            f"automatic: the last {WINDOW} step times within {SETTLED:.0%} of their median"
        )
        return True

    def steps(self, asked: int) -> int:
        """How many steps the capture covers: ``asked``, or one when the steps are long."""
        if self._times and statistics.median(self._times) >= LONG_STEP_S:
            self.reason += (
                f"; one step captured (steps of {statistics.median(self._times):.1f} s: "
                "a whole step is enough)"
            )
            return 1
        return asked

    def reset(self) -> None:
        """The steps seen so far were not the job's (evaluation before training)."""
        self._times.clear()
        self._last = None


def not_taken(steps: int) -> str:
    """The run's log line when the job ended before the default capture."""
    return (
        f"no profiler capture: the job ended after {steps} steps, before the automatic "
        f"capture (from step {FIRST_STEP}, once step times settle); the diagnosis rests on "
        "steps and samples (--profile-at STEP takes one earlier)"
    )


def window_bound() -> float:
    """WINDOW_BOUND_S, or the job's ``STEPSCOPE_CAPTURE_BOUND_S`` when it is a number > 0."""
    try:
        bound = float(os.environ.get(WINDOW_BOUND_ENV, ""))
    except ValueError:
        return WINDOW_BOUND_S
    return bound if bound > 0 else WINDOW_BOUND_S
