"""An experiment's design between its rounds: adaptive (the default) or fixed (``--full``).

``TrialLoop._rounds`` asks, before every round after the first, whether the round runs;
an experiment answers through its ``Design``, which applies the rules of ``adaptive.py``
to the trials so far and keeps what the result reports about them:

* **adaptive**: arms whose interval is decided stop getting trials (the loop takes
  their remaining trials out of the progress total), the phase ends when the best
  candidate is clear or every candidate is decided, and no round starts that the
  budget cannot hold;
* **adaptive, within the first round**: an arm whose fixes lie between two candidates
  that differ by nothing measurable gets no trial (``before_trial``);
* **full**: every arm that has not failed gets every trial, and there is no budget:
  today's fixed design, for whoever wants it and for ``bench/time_to_verdict.py``.

The confirmation phase (the kept fixes measured together beside baseline trials of its
own, ``experiment.py``) follows the same rules against its own baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stepscope.optim_runner.experiment.adaptive import (
    MIN_TRIALS,
    Interval,
    between_alike,
    budget_reached,
    budget_text,
    decide,
    round_forecast,
)
from stepscope.optim_runner.speedup.agreement import DISAGREE
from stepscope.optim_runner.trials.trials import Arm

FULL = "full"
ADAPTIVE = "adaptive"


def interval(arm: Arm, outcome: dict[str, Any]) -> Interval:
    """An arm's figures so far (``verdict.evaluate``'s outcome) as the rules read them."""
    lo, hi = outcome.get("ci") or (None, None)
    return Interval(
        name=arm.name,
        trials=len(arm.runs),
        ratio=outcome.get("speedup"),
        lo=lo,
        hi=hi,
        keepable=outcome.get("quality_ok") is not False,
        agrees=outcome.get("verdict") != DISAGREE,  # throughput and median step agree
    )


class Design:
    """What happened between an experiment's rounds: stops, the end, and why."""

    def __init__(self, full: bool, budget_min: float | None, max_rounds: int) -> None:
        self.full = full
        self.budget_min = None if full else budget_min
        self.max_rounds = max_rounds
        self.started = time.monotonic()
        self.stopped: dict[str, str] = {}  # arm name -> why
        self.ended: dict[str, str] = {}  # phase -> why it ended before its last round

    def between_rounds(
        self,
        phase: str,
        arms: list[Arm],
        judge: Callable[[Arm], dict[str, Any]],
        trial_s: dict[str, list[float]],
        stop: Callable[[Arm, str], None],
    ) -> bool:
        """Before the next round of ``phase`` (``arms[0]``: the baseline the others are
        judged against, by ``judge``): stop the decided arms (``stop``), and say whether
        the round runs."""
        reference, running = arms[0], [a for a in arms[1:] if a.runnable]
        if not self.full:
            ready = len(reference.runs) >= MIN_TRIALS and all(
                len(a.runs) >= MIN_TRIALS for a in running
            )
            decision = decide(
                [
                    interval(a, judge(a)) if ready else Interval(a.name, len(a.runs), *_NONE)
                    for a in running
                ],
                len(reference.runs),
            )
            for arm in running:
                why = decision.stops.get(arm.name)
                if why is not None:
                    stop(arm, why)
                    self.stopped[arm.name] = why
            if decision.end is not None:
                self.ended[phase] = decision.end
                return False
        if not self.budget_allows([a.name for a in arms if a.runnable], trial_s):
            self.ended[phase] = budget_text(self.budget_min or 0.0)
            return False
        return True

    def before_trial(
        self,
        arm: Arm,
        arms: list[Arm],
        judge: Callable[[Arm, Arm | None], dict[str, Any]],
    ) -> str | None:
        """Why ``arm`` (not run yet) gets no trial at all: it lies between two measured
        candidates of ``arms`` (``arms[0]``: the baseline) that differ by nothing
        measurable; ``judge(a, against)``: ``a``'s figures against another arm (None: the
        baseline). None when it runs (always in the full design)."""
        if self.full or arm.runs or len(arms[0].runs) < MIN_TRIALS:
            return None
        fixes = set(arm.fix_ids)
        # only the measured arms below or above it are judged (each judgement reads its
        # trials' steps and bootstraps an interval)
        pairs = [
            (set(a.fix_ids), a)
            for a in arms[1:]
            if a.runs and not a.failed and (set(a.fix_ids) < fixes or fixes < set(a.fix_ids))
        ]
        if not any(low < fixes for low, _ in pairs) or not any(fixes < high for high, _ in pairs):
            return None  # nothing on one side: nothing to judge
        by_name = {a.name: a for _, a in pairs}
        why = between_alike(
            fixes,
            [(f, interval(a, judge(a, None))) for f, a in pairs],
            lambda high, low: interval(by_name[high], judge(by_name[high], by_name[low])),
        )
        if why is not None:
            self.stopped[arm.name] = why
        return why

    def budget_allows(self, arms: list[str], trial_s: dict[str, list[float]]) -> bool:
        """Can a round of ``arms`` still end within the budget?"""
        elapsed = time.monotonic() - self.started
        return not budget_reached(elapsed, round_forecast(trial_s, arms), self.budget_min)

    def to_json(self, rounds: dict[str, int]) -> dict[str, Any]:
        """The design in the result: how many rounds ran of the most, what stopped early."""
        out: dict[str, Any] = {
            "mode": FULL if self.full else ADAPTIVE,
            "budget_min": self.budget_min,
            "min_trials": None if self.full else MIN_TRIALS,
            "rounds": rounds.get("trials", 0),
            "max_rounds": self.max_rounds,
            "ended": self.ended.get("trials"),
            "stopped": dict(self.stopped),
            "confirm": None,
        }
        if "confirm" in rounds or "confirm" in self.ended:
            out["confirm"] = {
                "rounds": rounds.get("confirm", 0),
                "max_rounds": self.max_rounds,
                "ended": self.ended.get("confirm"),
            }
        return out


_NONE = (None, None, None)

__all__ = ["ADAPTIVE", "FULL", "Design", "interval"]
