"""Per-device GPU metrics as torch-tb-profiler 0.4.3 computes them (gpu_metrics_parser.py).

tb-profiler's definitions, kept so the numbers match what users already know:

* window: from the first step's start to the last step's end, after the breakdown's
  device-side step adjustment (so both views cover the same time);
* GPU utilisation: union of the device's kernels inside the window / window;
* estimated SM efficiency: at each instant, the sum of 'blocks per SM' of the kernels
  running then, capped at 1, averaged over the window. Kineto already divides blocks
  by the device's SM count (deviceProperties.numSms) when it writes 'blocks per SM';
* estimated achieved occupancy: mean of 'est. achieved occupancy %' weighted by each
  kernel's duration inside the window;
* Tensor Core share: kernel time whose name matches tb-profiler's allow-list (NVIDIA
  PyProf's patterns) / all kernel time of the device.

AMD traces (ROCm) carry no 'blocks per SM' or occupancy: those metrics are NaN there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.breakdown import adjusted_steps, cat_mask, name_mask
from stepscope.analyzers.trace.intervals import covered_in
from stepscope.analyzers.trace.load import Trace

#: torch_tb_profiler/profiler/tensor_core.py TC_Allowlist (substring match)
TC_PATTERNS = (
    "h884",
    "s884",
    "h1688",
    "s1688",
    "hmma",
    "i8816",
    "16816",
    "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel",
    "conv1x1",
    "conv2d_c1_k1",
    "direct_group",
    "xmma_implicit_gemm",
    "xmma_sparse_conv",
    "xmma_warp_specialized_implicit_gemm",
    "xmma_gemm",
    "xmma_sparse_gemm",
    "c1688",
)

#: Tensor-Core kernel families that tb-profiler 0.4.3 predates: cuDNN 8 on Ampere
#: (``sm80_xmma_*_tf32f32_*_tensor16x8x8``), CUTLASS tensor-op kernels, Hopper's
#: warpgroup MMA (``wgmma``) and cuBLASLt's ``nvjet_sm90_*`` GEMMs (seen on an H100 with
#: torch 2.11 + CUDA 13 for a bf16 ``x @ x``). The diagnosis reads
#: ``tensor_core_share_modern``; ``tensor_core_share`` stays comparable with tb-profiler.
TC_PATTERNS_MODERN = (
    *TC_PATTERNS,
    "sm80_xmma",
    "sm86_xmma",
    "sm90_xmma",
    "tensor16x8",
    "tensorop",
    "wgmma",
    "nvjet",
)
#: CUDA-core kernels that the substring rules above would otherwise claim: on an H100,
#: a plain fp32 matmul runs ``sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_...`` (FFMA,
#: no Tensor Cores), which tb-profiler's ``xmma_gemm`` pattern counts as Tensor-Core
#: work, hiding exactly the "eligible but no Tensor Cores: enable TF32/bf16" finding.
CUDA_CORE_MARKERS = ("_ffma_", "simt", "sgemm")

COLUMNS = [
    "rank",
    "device",
    "name",
    "kernels",
    "kernel_time_ns",
    "window_ns",
    "gpu_utilization",
    "sm_efficiency",
    "achieved_occupancy",
    "tensor_core_share",
    "tensor_core_share_modern",
]


def uses_tensor_cores(name: str) -> bool:
    return any(p in name for p in TC_PATTERNS)


def uses_tensor_cores_modern(name: str) -> bool:
    if any(m in name for m in CUDA_CORE_MARKERS):
        return False
    return any(p in name for p in TC_PATTERNS_MODERN)


def sm_efficiency(ts: np.ndarray, end: np.ndarray, bps: np.ndarray, lo: int, hi: int) -> float:
    """Time-average over [lo, hi) of min(1, sum of blocks-per-SM of running kernels)."""
    keep = bps > 0
    ts, end, bps = ts[keep], end[keep], bps[keep].astype(np.float64)
    if ts.size == 0 or hi <= lo:
        return float("nan")
    times = np.concatenate([ts, end])
    delta = np.concatenate([bps, -bps])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(delta[order])
    seg_lo = np.clip(times[:-1], lo, hi)
    seg_hi = np.clip(times[1:], lo, hi)
    value = np.clip(level[:-1], 0.0, 1.0)
    value[level[:-1] <= 1e-9] = 0.0  # float residue after +x -x
    return float(((seg_hi - seg_lo) * value).sum() / (hi - lo))


def occupancy(ts: np.ndarray, end: np.ndarray, occ: np.ndarray, lo: int, hi: int) -> float:
    """Duration-weighted mean occupancy (%) of the kernels' parts inside [lo, hi)."""
    keep = occ >= 0  # NaN compares False: kernels without the field drop out
    s, e = np.maximum(ts[keep], lo), np.minimum(end[keep], hi)
    w = np.where(e > s, e - s, 0).astype(np.float64)
    return float((w * occ[keep]).sum() / w.sum()) if w.sum() > 0 else float("nan")


def _device_name(meta: dict, device: int) -> str:
    for prop in meta.get("deviceProperties") or []:
        if isinstance(prop, dict) and prop.get("id") == device:
            return str(prop.get("name", ""))
    return ""


def gpu_metrics(trace: Trace, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, device) that ran kernels; empty (with columns) on CPU-only traces.

    Fractions are 0..1 except achieved_occupancy, which is a percentage like Kineto's.
    """
    if not trace.has_device:
        return pd.DataFrame(columns=COLUMNS)
    steps = adjusted_steps(trace) if steps is None else steps
    ev = trace.events
    # the needed columns of the kernel rows only (not a filtered copy of the whole table)
    cols = ["rank", "device", "name", "ts", "end", "dur", "blocks_per_sm", "occupancy"]
    kern = ev[cols].iloc[np.flatnonzero(cat_mask(ev, ("kernel",)))]
    tc = name_mask(kern["name"], uses_tensor_cores)
    tc_modern = name_mask(kern["name"], uses_tensor_cores_modern)
    rows = []
    for (rank, device), idx in kern.groupby(["rank", "device"], sort=True).indices.items():
        k = kern.iloc[idx]
        st = steps[steps["rank"] == rank]
        lo, hi = int(st["start"].min()), int(st["end"].max())
        ts, end = k["ts"].to_numpy(), k["end"].to_numpy()
        dur = k["dur"].to_numpy()
        window = hi - lo
        rows.append(
            {
                "rank": int(rank),
                "device": int(device),
                "name": _device_name(trace.meta.get(int(rank), {}), int(device)),
                "kernels": len(k),
                "kernel_time_ns": int(dur.sum()),
                "window_ns": window,
                "gpu_utilization": covered_in(ts, end, lo, hi) / window if window > 0 else np.nan,
                "sm_efficiency": sm_efficiency(ts, end, k["blocks_per_sm"].to_numpy(), lo, hi),
                "achieved_occupancy": occupancy(ts, end, k["occupancy"].to_numpy(), lo, hi),
                "tensor_core_share": _share(dur, tc[idx]),
                "tensor_core_share_modern": _share(dur, tc_modern[idx]),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _share(dur: np.ndarray, mask: np.ndarray) -> float:
    total = dur.sum()
    return float(dur[mask].sum() / total) if total else 0.0


__all__ = [
    "COLUMNS",
    "TC_PATTERNS",
    "TC_PATTERNS_MODERN",
    "CUDA_CORE_MARKERS",
    "gpu_metrics",
    "uses_tensor_cores",
    "uses_tensor_cores_modern",
]
