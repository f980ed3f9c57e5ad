"""Every trace analysis over one rank's trace file: the work one worker does.

A rank's file is parsed and analysed where it is read (a local process, a Ray task next
to the object store), and only what the merge needs comes back: per-step and per-rank
tables, per-name sums (kernels, operators, syncs), the counted operators with their
time, never the events. A 50 MB trace comes back as a few hundred kB, so a job of many
ranks costs the caller their results, not their traces (``merge.merge_parts``).

Each analysis runs in its own section: one that fails on an odd trace costs that
section (a warning names it), never the whole report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from stepscope.analyzers.hardware.device_peaks import DevicePeak, device_properties
from stepscope.analyzers.hardware.flops import operator_flops
from stepscope.analyzers.hardware.gpu_metrics import gpu_metrics
from stepscope.analyzers.hardware.op_time import TimedOps, timed_ops
from stepscope.analyzers.hardware.roofline import choose_peak
from stepscope.analyzers.steps.phases import step_phases
from stepscope.analyzers.trace.breakdown import adjusted_steps, step_breakdown
from stepscope.analyzers.trace.communication import communication_parts
from stepscope.analyzers.trace.hta_rules import hta_device_events
from stepscope.analyzers.trace.idle_time import idle_time_breakdown
from stepscope.analyzers.trace.kernels import class_summary, device_work, top_kernels, top_ops
from stepscope.analyzers.trace.load import Trace, load_trace
from stepscope.analyzers.trace.memory import memory_summary
from stepscope.analyzers.trace.syncs import host_device_syncs
from stepscope.analyzers.trace.temporal import temporal_breakdown

#: Every name, not a top N: the merge sums names over ranks before it cuts the tables.
ALL_NAMES = 1_000_000_000


@dataclass
class RankPart:
    """What one rank's analyses found, in the shapes the merge combines (times in ns)."""

    rank: int
    path: str
    claimed_rank: bool  # the rank came from the file's distributedInfo (else its position)
    meta: dict[str, Any]
    has_device: bool
    counts: dict[str, int]  # events, device_events, memory_events, first_ts, last_end
    host_steps: int  # ProfilerStep# annotations with a number (the breakdown keeps fewer)
    steps: pd.DataFrame  # adjusted steps: the breakdown's and the roofline's windows
    per_step: pd.DataFrame
    kernels: pd.DataFrame  # top_kernels over every name
    kernel_classes: pd.DataFrame
    gpu: pd.DataFrame | None
    phases: pd.DataFrame | None
    ops: pd.DataFrame | None  # top_ops over every name
    syncs: pd.DataFrame | None
    idle_time: pd.DataFrame | None
    temporal: pd.DataFrame | None
    communication: dict[str, Any] | None  # communication_parts
    memory: dict[str, Any] | None
    timed_ops: TimedOps | None  # counted operators with their time (the roofline's input)
    peak: tuple[DevicePeak | None, str] | None  # the device's peak; None: a CPU-only rank
    has_device_properties: bool = False
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _section(name: str, fn: Callable[[], Any], warnings: list[str], timings: dict) -> Any:
    t0 = time.perf_counter()
    try:
        return fn()
    except Exception as exc:  # one analysis must not take the whole report down
        warnings.append(f"{name}: analysis failed ({type(exc).__name__}: {exc})")
        return None
    finally:
        timings[name] = time.perf_counter() - t0


def _as_rank(trace: Trace, rank: int) -> Trace:
    """The trace of one file, numbered as the rank it is in a job of several files."""
    (old,) = trace.ranks
    if old != rank:
        for frame in (trace.events, trace.memory, trace.steps):
            frame["rank"] = frame["rank"].dtype.type(rank)
        trace.meta = {rank: trace.meta[old]}
        trace.ranks = [rank]
    return trace


def _claimed(trace: Trace) -> bool:
    dist = next(iter(trace.meta.values())).get("distributedInfo") or {}
    return isinstance(dist.get("rank"), int)


def analyze_rank(
    source: str, position: int = 0, several: bool = False, by_position: bool = False
) -> RankPart:
    """Load one rank's file and run every analysis over it.

    ``position``: the file's place in the job's sorted list, its rank when the file names
    none (or when ``by_position``: files that claim the same rank); ``several``: the file
    is one of several ranks (memory devices are then labelled with their rank).
    """
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    trace = load_trace([Path(source) if "://" not in source else source])
    claimed = _claimed(trace)
    if by_position or not claimed:
        trace = _as_rank(trace, position)
    timings["load"] = time.perf_counter() - t0
    warnings = list(trace.warnings)
    rank = trace.ranks[0]

    t0 = time.perf_counter()
    steps = adjusted_steps(trace)
    per_step = step_breakdown(trace, steps)
    timings["breakdown"] = time.perf_counter() - t0
    gpu = _section("gpu", lambda: gpu_metrics(trace, steps), warnings, timings)
    phases = _section("phases", lambda: step_phases(trace, steps), warnings, timings)
    t0 = time.perf_counter()
    work = device_work(trace)
    kernels = top_kernels(trace, n=ALL_NAMES, work=work)
    kernel_classes = class_summary(trace, work=work)
    del work
    timings["kernels"] = time.perf_counter() - t0
    # every operator (not only the top ones): the diagnosis classifies all CPU time
    ops = _section("ops", lambda: top_ops(trace, n=ALL_NAMES), warnings, timings)
    syncs = _section("syncs", lambda: host_device_syncs(trace), warnings, timings)
    # The three HTA analyses select the same device events: build them once, in the
    # first section that needs them. If that fails, each section retries and fails
    # on its own, with its own warning, as when they were separate.
    shared: dict[str, pd.DataFrame] = {}

    def hta_dev() -> pd.DataFrame:
        if "dev" not in shared:
            shared["dev"] = hta_device_events(trace.events)
        return shared["dev"]

    idle = _section(
        "idle_time", lambda: idle_time_breakdown(trace, dev=hta_dev()), warnings, timings
    )
    temporal = _section(
        "temporal", lambda: temporal_breakdown(trace, dev=hta_dev()), warnings, timings
    )
    comm = _section(
        "communication", lambda: communication_parts(trace, dev=hta_dev()), warnings, timings
    )
    memory = _section(
        "memory", lambda: memory_summary(trace, rank_labels=several), warnings, timings
    )
    timed = _section("roofline", lambda: timed_ops(trace, operator_flops(trace)), warnings, timings)
    props = bool(device_properties(trace))
    device_side = props or trace.has_device
    ev = trace.events
    return RankPart(
        rank=rank,
        path=str(source),
        claimed_rank=claimed,
        meta=trace.meta[rank],
        has_device=trace.has_device,
        counts={
            "events": len(ev),
            "device_events": int(ev["on_device"].sum()),
            "memory_events": len(trace.memory),
            "first_ts": int(ev["ts"].min()) if len(ev) else 0,
            "last_end": int(ev["end"].max()) if len(ev) else 0,
        },
        host_steps=int((trace.steps["step"] >= 0).sum()),
        steps=steps,
        per_step=per_step,
        kernels=kernels,
        kernel_classes=kernel_classes,
        gpu=gpu,
        phases=phases,
        ops=ops,
        syncs=syncs,
        idle_time=idle,
        temporal=temporal,
        communication=comm,
        memory=memory,
        timed_ops=timed,
        peak=choose_peak(trace, None) if device_side else None,
        has_device_properties=props,
        warnings=warnings,
        timings=timings,
    )
