"""How long each counted operator took, the time a roofline divides its FLOPs by.

On a GPU trace an operator's time is the device time of the kernels, copies and sets it
launched (a launch, ``cuda_runtime``/``cuda_driver``, lies inside the op on the op's
thread; its device work shares its correlation id); on a CPU trace it is the op's own
wall duration. This needs the rank's events, so it is computed where the rank's trace
is loaded; the roofline itself (``roofline.roofline_of``) needs only the result, which
is what lets ranks be analysed in separate processes and merged.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.breakdown import DEVICE_WORK_CATS, LAUNCH_CATS, cat_mask, name_mask
from stepscope.analyzers.trace.load import Trace

#: Kernel names of TF32 tensor-core GEMM/conv kernels (cuBLAS/cuDNN/CUTLASS on Ampere+).
TF32_KERNEL = re.compile(r"tf32|s1688", re.IGNORECASE)
#: flops.py's basis -> the roofline's operator class.
CLASS_OF_BASIS: dict[str, str] = {
    "mm": "matmul",
    "bmm": "matmul",
    "conv": "conv",
    "conv_backward": "conv",
    "sdpa": "attention",
    "sdpa_backward": "attention",
    "elementwise": "elementwise",
    "norm": "normalisation",
    "norm_backward": "normalisation",
    "softmax": "normalisation",
    "copy": "copy",
    "fill": "copy",
}


@dataclass
class TimedOps:
    """Counted operators (``flops.operator_flops`` rows, plus ``op_class`` and
    ``time_ns``) and the two facts of the trace the roofs need besides them."""

    ops: pd.DataFrame
    has_device: bool  # time_ns is device time (else the op's CPU wall time)
    tf32: bool  # TF32 tensor-core kernels ran (the one sign of allow_tf32 a trace has)

    @property
    def host_only(self) -> int:
        """GPU trace: counted ops that launched no device work (a DataLoader's transforms)."""
        return int((self.ops["time_ns"] <= 0).sum()) if self.has_device else 0


def device_time(trace: Trace, ops: pd.DataFrame) -> np.ndarray:
    """Device ns of each counted op: its launches' kernels, copies and sets.

    Counted ops never nest on a thread (flops.py counts the outermost), so each launch
    falls in at most one of them: a binary search per thread.
    """
    out = np.zeros(len(ops), dtype=np.int64)
    if ops.empty:
        return out
    ev = trace.events
    corr = ev["correlation"].to_numpy()
    rank = ev["rank"].to_numpy()
    work = cat_mask(ev, DEVICE_WORK_CATS) & (corr >= 0)
    w = pd.DataFrame({"rank": rank[work], "corr": corr[work], "dur": ev["dur"].to_numpy()[work]})
    per_corr = w.groupby(["rank", "corr"])["dur"].sum()
    launch = cat_mask(ev, LAUNCH_CATS) & (corr >= 0)
    lf = pd.DataFrame(
        {
            "rank": rank[launch],
            "tid": ev["tid"].to_numpy()[launch],
            "ts": ev["ts"].to_numpy()[launch],
            "corr": corr[launch],
        }
    )
    keys = pd.MultiIndex.from_arrays([lf["rank"], lf["corr"]])
    lf["dev"] = per_corr.reindex(keys).fillna(0).to_numpy(dtype=np.int64)
    lf = lf[lf["dev"] > 0]
    o_ts = ops["ts"].to_numpy()
    o_end = o_ts + ops["dur_ns"].to_numpy()
    for (r, t), idx in ops.groupby(["rank", "tid"]).indices.items():
        idx = idx[np.argsort(o_ts[idx], kind="stable")]
        mine = lf[(lf["rank"] == r) & (lf["tid"] == t)]
        if mine.empty:
            continue
        lts = mine["ts"].to_numpy()
        j = np.searchsorted(o_ts[idx], lts, side="right") - 1
        ok = (j >= 0) & (lts < o_end[idx[np.maximum(j, 0)]])
        np.add.at(out, idx[j[ok]], mine["dev"].to_numpy()[ok])
    return out


def uses_tf32(trace: Trace) -> bool:
    """Did TF32 tensor-core kernels run? The one sign of ``allow_tf32`` a trace carries."""
    ev = trace.events
    kernel = cat_mask(ev, ("kernel",))
    return bool(kernel.any() and (name_mask(ev["name"], TF32_KERNEL.search) & kernel).any())


def timed_ops(trace: Trace, ops: pd.DataFrame) -> TimedOps:
    """``ops`` with each op's class and time (see the module docstring)."""
    ops = ops.copy()  # the caller's frame stays as operator_flops gave it
    ops["op_class"] = ops["basis"].map(CLASS_OF_BASIS)
    ops["time_ns"] = device_time(trace, ops) if trace.has_device else ops["dur_ns"]
    return TimedOps(ops=ops, has_device=trace.has_device, tf32=uses_tf32(trace))


def merge_timed(parts: list[TimedOps]) -> TimedOps:
    """Several ranks' timed ops as one (rank order kept; skipped counts summed)."""
    if len(parts) == 1:
        return parts[0]
    skipped: Counter = Counter()
    for p in parts:
        skipped.update(p.ops.attrs.get("skipped") or {})
    ops = pd.concat([p.ops for p in parts], ignore_index=True)
    ops.attrs["skipped"] = dict(skipped)
    return TimedOps(
        ops=ops,
        has_device=any(p.has_device for p in parts),
        tf32=any(p.tf32 for p in parts),
    )
