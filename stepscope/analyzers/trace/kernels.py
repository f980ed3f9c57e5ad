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

from stepscope.analyzers.trace.breakdown import cat_mask, name_mask
from stepscope.analyzers.trace.load import Trace

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


# The same rules for ASCII names, matched against the lower-cased name: case-insensitive
# search over these long alternations is ~5x slower than a case-sensitive one, and on
# ASCII text lower-casing first finds exactly the same matches. Patterns with capitals
# keep re.I (still correct on lower-cased text); non-ASCII names use _RULES as they are.
_RULES_ASCII: list[tuple[str, re.Pattern[str]]] = [
    (cls, re.compile(p.pattern, p.flags & ~re.I) if p.pattern == p.pattern.lower() else p)
    for cls, p in _RULES
]


def classify_kernel(name: str, cat: str = "kernel") -> str:
    """Class of one device event, from its category and name."""
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    rules = _RULES
    if name.isascii():
        name, rules = name.lower(), _RULES_ASCII
    for cls, pattern in rules:
        if pattern.search(name):
            return cls
    return "other"


def device_work(trace: Trace) -> pd.DataFrame:
    """Kernels, memcpys and memsets with their class (one classifier call per name)."""
    ev = trace.events
    rows = np.flatnonzero(cat_mask(ev, ("kernel", "gpu_memcpy", "gpu_memset")))
    # pick the columns before the rows: filtering the whole table copies all 15 columns
    dev = ev[["rank", "device", "stream", "cat", "name", "ts", "dur", "end"]].iloc[rows]
    names = dev["name"].cat.remove_unused_categories()
    dev["name"] = names
    per_name = np.array(
        [KERNEL_CLASSES.index(classify_kernel(str(n))) for n in names.cat.categories] + [7],
        dtype=np.int8,
    )
    codes = per_name[names.cat.codes.to_numpy()]
    codes[cat_mask(dev, ("gpu_memcpy",))] = KERNEL_CLASSES.index("memcpy")
    codes[cat_mask(dev, ("gpu_memset",))] = KERNEL_CLASSES.index("memset")
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


def _thread_ids(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Dense int64 id per distinct (rank, pid, tid): one integer factorize per column.

    Factorizing a MultiIndex of the three builds a million Python tuples first.
    """
    codes = np.zeros(rank.size, dtype=np.int64)
    for col in (rank, pid, tid):
        c, uniq = pd.factorize(col)
        codes = codes * len(uniq) + c
    return pd.factorize(codes)[0].astype(np.int64)


def _in_start_order(rank: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> bool:
    """Are the rows sorted by (rank, ts, -dur), the order ``load_trace`` gives them?"""
    if rank.size < 2:
        return True
    r0, r1 = rank[:-1], rank[1:]
    t0, t1 = ts[:-1], ts[1:]
    ok = (r1 > r0) | ((r1 == r0) & ((t1 > t0) | ((t1 == t0) & (dur[1:] <= dur[:-1]))))
    return bool(ok.all())


def self_times(ev: pd.DataFrame) -> np.ndarray:
    """Self time (ns) of each host event: its duration minus its direct children's
    (children = ranges nested inside it on the same thread), clipped at 0.

    Vectorised stack sweep: in (thread, start, longest-first) order, an event's depth
    is the number of earlier events of its thread still open at its start (earlier
    events minus those that ended by then, one searchsorted); its parent is the last
    earlier event one level up on the same thread. Zero-length events have no
    children and take no time from a parent, so they stay out of the tree.
    """
    cols = (ev[c].to_numpy() for c in ("rank", "pid", "tid", "ts", "dur", "end"))
    return _self_times(*cols)


def _self_times(
    rank: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    end: np.ndarray,
) -> np.ndarray:
    """``self_times`` on column arrays, so callers can pass a row subset without
    building a DataFrame of it."""
    self_ns = dur.astype(np.int64)  # astype copies: the caller's column stays intact
    nz = np.flatnonzero(self_ns > 0)
    if nz.size < 2:
        return self_ns
    rank = rank[nz]
    ts = ts[nz].astype(np.int64)
    end = end[nz].astype(np.int64)
    gid = _thread_ids(rank, pid[nz], tid[nz])
    if _in_start_order(rank, ts, end - ts):
        # already (ts, -dur) within each thread: a stable sort by thread alone gives
        # the same order as the three-key lexsort (and on uint16, numpy's radix sort)
        order = np.argsort(gid.astype(np.uint16) if gid.max() < 2**16 else gid, kind="stable")
    else:
        order = np.lexsort((-(end - ts), ts, gid))
    gid, ts, end = gid[order], ts[order], end[order]
    m = gid.size
    new_group = np.empty(m, dtype=bool)
    new_group[0] = True
    np.not_equal(gid[1:], gid[:-1], out=new_group[1:])
    pos = np.arange(m, dtype=np.int64)
    first = np.maximum.accumulate(np.where(new_group, pos, 0))  # group offset
    local = pos - first

    # (thread, time) keys: offset times when thread x span fits in int64, else ranks
    t_min = int(min(ts.min(), end.min()))
    width = int(max(ts.max(), end.max())) - t_min + 1
    if (int(gid[-1]) + 1) * width < 2**62:
        base = gid * np.int64(width) - np.int64(t_min)
        ts_key, end_key = base + ts, base + end
    else:
        times, inv = np.unique(np.concatenate([ts, end]), return_inverse=True)
        span = np.int64(times.size + 1)
        ts_key, end_key = gid * span + inv[:m], gid * span + inv[m:]
    closed = np.searchsorted(np.sort(end_key), ts_key, side="right") - first
    depth = local - closed

    dmax = np.int64(depth.max() + 1)
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
    # column arrays of the host rows only: filtering the whole table would copy every
    # column, and the name column as strings, for a million rows
    host = np.flatnonzero(cat_mask(ev, HOST_TREE_CATS))
    if host.size == 0:
        return pd.DataFrame(columns=cols)
    arrays = [ev[c].to_numpy()[host] for c in ("rank", "pid", "tid", "ts", "dur", "end")]
    self_ns = _self_times(*arrays)
    names = ev["name"]
    is_op = cat_mask(ev, ("cpu_op",)) & ~name_mask(names, lambda n: n.startswith("ProfilerStep#"))
    ops = is_op[host]
    if not ops.any():
        return pd.DataFrame(columns=cols)
    op_self = self_ns[ops]
    op_dur = arrays[4][ops]
    code = names.cat.codes.to_numpy()[host][ops]
    named = code >= 0  # a missing name is no group (pandas drops NaN keys) but counts in share
    # Groups by integer code in order of first appearance: the groups, order and exact
    # int64 sums that groupby(name, sort=False).agg gave on the names as strings, without
    # a string per row or pandas' aggregation machinery (most of the time on ResNet).
    group, first_code = pd.factorize(code[named])
    k = len(first_code)
    self_sum = np.zeros(k, dtype=np.int64)
    dur_sum = np.zeros(k, dtype=np.int64)
    np.add.at(self_sum, group, op_self[named])
    np.add.at(dur_sum, group, op_dur[named])
    count = np.bincount(group, minlength=k).astype(np.int64)
    out = pd.DataFrame(
        {
            "name": names.cat.categories.take(first_code).astype(str),
            "count": count,
            "self_ns": self_sum,
            "total_ns": dur_sum,
            "mean_self_ns": self_sum / count,
            "share": self_sum / max(int(op_self.sum()), 1),
        }
    )
    # the same sort call on the same values in the same row order: the same tie order
    return out.sort_values("self_ns", ascending=False).head(n).reset_index(drop=True)[cols]


# -- CPU operators -------------------------------------------------------------------
# On a CPU-only job the operators are the kernels: the same compute / memory-bound
# split, plus "framework" time (dispatch, views, allocation, autograd and optimizer
# bookkeeping) that is host overhead. Names outside ATen (autograd::engine::...,
# *Backward0, Optimizer.step#...) are framework; data loading and collectives have
# their own breakdown categories and are left out.
_CPU_GEMM = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|addbmm|addmv|mv|dot|matmul|linear|einsum|_addmm_activation"
    r"|\w*conv\w*|\w*linear\w*)$|^mkldnn::"
)
_CPU_FRAMEWORK_ATEN = re.compile(
    r"^aten::(empty\w*|new_empty\w*|view\w*|_unsafe_view|as_strided\w*|t|numpy_t|transpose|permute"
    r"|select|slice|narrow|split\w*|chunk|unbind|reshape|_reshape_alias|expand\w*|unsqueeze"
    r"|squeeze\w*|flatten|detach\w*|alias|resize_|contiguous|to|lift\w*|size|stride|numel"
    r"|result_type|set_|is_nonzero|item|_local_scalar_dense)$"
)
_CPU_EXCLUDED = ("enumerate(DataLoader)", "c10d::", "record_param_comms", "gloo:", "nccl:")
CPU_OP_CLASSES = ("gemm_conv", "pointwise", "framework")


def classify_cpu_op(name: str) -> str | None:
    """'gemm_conv' | 'pointwise' (memory-bound math) | 'framework' | None (not compute)."""
    if name.startswith(_CPU_EXCLUDED) or name.startswith("ProfilerStep#"):
        return None
    if _CPU_GEMM.match(name):
        return "gemm_conv"
    if name.startswith("aten::"):
        return "framework" if _CPU_FRAMEWORK_ATEN.match(name) else "pointwise"
    return "framework"


def cpu_op_classes(ops: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per class of ``top_ops`` rows: self time, op count, fraction of classified self time."""
    out = {c: {"self_ns": 0.0, "count": 0.0, "fraction": 0.0} for c in CPU_OP_CLASSES}
    if ops is None or ops.empty:
        return out
    for name, count, self_ns in zip(ops["name"], ops["count"], ops["self_ns"], strict=False):
        cls = classify_cpu_op(str(name))
        if cls is not None:
            out[cls]["self_ns"] += float(self_ns)
            out[cls]["count"] += float(count)
    total = sum(v["self_ns"] for v in out.values())
    for v in out.values():
        v["fraction"] = v["self_ns"] / total if total else 0.0
    return out
