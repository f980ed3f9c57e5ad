"""The run's profiler traces, for the pages: analysed and loaded once per file version.

Cached by the files' paths, sizes and mtimes (``file_stamp``), so a trace is analysed
once however often the page is redrawn, and again only when it is re-captured or
rewritten, or (the report) when the home's CPU calibration changes
(``calibration_stamp``). The analyses themselves are the analyzers'; this module only
caches them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from stepscope.analyzers.report.trace_report import TraceReport, analyze_trace
from stepscope.analyzers.steps.timeline import TIMELINE_MAX_EVENTS, step_timeline
from stepscope.analyzers.trace.load import Trace, load_trace
from stepscope.analyzers.trace.memory import memory_curve
from stepscope.app.dashboard.data import RunData
from stepscope.store.artifacts import artifact_files
from stepscope.store.calibration import calibration_path


def trace_files(data: RunData) -> tuple[list[str], list[str]]:
    """The run's trace artifacts: (local files that exist, the ones that are gone or
    cannot be fetched, with why). An uploaded trace is read from the local cache of the
    home (downloaded on first use, store/artifacts.py); run_dir is ``<home>/runs/<id>``."""
    arts = data.artifacts
    if arts.empty:
        return [], []
    files, problems = artifact_files(
        arts[arts["kind"] == "trace"].itertuples(), Path(data.run_dir).parents[1]
    )
    present = [str(p) for p in files if p.is_file()]
    return present, [str(p) for p in files if not p.is_file()] + problems


def file_stamp(paths: list[str]) -> tuple[tuple[str, int, int], ...]:
    """Cache key of trace files: a re-captured or rewritten file is analysed again."""
    out = []
    for p in paths:
        st_ = Path(p).stat()
        out.append((p, st_.st_size, st_.st_mtime_ns))
    return tuple(out)


def calibration_stamp(home: str | None) -> int | None:
    """Cache key of the home's CPU calibration (its mtime): a new ``stepscope calibrate``
    gives a CPU trace its roofs and MFU on the next redraw. None: no calibration."""
    if home is None:
        return None
    try:
        return calibration_path(home).stat().st_mtime_ns
    except OSError:
        return None


@st.cache_data(max_entries=16, show_spinner="Analysing the trace…")
def trace_report(
    stamp: tuple[tuple[str, int, int], ...],
    home: str | None = None,
    calibration: int | None = None,
) -> TraceReport:
    """analyze_trace of the files in ``stamp``, a CPU trace read against ``home``'s
    calibration; ``calibration`` (``calibration_stamp(home)``) is only the cache key.
    Raises TraceError."""
    return analyze_trace([p for p, _, _ in stamp], calibration_home=home)


@st.cache_resource(max_entries=2, show_spinner="Loading the trace…")
def _loaded_trace(stamp: tuple[tuple[str, int, int], ...]) -> Trace:
    """The loaded trace, shared and never modified: the timeline and memory curve read it."""
    return load_trace([p for p, _, _ in stamp])


@st.cache_data(max_entries=16, show_spinner=False)
def trace_steps(stamp: tuple[tuple[str, int, int], ...]) -> pd.DataFrame:
    """ProfilerStep ranges (rank, step, start, end in ns) of the trace."""
    return _loaded_trace(stamp).steps.copy()


@st.cache_data(max_entries=16, show_spinner=False)
def trace_memory_curve(stamp: tuple[tuple[str, int, int], ...]) -> pd.DataFrame:
    return memory_curve(_loaded_trace(stamp))


@st.cache_data(max_entries=32, show_spinner="Building the timeline…")
def trace_step_timeline(
    stamp: tuple[tuple[str, int, int], ...],
    rank: int,
    step: int,
    max_events: int = TIMELINE_MAX_EVENTS,
) -> pd.DataFrame:
    return step_timeline(_loaded_trace(stamp), rank, step, max_events)
