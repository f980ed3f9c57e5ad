"""Each arm's peak memory against the baseline's, and the arm kept when the goal is
memory (``optimize --goal memory``).

A fix for memory (activation checkpointing) makes the step slower and the peak lower:
judged on time alone it reads "slower". So every trial's peak is read (what the job
recorded at its exit, ``collectors/facts/peak_memory.py``: CUDA's max allocated where
the job used CUDA, else the process's peak RSS; a run recorded before that falls back
on the system sampler's highest RSS sample of its process tree), each arm gets the
median over its trials and its ratio to the baseline's, and ``--goal memory`` keeps the
arm with the lowest peak among those within ``--max-slowdown`` of the baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.optim_runner.verdict.memory_goal import (
    DEFAULT_MAX_SLOWDOWN,
    GOALS,
    parse_max_slowdown,
)


def run_peak(run: dict[str, Any], samples: Any = None) -> tuple[float | None, str | None]:
    """(peak bytes, what it is) of one run: CUDA max allocated, else peak RSS; the
    sampler's highest RSS sample where the job recorded none."""
    peak = (run.get("config") or {}).get("peak_memory") or {}
    for key, basis in (("cuda_allocated_bytes", "cuda_allocated"), ("rss_bytes", "rss")):
        value = peak.get(key)
        if isinstance(value, int | float) and value > 0:
            return float(value), basis
    if samples is not None and not samples.empty:
        rss = samples[(samples["scope"] == "proc") & (samples["metric"] == "rss_bytes")]
        if not rss.empty and rss["value"].max() > 0:
            return float(rss["value"].max()), "rss_sampled"
    return None, None


def arm_peak(store: Any, runs: list[int]) -> tuple[float | None, str | None]:
    """Median peak over an arm's trials (None where none recorded one), and its basis
    (the basis of its trials, 'mixed' where they differ)."""
    values, bases = [], set()
    read_run, read_samples = getattr(store, "run", None), getattr(store, "samples", None)
    for run_id in runs if read_run is not None else ():  # a store of steps alone: none
        run = read_run(run_id)
        if run is None:
            continue
        value, basis = run_peak(run)
        if value is None and read_samples is not None:
            value, basis = run_peak(run, read_samples(run_id))
        if value is not None:
            values.append(value)
            bases.add(basis)
    if not values:
        return None, None
    return float(np.median(values)), bases.pop() if len(bases) == 1 else "mixed"


def peak_fields(store: Any, runs: list[int], base_runs: list[int]) -> dict[str, Any]:
    """``peak_bytes``, ``peak_ratio`` (to the baseline's; < 1: lower) and ``peak_basis``
    of a candidate; the ratio only where both peaks are of one kind."""
    peak, basis = arm_peak(store, runs)
    base, base_basis = arm_peak(store, base_runs)
    ratio = None
    if peak is not None and base and basis == base_basis:
        ratio = round(peak / base, 4)
    return {"peak_bytes": peak, "peak_ratio": ratio, "peak_basis": basis}


def slowdown(outcome: dict[str, Any]) -> float | None:
    """How many times slower per sample (per step where no batch is known) than the
    baseline: 1 / speedup; None where not measured."""
    speedup = outcome.get("speedup")
    return 1.0 / speedup if speedup else None


def pick_lowest_peak(outcomes: list[dict[str, Any]], max_slowdown: float) -> dict[str, Any] | None:
    """The completed candidate with the lowest peak below the baseline's, whose guard
    did not fail and which is at most ``max_slowdown`` times slower; None if none."""
    pool = [
        o
        for o in outcomes
        if o.get("status") == "completed"
        and o.get("quality_ok") is not False
        and o.get("peak_ratio") is not None
        and o["peak_ratio"] < 1.0
        and (slowdown(o) or float("inf")) <= max_slowdown
    ]
    return min(pool, key=lambda o: o["peak_ratio"]) if pool else None


def trade_text(outcome: dict[str, Any]) -> str | None:
    """ "peak 0.41x, 1.27x slower per sample": the peak against the time, both said."""
    ratio = outcome.get("peak_ratio")
    if ratio is None:
        return None
    per = "per sample" if outcome.get("speedup_basis") == "samples_per_s" else "per step"
    speedup = outcome.get("speedup")
    if not speedup:
        return f"peak {ratio:.2f}x"
    if speedup < 1:
        return f"peak {ratio:.2f}x, {1 / speedup:.2f}x slower {per}"
    return f"peak {ratio:.2f}x, {speedup:.2f}x faster {per}"


def memory_best(
    outcomes: list[dict[str, Any]], max_slowdown: float
) -> tuple[dict[str, Any] | None, str]:
    """The arm kept for ``--goal memory``, and the answer line that says why."""
    top = pick_lowest_peak(outcomes, max_slowdown)
    if top is None:
        return None, (
            f"no candidate lowered the peak within {max_slowdown:g}x of the baseline's "
            "time with the guard kept: keep the job as it is"
        )
    return top, (
        f"lowest peak within {max_slowdown:g}x of the baseline's time: "
        f"{', '.join(top['fixes'])} ({trade_text(top)})"
    )


__all__ = [
    "DEFAULT_MAX_SLOWDOWN",
    "GOALS",
    "arm_peak",
    "memory_best",
    "parse_max_slowdown",
    "peak_fields",
    "pick_lowest_peak",
    "run_peak",
    "slowdown",
    "trade_text",
]
