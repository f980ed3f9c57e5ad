"""Step-time breakdown by priority subtraction, with torch-tb-profiler 0.4.3's rules.

Users compare our numbers with tb-profiler's overview page, so the rules are its rules
(``profiler/event_parser.py``, ``overall_parser.py``), done with arrays:

* Categories, highest priority first: Kernel > Memcpy > Memset > Communication >
  Runtime > DataLoader > CPU Exec > Other. Each instant of a step counts once, in the
  highest category active then, so the parts add up to the step's wall time.
* Kernel: device kernels, except communication kernels (below). Memcpy/Memset: device
  copies and sets.
* Communication: kernels launched by a collective (same external id as a host
  ``nccl:*``/``gloo:*`` op), plus the host ``nccl:*``/``gloo:*`` ranges themselves.
* Runtime: CUDA runtime calls. DataLoader: host ranges named
  ``enumerate(DataLoader)#*.__next__`` or ``enumerate(DataPipe)#*``. CPU Exec: any other
  host operator or record_function range (``ProfilerStep#`` excluded; Python-tracer
  ``python_function`` ranges excluded, as tb-profiler does, since one of them spans the
  whole step). Other: the rest of the step.
* Steps are the host ``ProfilerStep#N`` ranges, then moved to the device side: a step
  ends when the last device work launched from inside it ends, and starts no earlier
  than the previous step's end; trailing steps that launched < 80 % of the previous
  step's device work are dropped (the profiler stopped before their kernels ran).

Where we knowingly differ from tb-profiler 0.4.3 (only on new-style traces; the old
resnet50 traces agree exactly): it does not know the ``cuda_runtime`` category (so
it finds no Runtime and no launches, and never moves steps to the device side on
new traces), it drops ``user_annotation`` ranges except steps and collectives, it
only knows five collective names, and it turns a ``gpu_user_annotation`` copy of
``ProfilerStep#N`` into an extra step. We count ``cuda_runtime``/``cuda_driver`` as
Runtime and launches, keep user annotations as CPU Exec, treat every ``nccl:*``/
``gloo:*`` range and every kernel named ``nccl*``/``rccl*`` as communication, and
ignore GPU-side annotations.

CPU-only traces get the same rules with no device categories: Communication is the
gloo/nccl host ranges, DataLoader the loader ranges, CPU Exec the union of all other
operators and annotations, Other the rest (Python, idle, waiting).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.intervals import merge
from stepscope.analyzers.priority import covers, per_window_sums, priority_segments
from stepscope.analyzers.trace_load import Trace

CATEGORIES = [
    "Kernel",
    "Memcpy",
    "Memset",
    "Communication",
    "Runtime",
    "DataLoader",
    "CPU Exec",
    "Other",
]
HOST_OP_CATS = ("cpu_op", "user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_WORK_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
COMM_PREFIXES = ("nccl:", "gloo:")
COMM_KERNEL_PREFIXES = ("nccl", "rccl")


def name_mask(names: pd.Series, predicate) -> np.ndarray:
    """Evaluate a name predicate once per distinct name, not once per event."""
    cats = names.cat.categories
    hit = np.fromiter((bool(predicate(str(c))) for c in cats), dtype=bool, count=len(cats))
    codes = names.cat.codes.to_numpy()
    return np.where(codes >= 0, hit[codes], False)


def _is_dataloader(name: str) -> bool:
    return (
        name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")
    ) or name.startswith("enumerate(DataPipe)#")


def _is_comm_op(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def _is_comm_kernel(name: str) -> bool:
    return name.lower().startswith(COMM_KERNEL_PREFIXES)


def role_masks(ev: pd.DataFrame) -> dict[str, np.ndarray]:
    """Boolean masks of one rank's events for each breakdown category (before priority)."""
    cat = ev["cat"].to_numpy()
    names = ev["name"]
    host_op = np.isin(cat, HOST_OP_CATS)
    step = name_mask(names, lambda n: n.startswith("ProfilerStep#")) & host_op
    dataloader = name_mask(names, _is_dataloader) & host_op
    comm_op = name_mask(names, _is_comm_op) & host_op
    kernel = cat == "kernel"
    comm_ext = ev["external_id"].to_numpy()[comm_op]
    comm_ext = comm_ext[comm_ext > 0]
    comm_kernel = kernel & (
        name_mask(names, _is_comm_kernel) | np.isin(ev["external_id"].to_numpy(), comm_ext)
    )
    return {
        "Kernel": kernel & ~comm_kernel,
        "Memcpy": cat == "gpu_memcpy",
        "Memset": cat == "gpu_memset",
        "Communication": comm_kernel | comm_op,
        "Runtime": np.isin(cat, LAUNCH_CATS),
        "DataLoader": dataloader,
        "CPU Exec": host_op & ~step & ~dataloader & ~comm_op,
    }


def device_steps(ev: pd.DataFrame, host: pd.DataFrame) -> pd.DataFrame:
    """Move one rank's host steps to the device side, as tb-profiler's
    ``_find_device_steps`` + ``_update_steps_duration`` do.

    A launch belongs to a step when it lies entirely inside the step's host range; the
    device work it launched (matched by correlation id) then extends the step's end.
    """
    host = host.sort_values("start", kind="stable").reset_index(drop=True)
    starts = host["start"].to_numpy().astype(np.int64)
    ends = host["end"].to_numpy().astype(np.int64)
    n = len(host)
    cat = ev["cat"].to_numpy()
    corr = ev["correlation"].to_numpy()

    launch = np.isin(cat, LAUNCH_CATS) & (corr >= 0)
    l_ts = ev["ts"].to_numpy()[launch]
    l_end = ev["end"].to_numpy()[launch]
    l_corr = corr[launch]
    j = np.searchsorted(starts, l_ts, side="right") - 1
    ok = j >= 0
    ok[ok] = l_end[ok] <= ends[j[ok]]
    corr_step = pd.Series(j[ok], index=l_corr[ok])
    corr_step = corr_step[~corr_step.index.duplicated(keep="last")]

    work = np.isin(cat, DEVICE_WORK_CATS)
    w_ts = ev["ts"].to_numpy()[work]
    w_end = ev["end"].to_numpy()[work]
    w_step = corr_step.reindex(corr[work]).to_numpy()
    matched = ~np.isnan(w_step)
    w_step = np.where(matched, w_step, -1).astype(np.int64)

    dev_min = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    dev_max = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    np.minimum.at(dev_min, w_step[matched], w_ts[matched])
    np.maximum.at(dev_max, w_step[matched], w_end[matched])
    np.add.at(count, w_step[matched], 1)

    out = host.copy()
    out["host_start"], out["host_end"] = starts, ends
    out["device_work"] = count
    if not matched.any():  # CPU-only, or no launch inside any step: host ranges stand
        return out[["rank", "step", "start", "end", "host_start", "host_end", "device_work"]]

    prev_end = int(starts[0])
    if count[0] > 0:  # device work launched before step 0 but finishing before it runs
        before = ~matched & (w_end < dev_min[0])
        if before.any():
            prev_end = max(prev_end, int(w_end[before].max()))
    new_start = np.empty(n, dtype=np.int64)
    new_end = np.empty(n, dtype=np.int64)
    for i in range(n):
        s = max(prev_end, int(starts[i]))
        e = int(ends[i]) if count[i] == 0 else max(int(ends[i]), int(dev_max[i]))
        e = max(e, s)
        new_start[i], new_end[i] = s, e
        prev_end = e
    out["start"], out["end"] = new_start, new_end

    keep = n
    if n > 1:
        last = np.flatnonzero(count > 0)[-1]
        keep = last + 1
        if last > 0 and count[last - 1] * 0.8 > count[last]:
            keep = last
    out = out.iloc[:keep]
    return out[["rank", "step", "start", "end", "host_start", "host_end", "device_work"]]


def adjusted_steps(trace: Trace) -> pd.DataFrame:
    """Every rank's steps after the device-side adjustment (the breakdown's windows)."""
    frames = []
    for rank in trace.ranks:
        ev = trace.events[trace.events["rank"].to_numpy() == rank]
        host = trace.steps[trace.steps["rank"] == rank]
        frames.append(device_steps(ev, host))
    return pd.concat(frames, ignore_index=True)


def _rank_breakdown(ev: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    masks = role_masks(ev)
    ts = ev["ts"].to_numpy()
    end = ev["end"].to_numpy()
    roles = [(ts[masks[c]], end[masks[c]]) for c in CATEGORIES[:-1]]
    lo = steps["start"].to_numpy().astype(np.int64)
    hi = steps["end"].to_numpy().astype(np.int64)
    bounds, label = priority_segments(roles, np.concatenate([lo, hi]))
    sums = per_window_sums(bounds, label, len(CATEGORIES), lo, hi)
    out = steps[["rank", "step", "start", "end"]].reset_index(drop=True)
    out["duration"] = hi - lo
    for k, c in enumerate(CATEGORIES):
        out[c] = sums[:, k]

    # Communication overlap, tb-profiler's definition: communication time that runs
    # while computation (kernels; host ops when there are no kernels) runs too.
    compute = "Kernel" if masks["Kernel"].any() else "CPU Exec"
    pair = [(ts[masks["Communication"]], end[masks["Communication"]])]
    pair.append((ts[masks[compute]], end[masks[compute]]))
    b2, l2 = _overlap_segments(pair, np.concatenate([lo, hi]))
    s2 = per_window_sums(b2, l2, 4, lo, hi)
    out["comm_total"] = s2[:, 1] + s2[:, 3]
    out["comm_overlap"] = s2[:, 3]
    return out


def _overlap_segments(pair, extra):
    """Label pieces 0 = neither, 1 = comm only, 2 = compute only, 3 = both."""
    (cs, ce), (ks, ke) = pair
    mc, mk = merge(cs, ce), merge(ks, ke)
    bounds = np.unique(np.concatenate([extra.astype(np.int64), *mc, *mk]))
    if bounds.size < 2:
        return bounds, np.zeros(0, dtype=np.int8)
    left = bounds[:-1]
    label = covers(*mc, left).astype(np.int8) + 2 * covers(*mk, left).astype(np.int8)
    return bounds, label


def step_breakdown(trace: Trace) -> pd.DataFrame:
    """One row per (rank, step): wall time and each category's time, in ns.

    Columns: rank, step, start, end, duration, the CATEGORIES, comm_total,
    comm_overlap. The CATEGORIES of a row add up to its duration.
    """
    steps = adjusted_steps(trace)
    rank_col = trace.events["rank"].to_numpy()
    frames = []
    for rank in trace.ranks:
        ev = trace.events[rank_col == rank]
        frames.append(_rank_breakdown(ev, steps[steps["rank"] == rank]))
    return pd.concat(frames, ignore_index=True)


def average_breakdown(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per rank: mean time per step of each category (ns) and its share of the step (%).

    Shares are mean part / mean step, tb-profiler's 'extra' column on its overview.
    """
    rows = []
    for rank, g in per_step.groupby("rank", sort=True):
        mean = g[["duration", *CATEGORIES]].mean()
        for c in CATEGORIES:
            share = 100.0 * mean[c] / mean["duration"] if mean["duration"] > 0 else 0.0
            rows.append(
                {"rank": int(rank), "category": c, "mean_ns": float(mean[c]), "percent": share}
            )
    return pd.DataFrame(rows)


def breakdown_shares(per_step: pd.DataFrame) -> dict[str, float]:
    """Category -> share of step time (0..1) over all steps of all ranks."""
    total = float(per_step["duration"].sum())
    if total <= 0:
        return {c: 0.0 for c in CATEGORIES}
    return {c: float(per_step[c].sum()) / total for c in CATEGORIES}
