"""The run's profiler traces, for the pages: analysed and loaded once per file version.

Cached by the files' paths, sizes and mtimes (``file_stamp``), so a trace is analysed
once however often the page is redrawn, and again only when it is re-captured or
rewritten, or (the report) when the home's CPU calibration changes
(``calibration_stamp``). The analyses themselves are the analyzers'; this module only
caches them.

A trace is analysed when its page is viewed only up to a size (``trace_gate``): whoever
can write a run's row names its trace, and a few hundred KB of gzip can inflate past what
the dashboard's machine holds. Its JSON is measured first (decompressed a piece at a time
and counted, never kept: ``store/bounded_read.py``); past ``DEFAULT_ASK_ABOVE_BYTES``
(``$STEPSCOPE_DASHBOARD_TRACE_BYTES``) the page asks for a click, and a file past the
loader's own cap (``$STEPSCOPE_MAX_TRACE_BYTES``) is refused in one line, with no button.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from stepscope.analyzers.report.trace_report import TraceReport, analyze_trace
from stepscope.analyzers.steps.timeline import TIMELINE_MAX_EVENTS, step_timeline
from stepscope.analyzers.trace.load import Trace, load_trace
from stepscope.analyzers.trace.memory import memory_curve
from stepscope.app.dashboard import data
from stepscope.app.dashboard.data import RunData
from stepscope.store.artifacts import artifact_files
from stepscope.store.bounded_read import ReadError, json_size, max_json_bytes, parse_size
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


#: The most JSON (all of a run's trace files together, decompressed) the dashboard
#: analyses when a page is viewed; a bigger trace waits for the "Analyse this trace"
#: click. A synthetic trace of 200 MiB of JSON took 6-9 s and 1.3 GiB to load on two
#: cores: 512 MiB is about 20 s and 3 GiB, which a page view should not start unasked.
DEFAULT_ASK_ABOVE_BYTES = 512 << 20
ASK_ABOVE_ENV = "STEPSCOPE_DASHBOARD_TRACE_BYTES"


@dataclass(frozen=True)
class TraceGate:
    """What the page may do with a run's trace before anyone clicks."""

    json_bytes: int  # the JSON of its files together (counted up to the refusal)
    ask_above: int  # the size past which it waits for a click
    refused: str | None = None  # one line: a file past the loader's cap, or unreadable

    @property
    def ask(self) -> bool:
        return self.refused is None and self.json_bytes > self.ask_above


def ask_above_bytes() -> int:
    """``$STEPSCOPE_DASHBOARD_TRACE_BYTES``, else ``DEFAULT_ASK_ABOVE_BYTES``."""
    text = os.environ.get(ASK_ABOVE_ENV, "").strip()
    return parse_size(text, ASK_ABOVE_ENV) if text else DEFAULT_ASK_ABOVE_BYTES


@st.cache_data(max_entries=64, show_spinner="Measuring the trace…")
def trace_gate(stamp: tuple[tuple[str, int, int], ...]) -> TraceGate:
    """The files' JSON measured without keeping it (``bounded_read.json_size``, per file
    against the loader's cap), once per file version."""
    total = 0
    try:
        ask_above = ask_above_bytes()
        cap = max_json_bytes()
        for path, _, _ in stamp:
            total += json_size(path, cap)
    except ReadError as exc:
        return TraceGate(total, 0, str(exc))
    return TraceGate(total, ask_above)


def click_key(stamp: tuple[tuple[str, int, int], ...]) -> str:
    """The session's key for "Analyse this trace" clicked on these files."""
    return "analyse_trace_" + hashlib.sha1(repr(stamp).encode()).hexdigest()[:16]


def held_back(home: str, run_id: int) -> bool:
    """Whether the run's trace may not be analysed now: past the dashboard's size and
    not clicked in this session, or refused. A page that diagnoses the run then leaves
    the trace out (the Optimize page; the Run page asks itself, with the button)."""
    d = data.run_data(home, run_id, data.run_marker(data.run_header(home, run_id)))
    paths, _ = trace_files(d)
    if not paths:
        return False
    stamp = file_stamp(paths)
    gate = trace_gate(stamp)
    return gate.refused is not None or (gate.ask and not st.session_state.get(click_key(stamp)))


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
