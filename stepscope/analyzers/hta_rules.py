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

import re

import numpy as np
import pandas as pd

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


def kernel_types(names: pd.Series) -> np.ndarray:
    """HTA kernel type per event, as int8 codes (see the module constants).

    The regexes run once per distinct name (the categories), not per event.
    """
    if isinstance(names.dtype, pd.CategoricalDtype):
        per_cat = np.fromiter(
            (_type_of(str(c)) for c in names.cat.categories), dtype=np.int8, count=-1
        )
        codes = names.cat.codes.to_numpy()
        out = np.full(codes.size, OTHER, dtype=np.int8)
        valid = codes >= 0
        out[valid] = per_cat[codes[valid]]
        return out
    uniques, inverse = np.unique(names.astype(str).to_numpy(), return_inverse=True)
    per_name = np.fromiter((_type_of(n) for n in uniques), dtype=np.int8, count=-1)
    return per_name[inverse]


def _is_device(events: pd.DataFrame) -> np.ndarray:
    return events["cat"].isin(DEVICE_CATS).to_numpy()


def _profiler_step_mask(events: pd.DataFrame) -> np.ndarray:
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = names.cat.categories.astype(str)
        hit = np.asarray(cats.str.contains("ProfilerStep", regex=False), dtype=bool)
        codes = names.cat.codes.to_numpy()
        return (codes >= 0) & hit[np.maximum(codes, 0)]
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

    step_mask = _profiler_step_mask(events) & ~hta_gpu
    step_names = events.loc[step_mask, "name"].astype(str).unique()
    drop_last_step = len(step_names) > 1

    # host events that carry a correlation id: the launches (cudaLaunchKernel, ...)
    host = events.loc[~hta_gpu & (corr >= 0), ["rank", "correlation", "ts"]]
    if drop_last_step:
        last_start = (
            events.loc[step_mask, ["rank", "ts"]].groupby("rank", observed=True)["ts"].max()
        )
        limit = host["rank"].map(last_start).fillna(np.iinfo(np.int64).max)
        host = host[host["ts"].to_numpy() < limit.to_numpy()]
    # HTA keeps the last launch with a given correlation id when there are several
    host = host.drop_duplicates(["rank", "correlation"], keep="last")

    dev = events.loc[is_dev, ["rank", "name", "stream", "ts", "end", "correlation"]]
    dev = dev.merge(
        host.rename(columns={"ts": "runtime_ts"}),
        on=["rank", "correlation"],
        how="inner" if drop_last_step else "left",
        sort=False,
    )
    dev["runtime_ts"] = dev["runtime_ts"].fillna(-1).astype(np.int64)
    if hta_rounding:
        dev["ts"], dev["end"] = _hta_round(dev["ts"].to_numpy(), dev["end"].to_numpy())
        rt = dev["runtime_ts"].to_numpy()
        dev["runtime_ts"] = np.where(rt < 0, rt, _hta_round(rt, rt)[0])
    return dev
