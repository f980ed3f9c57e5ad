"""Other work on the machine during an experiment's trials, from the system samples.

A verdict measured while something else used the cores is not the verdict of a quiet
machine: the same experiment once gave channels_last 0.99x and compile 0.65x beside
another job, 1.30x and 1.24x alone. Every trial run has the system sampler beside it,
which sees the whole machine's CPU and the job's process tree: the difference is the
other work, in cores. Above ``BUSY_CORES`` on average, the result carries a warning
that says how much.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

# A quarter of a core of other work on average (stepscope's own sampler and launcher
# use a few per cent of one) is where the trials of a CPU-bound job start to shift.
BUSY_CORES = 0.25


def other_cores(samples: pd.DataFrame) -> np.ndarray:
    """Cores used by other processes at each sampling tick: the machine's busy cores
    minus the job's process tree."""
    if samples is None or samples.empty:
        return np.zeros(0)
    wide = samples.pivot_table(index="t", columns=["scope", "metric"], values="value")
    need = [("system", "cpu_percent"), ("system", "cpu_count"), ("proc", "cpu_percent")]
    if any(col not in wide.columns for col in need):
        return np.zeros(0)
    wide = wide[need].dropna()
    machine = wide[("system", "cpu_percent")] / 100.0 * wide[("system", "cpu_count")]
    job = wide[("proc", "cpu_percent")] / 100.0
    return np.clip((machine - job).to_numpy(dtype=float), 0.0, None)


def contention(samples_per_run: list[pd.DataFrame]) -> dict[str, Any]:
    """Other work during the trials: mean and p95 in cores, and a warning when busy."""
    ticks = [other_cores(s) for s in samples_per_run]
    values = np.concatenate(ticks) if ticks else np.zeros(0)
    cores = None
    for s in samples_per_run:
        counts = s[(s["metric"] == "cpu_count") & (s["scope"] == "system")]["value"]
        if len(counts):
            cores = int(counts.max())
            break
    out: dict[str, Any] = {
        "other_cores_mean": None,
        "other_cores_p95": None,
        "cores": cores,
        "ticks": int(values.size),
        "warning": None,
    }
    if not values.size:
        return out
    mean, p95 = float(values.mean()), float(np.percentile(values, 95))
    out["other_cores_mean"], out["other_cores_p95"] = round(mean, 2), round(p95, 2)
    if mean > BUSY_CORES:
        of = f" of {cores}" if cores else ""
        out["warning"] = (
            f"other work competed for the cores during the trials: {mean:.2f}{of} cores "
            f"on average (p95 {p95:.2f}) beside the job; verdicts may differ on a quiet "
            "machine"
        )
    return out


__all__ = ["BUSY_CORES", "contention", "other_cores"]
