"""Whether a run's profiler capture covered any complete step of its job.

A capture that opened after the job's last step (the job ended inside the window) or
whose window is short beside the job's steps (LBFGS steps of 58 s) holds only the tail
of the job: "steps" of a few ms after the last real one, and the store says no step was
profiled. Shares of step time read from it were 100 % host overhead, with fixes; the
diagnosis leaves such a trace out and reads steps, samples and stacks instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# A trace step shorter than this share of the job's median step is not one of its steps.
SHORT_STEP = 0.25
NO_COMPLETE_STEP = "the capture covered no complete step: shares from steps, samples and stacks"


def missed_every_step(per_step: Any, steps: Any) -> bool:
    """True where the store's steps say none ran inside the capture and the trace's
    ProfilerStep ranges are no step of the job (none, or far shorter than its steps).
    ``per_step``: the trace's per-step breakdown (durations in ns); ``steps``: the
    store's steps of the run."""
    if steps is None or len(steps) == 0 or "profiled" not in steps:
        return False  # nothing to compare with (a trace with no run, an attached job)
    if steps["profiled"].fillna(0).astype(bool).any():
        return False
    if per_step is None or len(per_step) == 0 or "duration" not in per_step:
        return True
    wall = (steps["end_s"] - steps["start_s"]).to_numpy(dtype=float)
    wall = wall[np.isfinite(wall) & (wall > 0)]
    if not len(wall):
        return False
    traced_s = float(np.median(per_step["duration"].to_numpy(dtype=float))) / 1e9
    return traced_s < SHORT_STEP * float(np.median(wall))


__all__ = ["NO_COMPLETE_STEP", "SHORT_STEP", "missed_every_step"]
