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
  ``warmup_steps`` is one process's warm-up (the most of any); ``left_out`` counts the
  rows each rule left out over all processes, each row once, so that evaluation steps,
  ``left_out`` and ``timed_steps`` add up to ``steps``.
* **Workers.** A job that trains in processes it starts itself (hogwild:
  ``torch.multiprocessing`` workers sharing a model, no ranks) has one series of steps per
  worker (``collectors/facts/workers.py``). Each worker is a process as a rank is: warm-up per
  worker, rates per worker and summed, step times pooled; ``workers`` counts those that
  trained and ``steps_per_worker`` splits their steps.
* **Evaluation in another process.** A process of the run that only ran forwards while
  others of it trained (hogwild's parent, which tests the model once its workers have
  joined) is not training: its steps are a phase of their own (``evaluation_steps``),
  counted in ``steps`` but never in the step-time figures, rates, warm-up or phases.
  Its one batch of 1,000 test samples read as 14,000 samples/s beside the workers' 9,000.
* **Outlier waits.** The data-wait share is a ratio of sums, so one long pause inside
  ``DataLoader.__next__`` (a garbage-collection pause, a cold cache, a lazy file open)
  can make a job whose median wait is 0.4 ms look "highly input-bound" (a real Lightning
  job: one 196 ms pause became a 46.5 % share, and the workers fix measured 0.82x). Such
  steps are left out of the share (``data_wait_share``; the plain ratio of sums stays as
  ``data_wait_share_raw``) when all of these hold: the wait is beyond Tukey's far-out
  fence (Q3 + 3 IQR of the timed steps' waits), longer than a median step (shorter
  pauses cannot move the share) and than five median waits (a job that waits 20 ms every
  step has a regular enough wait for a 43 ms one, a fetch preempted on a busy machine,
  to clear the fence: jitter, not a pause), the steps are few (at most 5 % of the timed
  steps, or one in a run of 10 or more; and fewer than one per round of the loader's
  workers, since a job whose workers deliver their batches together waits on one step in
  ``workers``), and they are not evenly spaced (that is a pattern, not an accident).
  When more steps clear the fence than that, the longest of them are still left out if
  they hold at least 75 % of the flagged waiting: on a busy machine a 0.2 s pause comes
  with a few 10 ms waits (the first batch after a validation loop) that clear it too,
  and those stay in the share. A job that waits on every step, or on many, keeps its
  share. The step-time figures keep those steps: the job did spend that time.
* **Phases** (``phases``): the mean seconds per step in data wait, forward, backward and
  optimizer (the step timer's exclusive host times, ``collectors/steps/step_accounting.py``)
  and "other" (the step minus those four, never below 0: the loop's own Python,
  ``.item()``, logging, a hand-written update), over the same timed steps as the
  step-time figures; each with its share of the mean step. The shares are over the sum
  of the five means, so they add to 1 (it equals the mean step unless a step's phases
  overran it by clock jitter). On CUDA the host's forward and backward are the time to
  *launch* their kernels, the device runs behind and the wait for it lands wherever the
  host first synchronises (``.item()``, the optimizer): a capture's trace has the
  device's phases. None for runs recorded before the phases were (store version < 4)
  and for attached processes, whose rows have no phase columns.
* **Latency** (``latency``): for an inference run (forward steps, no optimizer), the
  latency distribution of its timed steps, requests/s and samples/s
  (``analyzers/steps/latency.py``, which says what a request's latency holds); None for a
  training run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.steps.latency import latency_summary, per_rank_rate, process_keys

WARMUP_FRACTION = 0.10
WARMUP_MAX = 5
# Outlier waits (see the module docstring). Tukey's "far out" fence (Exploratory Data
# Analysis, 1977): beyond Q3 + 3 IQR is far outside the bulk of the distribution.
OUTLIER_IQR_K = 3.0
# At most this fraction of the timed steps can be outliers: a rare event, not a habit.
OUTLIER_MAX_FRACTION = 0.05
# ... but one step may always be, in a run of at least this many timed steps (a short
# run's one pause is as much an accident as a long run's): below it, none may.
OUTLIER_ONE_FROM_STEPS = 10
# More flagged steps than that: the longest that many are still outliers when they hold
# this share of the flagged steps' waiting (one pause beside short waits on a busy machine).
OUTLIER_DOMINANT_SHARE = 0.75
# A wait shorter than this many median steps cannot distort the share: not an outlier.
OUTLIER_MIN_STEPS = 1.0
# Nor can one within this many median waits: a job that waits 20 ms on every step once
# waited 43 ms on a loaded machine (a preempted fetch), jitter of the habit, not a pause.
OUTLIER_MIN_WAITS = 5.0
# Outlier steps whose gaps are this regular (largest gap / smallest gap, 3 or more
# steps) recur on a schedule, as the waits of a loader's workers do: kept.
PERIODIC_GAP_RATIO = 1.5
PERIODIC_MIN_COUNT = 3
# The phases of ``phases``: name -> the steps column it is read from (None: "other").
PHASES = {
    "data_wait": "data_wait_s",
    "forward": "forward_s",
    "backward": "backward_s",
    "optimizer": "optimizer_s",
    "other": None,
}


def default_warmup(n_steps: int) -> int:
    """Warm-up steps for a rank with ``n_steps`` steps (see the module docstring)."""
    if n_steps <= 1:
        return 0
    return min(WARMUP_MAX, max(1, math.ceil(n_steps * WARMUP_FRACTION)))


def summarize_steps(
    steps: pd.DataFrame, warmup: int | None = None, workers: int | None = None
) -> dict[str, Any]:
    """Summary figures of a steps DataFrame (the store's ``steps()``); None where unknown.

    ``workers``: the job's DataLoader workers when known (the job's facts); a loader with
    many workers waits once per round of them, which must not pass for an outlier.
    """
    out: dict[str, Any] = {
        "steps": int(len(steps)),
        "ranks": [],
        "steps_per_rank": {},
        "workers": 0,
        "steps_per_worker": {},
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
        "data_wait_share_raw": None,
        "data_wait_outliers": None,
        "data_wait_median_s": None,
        "loss_first": None,
        "loss_last": None,
        "phases": None,
        "latency": None,
        "evaluation_steps": 0,
        "left_out": {"warmup": 0, "profiled": 0},
    }
    if steps.empty:
        return out

    df = _ordered(steps)
    evaluating = evaluation_mask(df)
    out["evaluation_steps"] = int(evaluating.sum())
    df = df[~evaluating]
    ranks = sorted(int(r) for r in df["rank"].unique())
    out["ranks"] = ranks
    out["steps_per_rank"] = {str(r): int((df["rank"] == r).sum()) for r in ranks}
    if "worker" in df:
        trained = df[df["worker"] > 0].groupby(["rank", "worker"]).size()
        out["workers"] = int(len(trained))
        out["steps_per_worker"] = {
            (str(w) if len(ranks) == 1 else f"{r}.{w}"): int(n) for (r, w), n in trained.items()
        }

    is_warmup = _warmup_mask(df, warmup)
    profiled = _profiled_mask(df)
    warm = df[is_warmup]
    keys = process_keys(df)
    out["warmup_steps"] = int(warm.groupby(keys).size().max()) if len(warm) else 0
    if len(warm):
        # wall time until the slowest process is past its warm-up
        out["warmup_time_s"] = float(warm["end_s"].max() - warm["start_s"].min())
    out["profiled_steps"] = int(np.sum(profiled))
    # the rows each rule took out, each row once (warm-up first): with the evaluation
    # steps, these and the timed steps add up to ``steps``
    out["left_out"] = {
        "warmup": int(is_warmup.sum()),
        "profiled": int((profiled & ~is_warmup).sum()),
    }

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
            out["data_wait_share_raw"] = float(min(1.0, wait.sum() / total))
            out["data_wait_median_s"] = float(np.median(wait))
            outlier = _wait_outliers(timed, wait, t, workers)
            kept_total = float(t[~outlier].sum())
            if outlier.any() and kept_total > 0:
                out["data_wait_share"] = float(min(1.0, wait[~outlier].sum() / kept_total))
                out["data_wait_outliers"] = {
                    "count": int(outlier.sum()),
                    "steps": [int(x) for x in timed["step"].to_numpy()[outlier]],
                    "max_s": float(wait[outlier].max()),
                    "min_s": float(wait[outlier].min()),
                    "total_s": float(wait[outlier].sum()),
                    "median_wait_s": float(np.median(wait[~outlier])),
                }
            else:
                out["data_wait_share"] = out["data_wait_share_raw"]
        if "device_s" in timed and timed["device_s"].notna().all():
            out["device_step_time_median_s"] = float(timed["device_s"].median())
        out["samples_per_s"] = per_rank_rate(timed, "batch_size")
        out["phases"] = step_phases(timed)
        out["latency"] = latency_summary(timed)

    if "loss" in df:
        # one process's losses (rank 0's; its first worker's when workers trained)
        first = df[df["rank"] == ranks[0]]
        if "worker" in first and first["loss"].notna().any():
            first = first[first["worker"] == first.loc[first["loss"].notna(), "worker"].min()]
        losses = first["loss"].dropna()
        losses = losses[np.isfinite(losses.to_numpy(dtype=float))]
        if len(losses):
            out["loss_first"] = float(losses.iloc[0])
            out["loss_last"] = float(losses.iloc[-1])
    return out


def timed_steps(steps: pd.DataFrame, warmup: int | None = None) -> pd.DataFrame:
    """The steps the timing figures are over: warm-up and profiled steps left out.

    Sorted by rank and step, with ``step_time_s``; the one rule every caller that
    compares or plots timed steps uses, so they see what ``summarize_steps`` sees.
    """
    if steps.empty:
        return steps.assign(step_time_s=pd.Series(dtype=float))
    df = _ordered(steps)
    df = df[~evaluation_mask(df)]
    return df[~_warmup_mask(df, warmup) & ~_profiled_mask(df)]


def _ordered(steps: pd.DataFrame) -> pd.DataFrame:
    df = steps.sort_values([*process_keys(steps), "step"]).copy()
    df["step_time_s"] = (df["end_s"] - df["start_s"]).clip(lower=0.0)
    return df


def evaluation_mask(df: pd.DataFrame) -> pd.Series:
    """Rows of processes that only ran forwards while another process of the run trained
    (module docstring, "Evaluation in another process")."""
    none = pd.Series(False, index=df.index)
    if "kind" not in df or "worker" not in df:
        return none
    keys = process_keys(df)
    by = [df[k] for k in keys]
    trains = (df["kind"] != "forward").groupby(by, dropna=False).transform("any")
    if not trains.any():
        return none
    return ~trains & (df["worker"] == 0)


def _warmup_mask(df: pd.DataFrame, warmup: int | None) -> pd.Series:
    """Warm-up per process (each has its own first steps), over ``_ordered`` rows."""
    keys = process_keys(df)
    position = df.groupby(keys).cumcount()
    if warmup is None:
        limit = df.groupby(keys)["step"].transform("size").map(default_warmup)
    else:
        limit = pd.Series(max(0, int(warmup)), index=df.index)
    return position < limit


def _profiled_mask(df: pd.DataFrame) -> pd.Series:
    if "profiled" not in df:
        return pd.Series(False, index=df.index)
    return df["profiled"].fillna(0).astype(bool)


def step_phases(steps: pd.DataFrame) -> dict[str, dict[str, float]] | None:
    """Mean seconds per step and share of each phase (module docstring), over ``steps``
    as given (``summarize_steps`` passes its timed steps): ``{"forward": {"mean_s": ..,
    "share": ..}, ...}`` in the order of PHASES; None when no row has its phases."""
    columns = [c for c in PHASES.values() if c is not None]
    if any(c not in steps for c in columns):
        return None
    rows = steps[steps[columns].notna().all(axis=1)]
    if rows.empty:
        return None
    step_time = (rows["end_s"] - rows["start_s"]).clip(lower=0.0).to_numpy(dtype=float)
    parts = {c: rows[c].clip(lower=0.0).to_numpy(dtype=float) for c in columns}
    other = np.clip(step_time - sum(parts.values()), 0.0, None)
    means = {
        name: float((parts[c] if c is not None else other).mean()) for name, c in PHASES.items()
    }
    total = sum(means.values())
    return {
        name: {"mean_s": mean, "share": mean / total if total > 0 else 0.0}
        for name, mean in means.items()
    }


def _wait_outliers(
    timed: pd.DataFrame, wait: np.ndarray, step_time: np.ndarray, workers: int | None
) -> np.ndarray:
    """Boolean mask of the timed steps whose data wait is a rare outlier (module docstring)."""
    none = np.zeros(len(wait), dtype=bool)
    if len(wait) < 4:  # no quartiles worth the name
        return none
    q1, q3 = np.percentile(wait, [25, 75])
    fence = q3 + OUTLIER_IQR_K * (q3 - q1)
    mask = (
        (wait > fence)
        & (wait > OUTLIER_MIN_STEPS * float(np.median(step_time)))
        & (wait > OUTLIER_MIN_WAITS * float(np.median(wait)))
    )
    count = int(mask.sum())
    if count == 0:
        return none
    limit = OUTLIER_MAX_FRACTION * len(wait)
    if len(wait) >= OUTLIER_ONE_FROM_STEPS:
        limit = max(1.0, limit)
    if workers:
        # the loop of a loader with W workers may wait once per round: 1 step in W
        limit = min(limit, len(wait) / (2 * workers))
    if count > limit:
        mask = _dominant(wait, mask, int(limit))
    if not mask.any() or _evenly_spaced(timed, mask):
        return none
    return mask


def _dominant(wait: np.ndarray, mask: np.ndarray, keep: int) -> np.ndarray:
    """The ``keep`` longest flagged waits, when they hold nearly all the flagged waiting
    (a pause beside a few short waits that also clear the fence); else none."""
    out = np.zeros(len(wait), dtype=bool)
    if keep < 1:
        return out
    flagged = np.flatnonzero(mask)
    top = flagged[np.argsort(wait[flagged])[::-1][:keep]]
    if wait[top].sum() >= OUTLIER_DOMINANT_SHARE * wait[flagged].sum():
        out[top] = True
    return out


def _evenly_spaced(timed: pd.DataFrame, mask: np.ndarray) -> bool:
    """Do the flagged steps recur on a schedule (per rank, gaps within PERIODIC_GAP_RATIO)?"""
    gaps: list[float] = []
    flagged = timed[mask]
    for _, rows in flagged.groupby(process_keys(flagged)):
        gaps.extend(np.diff(np.sort(rows["step"].to_numpy(dtype=float))).tolist())
    if len(gaps) < PERIODIC_MIN_COUNT - 1 or min(gaps) <= 0:
        return False
    return max(gaps) / min(gaps) <= PERIODIC_GAP_RATIO


def describe_wait_outliers(summary: dict[str, Any]) -> str | None:
    """One line for the evidence: which waits were left out of the share, and the median.

    ``'1 step with a 196 ms wait left out as an outlier; median wait 0.4 ms'``; None
    when no step was left out.
    """
    out = summary.get("data_wait_outliers")
    if not out:
        return None
    median = f"median wait {_ms(out['median_wait_s'])}"
    if out["count"] == 1:
        return f"1 step with a {_ms(out['max_s'])} wait left out as an outlier; {median}"
    lo, hi = _ms(out["min_s"]).split()[0], _ms(out["max_s"])
    return f"{out['count']} steps with waits of {lo}-{hi} left out as outliers; {median}"


def _ms(seconds: float) -> str:
    ms = 1000 * seconds
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
