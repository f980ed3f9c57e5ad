"""Two runs (or two sets of trace files) -> their operator, kernel and phase diff.

A run with a trace is diffed operator by operator and kernel by kernel (the trace's
profiled steps), and by the trace's step-time categories; every run also by its step
timer's phases (data wait, forward, backward, optimizer step, other), which cover every
timed step, not only the profiled ones. A run without a trace falls back to the phases
alone, and says so. Runs of different commands are still diffed, with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.report.call_shapes import split_changed
from stepscope.analyzers.report.op_diff import COLUMNS, diff_calls, phase_calls
from stepscope.analyzers.steps.step_stats import timed_steps
from stepscope.analyzers.trace.breakdown import CATEGORIES, adjusted_steps, step_breakdown
from stepscope.analyzers.trace.load import Trace, TraceError, load_trace
from stepscope.analyzers.trace.op_steps import op_calls, step_windows
from stepscope.store.artifacts import ArtifactError, kind_files


@dataclass
class RunDiff:
    """B against A: ``ops`` (operators and kernels), ``categories`` (the trace's
    breakdown and the step timer's phases), both ``op_diff.COLUMNS``; why either is thin."""

    a: str  # what A is: "run 12", or its files
    b: str
    ops: pd.DataFrame
    categories: pd.DataFrame
    step_ns_a: float  # A's mean step: the scale of the changes
    step_ns_b: float
    warnings: list[str] = field(default_factory=list)
    # each side's operator and kernel calls (``op_steps.op_calls`` with their ``args``,
    # named as in ``ops``) and how many steps they are over, for what needs single calls
    # (``optim_runner/check/added_work.py``); not in the JSON
    calls_a: pd.DataFrame | None = None
    calls_b: pd.DataFrame | None = None
    windows_a: int = 0
    windows_b: int = 0
    timed_step_ns_a: float = float("nan")  # A's mean step by the step timer (no profiler)

    def to_json(self) -> dict[str, Any]:
        def records(df: pd.DataFrame) -> list[dict[str, Any]]:
            clean = df.astype(object).where(df.notna(), None)
            return clean.to_dict(orient="records")

        return {
            "a": self.a,
            "b": self.b,
            "step_ns_a": self.step_ns_a,
            "step_ns_b": self.step_ns_b,
            "ops": records(self.ops),
            "categories": records(self.categories),
            "warnings": list(self.warnings),
        }


@dataclass
class _Side:
    label: str
    trace: Trace | None
    steps: pd.DataFrame | None  # the step timer's steps (runs only)
    command: str | None = None


def _trace_calls(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, float]:
    """Calls, windows, breakdown-category 'calls' (one per step) and the mean step (ns)."""
    steps = adjusted_steps(trace)
    calls, windows = _with_signatures(op_calls(trace, steps), trace), step_windows(steps)
    per_step = step_breakdown(trace, steps)
    per_step = per_step[per_step["step"] >= 0]
    cats = [
        per_step[["rank", "step"]].assign(kind="category", name=c, time_ns=per_step[c])
        for c in CATEGORIES
        if c in per_step
    ]
    cat_calls = pd.concat(cats, ignore_index=True) if cats else calls.head(0)
    cat_calls = cat_calls[cat_calls["time_ns"] > 0]
    mean = float(per_step["duration"].mean()) if len(per_step) else 0.0
    return calls, windows, cat_calls, mean


def _with_signatures(calls: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """Calls with ``args``: the JSON bytes of their input shapes and types where the
    loader kept them (the FLOP operators), else None; one name's calls of another shape
    are other work (``call_shapes.py``)."""
    args = trace.op_args
    if args is None or args.empty:
        return calls.assign(args=None)
    by_event = pd.Series(args["args"].to_numpy(), index=args["row"].to_numpy())
    by_event = by_event[~by_event.index.duplicated()]
    found = by_event.reindex(calls["event"].to_numpy()).to_numpy()
    return calls.assign(args=np.where(calls["kind"].to_numpy() == "operator", found, None))


def _phases(steps: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame, float] | None:
    timed = timed_steps(steps) if steps is not None and len(steps) else None
    if timed is None or timed.empty:
        return None
    calls, windows = phase_calls(timed)
    return calls, windows, float(timed["step_time_s"].mean() * 1e9)


def _diff(a: _Side, b: _Side) -> RunDiff:
    warnings: list[str] = []
    if a.command and b.command and a.command != b.command:
        warnings.append(f"different commands: {a.label} ran {a.command!r}, {b.label} {b.command!r}")
    ops = categories = ca = cb = wa = wb = None
    step_a = step_b = timed_a = np.nan
    frames = []
    if a.trace is not None and b.trace is not None:
        ca, wa, cat_a, step_a = _trace_calls(a.trace)
        cb, wb, cat_b, step_b = _trace_calls(b.trace)
        ca, cb = split_changed(ca, len(wa), cb, len(wb))
        ops = diff_calls(ca, wa, cb, wb, step_a)
        frames.append(diff_calls(cat_a, wa, cat_b, wb, step_a))
    else:
        missing = [s.label for s in (a, b) if s.trace is None]
        warnings.append(
            f"no trace in {' and '.join(missing)}: no operator diff; the diff falls back to "
            "the step timer's phases"
        )
    pa, pb = _phases(a.steps), _phases(b.steps)
    if pa is not None and pb is not None:
        frames.append(diff_calls(pa[0], pa[1], pb[0], pb[1], pa[2]))
        timed_a = pa[2]
        step_a = step_a if np.isfinite(step_a) else pa[2]
        step_b = step_b if np.isfinite(step_b) else pb[2]
    elif a.steps is not None or b.steps is not None:
        warnings.append("no timed steps on one side: no phase diff")
    empty = pd.DataFrame(columns=COLUMNS)
    categories = pd.concat(frames, ignore_index=True) if frames else empty
    return RunDiff(
        a=a.label,
        b=b.label,
        ops=ops if ops is not None else categories.head(0),
        categories=categories,
        step_ns_a=float(step_a),
        step_ns_b=float(step_b),
        warnings=warnings,
        calls_a=ca,
        calls_b=cb,
        windows_a=0 if wa is None else len(wa),
        windows_b=0 if wb is None else len(wb),
        timed_step_ns_a=float(timed_a),
    )


def _run_side(store: Any, run_id: int) -> _Side:
    run = store.run(run_id)
    label = f"run {run_id}"
    trace = None
    try:  # an uploaded trace is read from the artifact cache (store/artifacts.py)
        files = kind_files(store.artifacts(run_id), store.home, "trace")
    except ArtifactError as exc:
        raise TraceError(f"{label}: {exc}") from None
    if files:
        trace = load_trace(files)
    return _Side(label, trace, store.steps(run_id), command=_command(run))


def _command(run: dict[str, Any]) -> str | None:
    cmd = run.get("command")
    if isinstance(cmd, (list, tuple)):
        return " ".join(map(str, cmd))
    return None if cmd is None else str(cmd)


def diff_runs(store: Any, run_a: int, run_b: int) -> RunDiff:
    """B against A for two runs of the store (ids)."""
    return _diff(_run_side(store, run_a), _run_side(store, run_b))


def diff_traces(
    paths_a: str | Path | Sequence[str | Path], paths_b: str | Path | Sequence[str | Path]
) -> RunDiff:
    """B against A for two sets of trace files or folders (no step timer: no phases)."""

    def side(paths: str | Path | Sequence[str | Path]) -> _Side:
        label = str(paths) if isinstance(paths, (str, Path)) else ", ".join(map(str, paths))
        return _Side(label, load_trace(paths), None)

    return _diff(side(paths_a), side(paths_b))
