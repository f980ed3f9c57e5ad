"""What the dashboard pages read: store rows and trace analyses, cached.

Streamlit reruns a page on every click, and a running job's page every few seconds,
so everything costly is cached with ``st.cache_data`` under a key that changes exactly
when the data can have changed: the run id plus a *marker* (its status and end time,
and for a running job a coarse clock, since its steps grow), or for traces the files'
paths, sizes and mtimes. A finished run is therefore read once, and a trace analysed
once, however often the page is redrawn.

Each call opens the store and closes it again: Streamlit runs sessions in threads and
a RunStore connection belongs to one thread.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from stepscope.analyzers.step_stats import summarize_steps
from stepscope.analyzers.trace_load import Trace, TraceError, load_trace
from stepscope.store import ExperimentNotFound, RunNotFound, RunStore, StoreError
from stepscope.store.store import default_home

#: seconds a running job's data is reused before the store is read again
LIVE_REFRESH_S = 2.0
#: events kept in the step timeline: the longest ones, enough to see the structure
TIMELINE_MAX_EVENTS = 2500
#: host categories shown in the step timeline (python_function ranges are the Python
#: tracer's: tens of thousands on a real job, and they hide the operators beneath)
TIMELINE_HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are about the user's data (locked/corrupt store, missing run, bad
    trace file), shown as one line; anything else is a bug and is logged."""
    return (
        StoreError,
        RunNotFound,
        TraceError,
        sqlite3.Error,
        pd.errors.DatabaseError,
        OSError,
        MemoryError,
    )


def one_line(exc: BaseException) -> str:
    """The first line of an error, prefixed where the bare message would not say what broke."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, (sqlite3.Error, pd.errors.DatabaseError)):
        return f"run store {store_home()}: {text}"
    if isinstance(exc, MemoryError):
        return "out of memory while loading the trace"
    if isinstance(exc, RunNotFound) and text.startswith("no run with id "):
        return f"{text} in {store_home()}"
    return text


def store_home() -> str:
    """The store the dashboard shows: $STEPSCOPE_HOME (set by `stepscope --home`)."""
    return str(default_home())


@contextmanager
def open_store(home: str) -> Iterator[RunStore]:
    store = RunStore(home)
    try:
        yield store
    finally:
        store.close()


def _plain(value: Any) -> Any:
    """pandas hands back NaN for SQL NULL in numeric columns; the pages want None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


# -- the runs table ------------------------------------------------------------------
@st.cache_data(max_entries=2048, show_spinner=False)
def _run_figures(home: str, run_id: int, n_steps: int, status: str) -> dict[str, Any]:
    """summarize_steps of one run; the key changes when a step is added or the run ends."""
    with open_store(home) as store:
        return summarize_steps(store.steps(run_id))


def runs_table(home: str) -> pd.DataFrame:
    """One row per run with its headline figures and top finding, newest first.

    Not cached itself: it is what shows a job going from running to finished.
    """
    with open_store(home) as store:
        runs = store.runs()
        top = store.top_findings()
    rows = []
    for rec in runs.to_dict("records"):
        rec = {k: _plain(v) for k, v in rec.items()}
        run_id = int(rec["id"])
        figures = _run_figures(home, run_id, int(rec["steps"]), str(rec["status"]))
        finding = top.get(run_id)
        rows.append(
            {
                "id": run_id,
                "name": rec["name"],
                "status": rec["status"],
                "command": rec["command"],
                "steps": int(rec["steps"]),
                "step_time_median_s": figures["step_time_median_s"],
                "samples_per_s": figures["samples_per_s"],
                "data_wait_share": figures["data_wait_share"],
                "top_finding": finding,
                "started_at": rec["started_at"],
                "ended_at": rec["ended_at"],
                "error": rec["error"],
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "id",
            "name",
            "status",
            "command",
            "steps",
            "step_time_median_s",
            "samples_per_s",
            "data_wait_share",
            "top_finding",
            "started_at",
            "ended_at",
            "error",
        ],
    )


# -- one run ---------------------------------------------------------------------------
@dataclass
class RunData:
    """Everything the run page shows that comes from the store (not from traces)."""

    run: dict[str, Any]
    run_dir: str
    steps: pd.DataFrame
    summary: dict[str, Any]
    samples: pd.DataFrame  # wide: index t (unix s), one column per scope.metric
    artifacts: pd.DataFrame
    events: pd.DataFrame


def run_marker(run: dict[str, Any]) -> tuple[Any, ...]:
    """What invalidates a run's cached data: its status and end, and for a live job the clock."""
    live = int(time.time() // LIVE_REFRESH_S) if run["status"] == "running" else None
    return (run["status"], run.get("ended_at"), live)


def run_header(home: str, run_id: int) -> dict[str, Any]:
    """The run's row (uncached: cheap, and its status is what the marker is made of)."""
    with open_store(home) as store:
        return store.run(run_id)


@st.cache_data(max_entries=64, show_spinner="Reading the run…")
def run_data(home: str, run_id: int, marker: tuple[Any, ...]) -> RunData:
    with open_store(home) as store:
        run = store.run(run_id)
        steps = store.steps(run_id)
        samples = store.samples(run_id, wide=True)
        artifacts = store.artifacts(run_id)
        events = store.events(run_id)
        run_dir = str(store.home / "runs" / str(run_id))
    return RunData(
        run=run,
        run_dir=run_dir,
        steps=steps,
        summary=summarize_steps(steps),
        samples=samples if not samples.empty else pd.DataFrame(),
        artifacts=artifacts,
        events=events,
    )


def findings(home: str, run_id: int) -> list[dict[str, Any]]:
    """Uncached: a Diagnose click must show its result on the very next rerun."""
    with open_store(home) as store:
        return store.findings(run_id)


def trace_files(data: RunData) -> tuple[list[str], list[str]]:
    """The run's trace artifacts: (paths that exist, paths that are gone)."""
    arts = data.artifacts
    if arts.empty:
        return [], []
    paths = [str(p) for p in arts.loc[arts["kind"] == "trace", "path"]]
    present = [p for p in paths if Path(p).is_file()]
    return present, [p for p in paths if p not in present]


def file_stamp(paths: list[str]) -> tuple[tuple[str, int, int], ...]:
    """Cache key of trace files: a re-captured or rewritten file is analysed again."""
    out = []
    for p in paths:
        st_ = Path(p).stat()
        out.append((p, st_.st_size, st_.st_mtime_ns))
    return tuple(out)


# -- traces ----------------------------------------------------------------------------
@st.cache_data(max_entries=16, show_spinner="Analysing the trace…")
def trace_report(stamp: tuple[tuple[str, int, int], ...]) -> Any:
    """analyze_trace of the files in ``stamp`` (a TraceReport); raises TraceError."""
    from stepscope.analyzers.trace_report import analyze_trace

    return analyze_trace([p for p, _, _ in stamp])


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
    from stepscope.analyzers.memory import memory_curve

    return memory_curve(_loaded_trace(stamp))


@st.cache_data(max_entries=32, show_spinner="Building the timeline…")
def trace_step_timeline(
    stamp: tuple[tuple[str, int, int], ...],
    rank: int,
    step: int,
    max_events: int = TIMELINE_MAX_EVENTS,
) -> pd.DataFrame:
    return step_timeline(_loaded_trace(stamp), rank, step, max_events)


def step_timeline(trace: Trace, rank: int, step: int, max_events: int) -> pd.DataFrame:
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


def run_choices(home: str) -> pd.DataFrame:
    """id, name, status, parent run of every run (newest first): the pickers' options."""
    cols = ["id", "name", "status", "parent_run_id"]
    with open_store(home) as store:
        runs = store.runs()
    if runs.empty:
        return pd.DataFrame(columns=cols)
    return runs[cols].astype({"id": int})


# -- experiments -------------------------------------------------------------------------
def experiment_row(home: str, experiment_id: int) -> dict[str, Any] | None:
    """One experiment (uncached: its progress is what a running page polls); None if absent.

    Reading it also fails an experiment whose process vanished (the store reconciles),
    so a page never waits on a dead one.
    """
    with open_store(home) as store:
        try:
            return store.experiment(experiment_id)
        except ExperimentNotFound:
            return None


def run_experiments(home: str, run_id: int) -> list[dict[str, Any]]:
    """The experiments on ``run_id`` as their baseline, newest first."""
    with open_store(home) as store:
        return store.experiments(run_id)


@st.cache_data(max_entries=256, show_spinner=False)
def finished_steps(home: str, run_id: int) -> pd.DataFrame:
    """Steps of a run that has ended (a completed experiment's trial runs): read once."""
    with open_store(home) as store:
        return store.steps(run_id)


def findings_marker(found: list[dict[str, Any]]) -> tuple[Any, ...]:
    """What invalidates fix plans cached for a run: its findings being replaced."""
    return (len(found), max((f.get("created_at") or 0 for f in found), default=0))


# -- figures derived from samples and run rows ------------------------------------------
def peak_memory(samples: pd.DataFrame) -> tuple[str, float | None]:
    """The memory figure that matters for the run: the job's GPU memory when there is a
    GPU (capacity is what runs out), else the job's resident memory."""
    if samples.empty:
        return "peak memory", None
    for suffix, label in (("job_mem_used_bytes", "peak GPU mem"),):
        cols = [c for c in samples.columns if c.startswith("gpu") and c.endswith("." + suffix)]
        if cols and samples[cols].notna().any().any():
            return label, float(samples[cols].max().max())
    if "proc.rss_bytes" in samples and samples["proc.rss_bytes"].notna().any():
        return "peak RSS", float(samples["proc.rss_bytes"].max())
    return "peak memory", None


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON -> {'a.b[0].c': leaf}: differences become single rows."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list):
        if not value and prefix:
            out[prefix] = []
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = value
    return out


def json_diff(a: dict[str, Any], b: dict[str, Any]) -> pd.DataFrame:
    """Keys whose values differ between two runs' JSON columns (key, A, B); '—' = absent."""
    fa, fb = flatten(a), flatten(b)
    rows = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, "—"), fb.get(key, "—")
        if va != vb:
            rows.append({"setting": key, "A": _show(va), "B": _show(vb)})
    return pd.DataFrame(rows, columns=["setting", "A", "B"])


def _show(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def command_diff(a: list[str], b: list[str]) -> list[str]:
    """The argv edits that turn A's command into B's, one readable line each."""
    import difflib

    lines = []
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        old, new = " ".join(a[i1:i2]), " ".join(b[j1:j2])
        if op == "insert":
            lines.append(f"added: {new}")
        elif op == "delete":
            lines.append(f"removed: {old}")
        elif op == "replace":
            lines.append(f"changed: {old} → {new}")
    return lines


# -- stack samples (attached processes) -----------------------------------------------
@dataclass
class StackView:
    """Where an attached job's main thread spent its time, as the Run page draws it."""

    samples: int  # main-thread samples classified (the shares' denominator)
    all_samples: int  # every stored sample, all threads and processes
    processes: int  # training processes (ranks) the shares average over
    windows: int  # sampling windows stored so far
    t0: float  # the run's start (unix s): the time axis's zero
    duration_s: float  # from the first window's start to the last one's end
    shares: pd.DataFrame  # stacks.phase_shares: category, label, samples, share
    sites: pd.DataFrame  # stacks.top_sites: site, category, samples, share
    over_time: pd.DataFrame  # stacks.shares_over_time plus t_end: t, t_end, category, share


@st.cache_data(max_entries=64, show_spinner="Reading the stack samples…")
def stack_view(home: str, run_id: int, marker: tuple[Any, ...]) -> StackView | None:
    """The run's stack samples, classified into step phases; None when it has none.

    Cached under the run marker like ``run_data``: a finished attach is classified once,
    a running one again every LIVE_REFRESH_S at most (a window lands every few seconds).
    """
    from stepscope.analyzers.stacks import (
        classify_samples,
        phase_shares,
        shares_over_time,
        top_sites,
    )

    with open_store(home) as store:
        raw = store.stack_samples(run_id)
        started_at = float(store.run(run_id)["started_at"])
    if raw.empty:
        return None
    classified = classify_samples(raw)
    over_time = shares_over_time(classified)
    ends = raw.groupby("t_start")["t_end"].max()
    over_time = over_time.assign(t_end=over_time["t"].map(ends).astype(float))
    return StackView(
        samples=int(classified["samples"].sum()) if not classified.empty else 0,
        all_samples=int(raw["samples"].sum()),
        processes=int(classified["pid"].nunique()) if not classified.empty else 0,
        windows=int(raw["t_start"].nunique()),
        t0=started_at,
        duration_s=float(raw["t_end"].max() - raw["t_start"].min()),
        shares=phase_shares(classified),
        sites=top_sites(classified, 10),
        over_time=over_time,
    )


def stack_sample_count(home: str, run_id: int) -> int:
    """Stack samples stored so far (uncached: the Attach page's progress polls it)."""
    with open_store(home) as store:
        raw = store.stack_samples(run_id)
    return int(raw["samples"].sum()) if not raw.empty else 0


def is_attach(run: dict[str, Any]) -> bool:
    """Whether the run was recorded by attaching to a process (no step timer, no trace)."""
    return (run.get("config") or {}).get("mode") == "attach"


def running_attaches(home: str) -> list[dict[str, Any]]:
    """Attach runs still recording, newest first (uncached: a reloaded Attach page finds
    the recordings under way here, whoever started them)."""
    with open_store(home) as store:
        runs = store.runs()
    if runs.empty:
        return []
    live = runs[runs["status"] == "running"]
    return [
        {k: _plain(v) for k, v in rec.items()} for rec in live.to_dict("records") if is_attach(rec)
    ]
