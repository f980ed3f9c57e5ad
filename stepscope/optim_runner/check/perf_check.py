"""Is a run measurably slower than its baseline? The answer `stepscope check` gates CI on.

Decisions, and why:

* **Intervals, not numbers.** Each figure is compared as experiments compare arms
  (``speed.compare_speed``: the ratio of a statistic baseline/run with its bootstrap 95 %
  interval; > 1: the run is faster). A run is *slower* only when even the interval's
  optimistic end is beyond the allowed slowdown: ``hi < 1 / (1 + max_slowdown)``. A
  single number crosses any threshold half the time on two runs of the same job;
  an interval that straddles the threshold says "cannot tell", and a gate that fails a
  pull request for that teaches people to re-run it until it passes.
* **Only intervals that contain run-to-run spread judge time** (``check_intervals.py``):
  over several runs of each side where there are 3 (by default), else one run against
  one widened by the host's run-to-run spread (``host_spread.py``: the names' history,
  else ``calibrate --noise``), else *inconclusive* where the per-step interval alone
  would say "slower" (exit 0, or 3 with ``inconclusive="fail"``). Two runs of one
  unchanged job measured 16.7 % apart on the shared VM, each ±1 % over its own steps.
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
* **More work per step** is the exception (``added_work.py``): an operator the run calls
  more often per step, whose extra time alone is beyond the allowed slowdown even at
  its interval's optimistic end, makes a run that its figures could not tell apart (or
  could not judge: inconclusive) slower, on one run a side too, since work does not
  depend on the machine's speed; a run measurably faster stays faster, with a note.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.report.run_diff_ops import diff_runs
from stepscope.analyzers.steps.generation import is_generation
from stepscope.optim_runner.check.added_work import AddedWork, added_work, beyond
from stepscope.optim_runner.check.check_intervals import (
    basis_words,
    figure_verdict,
    pick_runs,
    with_intervals,
)
from stepscope.optim_runner.check.check_result import (
    CANNOT_COMPARE,
    DEFAULT_MAX_SLOWDOWN,
    FASTER,
    INCONCLUSIVE,
    NO_SLOWDOWN,
    SLOWER,
    CheckResult,
    Figure,
    parse_slowdown,
)
from stepscope.optim_runner.check.over_runs import AUTO, MIN_RUNS_EACH, parse_runs
from stepscope.optim_runner.speedup.speed import compare_speed
from stepscope.optim_runner.speedup.stats import SpeedupCI, sec_per_sample, timed_step_times
from stepscope.optim_runner.verdict.verdict import tokens_as_samples

REGRESSED_STATUSES = ("slower", "new")
TOP_OPERATORS = 5


def check_runs(
    store: Any,
    run: int | str,
    baseline: int | str,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
    operators: bool = True,
    runs: int | str = AUTO,
    inconclusive: str = "pass",
) -> CheckResult:
    """Is ``run`` measurably slower than ``baseline`` (ids, names, tags or 'last')?

    ``max_slowdown``: the fraction (0.05), parsed at the edge that took it as text
    (``parse_slowdown``: the CLI, ``stepscope.check``). Raises ``RunNotFound`` for a run
    or tag the store lacks, ValueError for a bad ``runs`` or ``inconclusive``. ``operators=False`` leaves the
    operator diff out (it reads traces, and with it the added work). ``runs``: "auto"
    (each side's newest runs of its name, judged over when each side has 3) or N
    (``check_intervals.py``); the operator diff stays between the two named runs.
    ``inconclusive``: "pass" or "fail", what ``exit_code`` says of an inconclusive check.
    """
    asked = parse_runs(runs)
    if inconclusive not in ("pass", "fail"):
        raise ValueError(f"inconclusive {inconclusive!r}: 'pass' or 'fail'")
    allowed = float(max_slowdown)
    base_id, run_id = store.resolve_run(baseline), store.resolve_run(run)
    base_row, run_row = store.run(base_id), store.run(run_id)
    typed = str(baseline).strip()
    tag = typed if store.tag(typed) == base_id else None  # named by its tag: say so
    figures, problem, notes = _figures(store, base_id, run_id)
    base_ids, run_ids, over, more = pick_runs(store, base_id, run_id, asked)
    notes += more
    if problem is None:
        figures, more = with_intervals(store, figures, base_ids, run_ids, over)
        notes += more
    notes += _run_notes(base_row, run_row)
    result = {
        "run_id": run_id,
        "baseline_id": base_id,
        "run_name": str(run_row["name"]),
        "baseline_name": str(base_row["name"]),
        "max_slowdown": allowed,
        "baseline_tag": tag,
        "baseline_ids": tuple(base_ids),
        "run_ids": tuple(run_ids),
        "inconclusive_fails": inconclusive == "fail",
    }
    if problem is not None:
        return CheckResult(CANNOT_COMPARE, problem, notes=tuple(notes), **result)
    judged = tuple(replace(f, verdict=figure_verdict(f.ci, allowed, f.basis)) for f in figures)
    verdict, why = _overall(judged, allowed)
    ops, work = None, ()
    if operators:
        diff, more = _operator_diff(store, base_id, run_id)
        notes += more
        if diff is not None:
            ops = regressed_operators(diff)
            work = tuple(added_work(diff, _median_step_ns(store, run_id)))
            verdict, why, more = _with_added_work(
                verdict, why, beyond(list(work), allowed), allowed
            )
            notes += more
    return CheckResult(
        verdict, why, figures=judged, operators=ops, notes=tuple(notes), added_work=work, **result
    )


def _with_added_work(
    verdict: str, why: str, work: list[AddedWork], allowed: float
) -> tuple[str, str, list[str]]:
    """The verdict once the added work beyond the allowed slowdown is known: work does
    not depend on the machine's speed, so it decides where the figures could not."""
    if not work:
        return verdict, why, []
    said = "more work per step: " + "; ".join(w.describe() for w in work[:3])
    if verdict in (NO_SLOWDOWN, INCONCLUSIVE):
        return SLOWER, f"{said}: more than the {allowed * 100:g} % allowed (figures: {why})", []
    return verdict, why, [said]


def _overall(figures: tuple[Figure, ...], allowed: float) -> tuple[str, str]:
    """The run's verdict: slower if any figure is, faster if every figure is."""
    limit = f"{allowed * 100:g} %"
    how = f" ({basis_words(figures)})"
    slower = [f for f in figures if f.verdict == SLOWER]
    if slower:
        worst = max(slower, key=lambda f: f.slowdown[1])
        return SLOWER, (
            f"{worst.name} is at least {worst.slowdown[1] * 100:.1f} % slower "
            f"({_describe(worst)}): more than the {limit} allowed{how}"
        )
    unsure = [f for f in figures if f.verdict == INCONCLUSIVE]
    if unsure:
        worst = max(unsure, key=lambda f: f.slowdown[1])
        return INCONCLUSIVE, (
            f"{worst.name} measured {worst.slowdown[0] * 100:.1f} % slower over the runs' "
            f"own steps ({_describe(worst)}), but that interval knows nothing of run-to-run "
            "spread, and two runs of one unchanged job can differ by more: no verdict; "
            f"record {MIN_RUNS_EACH} runs of each side, or run `stepscope calibrate --noise` "
            "on this host"
        )
    if all(f.verdict == FASTER for f in figures):
        described = "; ".join(f"{f.name} {_describe(f)}" for f in figures)
        return FASTER, f"faster on {described}{how}"
    return NO_SLOWDOWN, (
        f"not measurably more than {limit} slower: "
        + "; ".join(f"{f.name} {_describe(f)}" for f in figures)
        + how
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


def _median_step_ns(store: Any, run_id: int) -> float | None:
    """The run's median timed step (ns), a scale of its added work (``added_work.py``;
    the median: a stall of a few steps is not the step); None: no steps."""
    times = timed_step_times(store.steps(run_id))
    return float(np.median(times) * 1e9) if times.size else None


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


def _operator_diff(store: Any, base_id: int, run_id: int) -> tuple[Any, list[str]]:
    """The operator diff of the two runs (None, with a note, where it could not be
    made), with its own warnings as notes."""
    try:
        diff = diff_runs(store, base_id, run_id)
    except Exception as exc:  # noqa: BLE001  the verdict stands without its explanation
        return None, [f"operators: not listed ({type(exc).__name__}: {exc})"]
    # the check says itself when the commands differ (with or without operators)
    return diff, [
        f"operators: {w}" for w in diff.warnings if not w.startswith("different commands")
    ]


def regressed_operators(diff: Any, top: int = TOP_OPERATORS) -> pd.DataFrame | None:
    """What the run spends more on: the diff's operators and kernels slower or new in
    it, largest change first (at most ``top``); where it has none (no trace, or none
    regressed), its categories and step phases (data wait, forward, ...), so a run
    recorded without a trace still says where its time went. None: nothing to list."""
    frames = [df for df in (diff.ops, diff.categories) if df is not None and not df.empty]
    if not frames:
        return None
    for df in frames:
        regressed = df[df["status"].isin(REGRESSED_STATUSES)]
        if not regressed.empty:
            return regressed.head(top).reset_index(drop=True)
    return frames[0].iloc[0:0].reset_index(drop=True)


__all__ = [
    "CANNOT_COMPARE",
    "DEFAULT_MAX_SLOWDOWN",
    "FASTER",
    "INCONCLUSIVE",
    "NO_SLOWDOWN",
    "SLOWER",
    "CheckResult",
    "Figure",
    "check_runs",
    "figure_verdict",
    "parse_slowdown",
]
