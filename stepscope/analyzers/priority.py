"""Priority subtraction over a cut time line: the core of the step-time breakdown.

torch-tb-profiler subtracts each category's ranges from what is left of the steps,
category after category (a Python loop over range lists per category). Cutting the
time line once at every interval edge and labelling each piece with the
highest-priority category covering it gives the same pieces in a few numpy passes.
"""

from __future__ import annotations

import numpy as np

from stepscope.analyzers.intervals import merge


def covers(ms: np.ndarray, me: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For merged intervals (from ``merge``): is each point inside one, [start, end)?"""
    if ms.size == 0:
        return np.zeros(points.size, dtype=bool)
    j = np.searchsorted(ms, points, side="right") - 1
    inside = j >= 0
    inside[inside] = me[j[inside]] > points[inside]
    return inside


def priority_segments(
    roles: list[tuple[np.ndarray, np.ndarray]], extra_bounds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cut the time line at every interval end and give each piece its winning role.

    Returns (bounds, label): piece k is [bounds[k], bounds[k+1]) and belongs to the
    first role in ``roles`` (highest priority first) that covers it, or to
    ``len(roles)`` ('other') when none does. Priority subtraction of role after role,
    as torch-tb-profiler does it, gives the same pieces; doing it in one pass costs one
    sort of all end points.
    """
    merged = [merge(s, e) for s, e in roles]
    pieces = [extra_bounds.astype(np.int64)]
    for ms, me in merged:
        pieces.extend((ms, me))
    bounds = np.unique(np.concatenate(pieces))
    label = np.full(max(bounds.size - 1, 0), len(roles), dtype=np.int8)
    if bounds.size < 2:
        return bounds, label
    left = bounds[:-1]
    for r in range(len(roles) - 1, -1, -1):  # lowest priority first, higher ones overwrite
        ms, me = merged[r]
        label[covers(ms, me, left)] = r
    return bounds, label


def per_window_sums(
    bounds: np.ndarray, label: np.ndarray, n_labels: int, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Time of each label inside each window [lo[i], hi[i]) -> array (windows, labels).

    Window edges must be among ``bounds`` (pass them as extra bounds), so each piece is
    either fully inside or fully outside a window, and cumulative sums give exact sums
    even for overlapping windows.
    """
    out = np.zeros((len(lo), n_labels), dtype=np.int64)
    if bounds.size < 2:
        return out
    length = np.diff(bounds)
    ilo = np.searchsorted(bounds, lo)
    ihi = np.searchsorted(bounds, hi)
    for k in range(n_labels):
        cum = np.concatenate(([0], np.cumsum(np.where(label == k, length, 0))))
        out[:, k] = cum[ihi] - cum[ilo]
    return out
