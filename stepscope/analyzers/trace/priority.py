"""Priority subtraction over a cut time line: the core of the step-time breakdown.

torch-tb-profiler subtracts each category's ranges from what is left of the steps,
category after category (a Python loop over range lists per category). Cutting the
time line once at every interval edge and labelling each piece with the
highest-priority category covering it gives the same pieces in a few numpy passes.
"""

from __future__ import annotations

import numpy as np

from stepscope.analyzers.trace.intervals import merge


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of int64 time stamps, by sorting.

    numpy 2's ``np.unique`` hashes integers first, which on epoch-nanosecond stamps
    (large values sharing their low bits) degrades badly: ~2 s for 2 M values where a
    sort and a neighbour compare take ~25 ms. Same result, sorted ascending.
    """
    s = np.sort(np.asarray(values, dtype=np.int64))
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def covers(ms: np.ndarray, me: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For merged intervals (from ``merge``): is each point inside one, [start, end)?"""
    if ms.size == 0:
        return np.zeros(points.size, dtype=bool)
    j = np.searchsorted(ms, points, side="right") - 1
    inside = j >= 0
    inside[inside] = me[j[inside]] > points[inside]
    return inside


def covered_pieces(bounds: np.ndarray, ms: np.ndarray, me: np.ndarray) -> np.ndarray:
    """Which pieces [bounds[k], bounds[k+1]) lie inside merged spans (ms, me)?

    Same answer as ``covers(ms, me, bounds[:-1])``, but every span edge must be one of
    ``bounds`` (true for the cut time lines here): then each span switches coverage on
    at its start's index and off at its end's, and one cumulative sum over the pieces
    replaces a binary search per piece, ~2.5x faster on a million pieces. Empty spans
    (a lone zero-length event) cover nothing, as in ``covers``.
    """
    keep = me > ms
    flag = np.zeros(bounds.size, dtype=np.int8)
    flag[np.searchsorted(bounds, ms[keep])] = 1  # merged spans are disjoint and do not
    flag[np.searchsorted(bounds, me[keep])] = -1  # touch: distinct indices, running sum 0/1
    return np.cumsum(flag[:-1], dtype=np.int8).view(bool)


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
    bounds = sorted_unique(np.concatenate(pieces))
    label = np.full(max(bounds.size - 1, 0), len(roles), dtype=np.int8)
    if bounds.size < 2:
        return bounds, label
    for r in range(len(roles) - 1, -1, -1):  # lowest priority first, higher ones overwrite
        label[covered_pieces(bounds, *merged[r])] = r
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
