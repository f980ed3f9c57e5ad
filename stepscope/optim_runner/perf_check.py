"""Is a run measurably slower than its baseline? The answer `stepscope check` gates CI on.

Decisions, and why:

* **Intervals, not numbers.** Each figure is compared as experiments compare arms
  (``speed.compare_speed``: the ratio of a statistic baseline/run with its bootstrap 95 %
  interval; > 1: the run is faster). A run is *slower* only when even the interval's
  optimistic end is beyond the allowed slowdown: ``hi < 1 / (1 + max_slowdown)``. A
  single number crosses any threshold half the time on two runs of the same job;
  an interval that straddles the threshold says "cannot tell", and a gate that fails a
  pull request for that teaches people to re-run it until it passes.
* **Slowdown is extra time per unit of work.** 5 % means the run may take up to 1.05x
  the baseline's time per sample (per request, per token): the same scale for a
  throughput and a latency, and the one that adds up over an epoch.
* **Which figures.** A training run: throughput (mean seconds per sample), or the median
  step where batch sizes are unknown (``Speed.headline``). An inference run: p50 *and*
  p99 latency, either measurably slower fails (a change can keep the median and
  lengthen the tail). A generation run, whose steps are requests: tokens/s, each
  request's new tokens counted as its samples, as experiments count them
  (``verdict.tokens_as_samples``); a request's time grows with its tokens, so its median
  says little about speed.
* **Cannot compare** (no timed steps, a generation run against one that is not) is its
  own answer (exit 2 in the CLI), never a pass: a gate that passes on nothing hides a
  broken benchmark.
* **What regressed** comes from the operator diff (``report/run_diff_ops.diff_runs``):
  the operators and kernels measured slower or new in the run, largest change first;
  where none did (no trace), its categories and step phases. They explain a verdict,
  they do not make it: a diff that fails leaves a note, and the verdict stands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.report.run_diff_ops import diff_runs
from stepscope.analyzers.steps.generation import is_generation
from stepscope.optim_runner.speed import compare_speed
from stepscope.optim_runner.stats import SpeedupCI, sec_per_sample, timed_step_times
from stepscope.optim_runner.verdict import tokens_as_samples

DEFAULT_MAX_SLOWDOWN = 0.05

SLOWER = "slower"
FASTER = "faster"
NO_SLOWDOWN = "no measurable slowdown"
CANNOT_COMPARE = "cannot compare"
EXIT_CODES = {NO_SLOWDOWN: 0, FASTER: 0, SLOWER: 1, CANNOT_COMPARE: 2}

REGRESSED_STATUSES = ("slower", "new")
TOP_OPERATORS = 5

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

    @property
    def exit_code(self) -> int:
        """0: not measurably slower (or faster); 1: slower; 2: cannot compare."""
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
            "run": {"id": self.run_id, "name": self.run_name},
            "baseline": {
                "id": self.baseline_id,
                "name": self.baseline_name,
                "tag": self.baseline_tag,
            },
            "max_slowdown": self.max_slowdown,
            "figures": [f.to_json() for f in self.figures],
            "operators": ops,
            "notes": list(self.notes),
        }

    def __repr__(self) -> str:
        return f"stepscope.CheckResult run {self.run_id} vs {self.baseline_id}: {self.why}"


def check_runs(
    store: Any,
    run: int | str,
    baseline: int | str,
    max_slowdown: float | str = DEFAULT_MAX_SLOWDOWN,
    operators: bool = True,
) -> CheckResult:
    """Is ``run`` measurably slower than ``baseline`` (ids, names, tags or 'last')?

    Raises ``RunNotFound`` for a run or tag the store lacks, ValueError for a bad
    ``max_slowdown``. ``operators=False`` leaves the operator diff out (it reads traces).
    """
    allowed = parse_slowdown(max_slowdown)
    base_id, run_id = store.resolve_run(baseline), store.resolve_run(run)
    base_row, run_row = store.run(base_id), store.run(run_id)
    typed = str(baseline).strip()
    tag = typed if store.tag(typed) == base_id else None  # named by its tag: say so
    figures, problem, notes = _figures(store, base_id, run_id)
    notes += _run_notes(base_row, run_row)
    result = {
        "run_id": run_id,
        "baseline_id": base_id,
        "run_name": str(run_row["name"]),
        "baseline_name": str(base_row["name"]),
        "max_slowdown": allowed,
        "baseline_tag": tag,
    }
    if problem is not None:
        return CheckResult(CANNOT_COMPARE, problem, notes=tuple(notes), **result)
    judged = tuple(replace(f, verdict=figure_verdict(f.ci, allowed)) for f in figures)
    verdict, why = _overall(judged, allowed)
    ops = None
    if operators:
        ops, more = regressed_operators(store, base_id, run_id)
        notes += more
    return CheckResult(verdict, why, figures=judged, operators=ops, notes=tuple(notes), **result)


def figure_verdict(ci: SpeedupCI, max_slowdown: float) -> str:
    """The rule of the module docstring, on one interval."""
    if ci.hi < 1.0 / (1.0 + max_slowdown):
        return SLOWER
    if ci.lo > 1.0:
        return FASTER
    return NO_SLOWDOWN


def _overall(figures: tuple[Figure, ...], allowed: float) -> tuple[str, str]:
    """The run's verdict: slower if any figure is, faster if every figure is."""
    limit = f"{allowed * 100:g} %"
    slower = [f for f in figures if f.verdict == SLOWER]
    if slower:
        worst = max(slower, key=lambda f: f.slowdown[1])
        return SLOWER, (
            f"{worst.name} is at least {worst.slowdown[1] * 100:.1f} % slower "
            f"({_describe(worst)}): more than the {limit} allowed"
        )
    if all(f.verdict == FASTER for f in figures):
        return FASTER, "faster on " + "; ".join(f"{f.name} {_describe(f)}" for f in figures)
    return NO_SLOWDOWN, (
        f"not measurably more than {limit} slower: "
        + "; ".join(f"{f.name} {_describe(f)}" for f in figures)
    )


def _describe(figure: Figure) -> str:
    ci = figure.ci
    return f"{ci.ratio:.2f}x the baseline's speed, 95 % CI {ci.lo:.2f}-{ci.hi:.2f}x"


def _figures(store: Any, base_id: int, run_id: int) -> tuple[list[Figure], str | None, list[str]]:
    """The figures for the kind of runs these are, or why there are none; with notes."""
    steps_a, steps_b = store.steps(base_id), store.steps(run_id)
    gen_a, gen_b = is_generation(steps_a), is_generation(steps_b)
    if gen_a != gen_b:
        which, other = (base_id, run_id) if gen_a else (run_id, base_id)
        return (
            [],
            (
                f"run {which} is a generation run (its steps are requests) and run {other} is "
                "not: their step times measure different things"
            ),
            [],
        )
    if gen_a:
        steps_a = tokens_as_samples(steps_a, store.requests(base_id))
        steps_b = tokens_as_samples(steps_b, store.requests(run_id))
    ta, tb = timed_step_times(steps_a), timed_step_times(steps_b)
    if ta.size < 2 or tb.size < 2:
        return (
            [],
            (
                f"too few timed steps to compare: baseline run {base_id} has {ta.size}, run "
                f"{run_id} has {tb.size}; each needs at least two (warm-up and profiled steps "
                "left out)"
            ),
            [],
        )
    speed = compare_speed(steps_a, steps_b)
    notes: list[str] = []
    if gen_a and speed.throughput is not None:
        found = [_rate("tokens/s", "tokens/s", speed.throughput, steps_a, steps_b)]
    elif gen_a:
        notes.append("not every request recorded its new tokens: compared by median request")
        found = [_time("median request time", np.median, speed.step_time, ta, tb)]
    elif speed.latency is not None:
        found = [
            _time(f"{p} latency", _percentile(p), ci, ta, tb) for p, ci in speed.latency.items()
        ]
    elif speed.throughput is not None:
        found = [_rate("throughput", "samples/s", speed.throughput, steps_a, steps_b)]
    else:
        notes.append("not every step recorded its batch size: compared by median step time")
        found = [_time("median step time", np.median, speed.step_time, ta, tb)]
    figures = [f for f in found if f is not None]
    if not figures:
        return [], speed.problem or "no figure could be compared (step times of zero?)", notes
    return figures, None, notes


def _percentile(name: str) -> Any:
    q = float(name.lstrip("p"))
    return lambda values: np.percentile(values, q)


def _rate(name: str, unit: str, ci: SpeedupCI, steps_a: Any, steps_b: Any) -> Figure:
    def per_second(steps: Any) -> float | None:
        spp = sec_per_sample(steps)
        return None if spp is None or not spp.size else float(1.0 / np.mean(spp))

    return Figure(name, unit, per_second(steps_a), per_second(steps_b), ci)


def _time(
    name: str, stat: Any, ci: SpeedupCI | None, ta: np.ndarray, tb: np.ndarray
) -> Figure | None:
    """None where the ratio could not be made (``speedup_ci`` refuses times of zero)."""
    return None if ci is None else Figure(name, "s", float(stat(ta)), float(stat(tb)), ci)


def _run_notes(base: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """What a reader of the verdict should know about the two runs themselves."""
    notes = []
    if base["command"] != run["command"]:
        notes.append(
            f"the runs ran different commands (baseline: {' '.join(base['command'])}; "
            f"run: {' '.join(run['command'])})"
        )
    for row, who in ((base, "baseline"), (run, "run")):
        if row["status"] not in ("completed", "stopped"):
            notes.append(f"the {who}, run {row['id']}, is {row['status']}")
    return notes


def regressed_operators(
    store: Any, base_id: int, run_id: int, top: int = TOP_OPERATORS
) -> tuple[pd.DataFrame | None, list[str]]:
    """What the run spends more on: the diff's operators and kernels slower or new in
    it, largest change first (at most ``top``); where it has none (no trace, or none
    regressed), its categories and step phases (data wait, forward, ...), so a run
    recorded without a trace still says where its time went. None, with a note, where
    no diff could be made; the diff's own warnings come as notes."""
    try:
        diff = diff_runs(store, base_id, run_id)
    except Exception as exc:  # noqa: BLE001  the verdict stands without its explanation
        return None, [f"operators: not listed ({type(exc).__name__}: {exc})"]
    # the check says itself when the commands differ (with or without operators)
    notes = [f"operators: {w}" for w in diff.warnings if not w.startswith("different commands")]
    frames = [df for df in (diff.ops, diff.categories) if df is not None and not df.empty]
    if not frames:
        return None, notes
    for df in frames:
        regressed = df[df["status"].isin(REGRESSED_STATUSES)]
        if not regressed.empty:
            return regressed.head(top).reset_index(drop=True), notes
    return frames[0].iloc[0:0].reset_index(drop=True), notes


__all__ = [
    "CANNOT_COMPARE",
    "DEFAULT_MAX_SLOWDOWN",
    "FASTER",
    "NO_SLOWDOWN",
    "SLOWER",
    "CheckResult",
    "Figure",
    "check_runs",
    "figure_verdict",
    "parse_slowdown",
]
