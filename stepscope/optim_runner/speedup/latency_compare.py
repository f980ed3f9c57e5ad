"""An inference experiment's latency: p50 and p99 of the candidate against the baseline.

Throughput alone can hide what a serving job cares about: a fix that batches more or
compiles may raise requests/s and still lengthen the tail. So for inference arms
(``analyzers/steps/latency.py``: forward steps, no optimizer; a generation job's requests) each candidate also gets the
ratio of the baseline's latency percentile to its own (> 1: its requests return sooner),
over the same pooled timed steps as the step-time ratio (warm-up left out of each trial),
each with a bootstrap interval (``stats.speedup_ci``; each arm resampled on its own).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.analyzers.steps.generation import is_generation
from stepscope.analyzers.steps.latency import is_inference
from stepscope.optim_runner.speedup.speed import LATENCY_RATIOS
from stepscope.optim_runner.speedup.stats import SpeedupCI, speedup_ci


def is_inference_arm(store: Any, runs: list[int]) -> bool:
    """Did the arm's trials record inference steps (every trial that recorded any)? A
    generation job's steps are its requests, each as long as the request: their
    percentiles are its request latency's."""
    recorded = [s for s in (store.steps(r) for r in runs) if not s.empty]
    return bool(recorded) and all(is_inference(s) or is_generation(s) for s in recorded)


def latency_ratios(
    store: Any, baseline_runs: list[int], baseline_s: np.ndarray, candidate_s: np.ndarray
) -> dict[str, dict[str, Any] | None] | None:
    """``{"p50": <ratio json>, "p99": <ratio json>}`` for an inference baseline; None for a
    training one. ``baseline_s``/``candidate_s``: the arms' pooled timed step times (each
    step's latency). A percentile with too few steps on a side to compare is None."""
    if not is_inference_arm(store, baseline_runs):
        return None
    out: dict[str, dict[str, Any] | None] = {}
    for name in LATENCY_RATIOS:
        try:
            ci = speedup_ci(baseline_s, candidate_s, statistic=name)
        except ValueError:  # fewer than two timed steps on a side
            out[name] = None
            continue
        q = float(name[1:])
        out[name] = _json(
            ci, float(np.percentile(baseline_s, q)), float(np.percentile(candidate_s, q))
        )
    return out


def _json(ci: SpeedupCI, baseline_s: float, candidate_s: float) -> dict[str, Any]:
    return {
        "ratio": round(ci.ratio, 4),
        "ci": [round(ci.lo, 4), round(ci.hi, 4)],
        "verdict": ci.verdict,
        "n": [ci.n_baseline, ci.n_candidate],
        "text": ci.describe(),
        "baseline_s": round(baseline_s, 6),
        "candidate_s": round(candidate_s, 6),
    }


__all__ = ["is_inference_arm", "latency_ratios"]
