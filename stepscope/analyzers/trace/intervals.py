"""Set operations on unions of intervals (numpy int64 ns): merge, intersect, clip.

Every analysis needs "how much time do these events cover" for tens of thousands of
overlapping events, and the HTA-parity ones also the intersection of two unions
(communication time during which compute runs). Sorting once and sweeping over the
boundaries does each in a few array operations, with no Python loop per interval.
"""

from __future__ import annotations

import numpy as np

__all__ = ["clip_to_windows", "clip_window", "covered_in", "intersect", "length", "merge", "total"]

Spans = tuple[np.ndarray, np.ndarray]


def merge(starts: np.ndarray, ends: np.ndarray) -> Spans:
    """Union of intervals as sorted, disjoint (start, end) arrays.

    Touching intervals (one ends where the next starts) are merged, as both
    torch-tb-profiler's ``merge_ranges`` and HTA's ``merge_kernel_intervals`` do, so
    counts and lengths agree with both.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if starts.size == 0:
        return starts[:0].copy(), ends[:0].copy()
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # a new span starts where this interval begins after everything before it ended
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def length(spans: Spans) -> int:
    """Total length of merged (disjoint) spans."""
    return int((spans[1] - spans[0]).sum())


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union, counting overlapping time once."""
    return length(merge(starts, ends))


def intersect(a: Spans, b: Spans) -> Spans:
    """Intersection of two merged (disjoint) span sets.

    A sweep over both sets of boundaries: time is in the intersection where the count
    of open spans is 2. At equal times ends sort before starts, so spans that only
    touch do not intersect.
    """
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0 or b_s.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy()
    times = np.concatenate([a_s, a_e, b_s, b_e]).astype(np.int64)
    delta = np.concatenate(
        [
            np.ones(a_s.size, np.int8),
            -np.ones(a_e.size, np.int8),
            np.ones(b_s.size, np.int8),
            -np.ones(b_e.size, np.int8),
        ]
    )
    order = np.lexsort((delta, times))
    times, delta = times[order], delta[order]
    running = np.cumsum(delta, dtype=np.int64)
    both = np.flatnonzero(running == 2)
    starts, ends = times[both], times[both + 1]
    keep = ends > starts
    return starts[keep], ends[keep]


def clip_to_windows(spans: Spans, lo: np.ndarray, hi: np.ndarray) -> Spans:
    """Merged spans restricted to a set of windows (e.g. the step windows)."""
    return intersect(spans, merge(lo, hi))


def clip_window(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> Spans:
    """Intervals cut to one window [lo, hi); empty pieces dropped (not merged)."""
    s = np.maximum(np.asarray(starts, dtype=np.int64), lo)
    e = np.minimum(np.asarray(ends, dtype=np.int64), hi)
    keep = e > s
    return s[keep], e[keep]


def covered_in(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    """Length of the union inside [lo, hi)."""
    return total(*clip_window(starts, ends, lo, hi))
