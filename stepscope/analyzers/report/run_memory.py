"""A recorded run's memory breakdown: its last capture's timeline and trace, read together.

The capture saves torch's categorised memory timeline beside each trace, with the same
file stem (``collectors/capture/profiler_capture.py``); the last capture that has a
timeline is the one shown (a later capture of a running job replaces an earlier one).
A file that cannot be read is one line in ``problems``; what the other file gives is
still shown.

On CUDA the run's latest allocator snapshot (``run_snapshot.py``: a capture's, or the
one dumped at an out-of-memory error) is read beside them: its figures fill the
breakdown's ``allocator``. A run with a snapshot and no timeline (the timeline's export
was skipped for a large trace, or the job ran out of memory outside a capture) gets
the snapshot's figures alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepscope.analyzers.report.run_snapshot import has_snapshot, run_snapshot
from stepscope.analyzers.trace.load import TraceError, load_trace
from stepscope.analyzers.trace.memory import load_memory_timeline, memory_timeline_by_category
from stepscope.analyzers.trace.memory_peak import MemoryBreakdown, memory_breakdown
from stepscope.store.artifacts import artifact_files

__all__ = ["NoMemoryData", "run_memory"]

TIMELINE_SUFFIX = ".memory_timeline.raw.json.gz"
TRACE_SUFFIX = ".pt.trace.json.gz"


class NoMemoryData(LookupError):
    """The run has nothing to break its memory down with; the message says what is missing."""


def _stem(path: str) -> str:
    name = Path(path).name
    for suffix in (TIMELINE_SUFFIX, TRACE_SUFFIX, ".pt.trace.json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def run_memory(store: Any, run_id: int) -> MemoryBreakdown:
    """The breakdown of run ``run_id``'s last capture with a memory timeline, with the
    run's latest allocator snapshot.

    Raises NoMemoryData when the run has neither a snapshot nor a capture with a
    timeline.
    """
    arts = store.artifacts(run_id)
    kinds = set(arts["kind"]) if len(arts) else set()
    snapshot, problems = run_snapshot(store, run_id, arts)
    if "memory_timeline" not in kinds:
        if "trace" not in kinds:
            missing = f"run {run_id} has no profiler capture: no memory breakdown"
        else:
            missing = (
                f"run {run_id}'s capture has no memory timeline (recorded before stepscope "
                "saved one, or its export failed: see the run's log)"
            )
        if not has_snapshot(arts):
            raise NoMemoryData(missing)
        if "trace" in kinds:  # the peak's split is missing, the snapshot is not
            problems.insert(0, missing)
        return memory_breakdown(None, None, problems=problems, allocator=snapshot)
    timeline_row = arts[arts["kind"] == "memory_timeline"].iloc[-1]
    meta = timeline_row["meta"] or {}
    stem = _stem(meta.get("local_path") or timeline_row["path"])
    traces = arts[arts["kind"] == "trace"]
    traces = traces[
        [
            _stem((m or {}).get("local_path") or p) == stem
            for p, m in zip(traces["path"], traces["meta"], strict=True)
        ]
    ]
    by_category = trace = None
    files, missing = artifact_files([timeline_row, *[r for _, r in traces.iterrows()]], store.home)
    problems.extend(missing)
    for path in files:
        if str(path).endswith(TIMELINE_SUFFIX):
            try:
                by_category = memory_timeline_by_category(load_memory_timeline(path))
            except (ValueError, IndexError, OSError) as exc:
                text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                problems.append(text if str(path) in text else f"{path}: {text}")
        else:
            try:
                trace = load_trace(path)
            except (TraceError, OSError) as exc:
                problems.append(str(exc).splitlines()[0])
    return memory_breakdown(
        by_category, trace, device=meta.get("device"), problems=problems, allocator=snapshot
    )
