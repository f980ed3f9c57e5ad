"""Figures over a run's steps: step time, throughput, data-wait share, warm-up.

Decisions, and why:

* **Warm-up.** The first steps pay one-off costs (lazy initialisation, allocator
  growth, cudnn autotuning, DataLoader worker start, torch.compile recompiles), so they
  are left out of every timing figure and reported on their own (``warmup_steps``,
  ``warmup_time_s``). Default: the first 10 % of each rank's steps, at least 1 and at
  most 5 (one step is enough for eager jobs; compiled jobs need a few; 5 keeps short
  experiment runs meaningful). A run with a single step has no warm-up: that step is
  all there is. Pass ``warmup`` to choose another count.
* **Profiled steps** (inside a capture window) run with the profiler's overhead and are
  left out of the timing figures too.
* **Host time is the step time.** ``end_s - start_s`` is what the user waits for,
  including data wait and host overhead; ``device_s`` (CUDA events) leaves out exactly
  the things we want to find. So ``step_time_*`` are host figures, and
  ``device_step_time_median_s`` is reported beside them as a cross-check, when every
  timed step has one.
* **Several ranks.** Rows of all ranks are pooled for the step-time percentiles (DDP
  ranks move in lock-step); ``steps_per_s`` is per rank (one rank's rate: what
  "iterations per second" means to the user), ``samples_per_s`` is global: every
  rank's samples together, the job's real throughput.
* ``steps`` counts rows over all ranks, as the store does; ``steps_per_rank`` splits it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

WARMUP_FRACTION = 0.10
WARMUP_MAX = 5


def default_warmup(n_steps: int) -> int:
    """Warm-up steps for a rank with ``n_steps`` steps (see the module docstring)."""
    if n_steps <= 1:
        return 0
    return min(WARMUP_MAX, max(1, math.ceil(n_steps * WARMUP_FRACTION)))


def summarize_steps(steps: pd.DataFrame, warmup: int | None = None) -> dict[str, Any]:
    """Summary figures of a steps DataFrame (the store's ``steps()``); None where unknown."""
    out: dict[str, Any] = {
        "steps": int(len(steps)),
        "ranks": [],
        "steps_per_rank": {},
        "timed_steps": 0,
        "warmup_steps": 0,
        "warmup_time_s": None,
        "profiled_steps": 0,
        "step_time_median_s": None,
        "step_time_p95_s": None,
        "step_time_mean_s": None,
        "step_time_min_s": None,
        "step_time_max_s": None,
        "device_step_time_median_s": None,
        "steps_per_s": None,
        "samples_per_s": None,
        "data_wait_share": None,
        "data_wait_median_s": None,
        "loss_first": None,
        "loss_last": None,
    }
    if steps.empty:
        return out

    df = steps.sort_values(["rank", "step"]).copy()
    df["step_time_s"] = (df["end_s"] - df["start_s"]).clip(lower=0.0)
    ranks = sorted(int(r) for r in df["rank"].unique())
    out["ranks"] = ranks
    out["steps_per_rank"] = {str(r): int((df["rank"] == r).sum()) for r in ranks}

    # warm-up per rank: each process has its own first steps
    position = df.groupby("rank").cumcount()
    sizes = df.groupby("rank")["step"].transform("size")
    if warmup is None:
        limit = sizes.map(default_warmup)
    else:
        limit = pd.Series(max(0, int(warmup)), index=df.index)
    is_warmup = position < limit
    profiled = df["profiled"].fillna(0).astype(bool) if "profiled" in df else False
    warm = df[is_warmup]
    out["warmup_steps"] = int(warm.groupby("rank").size().max()) if len(warm) else 0
    if len(warm):
        # wall time until the slowest rank is past its warm-up
        out["warmup_time_s"] = float(
            warm.groupby("rank")["end_s"].max().max() - warm.groupby("rank")["start_s"].min().min()
        )
    out["profiled_steps"] = int(np.sum(profiled))

    timed = df[~is_warmup & ~profiled]
    out["timed_steps"] = int(len(timed))
    if len(timed):
        t = timed["step_time_s"].to_numpy(dtype=float)
        total = float(t.sum())
        out["step_time_median_s"] = float(np.median(t))
        out["step_time_p95_s"] = float(np.percentile(t, 95))
        out["step_time_mean_s"] = float(t.mean())
        out["step_time_min_s"] = float(t.min())
        out["step_time_max_s"] = float(t.max())
        if total > 0:
            out["steps_per_s"] = len(t) / total
            wait = timed["data_wait_s"].fillna(0.0).to_numpy(dtype=float)
            out["data_wait_share"] = float(min(1.0, wait.sum() / total))
            out["data_wait_median_s"] = float(np.median(wait))
        if "device_s" in timed and timed["device_s"].notna().all():
            out["device_step_time_median_s"] = float(timed["device_s"].median())
        out["samples_per_s"] = _samples_per_s(timed)

    if "loss" in df:
        losses = df[df["rank"] == ranks[0]]["loss"].dropna()
        losses = losses[np.isfinite(losses.to_numpy(dtype=float))]
        if len(losses):
            out["loss_first"] = float(losses.iloc[0])
            out["loss_last"] = float(losses.iloc[-1])
    return out


def _samples_per_s(timed: pd.DataFrame) -> float | None:
    """Global throughput: per rank, samples over that rank's step time; summed over ranks."""
    if "batch_size" not in timed or timed["batch_size"].isna().all():
        return None
    total = 0.0
    for _, rows in timed.groupby("rank"):
        rows = rows[rows["batch_size"].notna()]
        seconds = float(rows["step_time_s"].sum())
        if seconds > 0:
            total += float(rows["batch_size"].sum()) / seconds
    return total or None
