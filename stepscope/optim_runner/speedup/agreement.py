"""Does the median step agree with the throughput? A fix is called faster only on both.

An experiment's headline is throughput (mean seconds per sample, ``verdict.evaluate``),
and the median step ratio is reported beside it. The two can part: "1.27x faster" on
throughput beside a median step ratio of 1.00x, when a few slow steps of the baseline's
trials (a neighbour's burst, a GC pause, one stalled batch) weigh on its mean and the
candidate's typical step is no faster. A fix kept on one statistic while the other says
"no change" is a verdict nobody can trust, so:

* **The rule.** Where throughput says faster (its interval's lower bound above 1), the
  median must say faster too: its bootstrap interval's lower bound above 1 as well. Short
  of that the candidate's verdict is ``DISAGREE``: it is not called faster and not kept
  (``pick_best`` and the per-fix "kept" read the verdict). A slower or unchanged
  throughput needs no second opinion: it is not kept either way. Without a median
  interval (too few steps) there is nothing to contradict the throughput.
* **Which median.** The median step time, the "median step ratio" the tables show. When a
  fix changes the batch size (``larger_batch``) a step carries other work and its time is
  not comparable: the median time *per sample* is checked instead, and the result says so.
* **Why they differ.** Throughput/median = (baseline mean/median) / (candidate
  mean/median) on the same times, exactly: the ratio of each arm's skew. When the
  baseline's skew exceeds the candidate's by ``SKEW_GAP`` its slow steps weigh on its
  mean and the text says so, with both skews; otherwise the median's interval is just
  wider than the gain (too few steps to tell), and more trials would.
* **Generation jobs** (tokens/s) are left out: a request's latency grows with its new
  tokens, so the median request is not the figure tokens/s should agree with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stepscope.optim_runner.speedup.stats import FASTER, SpeedupCI, speedup_ci

DISAGREE = "disagree"
# The baseline's mean/median over the candidate's at which its slow steps explain the gap
# between the throughput and the median ratio (they differ by exactly this factor).
SKEW_GAP = 1.1


class ArmTimes(Protocol):
    """What the check reads of an arm (``verdict.Figures``)."""

    step_times: np.ndarray
    sec_per_sample: np.ndarray | None
    batch: float | None


@dataclass(frozen=True)
class Agreement:
    """The median the throughput was checked against, and whether they agree.

    ``median`` is None without an interval (too few timed steps); ``text`` says why they
    disagree, or, when the batch sizes differ, why the median step is not the figure."""

    agrees: bool
    basis: str
    median: SpeedupCI | None
    text: str | None

    def to_json(self) -> dict[str, Any]:
        m = self.median
        return {
            "agrees": self.agrees,
            "basis": self.basis,
            "ratio": None if m is None else round(m.ratio, 4),
            "ci": None if m is None else [round(m.lo, 4), round(m.hi, 4)],
            "verdict": None if m is None else m.verdict,
            "text": self.text,
        }


def ratio_ci(
    base: np.ndarray | None, cand: np.ndarray | None, statistic: str = "median"
) -> SpeedupCI | None:
    """``stats.speedup_ci``, or None when a side is missing or has fewer than 2 steps."""
    if base is None or cand is None:
        return None
    try:
        return speedup_ci(base, cand, statistic=statistic)
    except ValueError:  # fewer than 2 timed steps on a side
        return None


def check_agreement(
    throughput: SpeedupCI, step: SpeedupCI | None, base: ArmTimes, cand: ArmTimes
) -> Agreement:
    """Does the median (``step``: the median step-time ratio) agree with ``throughput``?"""
    resized = base.batch is not None and cand.batch is not None and base.batch != cand.batch
    if resized:
        basis, b, c = "median time per sample", base.sec_per_sample, cand.sec_per_sample
        median = ratio_ci(b, c)
    else:
        basis, b, c, median = "median step", base.step_times, cand.step_times, step
    if throughput.verdict != FASTER or median is None or median.lo > 1.0:
        note = _resized_note(step, base, cand, median) if resized else None
        return Agreement(True, basis, median, note)
    head = (
        f"throughput {throughput.ratio:.2f}x but {basis} {median.ratio:.2f}x "
        f"({median.lo:.2f}-{median.hi:.2f}x)"
    )
    return Agreement(False, basis, median, f"{head}: {_why(b, c, basis)}")


def _skew(values: np.ndarray | None) -> float | None:
    """Mean over median: how much a few slow steps weigh on the mean (1: none)."""
    if values is None or not values.size:
        return None
    median = float(np.median(values))
    return float(np.mean(values)) / median if median > 0 else None


def _why(base: np.ndarray | None, cand: np.ndarray | None, basis: str) -> str:
    """Why the mean moved and the median did not: the ratio of the two arms' skews."""
    sb, sc = _skew(base), _skew(cand)
    unit = "step" if basis == "median step" else "time per sample"
    if sb is not None and sc is not None and sb >= SKEW_GAP * sc:
        return (
            f"a few slow steps in the baseline weigh on its mean (its mean {unit} is "
            f"{sb:.2f}x its median, the candidate's {sc:.2f}x); the typical step is not "
            "measurably faster"
        )
    return (
        f"the {basis}'s interval includes 1: too few timed steps to tell the typical "
        "step apart (more --trials or --steps would)"
    )


def _resized_note(
    step: SpeedupCI | None, base: ArmTimes, cand: ArmTimes, per_sample: SpeedupCI | None
) -> str:
    """Why the median step ratio is not the figure when a fix changed the batch size."""
    per = "" if per_sample is None else f"; per sample {per_sample.ratio:.2f}x"
    step_text = "" if step is None else f"median step {step.ratio:.2f}x "
    return (
        f"{step_text}with {cand.batch:g} samples a step against {base.batch:g}: "
        f"the median time per sample is compared instead{per}"
    )


__all__ = ["DISAGREE", "SKEW_GAP", "Agreement", "ArmTimes", "check_agreement", "ratio_ci"]
