"""Latency and throughput of an inference run: each step is one request or one batch.

Decisions, and why:

* **Which runs.** A run is an inference run when every step is a forward step (``kind ==
  'forward'``: the job never stepped an optimizer) and no step spent time in backward (a
  job that updates its parameters by hand also writes forward steps, with a backward).
  Runs recorded before the phases were (no ``backward_s``) are judged by their kind alone.
  Steps the user marks (``stepscope.mark()``) may or may not be requests: not judged.
* **Latency is the step's wall time** (``end_s - start_s``): a forward step runs from the
  end of the previous model call to the end of this one, so it holds the whole iteration:
  the data wait (the DataLoader, or waiting for the next request), moving the batch to the
  device, the model call, and the loop's own work on the previous result. That is what a
  batch or a request costs the loop, and it is the one basis on which the percentiles,
  requests/s (the count over the summed wall time: a closed loop's throughput is 1/mean
  latency), the step-time figures, the Compare page and experiments all agree. The data
  wait therefore counts.
* **Model-call latency beside it** (``model``): the step timer's forward phase, the time
  inside the outermost module calls (the model, and a softmax or loss module called at
  top level), without the data wait and the loop's own Python: what a server's timer
  around ``model(x)`` measures, and the figure to read when the loop waits for requests
  that come when they come. On CUDA the host's forward is the time to *launch* the
  kernels unless the call synchronises (the device runs behind): read it with care there.
  None where no step recorded its phases.
* **Warm-up and profiled steps** are left out as ``summarize_steps`` leaves them out: this
  module is given the timed steps it selected.
* **Several ranks.** Percentiles pool every rank's steps; requests/s and samples/s are
  global: each rank's count over its own time, summed over the ranks.
* Percentiles are numpy's default (linear interpolation between the two nearest steps): on
  a short run p99 is close to the maximum, and the count says how many steps it rests on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 95, 99)


def is_inference(steps: pd.DataFrame) -> bool:
    """Are these a job's inference steps (module docstring)? False for an empty frame."""
    if steps.empty or "kind" not in steps:
        return False
    if not (steps["kind"] == "forward").all():
        return False
    backward = steps["backward_s"] if "backward_s" in steps else pd.Series(dtype=float)
    return not (backward.fillna(0.0) > 0).any()


def wall_times(steps: pd.DataFrame) -> np.ndarray:
    """Each step's latency in seconds: its wall time, the whole iteration."""
    return (steps["end_s"] - steps["start_s"]).clip(lower=0.0).to_numpy(dtype=float)


def distribution(seconds: np.ndarray) -> dict[str, float]:
    """p50/p90/p95/p99, max, min and mean of ``seconds`` (at least one value)."""
    p = np.percentile(seconds, PERCENTILES)
    out = {f"p{q}_s": float(v) for q, v in zip(PERCENTILES, p, strict=True)}
    out.update(max_s=float(seconds.max()), min_s=float(seconds.min()), mean_s=float(seconds.mean()))
    return out


def process_keys(steps: pd.DataFrame) -> list[str]:
    """The columns that name one process's series of steps: its rank, and its worker
    where the job trained in processes of its own (a hogwild job; store's ``steps``)."""
    return ["rank", "worker"] if "worker" in steps else ["rank"]


def per_rank_rate(timed: pd.DataFrame, column: str | None) -> float | None:
    """Global rate: per process (rank, worker), the sum of ``column`` (None: one per
    step) over its wall time, summed over processes; None where the column is unknown or
    no time passed."""
    if column is not None and (column not in timed or timed[column].isna().all()):
        return None
    total = 0.0
    for _, rows in timed.groupby(process_keys(timed)):
        if column is not None:
            rows = rows[rows[column].notna()]
        seconds = float(wall_times(rows).sum())
        if seconds > 0:
            total += float(rows[column].sum()) / seconds if column else len(rows) / seconds
    return total or None


def latency_summary(timed: pd.DataFrame) -> dict[str, Any] | None:
    """Latency figures of an inference run's timed steps; None for a training run.

    ``timed``: the steps ``summarize_steps`` times (warm-up and profiled steps left out).
    ``{"count", "p50_s", "p90_s", "p95_s", "p99_s", "max_s", "min_s", "mean_s",
    "requests_per_s", "samples_per_s", "model": {...} | None}``.
    """
    if not is_inference(timed):
        return None
    seconds = wall_times(timed)
    out: dict[str, Any] = {"count": int(seconds.size), **distribution(seconds)}
    out["requests_per_s"] = per_rank_rate(timed, None)
    out["samples_per_s"] = per_rank_rate(timed, "batch_size")
    out["model"] = None
    if "forward_s" in timed and timed["forward_s"].notna().all():
        model = timed["forward_s"].clip(lower=0.0).to_numpy(dtype=float)
        out["model"] = distribution(model)
    return out


__all__ = [
    "PERCENTILES",
    "distribution",
    "is_inference",
    "latency_summary",
    "per_rank_rate",
    "wall_times",
]
