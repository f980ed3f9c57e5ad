"""speedup_ci: the interval excludes 1 for a real difference, contains it for none, and
covers the true ratio about as often as it claims; timed_step_times drops what
summarize_steps drops."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.optim_runner.speedup.stats import speedup_ci, timed_step_times


def _step_times(rng: np.random.Generator, median_s: float, n: int) -> np.ndarray:
    """Right-skewed step times (log-normal, 10 % spread) with the given median."""
    return median_s * rng.lognormal(0.0, 0.10, n)


def test_clear_speedup_excludes_one() -> None:
    rng = np.random.default_rng(1)
    base, cand = _step_times(rng, 0.200, 40), _step_times(rng, 0.100, 40)
    ci = speedup_ci(base, cand)
    assert ci.verdict == "faster"
    assert 1.0 < ci.lo <= ci.ratio <= ci.hi
    assert ci.ratio == pytest.approx(np.median(base) / np.median(cand))
    assert 1.7 < ci.ratio < 2.3
    assert "faster" in ci.describe()


def test_clear_slowdown_excludes_one() -> None:
    rng = np.random.default_rng(2)
    ci = speedup_ci(_step_times(rng, 0.100, 30), _step_times(rng, 0.150, 30))
    assert ci.verdict == "slower"
    assert ci.lo <= ci.ratio <= ci.hi < 1.0


def test_same_distribution_contains_one() -> None:
    rng = np.random.default_rng(3)
    ci = speedup_ci(_step_times(rng, 0.100, 40), _step_times(rng, 0.100, 40))
    assert ci.verdict == "no measurable change"
    assert ci.lo < 1.0 < ci.hi
    assert "no measurable change" in ci.describe()


def test_interval_is_reproducible_and_widens_with_confidence() -> None:
    rng = np.random.default_rng(4)
    base, cand = _step_times(rng, 0.120, 25), _step_times(rng, 0.100, 25)
    a, b = speedup_ci(base, cand, seed=7), speedup_ci(base, cand, seed=7)
    assert (a.lo, a.hi) == (b.lo, b.hi)
    wide = speedup_ci(base, cand, confidence=0.99, seed=7)
    assert wide.lo <= a.lo and wide.hi >= a.hi
    assert (wide.hi - wide.lo) > (a.hi - a.lo)


def test_coverage_is_near_nominal() -> None:
    """Over many experiments with a known true ratio (1.25), the 90 % interval holds it
    in roughly 90 % of them: the interval is neither a point nor the whole line."""
    rng = np.random.default_rng(5)
    hits = 0
    trials = 120
    for i in range(trials):
        ci = speedup_ci(
            _step_times(rng, 0.125, 30),
            _step_times(rng, 0.100, 30),
            confidence=0.90,
            n_resamples=1000,
            seed=i,
        )
        hits += ci.lo <= 1.25 <= ci.hi
    assert 0.78 <= hits / trials <= 0.98


def test_degenerate_and_bad_input() -> None:
    ci = speedup_ci([0.2, 0.2, 0.2], [0.1, 0.1, 0.1])
    assert (ci.ratio, ci.lo, ci.hi, ci.verdict) == (2.0, 2.0, 2.0, "faster")
    with pytest.raises(ValueError, match="at least 2"):
        speedup_ci([0.2], [0.1, 0.1])
    with pytest.raises(ValueError, match="positive"):
        speedup_ci([0.2, 0.0], [0.1, 0.1])
    # NaN/inf (a step whose end was never recorded) are dropped, not propagated
    assert speedup_ci([0.2, np.nan, 0.2, 0.2], [0.1, 0.1, np.inf]).ratio == 2.0


def test_timed_step_times_match_summarize_steps() -> None:
    """Warm-up (first 10 %, 1 to 5 steps, per rank) and profiled steps are left out."""
    rng = np.random.default_rng(6)
    rows = []
    for rank in (0, 1):
        t = 1000.0
        for step in range(30):
            dur = 0.5 if step < 3 else float(rng.uniform(0.09, 0.11))
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "start_s": t,
                    "end_s": t + dur,
                    "data_wait_s": 0.0,
                    "profiled": int(10 <= step < 13),
                    "batch_size": 8,
                }
            )
            t += dur
    steps = pd.DataFrame(rows)
    times = timed_step_times(steps)
    assert len(times) == 2 * (30 - 3 - 3)
    assert times.max() < 0.2  # the slow warm-up steps are gone
    assert float(np.median(times)) == pytest.approx(summarize_steps(steps)["step_time_median_s"])
    assert timed_step_times(steps.iloc[0:0]).size == 0
