"""Why the device sat idle between kernels, per stream: HTA's idle-time breakdown.

An idle gap on a stream is the time between one kernel's end and the next kernel's
start on that stream. HTA 0.5.0 (``BreakdownAnalysis._analyze_idle_time_for_stream``)
blames each gap on one of three causes, judged from the *next* kernel:

* **host wait**: the host launched the next kernel only after the previous one had
  finished (launch start > previous end): the CPU did not enqueue work fast enough;
* **kernel wait**: otherwise, a gap shorter than ``consecutive_kernel_delay`` (30 us,
  HTA's default, applied to its microsecond timestamps): the normal launch latency
  between back-to-back kernels;
* **other**: everything else, e.g. the stream waiting on an event from another
  stream (a communication kernel, a copy).

The event selection (kernels, memcpys, memsets; last profiled step dropped) is HTA's,
see :mod:`stepscope.analyzers.trace.hta_rules`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.hta_rules import hta_device_events

__all__ = ["CATEGORIES", "CONSECUTIVE_KERNEL_DELAY_NS", "idle_time_breakdown"]

CATEGORIES = ("host_wait", "kernel_wait", "other")
#: HTA's default threshold is 30 in its trace units, which are microseconds
CONSECUTIVE_KERNEL_DELAY_NS = 30_000

_COLUMNS = ["rank", "stream", "idle_category", "idle_ns", "idle_share", "gaps"]


def idle_time_breakdown(
    trace,
    consecutive_kernel_delay_ns: int = CONSECUTIVE_KERNEL_DELAY_NS,
    hta_rounding: bool = True,
    dev: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Idle ns per (rank, stream, category) and each category's share of the stream's idle time.

    Every stream gets all three categories (zero where none), so a consumer can pivot
    without filling holes. ``hta_rounding`` (default, for parity) rounds times to whole
    microseconds as HTA does; pass False for exact nanosecond gaps. An empty frame (same columns) when the trace has no device
    events: a CPU-only run has no device to be idle. ``dev`` is
    ``hta_device_events(trace.events, hta_rounding)`` when the caller already has it
    (the report shares it between the HTA analyses).
    """
    dev = hta_device_events(trace.events, hta_rounding) if dev is None else dev
    if dev.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _dtypes().items()})
    # (rank, stream, ts) order, stable: what sort_values on the three columns gives
    r0, s0, t0 = (dev[c].to_numpy() for c in ("rank", "stream", "ts"))
    order = np.lexsort((t0, s0, r0))
    rank, stream, ts = r0[order], s0[order], t0[order]
    end = dev["end"].to_numpy()[order]
    runtime_ts = dev["runtime_ts"].to_numpy()[order]

    # previous event on the same (rank, stream); the first one of a stream has no gap
    same = np.zeros(ts.size, dtype=bool)
    same[1:] = (rank[1:] == rank[:-1]) & (stream[1:] == stream[:-1])
    prev_end = np.empty_like(end)
    prev_end[0] = 0
    prev_end[1:] = end[:-1]
    gap = ts - prev_end

    host_wait = same & (runtime_ts > prev_end)
    kernel_wait = same & ~host_wait & (gap < consecutive_kernel_delay_ns)
    category = np.where(host_wait, 0, np.where(kernel_wait, 1, 2)).astype(np.int8)

    # Streams in sorted order, three categories each (zeros included): the rows are
    # already grouped by stream, so integer group ids replace pandas' groupby/reindex.
    stream_id = np.cumsum(~same) - 1
    firsts = np.flatnonzero(~same)
    n_groups = 3 * firsts.size
    group = (stream_id * 3 + category)[same]
    idle = np.zeros(n_groups, dtype=np.int64)
    np.add.at(idle, group, gap[same])
    gaps = np.bincount(group, minlength=n_groups).astype(np.int64)
    per_stream = np.repeat(idle.reshape(-1, 3).sum(axis=1), 3)
    share = np.where(per_stream > 0, idle / np.where(per_stream != 0, per_stream, 1), 0.0)
    cat_of_row = np.tile(np.arange(3), firsts.size)

    out = pd.DataFrame(
        {
            "rank": np.repeat(rank[firsts].astype(np.int64), 3),
            "stream": np.repeat(stream[firsts].astype(np.int64), 3),
            "idle_category": np.asarray(CATEGORIES, dtype=object)[cat_of_row],
            "idle_ns": idle,
            "idle_share": share.astype(float),
            "gaps": gaps,
        }
    )
    # already in (rank, stream, category) order: CATEGORIES are alphabetical
    return out[_COLUMNS]


def _dtypes() -> dict[str, str]:
    return {
        "rank": "int64",
        "stream": "int64",
        "idle_category": "object",
        "idle_ns": "int64",
        "idle_share": "float64",
        "gaps": "int64",
    }
