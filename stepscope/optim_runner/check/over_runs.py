"""Check figures over several runs of each side: an interval that covers run-to-run spread.

An interval over one run's steps says how well that run measured itself, not how much a
second run of the same job would differ: on a shared 2-core VM two runs of one job
differ by 3-10 % while each run's interval is about ±1 % (bench/README.md, "Diff and
check"), so one run against one run false-alarms whenever the machine had a slow
minute. pyperf's answer is to run the benchmark in several processes and compare over
them; ``stepscope check`` does the same with runs a CI job has recorded: the named run
and the runs before it with the same name, on each side. By default ("auto") it takes
up to ``AUTO_RUNS`` a side and judges over them when each side has at least
``MIN_RUNS_EACH`` (fewer give too few degrees of freedom to be worth more than one run
widened by the host's spread, ``host_spread.py``); ``--runs N`` asks for N.

Each run gives one value per figure (its mean seconds per sample, its median step, its
p99 request ...), the same statistic the one-run check compares. The speed ratio is the
ratio of the sides' geometric means, and its interval Student's t over the logs with
the two sides' variance pooled (``n_a + n_b - 2`` degrees of freedom: a side of one
run still counts, the other side's spread stands for it). Step times are skewed, run
values much less so (each is already a mean or a median of hundreds of steps), and a
ratio is symmetric on the log scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from stepscope.analyzers.steps.generation import is_generation
from stepscope.optim_runner.speedup.stats import (
    SpeedupCI,
    judged_ratio,
    sec_per_sample,
    timed_step_times,
)
from stepscope.optim_runner.verdict.verdict import tokens_as_samples

CONFIDENCE = 0.95
FINISHED = ("completed", "stopped")
AUTO = "auto"
#: The most runs a side is judged over by default (the newest ones).
AUTO_RUNS = 5
#: By default, intervals over runs need this many on each side.
MIN_RUNS_EACH = 3


def parse_runs(runs: int | str) -> int | None:
    """``"auto"`` as None, else a whole number of runs, at least 1; ValueError in one line."""
    if isinstance(runs, str) and runs.strip().lower() == AUTO:
        return None
    try:
        n = int(str(runs).strip())
    except ValueError:
        raise ValueError(f"runs {runs!r}: a number of runs (1 or more) or 'auto'") from None
    if n < 1:
        raise ValueError(f"runs {n}: at least 1 run of each side")
    return n


def replicate_ids(store: Any, run_id: int, n: int, exclude: Sequence[int] = ()) -> list[int]:
    """``run_id`` and up to ``n - 1`` finished runs before it with its name and with
    steps, newest first; never one of ``exclude`` (the other side's runs, when both
    sides share a name)."""
    if n <= 1:
        return [run_id]
    name = store.run(run_id)["name"]
    runs = store.runs()
    same = runs[(runs["name"] == name) & (runs["id"] < run_id) & runs["status"].isin(FINISHED)]
    same = same[same["steps"] >= 2]  # a run that recorded no steps has no figure
    same = same[~same["id"].isin(list(exclude))]
    before = same.sort_values("id", ascending=False)["id"].head(n - 1)
    return [run_id, *(int(i) for i in before)]


def judged_steps(store: Any, run_id: int) -> pd.DataFrame:
    """A run's steps as the check judges them (a generation run's, counted in tokens)."""
    steps = store.steps(run_id)
    return tokens_as_samples(steps, store.requests(run_id)) if is_generation(steps) else steps


def run_value(figure: str, steps: pd.DataFrame) -> float | None:
    """One run's value of a check figure, as time per unit of work (seconds); None where
    the run cannot give it (no batch sizes, fewer than two timed steps)."""
    if figure in ("throughput", "tokens/s"):
        spp = sec_per_sample(steps)
        return None if spp is None or not spp.size else float(np.mean(spp))
    times = timed_step_times(steps)
    if times.size < 2:
        return None
    if figure.endswith(" latency"):
        return float(np.percentile(times, float(figure.split()[0].lstrip("p"))))
    return float(np.median(times))  # the median step / request time


def interval_over_runs(base: list[float], run: list[float]) -> SpeedupCI | None:
    """Speed of ``run`` against ``base`` (times per unit of work, one per run): > 1, the
    run is faster. None with fewer than three runs in all or a time that is not > 0."""
    a, b = np.asarray(base, dtype=float), np.asarray(run, dtype=float)
    if a.size + b.size < 3 or not a.size or not b.size or (a <= 0).any() or (b <= 0).any():
        return None
    la, lb = np.log(a), np.log(b)
    diff = float(la.mean() - lb.mean())  # log of (base time / run time)
    squares = float(((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum())
    df = a.size + b.size - 2
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, df) * np.sqrt(squares / df * (1 / a.size + 1 / b.size))
    lo, hi = float(np.exp(diff - half)), float(np.exp(diff + half))
    ratio = float(np.exp(diff))
    return judged_ratio(ratio, lo, hi, CONFIDENCE, int(a.size), int(b.size), "t over runs")


__all__ = [
    "AUTO",
    "AUTO_RUNS",
    "MIN_RUNS_EACH",
    "interval_over_runs",
    "judged_steps",
    "parse_runs",
    "replicate_ids",
    "run_value",
]
