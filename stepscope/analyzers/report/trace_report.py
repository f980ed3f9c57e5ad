"""One call from trace files to every trace analysis: ``analyze_trace(paths)``, and its report.

The CLI and the dashboard both show this report, so it is computed in one place, and
``to_json`` is the stable, documented shape that scripts (and ``stepscope analyze
--json``) rely on. An analysis that fails on an odd trace costs its own section (with
a warning naming it), never the whole report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.hardware.roofline import Roofline
from stepscope.analyzers.report.merge import merge_parts
from stepscope.analyzers.report.ranks import Progress, map_ranks
from stepscope.analyzers.trace.load import trace_files


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


def analyze_trace(
    paths: str | Path | Sequence[str | Path],
    calibration_home: str | Path | None = None,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
) -> TraceReport:
    """Load the trace(s) and run every analysis. Raises TraceError for unreadable input.

    Each file (one per rank) is analysed on its own, side by side (``report.ranks``:
    ``workers`` local processes, by default one per core and at most one per file, none
    for a job of a few MB; 1: this process; ``ray_address``: a Ray cluster's tasks
    instead), and the ranks' parts are merged (``report.merge``). ``calibration_home``: the stepscope home whose
    ``stepscope calibrate`` results give a CPU-only trace its roofs (None: no CPU roofs;
    a GPU trace uses the peak table). ``progress(done, total)``: after each rank.
    """
    t0 = time.perf_counter()
    files = trace_files(paths)
    parts, warnings = map_ranks([str(f) for f in files], workers, ray_address, progress)
    ranks_s = time.perf_counter() - t0
    fields = merge_parts(parts, calibration_home, warnings)
    fields["timings"]["ranks_wall"] = ranks_s
    fields["timings"]["merge"] = time.perf_counter() - t0 - ranks_s
    return TraceReport(**fields)


__all__ = ["TraceReport", "analyze_trace"]
