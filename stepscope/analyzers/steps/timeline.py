"""One profiled step of a trace as timeline lanes: host threads and device streams.

Plain functions over a loaded ``Trace`` (no Streamlit, no plotting), so the Run page's
step timeline draws what this module computes and a test can check it on its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.load import Trace

#: events kept in the step timeline: the longest ones, enough to see the structure
TIMELINE_MAX_EVENTS = 2500
#: host categories shown in the step timeline (python_function ranges are the Python
#: tracer's: tens of thousands on a real job, and they hide the operators beneath)
TIMELINE_HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def step_timeline(
    trace: Trace, rank: int, step: int, max_events: int = TIMELINE_MAX_EVENTS
) -> pd.DataFrame:
    """Events of one profiled step as lanes (host threads, device streams) for a timeline.

    Keeps the ``max_events`` longest events (the step's structure; the thousands of
    sub-microsecond ones cannot be seen at this zoom anyway) and gives each its
    nesting depth within its lane, so parents and children can be stacked.
    Columns: lane, lane_kind ('host'|'device'), name, cat, start_ms (from the step's
    start), dur_ms, depth. ``.attrs`` holds total (events in the step) and kept.
    """
    steps = trace.steps
    row = steps[(steps["rank"] == rank) & (steps["step"] == step)]
    cols = ["lane", "lane_kind", "name", "cat", "start_ms", "dur_ms", "depth"]
    if row.empty:
        return pd.DataFrame(columns=cols)
    start, end = int(row["start"].iloc[0]), int(row["end"].iloc[0])
    ev = trace.events
    host = ev["cat"].isin(TIMELINE_HOST_CATS).to_numpy()
    keep = (
        (ev["rank"].to_numpy() == rank)
        & (host | ev["on_device"].to_numpy())
        & (ev["end"].to_numpy() > start)
        & (ev["ts"].to_numpy() < end)
    )
    sel = ev.loc[keep, ["pid", "tid", "cat", "name", "ts", "dur", "end", "on_device", "stream"]]
    total = len(sel)
    if total > max_events:
        sel = sel.nlargest(max_events, "dur", keep="first")
    sel = sel.sort_values(["ts", "dur"], ascending=[True, False])
    device = sel["on_device"].to_numpy()
    stream = sel["stream"].to_numpy()
    lane = np.where(
        device,
        # GPU-side copies of annotations (ProfilerStep, user ranges) carry no stream
        np.where(stream >= 0, "stream " + stream.astype(str), "GPU annotations"),
        "thread " + sel["tid"].astype(str).to_numpy(),
    )
    out = pd.DataFrame(
        {
            "lane": lane,
            "lane_kind": np.where(device, "device", "host"),
            "name": sel["name"].astype(str).to_numpy(),
            "cat": sel["cat"].astype(str).to_numpy(),
            "start_ms": (np.maximum(sel["ts"].to_numpy(), start) - start) / 1e6,
            "dur_ms": (
                np.minimum(sel["end"].to_numpy(), end) - np.maximum(sel["ts"].to_numpy(), start)
            )
            / 1e6,
            "depth": _depths(lane, sel["ts"].to_numpy(), sel["end"].to_numpy()),
        }
    )
    out.attrs["total"] = total
    out.attrs["kept"] = len(out)
    return out[cols]


def _depths(lane: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of each range within its lane (rows sorted by start, longest first)."""
    depth = np.zeros(len(lane), dtype=np.int64)
    stacks: dict[str, list[int]] = {}
    for i, (key, t0, t1) in enumerate(zip(lane.tolist(), ts.tolist(), end.tolist(), strict=True)):
        stack = stacks.setdefault(key, [])
        while stack and stack[-1] <= t0:
            stack.pop()
        depth[i] = len(stack)
        stack.append(t1)
    return depth


__all__ = ["TIMELINE_HOST_CATS", "TIMELINE_MAX_EVENTS", "step_timeline"]
