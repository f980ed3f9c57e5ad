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

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.intervals import merge
from stepscope.analyzers.trace.load import Trace
from stepscope.analyzers.trace.priority import (
    covered_pieces,
    per_window_sums,
    priority_segments,
    sorted_unique,
)

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


def name_mask(names: pd.Series, predicate: Callable[[str], bool]) -> np.ndarray:
    """Evaluate a name predicate once per distinct name, not once per event."""
    cats = names.cat.categories
    hit = np.zeros(len(cats) + 1, dtype=bool)  # the extra False is what code -1 (NaN) reads
    hit[:-1] = np.fromiter((bool(predicate(str(c))) for c in cats), dtype=bool, count=len(cats))
    return hit[names.cat.codes.to_numpy()]


def cat_mask(events: pd.DataFrame, cats: Iterable[str]) -> np.ndarray:
    """Rows whose 'cat' is one of ``cats``, read from the categorical's int8 codes.

    ``events["cat"] == "kernel"`` or ``np.isin(events["cat"].to_numpy(), ...)`` first
    turns the column into one Python string per row (an object array under pandas 3),
    which on a million-event trace costs more than the analysis using the mask.
    """
    col = events["cat"]
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return np.isin(col.to_numpy(), list(cats))
    wanted = set(cats)
    # a handful of categories: a Python loop beats Index.isin's setup
    hit = [c in wanted for c in col.cat.categories.tolist()]
    hit.append(False)  # code -1 (NaN) reads this last entry
    return np.array(hit, dtype=bool)[col.cat.codes.to_numpy()]


def rank_rows(events: pd.DataFrame, ranks: Iterable[int]) -> dict[int, slice | np.ndarray]:
    """Each rank's rows of ``events``: a slice when the frame is sorted by rank.

    ``load_trace`` concatenates the ranks in order, so each rank is one contiguous
    block and ``events.iloc[slice]`` is a view, where ``events[rank_col == r]`` would
    copy every column of the whole table (once per rank and per analysis).
    """
    rank = events["rank"].to_numpy()
    ranks = list(ranks)
    if rank.size < 2 or bool((rank[1:] >= rank[:-1]).all()):
        lo = np.searchsorted(rank, ranks, side="left")
        hi = np.searchsorted(rank, ranks, side="right")
        return {r: slice(int(a), int(b)) for r, a, b in zip(ranks, lo, hi, strict=True)}
    return {r: np.flatnonzero(rank == r) for r in ranks}


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
    names = ev["name"]
    host_op = cat_mask(ev, HOST_OP_CATS)
    step = name_mask(names, lambda n: n.startswith("ProfilerStep#")) & host_op
    dataloader = name_mask(names, _is_dataloader) & host_op
    comm_op = name_mask(names, _is_comm_op) & host_op
    kernel = cat_mask(ev, ("kernel",))
    external = ev["external_id"].to_numpy()
    comm_ext = external[comm_op]
    comm_ext = comm_ext[comm_ext > 0]
    comm_kernel = name_mask(names, _is_comm_kernel)
    if comm_ext.size:  # most traces have no collectives: skip a million-row isin
        comm_kernel |= np.isin(external, comm_ext)
    comm_kernel &= kernel
    return {
        "Kernel": kernel & ~comm_kernel,
        "Memcpy": cat_mask(ev, ("gpu_memcpy",)),
        "Memset": cat_mask(ev, ("gpu_memset",)),
        "Communication": comm_kernel | comm_op,
        "Runtime": cat_mask(ev, LAUNCH_CATS),
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
    corr = ev["correlation"].to_numpy()
    ts = ev["ts"].to_numpy()
    end = ev["end"].to_numpy()

    launch = cat_mask(ev, LAUNCH_CATS) & (corr >= 0)
    l_ts = ts[launch]
    l_end = end[launch]
    l_corr = corr[launch]
    j = np.searchsorted(starts, l_ts, side="right") - 1
    ok = j >= 0
    ok[ok] = l_end[ok] <= ends[j[ok]]

    work = cat_mask(ev, DEVICE_WORK_CATS)
    w_ts = ts[work]
    w_end = end[work]
    w_step, matched = _step_of_correlation(l_corr[ok], j[ok], corr[work])

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


def _step_of_correlation(
    l_corr: np.ndarray, l_step: np.ndarray, w_corr: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Step of each device event via its launch's correlation id (-1, False: no launch).

    Several launches with one id: the last one wins, as tb-profiler's dict does. A
    sort and a binary search; a pandas Series index with ``reindex`` hashes every id.
    """
    order = np.argsort(l_corr, kind="stable")
    c, st = l_corr[order], l_step[order]
    last = np.ones(c.size, dtype=bool)
    last[:-1] = c[1:] != c[:-1]
    c, st = c[last], st[last]
    if c.size == 0:
        return np.full(w_corr.size, -1, dtype=np.int64), np.zeros(w_corr.size, dtype=bool)
    pos = np.minimum(np.searchsorted(c, w_corr), c.size - 1)
    matched = c[pos] == w_corr
    return np.where(matched, st[pos], -1).astype(np.int64), matched


def adjusted_steps(trace: Trace) -> pd.DataFrame:
    """Every rank's steps after the device-side adjustment (the breakdown's windows)."""
    rows = rank_rows(trace.events, trace.ranks)
    step_rank = trace.steps["rank"].to_numpy()
    frames = []
    for rank in trace.ranks:
        ev = trace.events.iloc[rows[rank]]
        host = trace.steps[step_rank == rank]
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
    # one constructor call: a column assignment at a time re-indexes the frame each time
    cols = {c: steps[c].to_numpy() for c in ("rank", "step", "start", "end")}
    cols["duration"] = hi - lo
    cols.update({c: sums[:, k] for k, c in enumerate(CATEGORIES)})

    # Communication overlap, tb-profiler's definition: communication time that runs
    # while computation (kernels; host ops when there are no kernels) runs too.
    compute = "Kernel" if masks["Kernel"].any() else "CPU Exec"
    pair = [(ts[masks["Communication"]], end[masks["Communication"]])]
    pair.append((ts[masks[compute]], end[masks[compute]]))
    b2, l2 = _overlap_segments(pair, np.concatenate([lo, hi]))
    s2 = per_window_sums(b2, l2, 4, lo, hi)
    cols["comm_total"] = s2[:, 1] + s2[:, 3]
    cols["comm_overlap"] = s2[:, 3]
    return pd.DataFrame(cols)


def _overlap_segments(pair, extra):
    """Label pieces 0 = neither, 1 = comm only, 2 = compute only, 3 = both."""
    (cs, ce), (ks, ke) = pair
    mc, mk = merge(cs, ce), merge(ks, ke)
    bounds = sorted_unique(np.concatenate([extra.astype(np.int64), *mc, *mk]))
    if bounds.size < 2:
        return bounds, np.zeros(0, dtype=np.int8)
    label = covered_pieces(bounds, *mc).astype(np.int8)
    label += 2 * covered_pieces(bounds, *mk).astype(np.int8)
    return bounds, label


def step_breakdown(trace: Trace, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step): wall time and each category's time, in ns.

    Columns: rank, step, start, end, duration, the CATEGORIES, comm_total,
    comm_overlap. The CATEGORIES of a row add up to its duration. ``steps`` is
    ``adjusted_steps(trace)`` when the caller already has it (the report does).
    """
    steps = adjusted_steps(trace) if steps is None else steps
    rows = rank_rows(trace.events, trace.ranks)
    step_rank = steps["rank"].to_numpy()
    frames = []
    for rank in trace.ranks:
        ev = trace.events.iloc[rows[rank]]
        frames.append(_rank_breakdown(ev, steps[step_rank == rank]))
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
