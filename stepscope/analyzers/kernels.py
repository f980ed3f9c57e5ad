"""Top kernels (with a compute / memory-bound class) and top CPU operators by self time.

The kernel class feeds the bottleneck taxonomy: time dominated by GEMM/conv kernels
means device compute; by elementwise/reduction/normalisation kernels means memory
bandwidth; by NCCL/RCCL/Gloo kernels means communication. Names are the only
evidence a trace has, so the classifier is an ordered list of name patterns, checked
on real cuDNN/cuBLAS/CUTLASS (V100, A100), Tensile/rocBLAS (MI250) and ATen names.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from stepscope.analyzers.breakdown import name_mask
from stepscope.analyzers.trace_load import Trace

KERNEL_CLASSES = (
    "gemm_conv",
    "elementwise",
    "reduction",
    "normalization",
    "communication",
    "memcpy",
    "memset",
    "other",
)

# Ordered: the first match wins. Normalisation and layout/elementwise templates come
# before GEMM/conv because their names often carry 'cudnn' (cudnn::bn_fw_tr_...,
# cudnn::ops::nchwToNhwcKernel); reduction templates before GEMM because
# 'splitKreduce' and 'reduce_wgrad' belong to GEMM/conv and are listed there first.
_RULES: list[tuple[str, re.Pattern[str]]] = [
    (
        "communication",
        re.compile(
            r"^(nccl|rccl)|nccl(dev)?kernel|gloo|all_?reduce|allgather|reducescatter|sendrecv", re.I
        ),
    ),
    (
        "normalization",
        re.compile(
            r"batch_?norm|bn_(fw|bw)|layer_?norm|group_?norm|rms_?norm|instance_?norm|softmax|rowwisemoments|gammabetabackward|welford|norm_kernel",
            re.I,
        ),
    ),
    ("gemm_conv", re.compile(r"splitkreduce|reduce_wgrad", re.I)),
    (
        "elementwise",
        re.compile(
            r"elementwise|nchwtonhwc|nhwctonchw|catarray|copy_kernel|fill_kernel|transpose|permute|scalepackedtensor|multi_tensor_apply|index_?select|indexselect|scatter|gather|embedding|dropout|im2col",
            re.I,
        ),
    ),
    (
        "reduction",
        re.compile(
            r"reduce_kernel|reduction|devicereduce|devicescan|deviceradixsort|devicesegmented|devicecompact|cub::|pool|argmax|argmin|cumsum|nllcriterion|cross_?entropy|nll_loss|topk|sort",
            re.I,
        ),
    ),
    (
        "gemm_conv",
        re.compile(
            r"gemm|gemv|conv|cudnn|cutlass|cublas|hmma|xmma|wgrad|dgrad|fprop|winograd|implicit|^cijk_|tensile|matmul|_mm_|bmm|dot_kernel|mma|cask_|^nvjet",
            re.I,
        ),
    ),
]


def classify_kernel(name: str, cat: str = "kernel") -> str:
    """Class of one device event, from its category and name."""
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    for cls, pattern in _RULES:
        if pattern.search(name):
            return cls
    return "other"


def device_work(trace: Trace) -> pd.DataFrame:
    """Kernels, memcpys and memsets with their class (one classifier call per name)."""
    ev = trace.events
    dev = ev[ev["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).to_numpy()]
    dev = dev[["rank", "device", "stream", "cat", "name", "ts", "dur", "end"]].copy()
    names = dev["name"].cat.remove_unused_categories()
    dev["name"] = names
    per_name = np.array(
        [KERNEL_CLASSES.index(classify_kernel(str(n))) for n in names.cat.categories] + [7],
        dtype=np.int8,
    )
    codes = per_name[names.cat.codes.to_numpy()]
    cat = dev["cat"].to_numpy()
    codes[cat == "gpu_memcpy"] = KERNEL_CLASSES.index("memcpy")
    codes[cat == "gpu_memset"] = KERNEL_CLASSES.index("memset")
    dev["class"] = pd.Categorical.from_codes(codes, categories=KERNEL_CLASSES)
    return dev


def top_kernels(trace: Trace, n: int = 10, work: pd.DataFrame | None = None) -> pd.DataFrame:
    """Device work grouped by name, by total time: count, total/mean/max (ns), share, class.

    Share is of all device-work time (kernels + copies + sets) of all ranks.
    """
    work = device_work(trace) if work is None else work
    cols = ["name", "class", "count", "total_ns", "mean_ns", "max_ns", "share"]
    if work.empty:
        return pd.DataFrame(columns=cols)
    g = work.groupby("name", observed=True, sort=False)
    out = g["dur"].agg(count="count", total_ns="sum", mean_ns="mean", max_ns="max")
    out["class"] = g["class"].first()
    out["share"] = out["total_ns"] / max(int(work["dur"].sum()), 1)
    out = out.sort_values("total_ns", ascending=False).head(n).reset_index()
    out["name"] = out["name"].astype(str)
    out["class"] = out["class"].astype(str)
    return out[cols]


def class_summary(trace: Trace, work: pd.DataFrame | None = None) -> pd.DataFrame:
    """Time per kernel class: the compute vs memory-bound vs communication split."""
    work = device_work(trace) if work is None else work
    out = work.groupby("class", observed=False)["dur"].agg(count="count", total_ns="sum")
    out["share"] = out["total_ns"] / max(int(out["total_ns"].sum()), 1)
    return out.reset_index()


# -- operators -------------------------------------------------------------------------

HOST_TREE_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")


def self_times(ev: pd.DataFrame) -> np.ndarray:
    """Self time (ns) of each host event: its duration minus its direct children's
    (children = ranges nested inside it on the same thread), clipped at 0.

    Vectorised stack sweep: in (thread, start, longest-first) order, an event's depth
    is the number of earlier events of its thread still open at its start (earlier
    events minus those that ended by then, one searchsorted); its parent is the last
    earlier event one level up on the same thread. Zero-length events have no
    children and take no time from a parent, so they stay out of the tree.
    """
    self_ns = ev["dur"].to_numpy().astype(np.int64).copy()
    nz = np.flatnonzero(self_ns > 0)
    if nz.size < 2:
        return self_ns
    sub = ev.iloc[nz]
    thread = pd.MultiIndex.from_arrays([sub["rank"], sub["pid"], sub["tid"]])
    gid = pd.factorize(thread)[0].astype(np.int64)
    ts, end = sub["ts"].to_numpy(), sub["end"].to_numpy()
    order = np.lexsort((-(end - ts), ts, gid))
    gid, ts, end = gid[order], ts[order], end[order]
    m = gid.size
    first = np.searchsorted(gid, gid, side="left")  # group offset in sorted order
    local = np.arange(m) - first

    times, inv = np.unique(np.concatenate([ts, end]), return_inverse=True)
    r_ts, r_end = inv[:m], inv[m:]
    span = np.int64(times.size + 1)
    end_keys = np.sort(gid * span + r_end)
    closed = np.searchsorted(end_keys, gid * span + r_ts, side="right") - first
    depth = local - closed

    dmax = np.int64(depth.max() + 1)
    pos = np.arange(m, dtype=np.int64)
    key = (gid * dmax + depth) * m + pos
    key_sorted = np.sort(key)
    has_parent = depth > 0
    q = (gid[has_parent] * dmax + depth[has_parent] - 1) * m + pos[has_parent]
    cand = np.searchsorted(key_sorted, q, side="left") - 1
    valid = cand >= 0
    cand_key = key_sorted[np.maximum(cand, 0)]
    parent_pos = cand_key % m
    valid &= (cand_key // m) == (gid[has_parent] * dmax + depth[has_parent] - 1)
    child = pos[has_parent][valid]
    parent = parent_pos[valid]
    contrib = np.maximum(np.minimum(end[child], end[parent]) - ts[child], 0)
    child_sum = np.bincount(parent, weights=contrib, minlength=m).astype(np.int64)

    unsorted = np.empty(m, dtype=np.int64)
    unsorted[order] = np.maximum((end - ts) - child_sum, 0)
    self_ns[nz] = unsorted
    return self_ns


def top_ops(trace: Trace, n: int = 10) -> pd.DataFrame:
    """CPU operators (cpu_op) grouped by name, by total self time.

    Self time excludes nested operators, runtime calls and annotations on the same
    thread, which is what a user can act on; ProfilerStep# is not an operator.
    """
    cols = ["name", "count", "self_ns", "total_ns", "mean_self_ns", "share"]
    ev = trace.events
    host = ev[ev["cat"].isin(HOST_TREE_CATS).to_numpy()]
    if host.empty:
        return pd.DataFrame(columns=cols)
    self_ns = self_times(host)
    ops = (host["cat"] == "cpu_op").to_numpy() & ~name_mask(
        host["name"], lambda n: n.startswith("ProfilerStep#")
    )
    df = pd.DataFrame(
        {
            "name": host["name"].to_numpy()[ops],
            "self_ns": self_ns[ops],
            "dur": host["dur"].to_numpy()[ops],
        }
    )
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.groupby("name", observed=True, sort=False)
    out = g.agg(count=("dur", "count"), self_ns=("self_ns", "sum"), total_ns=("dur", "sum"))
    out["mean_self_ns"] = out["self_ns"] / out["count"]
    out["share"] = out["self_ns"] / max(int(df["self_ns"].sum()), 1)
    out = out.sort_values("self_ns", ascending=False).head(n).reset_index()
    out["name"] = out["name"].astype(str)
    return out[cols]
