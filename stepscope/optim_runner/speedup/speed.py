"""How much faster run B is than run A, decided the way experiments decide it.

The headline is throughput: the ratio of *mean* seconds per sample (A/B), because an
epoch's wall time follows the mean, and the mean is what the Amdahl bound of a fix
bounds. The ratio of *median* step times is kept beside it: it is robust to a
neighbour's burst, but it flatters fixes that make steps bimodal (DataLoader workers
with prefetching give many instant steps and a few long waits; see ``stats.py``).
Throughput needs every timed step's batch size; without them the median ratio is all
there is, and the page says so. For two inference runs (``analyzers/steps/latency.py``) the
p50 and p99 latency ratios come beside it (A/B, > 1: B's requests return sooner), each
with its interval: a fix can raise throughput and still lengthen the tail.

Plain functions over step tables (no Streamlit), beside the experiment runner's own
statistics, so the Compare page and the Optimize page's inline headline show the same
numbers the experiment runner computed. The words for them (``speed_caption``) are the
app's, in ``app/formats.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analyzers.steps.latency import is_inference
from stepscope.optim_runner.speedup.stats import (
    SpeedupCI,
    sec_per_sample,
    speedup_ci,
    timed_step_times,
)

# The latency percentiles compared between inference runs: the typical request and the tail.
LATENCY_RATIOS = ("p50", "p99")


@dataclass(frozen=True)
class Speed:
    """B against A: ``throughput`` (None without batch sizes) and ``step_time``."""

    throughput: SpeedupCI | None
    step_time: SpeedupCI | None
    problem: str | None = None  # why there is no ratio at all
    # inference runs: {"p50": ..., "p99": ...} latency ratios A/B; None for training runs
    latency: dict[str, SpeedupCI | None] | None = None

    @property
    def headline(self) -> SpeedupCI | None:
        return self.throughput if self.throughput is not None else self.step_time

    @property
    def basis(self) -> str:
        return "throughput" if self.throughput is not None else "median step time"


def _ratio(base: np.ndarray | None, cand: np.ndarray | None, statistic: str) -> SpeedupCI | None:
    if base is None or cand is None:
        return None
    try:
        return speedup_ci(base, cand, statistic=statistic)
    except ValueError:  # fewer than two timed steps on a side
        return None


def compare_speed(steps_a: pd.DataFrame, steps_b: pd.DataFrame) -> Speed:
    """Throughput and median step-time ratios of B against A, with bootstrap intervals."""
    ta, tb = timed_step_times(steps_a), timed_step_times(steps_b)
    step = _ratio(ta, tb, "median")
    throughput = _ratio(sec_per_sample(steps_a), sec_per_sample(steps_b), "mean")
    problem = None
    if step is None:
        problem = (
            f"too few timed steps (A has {ta.size}, B has {tb.size}; each needs at least two, "
            "warm-up and profiled steps left out)"
        )
    latency = None
    if is_inference(steps_a) and is_inference(steps_b):
        latency = {p: _ratio(ta, tb, p) for p in LATENCY_RATIOS}
    return Speed(throughput=throughput, step_time=step, problem=problem, latency=latency)


__all__ = ["LATENCY_RATIOS", "Speed", "compare_speed", "sec_per_sample"]
