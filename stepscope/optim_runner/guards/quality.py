"""Quality guard: does the model still learn the same with a fix applied?

A speed-up that changes what the model computes is no speed-up. Every arm of an
experiment runs with the same seed, so the loss of step k can be compared between a
baseline trial and a candidate trial. Decisions, and why:

* **Non-finite losses fail at once.** The store keeps a NaN loss as NULL (SQLite has no
  NaN), so a step whose loss the baseline has and the candidate lacks counts as NaN.
* **Drift is judged on the second half.** The first steps of a short run are dominated
  by the initialisation and move fast; the second half's mean loss is where a
  numerics change (a lower precision, another data order) shows as a level that
  differs. The drift is relative to the baseline's level.
* **The tolerance is never tighter than the noise.** Some jobs are not deterministic
  even when seeded (thread scheduling in reductions, worker order): the baseline's own
  drift between its trials is the noise, and a candidate is only failed beyond 3x that
  (and beyond ``tolerance``, 5 % by default).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

DEFAULT_TOLERANCE = 0.05
NOISE_FACTOR = 3.0
_TINY = 1e-12


@dataclass(frozen=True)
class QualityCheck:
    """Outcome of the guard: ``ok`` is None when there was nothing to compare."""

    ok: bool | None
    reason: str
    drift: float | None = None  # relative difference of the second-half mean loss
    tolerance: float | None = None
    baseline_drift: float | None = None  # between the baseline's own trials

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "drift": _round(self.drift),
            "tolerance": _round(self.tolerance),
            "baseline_drift": _round(self.baseline_drift),
        }


def loss_series(steps: pd.DataFrame) -> np.ndarray:
    """Rank 0's loss by step index (NaN where none was recorded); empty without losses."""
    if steps.empty or "loss" not in steps or steps["loss"].isna().all():
        return np.zeros(0)
    rank0 = steps[steps["rank"] == steps["rank"].min()]
    n = int(rank0["step"].max()) + 1
    out = np.full(n, np.nan)
    values = pd.to_numeric(rank0["loss"], errors="coerce").to_numpy(dtype=float)
    out[rank0["step"].to_numpy(dtype=int)] = values
    return out


def second_half_mean(series: np.ndarray, length: int) -> float:
    """Mean loss over steps [length // 2, length) of one trial (NaNs left out)."""
    part = series[length // 2 : length]
    part = part[np.isfinite(part)]
    return float(part.mean()) if part.size else float("nan")


def baseline_drift(baseline: list[np.ndarray]) -> float:
    """Largest relative difference of the second-half mean between two baseline trials."""
    usable = [s for s in baseline if s.size]
    if len(usable) < 2:
        return 0.0
    length = min(s.size for s in usable)
    means = [second_half_mean(s, length) for s in usable]
    level = max(abs(float(np.nanmean(means))), _TINY)
    pairs = [abs(a - b) / level for a, b in combinations(means, 2) if np.isfinite(a - b)]
    return max(pairs, default=0.0)


def check_quality(
    baseline: list[np.ndarray],
    candidate: list[np.ndarray],
    tolerance: float = DEFAULT_TOLERANCE,
) -> QualityCheck:
    """Compare the loss series of a candidate's trials with the baseline's (same seed)."""
    base = [s for s in baseline if s.size]
    cand = [s for s in candidate if s.size]
    if not base:
        return QualityCheck(None, "the baseline recorded no loss: not checked")
    if not cand:
        return QualityCheck(False, "the candidate recorded no loss while the baseline did")
    reference = _nanmean_rows([_pad(s, max(b.size for b in base)) for s in base])
    for series in cand:
        bad = _first_non_finite(reference, series)
        if bad is not None:
            return QualityCheck(False, f"loss is NaN or infinite from step {bad}")
    noise = baseline_drift(base)
    allowed = max(tolerance, NOISE_FACTOR * noise)
    length = min(min(s.size for s in base), min(s.size for s in cand))
    if length < 2:
        return QualityCheck(None, "too few steps with a loss to compare", None, allowed, noise)
    base_mean = float(np.nanmean([second_half_mean(s, length) for s in base]))
    cand_mean = float(np.nanmean([second_half_mean(s, length) for s in cand]))
    drift = abs(cand_mean - base_mean) / max(abs(base_mean), _TINY)
    what = (
        f"second-half mean loss {cand_mean:.4g} vs {base_mean:.4g} "
        f"({100 * drift:.3g} % drift, tolerance {100 * allowed:.3g} %)"
    )
    if drift > allowed:
        return QualityCheck(False, f"loss drifted: {what}", drift, allowed, noise)
    return QualityCheck(True, f"loss kept: {what}", drift, allowed, noise)


def _first_non_finite(reference: np.ndarray, series: np.ndarray) -> int | None:
    """First step whose loss is inf, or missing (NaN) where the baseline has one."""
    n = min(reference.size, series.size)
    bad = np.isinf(series[:n]) | (np.isnan(series[:n]) & np.isfinite(reference[:n]))
    idx = np.flatnonzero(bad)
    return int(idx[0]) if idx.size else None


def _nanmean_rows(rows: list[np.ndarray]) -> np.ndarray:
    """Per-step mean over trials; NaN (quietly) where no trial has a loss."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.vstack(rows), axis=0)


def _pad(series: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, np.nan)
    out[: min(n, series.size)] = series[:n]
    return out


def _round(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), 5)


__all__ = ["QualityCheck", "baseline_drift", "check_quality", "loss_series"]
