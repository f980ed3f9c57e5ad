"""Is run B really faster than run A? Ratios of medians with bootstrap intervals.

Step times are skewed (a few slow steps: GC, a checkpoint, a neighbour's burst), so
the figure of merit is the ratio of *medians*, and its uncertainty comes from the
bootstrap rather than from a normal approximation that does not hold for a median.
The two runs are independent samples (different processes, different steps), so each
is resampled on its own; a difference whose interval contains 1 is reported as "no
measurable change" rather than as a small gain that the noise could have made.

Plain functions over arrays and step tables, so the dashboard, the CLI and the
experiment runner report the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analyzers.steps.latency import PERCENTILES
from stepscope.analyzers.steps.step_stats import timed_steps

__all__ = [
    "SpeedupCI",
    "judged_ratio",
    "sec_per_sample",
    "speedup_ci",
    "timed_step_times",
]

FASTER = "faster"
SLOWER = "slower"
NO_CHANGE = "no measurable change"


@dataclass(frozen=True)
class SpeedupCI:
    """Speed of a candidate against a baseline: ``ratio`` > 1 means the candidate is faster.

    ``lo``/``hi`` bound ``ratio`` at ``confidence``; ``verdict`` is one of "faster",
    "slower", "no measurable change" (the interval contains 1).
    """

    ratio: float
    lo: float
    hi: float
    confidence: float
    verdict: str
    n_baseline: int
    n_candidate: int
    method: str

    def describe(self) -> str:
        """One line for people: '2.31x faster (95 % CI 2.10-2.52x)'."""
        pct = f"{self.confidence * 100:g} % CI"
        if self.verdict == NO_CHANGE:
            return f"no measurable change: {self.ratio:.2f}x ({pct} {self.lo:.2f}-{self.hi:.2f}x)"
        return f"{self.ratio:.2f}x {self.verdict} ({pct} {self.lo:.2f}-{self.hi:.2f}x)"


def _median_ratio(baseline: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(baseline, axis=axis) / np.median(candidate, axis=axis)


def _mean_ratio(baseline: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(baseline, axis=axis) / np.mean(candidate, axis=axis)


# "median": the typical step, robust to a neighbour's burst. "mean": throughput (total
# time over total work), which is what an epoch's wall time follows. They differ when
# a fix makes steps bimodal: DataLoader workers with prefetching give many instant
# steps and a few that wait, so the median ratio can exceed the throughput gain (and
# the Amdahl bound, which bounds throughput).
_STATISTICS = {"median": _median_ratio, "mean": _mean_ratio}


def _percentile_ratio(q: float) -> Callable[..., np.ndarray]:
    def ratio(baseline: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.percentile(baseline, q, axis=axis) / np.percentile(candidate, q, axis=axis)

    return ratio


# "p50" ... "p99": the latency percentiles of an inference run (``analyzers/steps/latency.py``),
# baseline/candidate as the others, so > 1 means the candidate's requests return sooner.
# The bootstrap interval of a tail percentile rests on the few slowest steps: on a run of
# a few dozen steps p99 is nearly the maximum, and its interval is wide, as it should be.
_STATISTICS.update({f"p{q}": _percentile_ratio(q) for q in PERCENTILES})


def _clean(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    arr = arr[np.isfinite(arr)]
    if arr.size < 2:
        raise ValueError(f"{what}: need at least 2 finite step times, got {arr.size}")
    if (arr <= 0).any():
        raise ValueError(f"{what}: step times must be positive")
    return arr


def speedup_ci(
    baseline_s: Sequence[float] | np.ndarray,
    candidate_s: Sequence[float] | np.ndarray,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    method: str = "percentile",
    statistic: str = "median",
) -> SpeedupCI:
    """Ratio of a statistic of step times baseline/candidate with a bootstrap interval.

    ``statistic``: "median" (the default), "mean" (throughput, over seconds per sample)
    or a latency percentile "p50", "p90", "p95", "p99".

    ``method`` is passed to ``scipy.stats.bootstrap`` ("percentile" by default: BCa's
    jackknife of a median is unstable on the short, tied samples of a bounded run).
    Raises ValueError when either side has fewer than two finite, positive times.
    """

    base = _clean(baseline_s, "baseline")
    cand = _clean(candidate_s, "candidate")
    ratio_of = _STATISTICS[statistic]
    ratio = float(ratio_of(base, cand))
    if np.ptp(base) == 0 and np.ptp(cand) == 0:
        lo = hi = ratio  # no spread at all: every resample gives the same ratio
    else:
        lo, hi = bootstrap_interval((base, cand), ratio_of, confidence, n_resamples, method, seed)
    return judged_ratio(ratio, lo, hi, confidence, int(base.size), int(cand.size), method)


def bootstrap_interval(
    samples: tuple[np.ndarray, ...],
    statistic: Callable[..., np.ndarray],
    confidence: float,
    n_resamples: int,
    method: str = "percentile",
    seed: int = 0,
) -> tuple[float, float]:
    """scipy's bootstrap interval of ``statistic`` over independent ``samples`` (each
    resampled on its own, vectorized), seeded so that a figure reads the same twice."""
    from scipy import stats

    res = stats.bootstrap(
        samples,
        statistic,
        paired=False,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=method,
        random_state=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def judged_ratio(
    ratio: float, lo: float, hi: float, confidence: float, n_a: int, n_b: int, method: str
) -> SpeedupCI:
    """A speed ratio with its interval, and the verdict the interval gives."""
    verdict = FASTER if lo > 1.0 else SLOWER if hi < 1.0 else NO_CHANGE
    return SpeedupCI(ratio, lo, hi, confidence, verdict, n_a, n_b, method)


def timed_step_times(steps: pd.DataFrame, warmup: int | None = None) -> np.ndarray:
    """Host step times (s) of the steps ``summarize_steps`` times: no warm-up, no profiled.

    The same exclusions as the run's headline figures, so a compared median is the
    median the run page shows. For an inference run these are its request latencies.
    """
    return timed_steps(steps, warmup)["step_time_s"].to_numpy(dtype=float)


def sec_per_sample(steps: pd.DataFrame) -> np.ndarray | None:
    """Seconds per sample of the timed steps; None unless every step knows its batch.

    The same exclusions as ``timed_step_times`` (warm-up, profiled steps), applied to
    each step's time divided by its batch size: throughput is the mean of these.
    """
    if steps.empty or "batch_size" not in steps or not steps["batch_size"].notna().all():
        return None
    scaled = steps.copy()
    duration = steps["end_s"] - steps["start_s"]
    scaled["end_s"] = steps["start_s"] + duration / steps["batch_size"].astype(float).clip(lower=1)
    return timed_step_times(scaled)
