"""A trial during which other work competed for the cores is run again, not counted.

The system sampler beside every trial sees the machine's CPU and the job's process tree
(``contention.other_cores``). A trial whose other work, while its steps ran, averaged
more than ``contention.BUSY_CORES`` measured the neighbour as much as the fix: the same experiment
once gave channels_last 0.99x beside another job and 1.30x alone. Such a trial is run
again at once (same arm, same trial number), and its run stays in the store, marked in
the experiment's result as not counted, so its numbers never enter the statistics.

Bounded, so that it cannot loop and a machine that is always busy still ends: at most
``PER_ARM`` repeats of one arm and ``PER_EXPERIMENT`` in all (``STEPSCOPE_BUSY_REPEATS``
or ``ExperimentOptions(busy_repeats=...)`` changes the latter, 0 turns repeats off). Past
the limit busy trials are counted as they come, and the result says the machine stayed
busy. Only trials that ran their steps are repeated: a failed one is the failure's.
"""

from __future__ import annotations

import os
from typing import Any

from stepscope.optim_runner.trials.contention import BUSY_CORES, other_cores
from stepscope.optim_runner.trials.trials import Arm

PER_ARM = 2
PER_EXPERIMENT = 6
ENV = "STEPSCOPE_BUSY_REPEATS"


def default_limit() -> int:
    """Repeats per experiment: ``$STEPSCOPE_BUSY_REPEATS`` when set (a test suite that runs
    two jobs on two cores by design sets 0), else ``PER_EXPERIMENT``."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return PER_EXPERIMENT
    try:
        return max(0, int(value))
    except ValueError as exc:
        raise ValueError(f"{ENV} must be a whole number of trials, got {value!r}") from exc


def busy_cores(samples: Any, window: tuple[float, float] | None = None) -> float | None:
    """Mean cores of other work during one trial's steps (``window``: first start, last
    end); None when the sampler saw nothing. Outside the steps, the trial's own launcher
    and sampler start up beside the job and read as other work: a quiet 2-core machine
    once had three of six short trials run again for them. A window with no tick
    (steps shorter than the sampling interval) falls back to the whole trial."""
    if window is not None and samples is not None and not samples.empty:
        inside = samples[(samples["t"] >= window[0]) & (samples["t"] <= window[1])]
        ticks = other_cores(inside)
        if ticks.size:
            return float(ticks.mean())
    ticks = other_cores(samples)
    return float(ticks.mean()) if ticks.size else None


def steps_window(steps: Any) -> tuple[float, float] | None:
    """From the first step's start to the last one's end; None without steps."""
    if steps is None or steps.empty:
        return None
    return float(steps["start_s"].min()), float(steps["end_s"].max())


def may_repeat(repeats_of_arm: int, repeats_in_all: int, limit: int) -> bool:
    """Is a busy trial of this arm run again, or counted (a limit is reached)?"""
    return repeats_of_arm < min(PER_ARM, limit) and repeats_in_all < limit


class Repeats:
    """The trials run again in one experiment, and the busy ones counted past the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.trials: list[dict[str, Any]] = []  # the runs not counted
        self.busy_counted: list[int] = []  # busy trials counted: the limit was reached

    def check(self, store: Any, arm: Arm, run: dict[str, Any], k: int, phase: str) -> str | None:
        """After a trial that ran its steps: why it is run again (one line), or None
        when it counts."""
        if self.limit <= 0:
            return None
        other = busy_cores(store.samples(run["id"]), steps_window(store.steps(run["id"])))
        if other is None or other <= BUSY_CORES:
            return None
        mine = sum(1 for t in self.trials if t["arm"] == arm.name)
        if not may_repeat(mine, len(self.trials), self.limit):
            self.busy_counted.append(int(run["id"]))
            return None
        self.trials.append(
            {
                "run": int(run["id"]),
                "arm": arm.name,
                "trial": k,
                "phase": phase,
                "other_cores": round(other, 2),
                "counted": False,
            }
        )
        return (
            f"other work used {other:.2f} cores beside the trial: run again, this one not counted"
        )

    def to_json(self) -> dict[str, Any]:
        note = None
        if self.busy_counted:
            note = (
                f"the machine stayed busy: after {len(self.trials)} repeated trials "
                f"(at most {min(PER_ARM, self.limit)} per arm, {self.limit} in all), "
                f"{len(self.busy_counted)} busy trials were counted as they came"
            )
        return {
            "count": len(self.trials),
            "trials": list(self.trials),
            "per_arm": min(PER_ARM, self.limit),
            "limit": self.limit,
            "busy_counted": list(self.busy_counted),
            "note": note,
        }


__all__ = [
    "ENV",
    "PER_ARM",
    "PER_EXPERIMENT",
    "Repeats",
    "busy_cores",
    "default_limit",
    "may_repeat",
    "steps_window",
]
