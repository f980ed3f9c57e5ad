"""Ranks' results into one report: tables side by side, sums over names, the cross-rank
figures (communication skew, stragglers, the job's roofline) over all of them.

One rank's part is the report as it is (``merge_parts`` of one part changes nothing);
several are what analysing their traces together gives, except that rows that tie in a
sorted table are in name order (one table sorts them in the order it met them): per-(rank, step) and per-rank tables are concatenated in rank
order, per-name tables are summed by name (means and shares from the sums), and the
communication summary and the roofline run their cross-rank part over every rank's.
A section that failed on any rank is missing from the merged report, as it would be
had all ranks been analysed in one table (each failure is a warning).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from stepscope.analyzers.hardware.op_time import merge_timed
from stepscope.analyzers.hardware.roofline import Roofline, cpu_peak, job_dtype, roofline_of
from stepscope.analyzers.report.rank_analysis import RankPart
from stepscope.analyzers.steps.phases import phase_shares
from stepscope.analyzers.trace.breakdown import average_breakdown, breakdown_shares
from stepscope.analyzers.trace.communication import combine_communication
from stepscope.store.calibration import cached_calibration

TOP_KERNELS = 50


def _concat(frames: Sequence[pd.DataFrame | None]) -> pd.DataFrame | None:
    """Concatenated in rank order; None when any rank's section failed."""
    if any(f is None for f in frames):
        return None
    if len(frames) == 1:
        return frames[0]
    kept = [f for f in frames if len(f)] or list(frames[:1])
    return pd.concat(kept, ignore_index=True)


def _kernels(parts: Sequence[RankPart]) -> pd.DataFrame:
    """Top kernels by total time over all ranks; share of all ranks' device work."""
    if len(parts) == 1:
        return parts[0].kernels.head(TOP_KERNELS).reset_index(drop=True)
    cols = list(parts[0].kernels.columns)
    frames = [p.kernels for p in parts if len(p.kernels)]
    if not frames:
        return parts[0].kernels.head(0)
    both = pd.concat(frames, ignore_index=True)
    g = both.groupby("name", sort=False)
    out = g.agg(count=("count", "sum"), total_ns=("total_ns", "sum"), max_ns=("max_ns", "max"))
    out["class"] = g["class"].first()
    out["mean_ns"] = out["total_ns"] / out["count"]
    out["share"] = out["total_ns"] / max(int(out["total_ns"].sum()), 1)
    out = out.reset_index().sort_values(["total_ns", "name"], ascending=[False, True])
    out = out.head(TOP_KERNELS).reset_index(drop=True)
    return out[cols]


def _kernel_classes(parts: Sequence[RankPart]) -> pd.DataFrame:
    if len(parts) == 1:
        return parts[0].kernel_classes
    both = pd.concat([p.kernel_classes for p in parts], ignore_index=True)
    out = both.groupby("class", sort=False, observed=False)[["count", "total_ns"]].sum()
    out["share"] = out["total_ns"] / max(int(out["total_ns"].sum()), 1)
    return out.reset_index()


def _denominator(ops: pd.DataFrame) -> int:
    """All operators' self time of one rank, as its shares were taken of (unnamed ones too)."""
    shared = ops[ops["share"] > 0]
    if len(shared):
        return round(float(shared["self_ns"].iloc[0]) / float(shared["share"].iloc[0]))
    return max(int(ops["self_ns"].sum()), 1)


def _summed(
    frames: list[pd.DataFrame | None], keys: list[str], sums: list[str]
) -> tuple[pd.DataFrame | None, bool]:
    """Per-name tables of several ranks summed by ``keys`` (True: a sum was made); one
    rank's table, an empty one, or None when any rank's section failed, as they are."""
    if any(f is None for f in frames):
        return None, False
    kept = [f for f in frames if len(f)]
    if len(frames) == 1 or not kept:
        return frames[0], False
    both = pd.concat(kept, ignore_index=True)
    return both.groupby(keys, sort=False)[sums].sum().reset_index(), True


def _ops(parts: Sequence[RankPart]) -> pd.DataFrame | None:
    frames = [p.ops for p in parts]
    out, summed = _summed(frames, ["name"], ["count", "self_ns", "total_ns"])
    if not summed:
        return out
    total = sum(_denominator(f) for f in frames if len(f))
    out["mean_self_ns"] = out["self_ns"] / out["count"]
    out["share"] = out["self_ns"] / max(total, 1)
    out = out.sort_values(["self_ns", "name"], ascending=[False, True], ignore_index=True)
    return out[list(frames[0].columns)]


def _syncs(parts: Sequence[RankPart]) -> pd.DataFrame | None:
    frames = [p.syncs for p in parts]
    out, summed = _summed(frames, ["call", "op"], ["count", "total_ns"])
    if not summed:
        return out
    order = ["total_ns", "call", "op"]
    out = out.sort_values(order, ascending=[False, True, True], ignore_index=True)
    return out[list(frames[0].columns)]


def _memory(parts: Sequence[RankPart]) -> dict | None:
    if any(p.memory is None for p in parts):
        return None
    merged = {k: v for p in parts for k, v in p.memory.items()}
    return {k: merged[k] for k in sorted(merged)}  # device labels in sorted order, as one table


def _roofline(
    parts: Sequence[RankPart], steps: pd.DataFrame, calibration_home: str | Path | None
) -> Roofline | None:
    """The job's roofline: every rank's timed operators against one peak (the first
    device rank's; a CPU-only job's host calibration at the job's dtype)."""
    if any(p.timed_ops is None for p in parts):
        return None
    timed = merge_timed([p.timed_ops for p in parts])
    device = [p for p in parts if p.peak is not None]
    if device:
        chosen = next((p for p in device if p.has_device_properties), device[0])
        peak, note = chosen.peak
    else:
        calibration = None
        if calibration_home is not None:
            calibration = cached_calibration(calibration_home, job_dtype(timed.ops))
        peak, note = cpu_peak(calibration)
    return roofline_of(timed, steps, peak, note)


def _summary(parts: Sequence[RankPart], per_step: pd.DataFrame) -> dict:
    counts = [p.counts for p in parts]
    events = sum(c["events"] for c in counts)
    span = 0
    if events:
        span = max(c["last_end"] for c in counts if c["events"]) - min(
            c["first_ts"] for c in counts if c["events"]
        )
    return {
        "ranks": [p.rank for p in parts],
        "events": events,
        "device_events": sum(c["device_events"] for c in counts),
        "memory_events": sum(c["memory_events"] for c in counts),
        "has_device": any(p.has_device for p in parts),
        "steps": len(per_step),
        "step_numbers": per_step["step"].tolist(),
        "mean_step_ns": float(per_step["duration"].mean()) if len(per_step) else 0.0,
        "trace_span_ns": int(span),
        "device_properties": [
            {k: v for k, v in prop.items() if isinstance(v, (int, float, str))}
            for p in parts
            for prop in p.meta.get("deviceProperties") or []
            if isinstance(prop, dict)
        ],
        "devices": {
            p.rank: [
                prop.get("name")
                for prop in p.meta.get("deviceProperties") or []
                if isinstance(prop, dict)
            ]
            for p in parts
        },
    }


def _warnings(parts: Sequence[RankPart], per_step: pd.DataFrame, extra: list[str]) -> list[str]:
    found = [*extra, *(w for p in parts for w in p.warnings)]
    if len(per_step) < sum(p.host_steps for p in parts):
        found.append(
            "breakdown: trailing step(s) dropped: they launched < 80 % of the device work "
            "of the step before (the profiler stopped before their kernels ran), as tb-profiler does"
        )
    return list(dict.fromkeys(found))  # once each, in order: ranks often fail alike


def merge_parts(
    parts: Sequence[RankPart],
    calibration_home: str | Path | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    """The fields of one ``TraceReport`` from the ranks' parts (any order)."""
    parts = sorted(parts, key=lambda p: p.rank)
    timings: dict[str, float] = {}
    for p in parts:
        for k, v in p.timings.items():
            timings[k] = timings.get(k, 0.0) + v
    per_step = _concat([p.per_step for p in parts])
    steps = _concat([p.steps for p in parts])
    phases = _concat([p.phases for p in parts])
    comm = None
    if all(p.communication is not None for p in parts):
        comm = combine_communication([p.communication for p in parts])
    gpu = _concat([p.gpu for p in parts])
    ops = _ops(parts)
    return dict(
        paths=[p.path for p in parts],
        summary=_summary(parts, per_step),
        per_step=per_step,
        breakdown_avg=average_breakdown(per_step),
        breakdown=breakdown_shares(per_step),
        gpu=gpu if gpu is not None else pd.DataFrame(),
        kernels_top=_kernels(parts),
        kernel_classes=_kernel_classes(parts),
        ops_top=ops if ops is not None else pd.DataFrame(),
        idle_time=_concat([p.idle_time for p in parts]),
        syncs=_syncs(parts),
        temporal=_concat([p.temporal for p in parts]),
        communication=comm,
        memory=_memory(parts),
        warnings=_warnings(parts, per_step, warnings or []),
        timings=timings,
        phases=phases,
        phase_shares=phase_shares(phases) if phases is not None and len(phases) else {},
        roofline=_roofline(parts, steps, calibration_home),
    )
