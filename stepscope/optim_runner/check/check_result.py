"""The answer of `stepscope check`: its verdicts, the figures it rests on, the allowed
slowdown as people type it. The judging itself is ``perf_check.py``; these are what the
CLI's text, markdown, JSON and JUnit reports and the Python API read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stepscope.optim_runner.check.added_work import AddedWork
from stepscope.optim_runner.check.host_spread import Spread
from stepscope.optim_runner.speedup.stats import SpeedupCI

DEFAULT_MAX_SLOWDOWN = 0.05

SLOWER = "slower"
FASTER = "faster"
NO_SLOWDOWN = "no measurable slowdown"
CANNOT_COMPARE = "cannot compare"
#: A time-based "slower" from an interval that knows nothing of run-to-run spread: one
#: run a side, and neither same-name history nor ``calibrate --noise`` for the host.
INCONCLUSIVE = "inconclusive"
EXIT_CODES = {NO_SLOWDOWN: 0, FASTER: 0, SLOWER: 1, CANNOT_COMPARE: 2, INCONCLUSIVE: 0}
#: The exit code of an inconclusive check asked to fail (``--inconclusive fail``): not
#: 1, so a pipeline can tell "slower" from "could not tell without more runs".
INCONCLUSIVE_FAIL_EXIT = 3

#: How a figure's interval was made (``Figure.basis``).
OVER_RUNS = "over runs"  # Student's t over several runs of each side
WIDENED = "widened"  # one run a side, its per-step interval widened by the host's spread
STEPS_ONLY = "steps only"  # per-step only: no run-to-run spread known


_SLOWDOWN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*$")


def parse_slowdown(text: str | float) -> float:
    """``"5%"``, ``"5 %"`` or ``"0.05"`` as the fraction 0.05; ValueError in one line.

    A bare number of 1 or more is refused rather than read as a percentage: "5" could
    mean 5 % or 500 %, and a gate that guesses wrong passes everything.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, percent = float(text), False
    else:
        match = _SLOWDOWN.match(str(text))
        if match is None:
            raise ValueError(f"max slowdown {text!r}: write a percentage (5%) or a fraction (0.05)")
        value, percent = float(match.group(1)), bool(match.group(2))
    if percent:
        value /= 100.0
    elif value >= 1:
        raise ValueError(
            f"max slowdown {text!r}: a fraction below 1 (0.05) or a percentage ({value:g}%)"
        )
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"max slowdown {text!r}: must be 0 or more")
    return value


@dataclass(frozen=True)
class Figure:
    """One compared figure: its value in each run and the run's speed against the
    baseline (``ci.ratio`` > 1: the run is faster), with the figure's verdict."""

    name: str  # 'throughput', 'median step time', 'p50 latency', 'p99 latency', 'tokens/s'
    unit: str  # what ``baseline``/``run`` are in: 'samples/s', 'tokens/s' or 's'
    baseline: float | None
    run: float | None
    ci: SpeedupCI
    verdict: str = ""  # set by ``check_runs`` against the allowed slowdown
    basis: str = STEPS_ONLY  # OVER_RUNS, WIDENED or STEPS_ONLY
    spread: tuple[Spread, Spread] | None = None  # the baseline's and the run's (WIDENED)

    def basis_text(self) -> str:
        """How the interval was made, in the words of the verdict line."""
        if self.basis == OVER_RUNS:
            n_a, n_b = self.ci.n_baseline, self.ci.n_candidate
            return f"Student's t over {n_a} baseline runs and {n_b} runs"
        if self.basis == WIDENED and self.spread is not None:
            base, run = self.spread
            said = base.describe() if base == run else f"{base.describe()}; {run.describe()}"
            return f"one run against one, widened by this host's run-to-run spread: {said}"
        return "one run against one, over its steps only: no run-to-run spread known"

    @property
    def slowdown(self) -> tuple[float, float, float]:
        """Extra time per unit of work (0.10: 10 % more): the estimate, and its interval
        from the optimistic end (the least slowdown the data allow) to the pessimistic."""
        return 1.0 / self.ci.ratio - 1.0, 1.0 / self.ci.hi - 1.0, 1.0 / self.ci.lo - 1.0

    def to_json(self) -> dict[str, Any]:
        estimate, least, most = self.slowdown
        return {
            "name": self.name,
            "unit": self.unit,
            "baseline": self.baseline,
            "run": self.run,
            "speed_ratio": self.ci.ratio,
            "ci": [self.ci.lo, self.ci.hi],
            "slowdown": estimate,
            "slowdown_ci": [least, most],
            "n": [self.ci.n_baseline, self.ci.n_candidate],
            "verdict": self.verdict,
            "interval": {
                "basis": self.basis,
                "text": self.basis_text(),
                "spread": None if self.spread is None else [s.to_json() for s in self.spread],
            },
        }


@dataclass(frozen=True)
class CheckResult:
    """``run`` against ``baseline``: the verdict, its one-line reason, the figures it
    rests on, the operators that regressed (rows of the operator diff; None where it
    could not be made) and notes (runs of different commands, a failed run, ...)."""

    verdict: str
    why: str
    run_id: int
    baseline_id: int
    run_name: str
    baseline_name: str
    max_slowdown: float
    baseline_tag: str | None = None  # the tag the baseline was named by, if any
    figures: tuple[Figure, ...] = ()
    operators: pd.DataFrame | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    added_work: tuple[AddedWork, ...] = ()  # operators called more often per step
    # the runs each side's figures are over (``--runs N``): the named run first
    baseline_ids: tuple[int, ...] = ()
    run_ids: tuple[int, ...] = ()
    inconclusive_fails: bool = False  # ``--inconclusive fail``

    @property
    def exit_code(self) -> int:
        """0: not measurably slower (or faster), or inconclusive; 1: slower; 2: cannot
        compare; 3: inconclusive when asked to fail on it."""
        if self.verdict == INCONCLUSIVE and self.inconclusive_fails:
            return INCONCLUSIVE_FAIL_EXIT
        return EXIT_CODES[self.verdict]

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        ops = None
        if self.operators is not None:
            clean = self.operators.astype(object).where(self.operators.notna(), None)
            ops = clean.to_dict("records")
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "why": self.why,
            "run": {
                "id": self.run_id,
                "name": self.run_name,
                "runs": list(self.run_ids or (self.run_id,)),
            },
            "baseline": {
                "id": self.baseline_id,
                "name": self.baseline_name,
                "tag": self.baseline_tag,
                "runs": list(self.baseline_ids or (self.baseline_id,)),
            },
            "max_slowdown": self.max_slowdown,
            "inconclusive": self.verdict == INCONCLUSIVE,
            "on_inconclusive": "fail" if self.inconclusive_fails else "pass",
            "figures": [f.to_json() for f in self.figures],
            "operators": ops,
            "added_work": [w.to_json() for w in self.added_work],
            "notes": list(self.notes),
        }

    def __repr__(self) -> str:
        return f"stepscope.CheckResult run {self.run_id} vs {self.baseline_id}: {self.why}"
