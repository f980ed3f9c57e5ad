"""Where the peak goes: the peak split by what it holds, and who allocated what is live.

Two sources, read together. torch's categorised memory timeline (the capture's
``memory_timeline`` artifact, ``memory.load_memory_timeline``) says what every byte is
for (parameters, gradients, optimizer state, activations...): the peak's breakdown is
its row at the moment the total is highest, so the categories add up to the peak
exactly, and each category's own maximum over the captured steps sits beside it.

The timeline carries no stacks. The Kineto trace does: every ``[memory]`` instant has
the block's address, its thread and its time, and the Python tracer's events
(``python_function``: ``nn.Module: Block_0`` scopes and ``file.py(line): function``
frames) nest around it. The blocks live at the peak are the trace's allocations not
freed by then (the timeline's peak time, mapped to the trace's clock through its
``baseTimeNanoseconds``); each is put in the Python stack open on its thread when it
was allocated. What that gives, and what it does not:

* modules: a block allocated inside a module's forward and still live at the peak.
  In a training job that is, nearly always, an activation saved for backward; it is
  not the timeline's ACTIVATION category block by block (the trace cannot tell), so
  the table is "live at the peak, allocated in this module's forward".
* lines: the innermost frame of the job's own code (frames of torch, stepscope and
  the standard library skipped) for every live block allocated in the window.
* blocks allocated before the capture started (the parameters, the optimizer's
  state) have no event in the trace: ``attributed_bytes`` says how much of the peak
  the two tables cover.

CUDA's allocator reserves more than it hands out: ``reserved_unused_bytes`` is the
trace's reserved minus allocated at the peak (0 or absent on CPU). Where the trace has
none (no trace, or only the allocator's snapshot of an out-of-memory error) it is the
allocator snapshot's unused bytes at its own moment, and ``reserved_unused_at`` says
which. ``allocator`` holds the snapshot's figures (``allocator_snapshot.py``: reserved,
allocated, the largest free block, segments, the job's lines holding the blocks, an
OOM's request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.allocator_snapshot import AllocatorSnapshot
from stepscope.analyzers.trace.job_frames import is_job_frame
from stepscope.analyzers.trace.memory import TIMELINE_CATEGORIES

__all__ = [
    "CATEGORY_LABELS",
    "MemoryBreakdown",
    "live_at_peak",
    "memory_breakdown",
    "peak_categories",
]

#: torch's category names -> the words the CLI, API and dashboard show
CATEGORY_LABELS = {
    "PARAMETER": "parameters",
    "GRADIENT": "gradients",
    "OPTIMIZER_STATE": "optimizer state",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
    "INPUT": "inputs",
    "AUTOGRAD_DETAIL": "autograd detail",
    "UNKNOWN": "unknown",
}
#: torch's MemoryProfileTimeline coalesces events to whole microseconds
TIMELINE_RESOLUTION_NS = 1000
MODULE_PREFIX = "nn.Module: "
TOP_ROWS = 10


@dataclass
class MemoryBreakdown:
    """One capture's memory: the timeline, the peak's split, the modules and lines.

    ``peak`` has one row per category (category, label, bytes at the peak, share of the
    peak, the category's own max over the window); ``timeline`` the bytes live per
    category over time (ts in ns on the trace's clock where known); ``modules`` and
    ``lines`` the live blocks at the peak by module and by source line.
    """

    device: str | None
    peak_bytes: int | None
    peak_ts_ns: int | None
    peak: pd.DataFrame
    timeline: pd.DataFrame
    modules: pd.DataFrame
    lines: pd.DataFrame
    attributed_bytes: int | None = None
    reserved_unused_bytes: int | None = None
    reserved_unused_at: str | None = None  # "the peak", or the snapshot's moment
    allocator: AllocatorSnapshot | None = None
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`stepscope memory --json`): everything but the timeline's rows."""
        return {
            "device": self.device,
            "peak_bytes": self.peak_bytes,
            "reserved_unused_bytes": self.reserved_unused_bytes,
            "reserved_unused_at": self.reserved_unused_at,
            "attributed_bytes": self.attributed_bytes,
            "peak": _records(self.peak),
            "modules": _records(self.modules),
            "lines": _records(self.lines),
            "allocator_snapshot": None if self.allocator is None else self.allocator.to_dict(),
            "problems": list(self.problems),
        }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
        for row in df.to_dict("records")
    ]


def peak_categories(by_category: pd.DataFrame) -> tuple[pd.DataFrame, int | None, int | None]:
    """The peak's split (``memory_timeline_by_category`` rows): (table, peak bytes, its ts).

    The peak is the first row where the total is highest; each category's bytes are
    that row's, so they add up to the peak; ``max_bytes`` is the category's own highest
    point over the window (it may come at another moment: gradients after backward,
    activations before it).
    """
    cols = ["category", "label", "bytes", "share", "max_bytes"]
    if by_category.empty:
        return pd.DataFrame(columns=cols), None, None
    at = int(by_category["total"].to_numpy().argmax())
    row = by_category.iloc[at]
    total = int(row["total"])
    rows = [
        {
            "category": cat,
            "label": CATEGORY_LABELS[cat],
            "bytes": int(row[cat]),
            "share": int(row[cat]) / total if total > 0 else 0.0,
            "max_bytes": int(by_category[cat].max()),
        }
        for cat in TIMELINE_CATEGORIES
    ]
    table = pd.DataFrame(rows, columns=cols).sort_values("bytes", ascending=False, kind="stable")
    return table.reset_index(drop=True), total, int(row["ts"])


def _device_rows(memory: pd.DataFrame, device: str | None) -> pd.DataFrame:
    """The trace's ``[memory]`` rows of one device (``cpu``, ``cuda:0``); None: the
    device with the most events."""
    if memory.empty:
        return memory
    if device is None:
        key = memory.groupby(["device_type", "device_id"]).size().idxmax()
        dev_type, dev_id = int(key[0]), int(key[1])
    elif device == "cpu":
        dev_type, dev_id = 0, None
    else:
        dev_type, dev_id = 1, int(device.partition(":")[2] or 0)
    rows = memory[memory["device_type"] == dev_type]
    if dev_id is not None:
        rows = rows[rows["device_id"] == dev_id]
    return rows


def live_at_peak(rows: pd.DataFrame, peak_ts: int | None) -> tuple[pd.DataFrame, int | None]:
    """The blocks allocated in the window and still live at ``peak_ts`` (trace ns;
    None: the trace's own highest allocated). Returns (blocks: addr, ts, tid, bytes;
    the reserved-but-unused bytes at that moment, None where not reported)."""
    empty = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("addr", "ts", "tid", "bytes")})
    if rows.empty or "addr" not in rows:
        return empty, None
    if peak_ts is None:
        at = int(rows["total_allocated"].to_numpy().argmax())
        upto = rows.iloc[: at + 1]
    else:  # the timeline's peak is a whole microsecond: events within it are applied
        upto = rows[rows["ts"].to_numpy() < peak_ts + TIMELINE_RESOLUTION_NS]
    live: dict[int, tuple[int, int, int]] = {}
    for addr, ts, tid, nbytes in zip(
        upto["addr"].tolist(),
        upto["ts"].tolist(),
        upto["tid"].tolist(),
        upto["bytes"].tolist(),
        strict=True,
    ):
        if nbytes > 0:
            live[addr] = (ts, tid, nbytes)
        elif nbytes < 0:
            live.pop(addr, None)
    reserved_unused = None
    if not upto.empty:
        last = upto.iloc[-1]
        if int(last["total_reserved"]) > 0 and int(last["total_allocated"]) >= 0:
            reserved_unused = max(int(last["total_reserved"]) - int(last["total_allocated"]), 0)
    if not live:
        return empty, reserved_unused
    addrs = np.fromiter(live.keys(), dtype=np.int64, count=len(live))
    vals = np.array(list(live.values()), dtype=np.int64).reshape(-1, 3)
    blocks = pd.DataFrame({"addr": addrs, "ts": vals[:, 0], "tid": vals[:, 1], "bytes": vals[:, 2]})
    return blocks.sort_values("ts", kind="stable", ignore_index=True), reserved_unused


def _stacks(frames: pd.DataFrame, blocks: pd.DataFrame) -> list[list[str]]:
    """The Python stack (outermost first) open on each block's thread when it was
    allocated: one sweep per thread over the frames sorted by start."""
    out: list[list[str]] = [[] for _ in range(len(blocks))]
    by_tid = {tid: g for tid, g in frames.groupby("tid", sort=False)}
    for tid, idx in blocks.groupby("tid", sort=False).indices.items():
        g = by_tid.get(tid)
        if g is None:  # a thread the Python tracer did not see: its stack is unknown
            continue
        g = g.sort_values(["ts", "end"], ascending=[True, False], kind="stable")
        starts, ends = g["ts"].to_numpy(), g["end"].to_numpy()
        names = g["name"].astype(str).tolist()
        stack: list[int] = []
        i = 0
        order = sorted(idx, key=lambda k: blocks["ts"].iat[k])
        for k in order:
            t = int(blocks["ts"].iat[k])
            while i < len(starts) and starts[i] <= t:
                while stack and ends[stack[-1]] <= starts[i]:
                    stack.pop()
                stack.append(i)
                i += 1
            while stack and ends[stack[-1]] < t:
                stack.pop()
            out[k] = [names[j] for j in stack if ends[j] >= t]
    return out


def _attribute(blocks: pd.DataFrame, stacks: list[list[str]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    mod_bytes: dict[str, list[int]] = {}  # name -> [inclusive bytes, own bytes, blocks]
    line_bytes: dict[str, list[int]] = {}
    for nbytes, stack in zip(blocks["bytes"].tolist(), stacks, strict=True):
        modules = [n[len(MODULE_PREFIX) :] for n in stack if n.startswith(MODULE_PREFIX)]
        for pos, name in enumerate(dict.fromkeys(modules)):
            entry = mod_bytes.setdefault(name, [0, 0, 0])
            entry[0] += nbytes
            entry[2] += 1
            if pos == len(dict.fromkeys(modules)) - 1:
                entry[1] += nbytes
        line = next((n for n in reversed(stack) if is_job_frame(n)), None)
        if line is not None:
            entry = line_bytes.setdefault(line, [0, 0])
            entry[0] += nbytes
            entry[1] += 1
    modules = pd.DataFrame(
        [(n, b, own, c) for n, (b, own, c) in mod_bytes.items()],
        columns=["module", "bytes", "own_bytes", "blocks"],
    )
    lines = pd.DataFrame(
        [(n, b, c) for n, (b, c) in line_bytes.items()], columns=["line", "bytes", "blocks"]
    )
    modules = modules.sort_values(["bytes", "module"], ascending=[False, True], kind="stable")
    lines = lines.sort_values(["bytes", "line"], ascending=[False, True], kind="stable")
    return modules.head(TOP_ROWS).reset_index(drop=True), lines.head(TOP_ROWS).reset_index(
        drop=True
    )


def memory_breakdown(
    by_category: pd.DataFrame | None,
    trace: Any | None,
    *,
    device: str | None = None,
    problems: list[str] | None = None,
    allocator: AllocatorSnapshot | None = None,
) -> MemoryBreakdown:
    """The peak's breakdown from a timeline (``memory_timeline_by_category``; None when
    unreadable) and the same window's trace (a ``Trace``; None when unreadable): each
    part that can be had from what is there, the rest empty. ``allocator``: the run's
    CUDA allocator snapshot, kept beside them."""
    problems = list(problems or [])
    if by_category is None:
        by_category = pd.DataFrame(columns=["ts", *TIMELINE_CATEGORIES, "total"])
    peak, peak_bytes, peak_ts = peak_categories(by_category)
    base = None
    if trace is not None and trace.meta:
        base = next(iter(trace.meta.values())).get("baseTimeNanoseconds")
    timeline = by_category.copy()
    trace_peak = None
    if base is not None:
        if not timeline.empty:
            timeline["ts"] = timeline["ts"] - int(base)  # the trace's clock
        trace_peak = None if peak_ts is None else peak_ts - int(base)
    modules = pd.DataFrame(columns=["module", "bytes", "own_bytes", "blocks"])
    lines = pd.DataFrame(columns=["line", "bytes", "blocks"])
    attributed = reserved_unused = None
    if trace is not None:
        rows = _device_rows(trace.memory, device)
        if peak_ts is not None and trace_peak is None:
            problems.append(
                "the trace has no baseTimeNanoseconds: modules and lines at its own peak"
            )
        blocks, reserved_unused = live_at_peak(rows, trace_peak)
        ev = trace.events
        frames = ev[ev["cat"] == "python_function"][["tid", "name", "ts", "end"]]
        modules, lines = _attribute(blocks, _stacks(frames, blocks))
        attributed = int(blocks["bytes"].sum())
        if peak_bytes is None and not rows.empty:
            at = int(rows["total_allocated"].to_numpy().argmax())
            peak_bytes = int(rows["total_allocated"].iat[at])
    unused_at = None if reserved_unused is None else "the peak"
    if reserved_unused is None and allocator is not None:
        reserved_unused, unused_at = allocator.unused_bytes, allocator.moment
    if device is None and allocator is not None:
        device = f"cuda:{allocator.device}"
    return MemoryBreakdown(
        device=device,
        peak_bytes=peak_bytes,
        peak_ts_ns=trace_peak if trace_peak is not None else peak_ts,
        peak=peak,
        timeline=timeline,
        modules=modules,
        lines=lines,
        attributed_bytes=attributed,
        reserved_unused_bytes=reserved_unused,
        reserved_unused_at=unused_at,
        allocator=allocator,
        problems=problems,
    )
