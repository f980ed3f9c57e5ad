"""One call from trace files to every trace analysis: ``analyze_trace(paths)``.

The CLI and the dashboard both show this report, so it is computed in one place, and
``to_json`` is the stable, documented shape that scripts (and ``stepscope analyze
--json``) rely on. An analysis that fails on an odd trace costs its own section (with
a warning naming it), never the whole report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.hardware.flops import operator_flops
from stepscope.analyzers.hardware.gpu_metrics import gpu_metrics
from stepscope.analyzers.hardware.roofline import Roofline, job_dtype, roofline
from stepscope.analyzers.steps.phases import phase_shares, step_phases
from stepscope.analyzers.trace.breakdown import (
    CATEGORIES,
    adjusted_steps,
    average_breakdown,
    breakdown_shares,
    step_breakdown,
)
from stepscope.analyzers.trace.communication import communication_summary
from stepscope.analyzers.trace.hta_rules import hta_device_events
from stepscope.analyzers.trace.idle_time import idle_time_breakdown
from stepscope.analyzers.trace.kernels import class_summary, device_work, top_kernels, top_ops
from stepscope.analyzers.trace.load import Trace, load_trace
from stepscope.analyzers.trace.memory import memory_summary
from stepscope.analyzers.trace.syncs import host_device_syncs
from stepscope.analyzers.trace.temporal import temporal_breakdown
from stepscope.store.calibration import cached_calibration

ALL_OPS = 100_000


@dataclass
class TraceReport:
    """Everything the trace analyses found, as DataFrames/dicts (times in ns)."""

    paths: list[str]
    summary: dict[str, Any]
    per_step: pd.DataFrame  # breakdown per (rank, step), see breakdown.step_breakdown
    breakdown_avg: pd.DataFrame  # per rank and category: mean ns and percent
    breakdown: dict[str, float]  # category -> share (0..1) over all steps
    gpu: pd.DataFrame
    kernels_top: pd.DataFrame
    kernel_classes: pd.DataFrame
    ops_top: pd.DataFrame
    idle_time: pd.DataFrame | None
    syncs: pd.DataFrame | None
    temporal: pd.DataFrame | None
    communication: dict[str, Any] | None
    memory: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    # phases of each step (phases.step_phases) and their shares over all steps
    phases: pd.DataFrame | None = None
    phase_shares: dict[str, float] = field(default_factory=dict)
    roofline: Roofline | None = None  # FLOPs from shapes against the device's peak

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        """Plain JSON types only (NaN -> null), for ``--json`` and for the store."""
        k = self.kernels_top if top is None else self.kernels_top.head(top)
        o = self.ops_top if top is None else self.ops_top.head(top)
        comm = None
        if self.communication is not None:
            comm = {
                key: _plain(val)
                for key, val in self.communication.items()
                if not isinstance(val, pd.DataFrame)
            }
            per_rank = self.communication.get("per_rank")
            if isinstance(per_rank, pd.DataFrame):
                comm["per_rank"] = _records(per_rank)
            skew = self.communication.get("skew")
            if isinstance(skew, pd.DataFrame):
                comm["skew"] = _records(skew)
        return {
            "paths": self.paths,
            "summary": _plain(self.summary),
            "steps": int(self.summary["steps"]),
            "breakdown": {c: _plain(v) for c, v in self.breakdown.items()},
            "breakdown_per_rank": _records(self.breakdown_avg),
            "per_step": _records(self.per_step),
            "gpu": _records(self.gpu),
            "communication": comm,
            "memory": _plain(self.memory),
            "idle_time": None if self.idle_time is None else _records(self.idle_time),
            "temporal": None if self.temporal is None else _records(self.temporal),
            "kernel_classes": _records(self.kernel_classes),
            "kernels_top": _records(k),
            "syncs": None if self.syncs is None else _records(self.syncs),
            "ops_top": _records(o),
            "phases": {
                "shares": _plain(self.phase_shares),
                "per_step": None if self.phases is None else _records(self.phases),
            },
            "roofline": None if self.roofline is None else self.roofline.to_json(),
            "warnings": list(self.warnings),
            "timings_s": _plain(self.timings),
        }


def _plain(value: Any) -> Any:
    """numpy/pandas scalars and containers -> JSON-able Python values; NaN -> None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, pd.DataFrame):
        return _records(value)
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return None if math.isnan(f) or math.isinf(f) else f
    return value


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [_plain(r) for r in df.to_dict(orient="records")]


def _section(
    name: str, fn: Callable[[Trace], Any], trace: Trace, warnings: list[str], timings: dict
) -> Any:
    t0 = time.perf_counter()
    try:
        return fn(trace)
    except Exception as exc:  # one analysis must not take the whole report down
        warnings.append(f"{name}: analysis failed ({type(exc).__name__}: {exc})")
        return None
    finally:
        timings[name] = time.perf_counter() - t0


def _roofline(trace: Trace, steps: pd.DataFrame, calibration_home: str | Path | None) -> Roofline:
    """The roofline against the device's table row, or, for a CPU-only trace, against
    this host's calibration at the job's dtype (from ``calibration_home``)."""
    ops = operator_flops(trace)
    calibration = None
    if calibration_home is not None and not trace.has_device:
        calibration = cached_calibration(calibration_home, job_dtype(ops))
    return roofline(trace, ops, steps=steps, calibration=calibration)


def analyze_trace(
    paths: str | Path | Sequence[str | Path], calibration_home: str | Path | None = None
) -> TraceReport:
    """Load the trace(s) and run every analysis. Raises TraceError for unreadable input.

    ``calibration_home``: the stepscope home whose ``stepscope calibrate`` results give a
    CPU-only trace its roofs (None: no CPU roofs; a GPU trace uses the peak table).
    """
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    trace = load_trace(paths)
    timings["load"] = time.perf_counter() - t0
    warnings = list(trace.warnings)

    t0 = time.perf_counter()
    steps = adjusted_steps(trace)
    per_step = step_breakdown(trace, steps)
    timings["breakdown"] = time.perf_counter() - t0
    if len(per_step) < int((trace.steps["step"] >= 0).sum()):
        warnings.append(
            "breakdown: trailing step(s) dropped: they launched < 80 % of the device work "
            "of the step before (the profiler stopped before their kernels ran), as tb-profiler does"
        )

    gpu = _section("gpu", lambda t: gpu_metrics(t, steps), trace, warnings, timings)
    phases = _section("phases", lambda t: step_phases(t, steps), trace, warnings, timings)
    t0 = time.perf_counter()
    work = device_work(trace)
    kernels_top = top_kernels(trace, n=50, work=work)
    kernel_classes = class_summary(trace, work=work)
    del work
    timings["kernels"] = time.perf_counter() - t0
    # every operator (not only the top ones): the diagnosis classifies all CPU time
    ops = _section("ops", lambda t: top_ops(t, n=ALL_OPS), trace, warnings, timings)
    syncs = _section("syncs", host_device_syncs, trace, warnings, timings)
    # The three HTA analyses select the same device events: build them once, in the
    # first section that needs them. If that fails, each section retries and fails
    # on its own, with its own warning, as when they were separate.
    shared: dict[str, pd.DataFrame] = {}

    def hta_dev(t: Trace) -> pd.DataFrame:
        if "dev" not in shared:
            shared["dev"] = hta_device_events(t.events)
        return shared["dev"]

    idle = _section(
        "idle_time", lambda t: idle_time_breakdown(t, dev=hta_dev(t)), trace, warnings, timings
    )
    temporal = _section(
        "temporal", lambda t: temporal_breakdown(t, dev=hta_dev(t)), trace, warnings, timings
    )
    comm = _section(
        "communication",
        lambda t: communication_summary(t, dev=hta_dev(t)),
        trace,
        warnings,
        timings,
    )
    memory = _section("memory", memory_summary, trace, warnings, timings)
    roof = _section(
        "roofline", lambda t: _roofline(t, steps, calibration_home), trace, warnings, timings
    )

    ev = trace.events
    summary = {
        "ranks": trace.ranks,
        "events": len(ev),
        "device_events": int(ev["on_device"].sum()),
        "memory_events": len(trace.memory),
        "has_device": trace.has_device,
        "steps": len(per_step),
        "step_numbers": per_step["step"].tolist(),
        "mean_step_ns": float(per_step["duration"].mean()) if len(per_step) else 0.0,
        "trace_span_ns": int(ev["end"].max() - ev["ts"].min()) if len(ev) else 0,
        "device_properties": [
            {k: v for k, v in p.items() if isinstance(v, (int, float, str))}
            for m in trace.meta.values()
            for p in m.get("deviceProperties") or []
            if isinstance(p, dict)
        ],
        "devices": {
            int(r): [p.get("name") for p in m.get("deviceProperties") or [] if isinstance(p, dict)]
            for r, m in trace.meta.items()
        },
    }
    return TraceReport(
        paths=[m["path"] for m in trace.meta.values()],
        summary=summary,
        per_step=per_step,
        breakdown_avg=average_breakdown(per_step),
        breakdown=breakdown_shares(per_step),
        gpu=gpu if gpu is not None else pd.DataFrame(),
        kernels_top=kernels_top,
        kernel_classes=kernel_classes,
        ops_top=ops if ops is not None else pd.DataFrame(),
        idle_time=idle,
        syncs=syncs,
        temporal=temporal,
        communication=comm,
        memory=memory,
        warnings=warnings,
        timings=timings,
        phases=phases,
        phase_shares=phase_shares(phases) if phases is not None and len(phases) else {},
        roofline=roof,
    )


__all__ = ["CATEGORIES", "TraceReport", "analyze_trace"]
