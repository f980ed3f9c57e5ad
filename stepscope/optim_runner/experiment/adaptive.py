"""When an experiment knows enough: which arms stop getting trials, when it ends, the budget.

Plain functions over each arm's figures so far (no store, no clock), so the rules can be
tested on synthetic figures and read in one place. ``design.py`` applies them between
the rounds of a running experiment.

The rules, and why:

* **Nothing is decided before ``MIN_TRIALS`` trials of every arm** (the baseline's
  included). One is enough to start from: its interval is the bootstrap over its timed
  steps (``stats.speedup_ci``), and an input-bound job's verdict is clear after the first
  round (2.4x, 1.9-3.0, where the fixed design ran every round to the same answer). A
  trial that a neighbour's burst hit is run again (``repeats.py``), not decided on.
* **An arm whose interval is decided stops getting trials.** Clearly slower than the
  baseline (its interval entirely below 1), or clearly behind the best candidate (its
  upper bound below the best one's lower bound): more trials would narrow its interval,
  not change what is kept. Its verdict stays the one its trials gave.
* **The best candidate** is the fastest by its ratio among the arms still running whose
  guard (loss, outputs, tokens) has not failed: an arm whose loss changed cannot be kept,
  so it must not stop the others. It keeps its trials until it is decided as well.
* **The experiment ends early** when the best candidate is clear of 1 (lower bound > 1)
  and of every other arm still running (they were all stopped as behind it), when
  every candidate is decided (stopped, failed, not applied), or when the arms still
  running are all clearly faster than the baseline and overlap the best (*leaders*:
  "all fixes" and "the one fix that matters" measure alike). More trials would only
  split hairs between leaders; the verdict (``verdict.py``) keeps the fixes that earned
  their place among them, and a confirmation round measures that combination.
* **Clearly faster means faster on both statistics**, as the verdict has it
  (``agreement.py``): an arm whose throughput interval is above 1 while its median step
  disagrees is not clear of the baseline, so it does not end the experiment (more
  trials may settle the median); it still ranks, and stops others, on its throughput.
* **An arm between two arms that measured alike is not run.** The fixes an arm adds
  on top of a fix it needs lie between that fix alone and all fixes together
  (``prefetch_factor`` with the workers it needs, between the workers alone and
  everything): when those two are clearly faster and the larger, measured directly
  against the smaller, changed nothing measurable (its interval includes 1), no part
  of what it adds is expected to. Decided before each trial of the first round, so the
  arm costs no trial at all; it is reported as not run, with the two arms and their
  figures. It assumes the fixes in between do not cancel each other out (one faster,
  one as much slower): ``--full`` runs every arm.
* **The budget**: before a round, when the elapsed time plus the round's forecast (each
  arm's mean trial so far) would exceed it, the experiment ends with what it has. The
  first round always runs: it is what the forecast is made of, and without it nothing
  can be said at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Trials every arm (the baseline too) has before any arm stops or the experiment ends.
MIN_TRIALS = 1
# Generous: the default 3 trials x 30 steps of a handful of arms take minutes; the
# budget is for the job whose trials are long, not for the usual one.
DEFAULT_BUDGET_MIN = 30.0

EVERY_DECIDED = "every candidate is decided (stopped, failed or not applied)"


@dataclass(frozen=True)
class Interval:
    """One candidate's speed-up against the baseline so far (> 1: faster).

    ``ratio``/``lo``/``hi`` are None while it has no interval (too few timed steps);
    ``keepable`` is False once its guard failed (the loss, outputs or tokens changed);
    ``agrees`` is False while its median step disagrees with its throughput (the
    verdict's "disagree"): then it is not clearly faster, whatever ``lo`` says.
    """

    name: str
    trials: int
    ratio: float | None
    lo: float | None
    hi: float | None
    keepable: bool = True
    agrees: bool = True

    @property
    def measured(self) -> bool:
        return self.ratio is not None and self.lo is not None and self.hi is not None

    @property
    def clearly_faster(self) -> bool:
        """Faster than the baseline as the verdict says it: above 1, on both statistics."""
        return self.measured and self.agrees and (self.lo or 0.0) > 1.0

    def text(self) -> str:
        """'0.62x, 0.55-0.70'."""
        return f"{self.ratio:.2f}x, {self.lo:.2f}-{self.hi:.2f}"


@dataclass(frozen=True)
class Decision:
    """What to do before the next round: arms that stop (name -> why) and, when the
    experiment (or its phase) ends now, why."""

    stops: dict[str, str]
    end: str | None


def decide(
    candidates: list[Interval], baseline_trials: int, min_trials: int = MIN_TRIALS
) -> Decision:
    """The stops and the end after a round; ``candidates``: the arms still running."""
    if not candidates:
        return Decision({}, EVERY_DECIDED)
    if baseline_trials < min_trials or any(c.trials < min_trials for c in candidates):
        return Decision({}, None)
    stops: dict[str, str] = {}
    for c in candidates:
        if c.measured and c.hi < 1.0:
            stops[c.name] = f"{_after(c)}: slower than the baseline ({c.text()})"
    left = [c for c in candidates if c.name not in stops]
    best = best_of(left)
    if best is not None:
        for c in left:
            if c is not best and c.measured and c.hi < best.lo:
                stops[c.name] = (
                    f"{_after(c)}: behind the best candidate, {best.name} "
                    f"({c.text()}, against {best.text()})"
                )
    left = [c for c in left if c.name not in stops]
    if not left:
        return Decision(stops, EVERY_DECIDED)
    if best is None or not best.clearly_faster:
        return Decision(stops, None)
    if left == [best]:
        if len(candidates) == 1:
            return Decision(
                stops, f"{best.name} is clearly faster than the baseline ({best.text()})"
            )
        return Decision(
            stops,
            f"{best.name} is clearly the fastest ({best.text()}): clear of the baseline and of "
            "every other candidate",
        )
    if all(c.keepable and c.clearly_faster for c in left):
        names = ", ".join(f"{c.name} ({c.text()})" for c in left)
        return Decision(
            stops,
            f"the candidates left are all clearly faster than the baseline and alike: {names}",
        )
    return Decision(stops, None)


def between_alike(
    fixes: set[str],
    measured: list[tuple[set[str], Interval]],
    added: Callable[[str, str], Interval],
) -> str | None:
    """Why an arm of ``fixes`` is not run: two measured arms (fix set, figures against the
    baseline), one of fewer fixes and one of more, both clearly faster, where the larger
    measured against the smaller (``added(larger, smaller)``) changed nothing measurable
    (its interval includes 1); None when there are none.

    The two are compared directly, not by their intervals against the baseline: in one
    demo run all fixes measured 6.53x (5.38-7.79) and the workers alone 4.74x
    (4.17-5.40), intervals that overlap, while what "all" added was not nothing."""
    for low_fixes, low in measured:
        for high_fixes, high in measured:
            if not (low_fixes < fixes < high_fixes):
                continue
            if not all(x.keepable and x.clearly_faster for x in (low, high)):
                continue
            more = added(high.name, low.name)
            if more.measured and (more.lo or 0.0) <= 1.0 <= (more.hi or 0.0):
                return (
                    f"not run: its fixes lie between {low.name} ({low.text()}) and "
                    f"{high.name} ({high.text()}), and {high.name} measured against "
                    f"{low.name} changed nothing measurable ({more.text()})"
                )
    return None


def best_of(candidates: list[Interval]) -> Interval | None:
    """The fastest measured candidate whose guard has not failed; None when none is."""
    pool = [c for c in candidates if c.measured and c.keepable]
    return max(pool, key=lambda c: c.ratio or 0.0) if pool else None


def _after(c: Interval) -> str:
    return f"stopped after {c.trials} trial{'' if c.trials == 1 else 's'}"


# -- the budget --------------------------------------------------------------------------
def round_forecast(trial_s: dict[str, list[float]], arms: list[str]) -> float | None:
    """Seconds the next round of ``arms`` should take: each arm's mean trial so far (an
    arm not run yet: the slowest arm's mean); None before any trial ended."""
    means = {name: sum(v) / len(v) for name, v in trial_s.items() if v}
    if not means:
        return None
    slowest = max(means.values())
    return sum(means.get(name, slowest) for name in arms)


def budget_reached(elapsed_s: float, next_round_s: float | None, budget_min: float | None) -> bool:
    """Would the next round end past the budget? Never without a budget or a forecast."""
    if budget_min is None or next_round_s is None:
        return False
    return elapsed_s + next_round_s > budget_min * 60.0


def budget_text(budget_min: float) -> str:
    return f"budget of {budget_min:g} min reached"


def check_budget(budget_min: float | None, full: bool) -> None:
    """Refuse a budget that allows nothing, and a budget with ``full`` (every trial runs)."""
    if budget_min is None:
        return
    if full:
        raise ValueError("--full runs every trial: it takes no --budget (choose one)")
    if not budget_min > 0:  # also NaN
        raise ValueError(f"--budget must be more than 0 minutes (got {budget_min:g})")


__all__ = [
    "DEFAULT_BUDGET_MIN",
    "EVERY_DECIDED",
    "MIN_TRIALS",
    "Decision",
    "Interval",
    "best_of",
    "between_alike",
    "budget_reached",
    "budget_text",
    "check_budget",
    "decide",
    "round_forecast",
]
