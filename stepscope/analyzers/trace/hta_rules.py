"""Holistic Trace Analysis 0.5.0's rules for which device events count, and as what.

The idle-time, temporal and overlap analyses promise agreement with HTA, so the
rules that decide their inputs live in one place and follow HTA's source
(``hta/utils/utils.py``, ``hta/common/trace.py``) rather than our own taste:

* kernel types come from the kernel's name with HTA's regular expressions
  (communication ``^nccl.*Kernel``, memory ``^Memcpy|^Memset|^dma``, computation
  everything not matching HTA's ``(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)``);
  RCCL kernels are also called ``nccl...Kernel`` so AMD traces class the same way;
* the events are the kernels, memcpys and memsets (HTA's events with a stream);
* HTA rounds fractional-microsecond timestamps (ns-resolution traces) inwards to whole
  microseconds, start up and end down (``round_down_time_stamps``). That widens every
  gap by up to 2 us, which on a trace of thousands of short kernels moves the idle
  split by several points; ``hta_rounding=True`` reproduces it, ``False`` keeps the
  exact nanoseconds;
* with more than one ``ProfilerStep`` in the job, HTA drops the last profiled step:
  only device events launched (same correlation id) by a host event that starts
  before the last step's start are kept. Its reason: the last step is usually cut
  short by the profiler stopping.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.breakdown import cat_mask, name_mask

__all__ = [
    "COMMUNICATION",
    "COMPUTATION",
    "DEVICE_CATS",
    "MEMORY",
    "OTHER",
    "hta_device_events",
    "kernel_types",
]

COMMUNICATION, MEMORY, COMPUTATION, OTHER = 0, 1, 2, 3
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

_COMM_RE = re.compile(r"^(nccl|rccl).*Kernel")
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^(nccl|rccl).*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def _type_of(name: str) -> int:
    if _COMM_RE.match(name):
        return COMMUNICATION
    if _MEMORY_RE.match(name):
        return MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


@functools.lru_cache(maxsize=2)
def _types_of(categories: tuple) -> np.ndarray:
    """Types of a trace's distinct names, kept: the temporal, overlap and communication
    analyses each type the same categories (all of the trace's names, host ones too)."""
    out = np.fromiter((_type_of(str(c)) for c in categories), dtype=np.int8, count=-1)
    out.flags.writeable = False  # shared between callers
    return out


def kernel_types(names: pd.Series) -> np.ndarray:
    """HTA kernel type per event, as int8 codes (see the module constants).

    The regexes run once per distinct name (the categories), not per event.
    """
    if isinstance(names.dtype, pd.CategoricalDtype):
        per_cat = _types_of(tuple(names.cat.categories.tolist()))
        codes = names.cat.codes.to_numpy()
        out = np.full(codes.size, OTHER, dtype=np.int8)
        valid = codes >= 0
        out[valid] = per_cat[codes[valid]]
        return out
    uniques, inverse = np.unique(names.astype(str).to_numpy(), return_inverse=True)
    per_name = np.fromiter((_type_of(n) for n in uniques), dtype=np.int8, count=-1)
    return per_name[inverse]


def _is_device(events: pd.DataFrame) -> np.ndarray:
    # from the category codes: comparing the column itself builds a string per row
    return cat_mask(events, DEVICE_CATS)


def _profiler_step_mask(events: pd.DataFrame) -> np.ndarray:
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        return name_mask(names, lambda n: "ProfilerStep" in n)
    return names.astype(str).str.contains("ProfilerStep", regex=False).to_numpy()


def _us_float(ns: np.ndarray) -> np.ndarray:
    """ns -> the float64 microseconds a JSON parser reads for the same decimal value."""
    return (ns // 1000).astype(np.float64) + (ns % 1000) / 1000.0


def _hta_round(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA's ``round_down_time_stamps``, float arithmetic included.

    HTA computes ``end = ts + dur`` in float64 microseconds, where epoch timestamps
    (~1.7e15 us) keep only quarter-microsecond precision, then floors it; the float
    sum sometimes rounds up across a whole microsecond. Doing the same sum here is
    what makes the idle totals match HTA's, not just its shares.
    """
    ts_f = _us_float(ts)
    end_f = ts_f + (end - ts) / 1000.0
    return np.ceil(ts_f).astype(np.int64) * 1000, np.floor(end_f).astype(np.int64) * 1000


def hta_device_events(events: pd.DataFrame, hta_rounding: bool = True) -> pd.DataFrame:
    """The device events HTA analyses, with ``runtime_ts`` (launching host event's start).

    ``events`` is ``Trace.events`` (all ranks). The returned frame keeps the columns
    rank, name, stream, ts, end, and adds ``runtime_ts`` (NaN-free int64, -1 when
    the launch is not in the trace), sorted by (rank, ts). Times stay in ns; with
    ``hta_rounding`` they are rounded inwards to whole microseconds as HTA does.
    """
    is_dev = _is_device(events)
    corr = events["correlation"].to_numpy()
    hta_gpu = is_dev & (corr >= 0)
    rank = events["rank"].to_numpy()
    ts = events["ts"].to_numpy()

    step_mask = _profiler_step_mask(events) & ~hta_gpu
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):  # distinct step names, by code
        drop_last_step = np.unique(names.cat.codes.to_numpy()[step_mask]).size > 1
    else:
        drop_last_step = len(names[step_mask].astype(str).unique()) > 1

    # host events that carry a correlation id: the launches (cudaLaunchKernel, ...)
    host = ~hta_gpu & (corr >= 0)
    if drop_last_step:
        host &= _before_last_step(rank, ts, step_mask, host)
    h_rank, h_corr, h_ts = rank[host], corr[host], ts[host]

    dev_rows = np.flatnonzero(is_dev)
    d_rank, d_corr = rank[dev_rows], corr[dev_rows]
    runtime_ts, matched = _last_launch(h_rank, h_corr, h_ts, d_rank, d_corr)
    if drop_last_step:  # HTA's inner join: device events without a kept launch go
        dev_rows, runtime_ts = dev_rows[matched], runtime_ts[matched]
    cols = ["rank", "name", "stream", "ts", "end", "correlation"]
    dev = events[cols].iloc[dev_rows].reset_index(drop=True)
    dev["runtime_ts"] = runtime_ts
    if hta_rounding:
        dev["ts"], dev["end"] = _hta_round(dev["ts"].to_numpy(), dev["end"].to_numpy())
        rt = dev["runtime_ts"].to_numpy()
        dev["runtime_ts"] = np.where(rt < 0, rt, _hta_round(rt, rt)[0])
    return dev


def _before_last_step(
    rank: np.ndarray, ts: np.ndarray, step_mask: np.ndarray, host: np.ndarray
) -> np.ndarray:
    """Rows that start before their rank's last ProfilerStep (HTA drops the last step).

    Reproduces the pandas version's comparison exactly: ``rank.map(last_start)`` is
    int64 when every launch's rank has a step, else float64 (NaN filled with the int64
    maximum), and then ``ts < limit`` compares in float64.
    """
    step_ranks, inv = np.unique(rank[step_mask], return_inverse=True)
    last = np.full(step_ranks.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, inv, ts[step_mask])
    pos = np.minimum(np.searchsorted(step_ranks, rank), max(step_ranks.size - 1, 0))
    found = step_ranks[pos] == rank if step_ranks.size else np.zeros(rank.size, dtype=bool)
    if found[host].all():
        return ts < last[pos]
    limit = np.where(found, last[pos].astype(np.float64), float(np.iinfo(np.int64).max))
    return ts < limit


def _last_launch(
    h_rank: np.ndarray,
    h_corr: np.ndarray,
    h_ts: np.ndarray,
    d_rank: np.ndarray,
    d_corr: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Start of each device event's launch, matched on (rank, correlation): -1 if none.

    With several launches of one id the last one wins (HTA's ``drop_duplicates(keep=
    'last')``). One sort and a binary search instead of a pandas merge, which
    hashes both sides' keys.
    """
    if h_rank.size == 0 or d_rank.size == 0:
        return np.full(d_rank.size, -1, dtype=np.int64), np.zeros(d_rank.size, dtype=bool)
    order = np.lexsort((h_corr, h_rank))  # stable: equal keys keep their row order
    hr, hc, ht = h_rank[order], h_corr[order], h_ts[order]
    last = np.ones(hr.size, dtype=bool)
    last[:-1] = (hr[1:] != hr[:-1]) | (hc[1:] != hc[:-1])
    hr, hc, ht = hr[last], hc[last], ht[last]
    matched = np.zeros(d_rank.size, dtype=bool)
    pos = np.zeros(d_rank.size, dtype=np.int64)
    for r in np.unique(hr):  # a handful of ranks: a binary search in each rank's block
        a, b = int(np.searchsorted(hr, r, side="left")), int(np.searchsorted(hr, r, side="right"))
        on = np.flatnonzero(d_rank == r)
        p = a + np.minimum(np.searchsorted(hc[a:b], d_corr[on]), b - a - 1)
        pos[on] = p
        matched[on] = hc[p] == d_corr[on]
    return np.where(matched, ht[pos], -1).astype(np.int64), matched
