"""What the dashboard pages read from the store: runs, findings, experiments, cached.

Streamlit reruns a page on every click, and a running job's page every few seconds,
so everything costly is cached with ``st.cache_data`` under a key that changes exactly
when the data can have changed: the run id plus a *marker* (its status and end time,
and for a running job a coarse clock, since its steps grow). A finished run is
therefore read once, however often the page is redrawn. Traces are read through
``trace_data``, attached runs' stack samples through ``stack_data``.

Each call opens the store and closes it again: Streamlit runs sessions in threads and
a RunStore connection belongs to one thread.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.analyzers.rules.diagnosis import Diagnosis, saved_diagnosis
from stepscope.analyzers.steps.run_figures import (
    RunState,
    compute_figures,
    kept_figures,
    run_states,
)
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.analyzers.trace.load import TraceError
from stepscope.store import (
    ExperimentNotFound,
    RunNotFound,
    RunStore,
    StoreError,
    resolve_store_url,
)
from stepscope.store.store import default_home
from stepscope.types import Finding

if TYPE_CHECKING:
    from stepscope.analyzers.report.run_diff_ops import RunDiff

#: seconds a running job's data is reused before the store is read again
LIVE_REFRESH_S = 2.0


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are about the user's data (locked/corrupt store, missing run, bad
    trace file), shown as one line; anything else is a bug and is logged."""
    return (
        StoreError,
        RunNotFound,
        TraceError,
        sqlite3.Error,
        SQLAlchemyError,  # the store's database on either backend (a server gone away)
        pd.errors.DatabaseError,
        OSError,
        MemoryError,
    )


def one_line(exc: BaseException) -> str:
    """The first line of an error, prefixed where the bare message would not say what broke."""
    if isinstance(exc, SQLAlchemyError):  # its own text carries the SQL: the driver's only
        exc = getattr(exc, "orig", None) or exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, (sqlite3.Error, SQLAlchemyError, pd.errors.DatabaseError)):
        return f"run store {store_location()}: {text}"
    if isinstance(exc, MemoryError):
        return "out of memory while loading the trace"
    if isinstance(exc, RunNotFound) and text.startswith("no run with id "):
        return f"{text} in {store_home()}"
    return text


def store_home() -> str:
    """The store the dashboard shows: $STEPSCOPE_HOME (set by `stepscope --home`)."""
    return str(default_home())


def store_location() -> str:
    """Where the store's database is, password hidden: $STEPSCOPE_STORE (`stepscope
    --store`), else the home's stepscope.db."""
    try:
        return resolve_store_url(default_home()).display
    except StoreError:
        return store_home()


@contextmanager
def open_store(home: str) -> Iterator[RunStore]:
    store = RunStore(home)
    try:
        yield store
    finally:
        store.close()


def plain(value: Any) -> Any:
    """pandas hands back NaN for SQL NULL in numeric columns; the pages want None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


# -- the runs table ------------------------------------------------------------------
#: ended runs whose figures the table computes (the first table after an upgrade, a
#: store that many runs ended in since) from which a spinner says so
SAY_COMPUTING_FROM = 100


@st.cache_data(max_entries=256, show_spinner=False)
def _running_figures(
    home: str, run_id: int, n_steps: int, status: str, _store: RunStore
) -> dict[str, Any]:
    """A running run's figures (never kept: they change); the key changes when a step is
    added or the run ends. ``_store``: the table's open store (not part of the key)."""
    return compute_figures(_store, [RunState(run_id, n_steps, status, None)])[run_id]


def _table_figures(home: str, store: RunStore, runs: pd.DataFrame) -> dict[int, dict[str, Any]]:
    """Each run's figures: an ended run's as kept in the store (one query for all), or
    computed and kept (``run_figures``); a running run's cached per step count."""
    figures, todo = kept_figures(store, run_states(runs))
    ended = [s for s in todo if s.ended]
    if len(ended) >= SAY_COMPUTING_FROM:
        with st.spinner(f"Computing the figures of {len(ended)} runs once (kept for later)…"):
            figures.update(compute_figures(store, ended))
    else:
        figures.update(compute_figures(store, ended))
    for s in todo:
        if not s.ended:
            figures[s.run_id] = _running_figures(home, s.run_id, s.step_count, s.status, store)
    return figures


def runs_table(home: str) -> pd.DataFrame:
    """One row per run with its headline figures and top finding, newest first.

    Not cached itself: it is what shows a job going from running to finished.
    """
    with open_store(home) as store:
        runs = store.run_list()
        top = store.top_findings()
        figures_of = _table_figures(home, store, runs)
    rows = []
    for rec in runs.to_dict("records"):
        rec = {k: plain(v) for k, v in rec.items()}
        run_id = int(rec["id"])
        figures = figures_of[run_id]
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
                "stop_reason": rec.get("stop_reason"),
                "user": rec.get("user"),  # None: a run recorded before schema 5
                "host": rec["host"],
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
            "stop_reason",
            "user",
            "host",
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


def diagnosis(
    home: str, run_id: int, report: TraceReport | None = None, read_trace: bool = True
) -> Diagnosis | None:
    """Uncached: the run's saved diagnosis, made now for a run that ended since
    (``saved_diagnosis``); a Diagnose click shows its result on the very next rerun.
    ``read_trace``: False where the page holds the trace back (``trace_data.trace_gate``)."""
    with open_store(home) as store:
        return saved_diagnosis(store, run_id, report, read_trace=read_trace)


def findings(home: str, run_id: int) -> list[Finding]:
    """Uncached: a Diagnose click must show its result on the very next rerun."""
    with open_store(home) as store:
        return store.findings(run_id)


def run_choices(home: str) -> pd.DataFrame:
    """id, name, status, parent run of every run (newest first): the pickers' options."""
    cols = ["id", "name", "status", "parent_run_id"]
    with open_store(home) as store:
        runs = store.run_list()
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


@st.cache_data(max_entries=16, show_spinner="Diffing the runs operator by operator…")
def ops_diff(
    home: str, run_a: int, run_b: int, marker_a: tuple[Any, ...], marker_b: tuple[Any, ...]
) -> RunDiff:
    """B against A, operator by operator and phase by phase (``diff_runs``): both traces
    are loaded and resampled, so a pair is diffed once until either run changes
    (``run_marker``). Raises the store's and the trace's errors (``user_errors``)."""
    # local: the diff imports scipy.stats (1 s), which the Runs page, the dashboard's
    # first, has no use for
    from stepscope.analyzers.report.run_diff_ops import diff_runs

    with open_store(home) as store:
        return diff_runs(store, run_a, run_b)


@st.cache_data(max_entries=32, show_spinner="Reading where each arm changed the step…")
def arm_changes(
    home: str, experiment_id: int, ended_at: float | None, _result: dict[str, Any]
) -> dict[str, str]:
    """Each arm's line of what it changed most against the baseline (``arm_changes``):
    one diff per arm, of trials that never change once the experiment has ended, so
    the experiment and its end are the key (``_result``, its stored result, is not
    hashed). An arm's own failure is its line; only a store that cannot be opened raises."""
    # local: as in ops_diff, the diffs import scipy.stats
    from stepscope.optim_runner.verdict.arm_changes import explain_result

    with open_store(home) as store:
        return explain_result(store, _result)


def run_experiments(home: str, run_id: int) -> list[dict[str, Any]]:
    """The experiments on ``run_id`` as their baseline, newest first."""
    with open_store(home) as store:
        return store.experiments(run_id)


@st.cache_data(max_entries=256, show_spinner=False)
def finished_steps(home: str, run_id: int) -> pd.DataFrame:
    """Steps of a run that has ended (a completed experiment's trial runs): read once."""
    with open_store(home) as store:
        return store.steps(run_id)


def findings_marker(found: list[Finding]) -> str:
    """What invalidates fix plans cached for a run: its findings being replaced by others."""
    return json.dumps([f.to_json() for f in found], sort_keys=True)


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


# -- how runs relate (Compare's default pair, the Optimize form's earlier evidence) -------
def run_relations(home: str) -> dict[int, dict[str, Any]]:
    """Every run by id, newest first: its name, command, working folder, parent run, experiment and arm
    (a trial's ``config``), status, start and end. What decides which run is whose
    baseline (``compare_pair``) and how long an earlier experiment's trials took
    (``optimize_estimate``); plain dicts, since a parent id in a frame turns into a float.

    Uncached: a trial recorded a second ago must count, and the read is one query.
    """
    with open_store(home) as store:
        runs = store.run_list("config", "cwd")
    return {int(rec["id"]): _relation(rec) for rec in runs.to_dict("records")}


def pair_relations(home: str, run_ids: list[int]) -> dict[int, dict[str, Any]]:
    """``run_relations`` of a few runs only (the Runs page's two to compare), each read
    on its own: the whole store's took a third of a second a rerun on 10,000 runs."""
    with open_store(home) as store:
        return {int(i): _relation(store.run(int(i))) for i in run_ids}


def _relation(rec: dict[str, Any]) -> dict[str, Any]:
    config = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    parent, experiment = plain(rec.get("parent_run_id")), config.get("experiment")
    return {
        "id": int(rec["id"]),
        "name": str(rec["name"]),
        "command": rec["command"] if isinstance(rec["command"], list) else [],
        "cwd": rec.get("cwd") if isinstance(rec.get("cwd"), str) and rec.get("cwd") else None,
        "parent_run_id": None if parent is None else int(parent),
        "experiment": None if experiment is None else int(experiment),
        "arm": config.get("arm"),
        "status": rec["status"],
        "started_at": plain(rec["started_at"]),
        "ended_at": plain(rec["ended_at"]),
    }


def all_experiments(home: str) -> list[dict[str, Any]]:
    """Every experiment in the store, newest first (uncached, as ``run_experiments``):
    a run never optimized itself can borrow the trial times of its command's experiments."""
    with open_store(home) as store:
        return store.experiments()
