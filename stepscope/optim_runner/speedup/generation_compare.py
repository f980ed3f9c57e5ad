"""Two generation runs compared by what a generation job is judged by: tokens/s, time to
first token, time per output token and the request latency's p50 and p99.

A generation run's steps are its requests, so the step-time and samples/s ratios the
Compare page gives other runs would read requests/s as samples/s (2.79 -> 1.07 "samples/s"
from 2 timed requests, issue 39). Each figure here is ``generation_summary``'s own over
the timed requests of each run, its ratio B against A oriented so that > 1 means B is
better (more tokens/s, less time), with a bootstrap interval over the requests and the
number of timed requests it rests on: fewer than ``MIN_REQUESTS`` in a run give the two
figures and their plain ratio, with no interval and no verdict, and say so.

* **tokens/s** is new tokens over the timed requests' summed latency (a ratio of sums, as
  the Run page's figure is): requests are resampled whole (their tokens with their time).
* **TTFT and TPOT** compare medians; **request p50 and p99** the latency's percentiles
  (``stats.speedup_ci``'s statistics). A request that decoded no token past its first has
  no TPOT and is left out of that figure only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analyzers.steps.generation import timed_requests
from stepscope.optim_runner.speedup.stats import (
    SpeedupCI,
    bootstrap_interval,
    judged_ratio,
    speedup_ci,
)

CONFIDENCE = 0.95
RESAMPLES = 2000
# An interval, and so a verdict, from this many timed requests a run: a bootstrap over 2
# requests called a 0.75x "slower" with an interval of 0.54-0.98x
MIN_REQUESTS = 5

# name, the requests' column, the statistic compared, what the figure is (help text)
TIMES = (
    ("TTFT p50", "ttft_s", "median", "time to first token, median"),
    ("TPOT p50", "tpot_s", "median", "time per output token after the first, median"),
    ("request p50", "latency_s", "p50", "a request's whole latency, median"),
    ("request p99", "latency_s", "p99", "a request's whole latency, 99th percentile"),
)


@dataclass(frozen=True)
class GenerationFigure:
    """One figure of both runs, their plain ratio (B better: > 1; None where a run has
    none) and its interval (None: too few requests, ``why``)."""

    name: str
    what: str
    a: float | None
    b: float | None
    unit: str  # "tokens/s" or "s"
    n_a: int
    n_b: int
    ratio: SpeedupCI | None
    why: str = ""
    plain: float | None = None


def compare_generation(
    requests_a: pd.DataFrame,
    steps_a: pd.DataFrame,
    requests_b: pd.DataFrame,
    steps_b: pd.DataFrame,
) -> list[GenerationFigure] | None:
    """tokens/s, TTFT, TPOT and request p50/p99 of runs A and B (module docstring); None
    when either run served no request (not a generation pair)."""
    if requests_a.empty or requests_b.empty:
        return None
    ta, tb = timed_requests(requests_a, steps_a), timed_requests(requests_b, steps_b)
    out = [_tokens_per_s(ta, tb)]
    for name, column, statistic, what in TIMES:
        va, vb = _values(ta, column), _values(tb, column)
        a = _statistic(va, statistic)
        b = _statistic(vb, statistic)
        ratio, why = None, _too_few(va.size, vb.size)
        if not why:
            ratio = speedup_ci(va, vb, CONFIDENCE, RESAMPLES, statistic=statistic)
        plain = a / b if a and b else None  # a time: B better when shorter
        out.append(GenerationFigure(name, what, a, b, "s", va.size, vb.size, ratio, why, plain))
    return out


def _values(timed: pd.DataFrame, column: str) -> np.ndarray:
    values = timed[column].to_numpy(dtype=float) if column in timed else np.empty(0)
    return values[np.isfinite(values) & (values > 0)]


def _statistic(values: np.ndarray, statistic: str) -> float | None:
    if values.size == 0:
        return None
    q = 50.0 if statistic == "median" else float(statistic.removeprefix("p"))
    return float(np.percentile(values, q))


def _too_few(n_a: int, n_b: int) -> str:
    if min(n_a, n_b) >= MIN_REQUESTS:
        return ""
    return f"no interval: {n_a} and {n_b} timed requests ({MIN_REQUESTS} each at least)"


def _tokens_per_s(ta: pd.DataFrame, tb: pd.DataFrame) -> GenerationFigure:
    what = "new tokens over the timed requests' summed latency"

    def kept(timed: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        seconds = timed["latency_s"].to_numpy(dtype=float)
        tokens = timed["new_tokens"].fillna(0).to_numpy(dtype=float)
        ok = np.isfinite(seconds) & (seconds > 0)
        return seconds[ok], tokens[ok]

    (sa, ka), (sb, kb) = kept(ta), kept(tb)
    a = float(ka.sum() / sa.sum()) if sa.size else None
    b = float(kb.sum() / sb.sum()) if sb.size else None
    why = _too_few(sa.size, sb.size)
    if not why and (not a or not b):
        why = "no interval: a run decoded no new token"
    ratio = None if why else _rate_ratio(sa, ka, sb, kb)
    plain = b / a if a and b else None
    return GenerationFigure("tokens/s", what, a, b, "tokens/s", sa.size, sb.size, ratio, why, plain)


def _rate_ratio(sa: np.ndarray, ka: np.ndarray, sb: np.ndarray, kb: np.ndarray) -> SpeedupCI:
    """tokens/s of B over A, requests resampled whole: a bootstrap over index arrays
    (a request's tokens go with its time)."""

    def rate_ratio(ia: np.ndarray, ib: np.ndarray, axis: int = -1) -> np.ndarray:
        ia, ib = ia.astype(int), ib.astype(int)
        rate_a = ka[ia].sum(axis=axis) / sa[ia].sum(axis=axis)
        rate_b = kb[ib].sum(axis=axis) / sb[ib].sum(axis=axis)
        return rate_b / rate_a

    index_a, index_b = np.arange(sa.size, dtype=float), np.arange(sb.size, dtype=float)
    ratio = float(rate_ratio(index_a, index_b))
    lo, hi = bootstrap_interval((index_a, index_b), rate_ratio, CONFIDENCE, RESAMPLES)
    if not (np.isfinite(lo) and np.isfinite(hi)):  # no spread in either run
        lo = hi = ratio
    return judged_ratio(ratio, lo, hi, CONFIDENCE, sa.size, sb.size, "percentile")
