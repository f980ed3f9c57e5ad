"""Where the device's time went, per rank: idle, compute, non-compute (HTA's temporal breakdown).

HTA 0.5.0 (``BreakdownAnalysis.get_temporal_breakdown``) measures from the start of
the first device event to the end of the last one (``kernel_time``); ``idle`` is
the part of it with no event running on any stream; ``compute`` is the union of
computation kernels; ``non_compute`` is the rest: time covered only by
communication (NCCL/RCCL), memory (memcpy/memset) or other kernels. Counting unions,
overlapping kernels on several streams are counted once, so the three add up to the
span. Event selection and kernel classes follow :mod:`stepscope.analyzers.trace.hta_rules`.

HTA fails on a rank without device events. Here such a rank (a CPU-only run) gets the
same three numbers from its CPU operators and annotations instead (``basis ==
"cpu"``): the span is the first to the last of them, compute is the union of
operators that are not collectives, non-compute the time covered by collectives
(``gloo:all_reduce`` ...) alone, so a CPU-only job still gets an answer with the same
meaning.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.trace import intervals
from stepscope.analyzers.trace.breakdown import cat_mask, name_mask
from stepscope.analyzers.trace.hta_rules import COMPUTATION, hta_device_events, kernel_types

__all__ = ["cpu_comm_mask", "temporal_breakdown"]

_COLUMNS = [
    "rank",
    "basis",
    "idle_ns",
    "compute_ns",
    "non_compute_ns",
    "span_ns",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
]

#: host-side collectives: record_function names of c10d backends (``gloo:all_reduce``)
#: and the c10d operators themselves
_CPU_COMM = r"^(?:gloo|nccl|rccl|ucc|mpi|xccl):|^c10d::"


def cpu_comm_mask(events: pd.DataFrame) -> np.ndarray:
    """Host events that are collectives: what communication looks like without a device."""
    host = cat_mask(events, ("cpu_op", "user_annotation"))
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = names.cat.categories.astype(str)
        hit = np.asarray(cats.str.contains(_CPU_COMM, regex=True), dtype=bool)
        codes = names.cat.codes.to_numpy()
        return host & (codes >= 0) & hit[np.maximum(codes, 0)]
    return host & names.astype(str).str.contains(_CPU_COMM, regex=True).to_numpy()


def _split(starts, ends, compute_mask) -> tuple[int, int, int, int]:
    """(idle, compute, non_compute, span) of one rank's busy intervals."""
    busy_s, busy_e = intervals.merge(starts, ends)
    span = int(busy_e[-1] - busy_s[0])
    busy = int((busy_e - busy_s).sum())
    compute = intervals.total(starts[compute_mask], ends[compute_mask])
    idle = span - busy
    return idle, compute, span - compute - idle, span


def temporal_breakdown(
    trace, hta_rounding: bool = True, dev: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per rank: idle / compute / non-compute ns and percent of the device span.

    ``hta_rounding`` (default, for parity) rounds device times to whole microseconds
    as HTA does; False keeps exact nanoseconds (see :mod:`.hta_rules`). ``dev`` is
    ``hta_device_events(trace.events, hta_rounding)`` when the caller already has it.
    """
    dev = hta_device_events(trace.events, hta_rounding) if dev is None else dev
    ktype = kernel_types(dev["name"]) if not dev.empty else np.empty(0, np.int8)
    rows = []
    dev_rank = dev["rank"].to_numpy()
    events = trace.events
    ev_rank = events["rank"].to_numpy()
    host_masks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    for rank in trace.ranks:
        sel = dev_rank == rank
        if sel.any():
            s = dev["ts"].to_numpy()[sel]
            e = dev["end"].to_numpy()[sel]
            parts = _split(s, e, ktype[sel] == COMPUTATION)
            basis = "device"
        else:
            if host_masks is None:  # once for all CPU-only ranks, from category codes
                host_masks = (
                    cat_mask(events, ("cpu_op", "user_annotation")),
                    cpu_comm_mask(events),
                    # ProfilerStep annotations cover the whole step: they are not work
                    name_mask(events["name"], lambda n: n.startswith("ProfilerStep")),
                )
            host_op, host_comm, is_step = host_masks
            ops = (ev_rank == rank) & host_op
            if not ops.any():
                continue
            comm = host_comm[ops]
            s = events["ts"].to_numpy()[ops]
            e = events["end"].to_numpy()[ops]
            not_step = ~is_step[ops]
            s, e, comm = s[not_step], e[not_step], comm[not_step]
            if s.size == 0:
                continue
            parts = _split(s, e, ~comm)
            basis = "cpu"
        rows.append((int(rank), basis, *parts))

    out = pd.DataFrame(rows, columns=_COLUMNS[:6])
    for part in ("idle", "compute", "non_compute"):
        span = out["span_ns"].where(out["span_ns"] > 0)
        out[f"{part}_pct"] = (100.0 * out[f"{part}_ns"] / span).fillna(0.0)
    return out[_COLUMNS]
