"""Roofline and MFU of a capture: what FLOP/s and bytes/s the job reached, against the
device's roofs (Williams, Waterman, Patterson, "Roofline", CACM 2009).

Inputs: the FLOPs and bytes of each counted operator (``flops.operator_flops``: from
the shapes a capture records), the device's peak (``device_peaks``: the datasheet table
for a GPU, ``stepscope calibrate`` for a CPU) and the steps (``breakdown.adjusted_steps``).

Time of an operator: on a GPU trace, the device time of the kernels, copies and sets it
launched, itself and its children (a launch, ``cuda_runtime``/``cuda_driver``, lies
inside the op on the op's thread; its device work shares its correlation id); an op that
launched nothing (it ran on CPU tensors) has no device time and stays out of the class
and operator tables and from the step's FLOPs (``Roofline.host_only_ops`` counts them:
a DataLoader's transforms on CPU tensors are not model FLOPs). On a CPU trace, the op's
own wall duration (``dur_ns``: children included, since they are part of its work).

Roofs:
- MFU and the chart's compute roof: the matmul peak at the job's dtype, the dtype of most
  matmul/conv/attention FLOPs. For float32 TF32 counts only where the trace shows TF32
  tensor-core kernels (names with ``tf32`` or ``s1688``, Ampere's TF32 MMA shape), or the
  caller says the job enabled it; else the fp32 peak, and the note says so where the
  device has a TF32 path (the trace cannot tell).
- matmul, conv, attention: the same matmul roof (they run on tensor/matrix cores).
- elementwise, normalisation, copy: the vector fp32 peak (``DevicePeak.fp32``; the CUDA
  cores) where the table has one, else the matmul roof. Why fp32 whatever the dtype:
  PyTorch's elementwise and reduction kernels compute in ``opmath_type``, float for
  half and bfloat16 (ATen's ``OpMathType.h``), and never use tensor cores.
- memory: the table's bandwidth (datasheet) or the calibration's triad figure.

Ratios are fractions (0.42 is 42 %; ``app.formats.fmt_pct`` prints them). A class is
compute-bound when its intensity (FLOP/byte) reaches its own ridge (its compute roof /
bandwidth), so ``pct_of_roof`` is ``pct_compute_roof`` for a compute-bound class and
``pct_memory_roof`` for a memory-bound one (the same as achieved / attainable FLOP/s, and
defined for copies, which have no FLOPs). Bytes are flops.py's minimum traffic of the
recorded shapes: an operand that is an expanded (stride-0) view counts at its full size,
so an op on one (a mean's backward) can show more than 100 % of the memory roof.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.hardware.device_peaks import (
    DevicePeak,
    device_properties,
    peak_for_trace,
    peak_from_calibration,
)
from stepscope.analyzers.hardware.flops import operator_flops
from stepscope.analyzers.hardware.op_time import (
    CLASS_OF_BASIS,
    TimedOps,
    device_time,
    timed_ops,
    uses_tf32,
)
from stepscope.analyzers.trace.breakdown import adjusted_steps
from stepscope.analyzers.trace.load import Trace
from stepscope.store.calibration import Calibration

OP_CLASSES = ("matmul", "conv", "attention", "elementwise", "normalisation", "copy")
#: Classes held against the matmul roof; the others against the vector fp32 peak.
MATRIX_CLASSES = ("matmul", "conv", "attention")
#: "Input type" names (c10's) -> torch dtype names.
DTYPE_NAMES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
}
TOP_OPS = 15
COLUMNS = ["op_class", "count", "time_ns", "share", "flops", "bytes", "tflops", "gbs"]
COLUMNS += ["intensity", "roof_tflops", "attainable_tflops", "pct_compute_roof"]
COLUMNS += ["pct_memory_roof", "pct_of_roof", "bound"]
STEP_COLUMNS = ["rank", "step", "flops", "bytes", "duration_ns", "tflops", "mfu"]
NO_CALIBRATION = "no calibration for this host: run `stepscope calibrate`"


@dataclass
class Roofline:
    """Achieved FLOP/s and bytes/s per op class, per top operator and per step, with the
    roofs they are read against (see the module docstring for times and roofs)."""

    peak: DevicePeak | None  # None: no peak known (reason in .note)
    dtype: str  # the dtype of most matmul FLOPs ("float32", "bfloat16")
    compute_tflops: float | None  # the compute roof of MFU and the chart
    memory_gbs: float | None
    ridge: float | None  # FLOP/byte where the compute roof meets the memory roof
    classes: pd.DataFrame  # COLUMNS, one row per op class with FLOPs or bytes
    top_ops: pd.DataFrame  # "name" + COLUMNS, top TOP_OPS operator names by time
    steps: pd.DataFrame  # STEP_COLUMNS
    mfu: float | None  # FLOPs of the steps / their time / compute roof
    basis: str  # "shapes", or why there are no FLOPs
    note: str  # the peak's source and conditions, shown beside every ratio
    vector_tflops: float | None = None  # the roof of elementwise/normalisation/copy
    host_only_ops: int = 0  # GPU trace: counted ops that launched no device work
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (NaN -> None), for ``stepscope analyze --json`` and the store."""
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        p = self.peak
        keys = ("name", "vendor", "source", "matched_on", "note")
        out["peak"] = None if p is None else {k: getattr(p, k) for k in keys}
        for key in ("classes", "top_ops", "steps"):
            out[key] = _records(getattr(self, key))
        out["warnings"] = list(self.warnings)
        return out


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain Python values; NaN and inf (an unknown figure) as None."""
    rows = df.astype(object).where(df.notna(), None).to_dict(orient="records")
    return [{k: _plain(v) for k, v in row.items()} for row in rows]


def _plain(v: Any) -> Any:
    if isinstance(v, pd.DataFrame | DevicePeak | list):
        return v  # to_json replaces these
    v = v.item() if isinstance(v, np.generic) else v
    return None if isinstance(v, float) and not np.isfinite(v) else v


# -- the peak --------------------------------------------------------------------------


def choose_peak(trace: Trace, calibration: Calibration | None) -> tuple[DevicePeak | None, str]:
    """The peak to read this trace against, and a one-line note: its source, or why none.

    A trace with devices (``deviceProperties`` or device events) takes the datasheet table;
    a CPU-only trace takes the host's calibration (measured, not a datasheet).
    """
    props = device_properties(trace)
    if props or trace.has_device:
        peak = peak_for_trace(trace)
        if peak is not None:
            return peak, f"{peak.name}: {peak.source} (matched on {peak.matched_on})"
        if not props:
            return None, "the trace has device events but no deviceProperties: device unknown"
        return None, f"device {props[0].get('name', '?')!r} is not in the peak table"
    return cpu_peak(calibration)


def cpu_peak(calibration: Calibration | None) -> tuple[DevicePeak | None, str]:
    """A CPU-only trace's peak: this host's calibration, or why there is none."""
    if calibration is None:
        return None, NO_CALIBRATION
    peak = peak_from_calibration(calibration)
    return peak, f"{peak.name}: {peak.source}"


def job_dtype(ops: pd.DataFrame) -> str:
    """The dtype of most matmul/conv/attention FLOPs (of all FLOPs where there are none)."""
    if ops.empty:
        return "float32"
    matrix = ops["basis"].map(CLASS_OF_BASIS).isin(MATRIX_CLASSES)
    pick = ops[matrix] if matrix.any() and ops.loc[matrix, "flops"].sum() > 0 else ops
    by = pick.groupby("dtype")["flops"].sum()
    if by.empty or by.max() <= 0:
        return "float32"
    raw = str(by.idxmax())
    return DTYPE_NAMES.get(raw, raw)


# -- the tables ------------------------------------------------------------------------


def _table(
    g: pd.DataFrame, key: str, roof: dict[str, float | None], gbs_roof: float | None
) -> pd.DataFrame:
    """Roofline columns for ops grouped by ``key`` ('op_class' or 'name')."""
    agg = g.groupby(key, observed=True, sort=False).agg(
        op_class=("op_class", "first"),
        count=("flops", "size"),
        time_ns=("time_ns", "sum"),
        flops=("flops", "sum"),
        bytes=("bytes", "sum"),
    )
    agg = agg.drop(columns="op_class") if key == "op_class" else agg
    agg = agg.reset_index()
    total = float(agg["time_ns"].sum())
    t = agg["time_ns"].astype(float).where(agg["time_ns"] > 0)
    agg["share"] = agg["time_ns"] / total if total > 0 else np.nan
    agg["tflops"] = agg["flops"] / t / 1e3  # FLOP/ns = 1e9 FLOP/s; TFLOP/s = /1e3
    agg["gbs"] = agg["bytes"] / t  # byte/ns = GB/s
    agg["intensity"] = agg["flops"] / agg["bytes"].astype(float).where(agg["bytes"] > 0)
    cls_roof = agg["op_class"].map(lambda c: roof.get(c)).astype(float)
    agg["roof_tflops"] = cls_roof
    bw = np.nan if gbs_roof is None else float(gbs_roof)
    mem_roof = agg["intensity"] * bw / 1e3  # FLOP/byte x GB/s = GFLOP/s
    agg["attainable_tflops"] = np.fmin(cls_roof, mem_roof)
    agg["pct_compute_roof"] = agg["tflops"] / cls_roof
    agg["pct_memory_roof"] = agg["gbs"] / bw
    ridge = cls_roof * 1e3 / bw
    compute = (agg["intensity"] >= ridge).to_numpy()
    unknown = (ridge.isna() | agg["intensity"].isna()).to_numpy()  # no roofs, or no bytes
    kinds = zip(unknown, compute, strict=True)
    bound = [None if u else "compute" if c else "memory" for u, c in kinds]
    agg["bound"] = pd.Series(bound, index=agg.index, dtype=object)
    pct = np.where(compute, agg["pct_compute_roof"], agg["pct_memory_roof"])
    agg["pct_of_roof"] = np.where(unknown, np.nan, pct)
    cols = COLUMNS if key == "op_class" else ["name", *COLUMNS]
    return agg.sort_values("time_ns", ascending=False, ignore_index=True)[cols]


def _steps(
    ops: pd.DataFrame, steps: pd.DataFrame, roof: float | None, counted: bool
) -> pd.DataFrame:
    """FLOPs, bytes, TFLOP/s and MFU per (rank, step); rates are NaN where nothing was
    counted (no shapes): zero would read as an idle device."""
    st = steps[["rank", "step"]].copy()
    st["duration_ns"] = (steps["end"] - steps["start"]).to_numpy()
    sums = ops.groupby(["rank", "step"])[["flops", "bytes"]].sum()
    keys = pd.MultiIndex.from_arrays([st["rank"].astype(ops["rank"].dtype), st["step"]])
    got = sums.reindex(keys).fillna(0)
    st["flops"] = got["flops"].to_numpy(dtype=np.int64)
    st["bytes"] = got["bytes"].to_numpy(dtype=np.int64)
    dur = st["duration_ns"].astype(float).where(st["duration_ns"] > 0)
    st["tflops"] = st["flops"] / dur / 1e3 if counted else np.nan
    st["mfu"] = st["tflops"] / roof if roof else np.nan
    return st[STEP_COLUMNS].reset_index(drop=True)


def roofline(
    trace: Trace,
    ops: pd.DataFrame | None = None,
    peak: DevicePeak | None = None,
    steps: pd.DataFrame | None = None,
    *,
    calibration: Calibration | None = None,
    allow_tf32: bool | None = None,
) -> Roofline:
    """The roofline of one capture.

    ``ops``: ``operator_flops(trace)`` when the caller has it; ``peak``: else
    ``choose_peak(trace, calibration)``; ``steps``: else ``adjusted_steps(trace)``;
    ``allow_tf32``: what the job is known to have set (None: read the kernel names).
    """
    ops = operator_flops(trace) if ops is None else ops
    steps = adjusted_steps(trace) if steps is None else steps
    if peak is None:
        peak, note = choose_peak(trace, calibration)
    else:
        note = f"{peak.name}: {peak.source}"
    return roofline_of(timed_ops(trace, ops), steps, peak, note, allow_tf32=allow_tf32)


def roofline_of(
    timed: TimedOps,
    steps: pd.DataFrame,
    peak: DevicePeak | None,
    note: str,
    *,
    allow_tf32: bool | None = None,
) -> Roofline:
    """The roofline from operators already timed (one rank's, or several merged)."""
    ops = timed.ops
    warnings: list[str] = []
    dtype = job_dtype(ops)
    basis = "shapes" if not ops.empty and (ops["flops"] > 0).any() else _no_flops(ops)
    if basis != "shapes":
        warnings.append("dtype unknown without shapes: float32 assumed")

    compute = vector = memory = ridge = None
    if peak is not None:
        tf32 = timed.tf32 if allow_tf32 is None else allow_tf32
        compute = peak.matmul_tflops(dtype, allow_tf32=tf32)
        memory = peak.memory_gbs or None
        if dtype == "float32" and peak.tf32 and compute == peak.fp32:
            warnings.append(
                "fp32 compute roof: no TF32 kernel in the trace (TF32 would be "
                f"{peak.tf32:g} TFLOP/s)"
            )
        elif dtype == "float32" and tf32 and peak.tf32:
            warnings.append("TF32 compute roof: the trace ran TF32 tensor-core kernels")
        if compute is None:
            fix = f" (`stepscope calibrate --dtype {dtype}`)" if peak.vendor == "CPU" else ""
            warnings.append(f"{peak.name} has no {dtype} matmul peak{fix}: no compute roof or MFU")
        vector = peak.fp32 if peak.fp32 is not None else compute
        if compute and memory:
            ridge = compute * 1e12 / (memory * 1e9)
        roofs = f"compute roof {_num(compute)} TFLOP/s ({dtype} matmul)"
        roofs += f", vector {_num(vector)} TFLOP/s, memory {_num(memory)} GB/s"
        note = f"{note}; {roofs}"

    host_only = timed.host_only
    timed_rows = ops[ops["time_ns"] > 0]
    roof = {c: (compute if c in MATRIX_CLASSES else vector) for c in OP_CLASSES}
    classes = _table(timed_rows, "op_class", roof, memory)
    top = _table(timed_rows, "name", roof, memory).head(TOP_OPS)
    # model FLOPs: on a GPU trace those of the device's work, not of host-side ops
    # (a DataLoader's transforms on CPU tensors run inside the step too)
    counted = basis == "shapes"
    step_table = _steps(timed_rows if timed.has_device else ops, steps, compute, counted)
    mfu = None
    total_ns = float(step_table["duration_ns"].sum())
    if compute and total_ns > 0 and counted:
        mfu = float(step_table["flops"].sum()) / total_ns / 1e3 / compute
    if host_only:
        warnings.append(f"{host_only} counted ops launched no device work (left out of classes)")
    return Roofline(
        peak=peak,
        dtype=dtype,
        compute_tflops=compute,
        memory_gbs=memory,
        ridge=ridge,
        classes=classes,
        top_ops=top,
        steps=step_table,
        mfu=mfu,
        basis=basis,
        note=note,
        vector_tflops=vector,
        host_only_ops=host_only,
        warnings=warnings,
    )


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def _no_flops(ops: pd.DataFrame) -> str:
    skipped = sum((ops.attrs.get("skipped") or {}).values())
    if skipped:
        return (
            f"no shapes: {skipped} operators with a FLOP formula have no recorded shapes "
            "(capture with record_shapes=True)"
        )
    return "no operators with a FLOP formula in the trace"


__all__ = [
    "CLASS_OF_BASIS",
    "COLUMNS",
    "OP_CLASSES",
    "Roofline",
    "choose_peak",
    "cpu_peak",
    "device_time",
    "job_dtype",
    "roofline",
    "roofline_of",
    "uses_tf32",
]
