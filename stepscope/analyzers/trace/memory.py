"""Memory: peaks and curves from the trace's ``[memory]`` events, and torch's categorised timeline.

Two sources, two questions. The Kineto trace's ``[memory]`` instants carry the
allocator's running totals (allocated, reserved) per device, which answer "how close
to capacity did we get" and "is reserved much larger than allocated"
(fragmentation). ``torch.profiler.profile.export_memory_timeline`` raw files
answer "what was the memory *for*" (parameters, activations, gradients, optimizer
state...), which the trace alone cannot tell.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from stepscope.store import bounded_read

__all__ = [
    "ACTIONS",
    "TIMELINE_CATEGORIES",
    "load_memory_timeline",
    "memory_curve",
    "memory_summary",
    "memory_timeline_by_category",
    "memory_timeline_peaks",
]

#: c10::DeviceType codes seen in ``[memory]`` events (ROCm builds report CUDA)
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 20: "privateuse1"}

#: ``torch.profiler._memory_profiler._CATEGORY_TO_INDEX`` order (dict order of
#: ``_CATEGORY_TO_COLORS``); index 7 is ``None``: memory torch could not categorise
TIMELINE_CATEGORIES = (
    "PARAMETER",
    "OPTIMIZER_STATE",
    "INPUT",
    "TEMPORARY",
    "ACTIVATION",
    "GRADIENT",
    "AUTOGRAD_DETAIL",
    "UNKNOWN",
)
#: ``_ACTION_TO_INDEX``: Action enum values
ACTIONS = {1: "PREEXISTING", 2: "CREATE", 3: "INCREMENT_VERSION", 4: "DESTROY"}


def _device_label(device_type: int, device_id: int) -> str:
    kind = _DEVICE_TYPES.get(int(device_type), f"type{int(device_type)}")
    return kind if kind == "cpu" else f"{kind}:{int(device_id)}"


def _labelled(trace) -> pd.DataFrame:
    mem = trace.memory
    if mem.empty:
        return mem.assign(device=pd.Series(dtype=object))
    pairs = mem[["device_type", "device_id"]].drop_duplicates()
    labels = {(t, i): _device_label(t, i) for t, i in pairs.itertuples(index=False, name=None)}
    dev = [labels[(t, i)] for t, i in pairs.itertuples(index=False, name=None)]
    lookup = pairs.assign(device=dev)
    out = mem.merge(lookup, on=["device_type", "device_id"], how="left", sort=False)
    if len(trace.ranks) > 1:
        out["device"] = "rank" + out["rank"].astype(str) + "/" + out["device"]
    # old traces lack the running totals (-1): rebuild allocated from the signed deltas
    missing = out["total_allocated"] < 0
    if missing.any():
        running = out.groupby(["rank", "device"], sort=False)["bytes"].cumsum()
        out.loc[missing, "total_allocated"] = running[missing]
    return out


def _capacity(trace, rank: int, device_id: int) -> int | None:
    for prop in trace.meta.get(rank, {}).get("deviceProperties") or []:
        if isinstance(prop, dict) and prop.get("id") == device_id:
            total = prop.get("totalGlobalMem")
            return int(total) if total else None
    return None


def memory_summary(trace, rank_labels: bool | None = None) -> dict[str, dict]:
    """Per device (``cpu``, ``cuda:0``; ``rank1/cuda:0`` with several ranks): peaks in bytes.

    ``rank_labels``: prefix each device with its rank (None: when the trace has several
    ranks; True for one rank of a multi-rank job analysed on its own).

    Each entry: peak_allocated_bytes, peak_reserved_bytes (0 where the allocator does
    not report it, e.g. CPU), events, and for devices with known capacity
    (deviceProperties.totalGlobalMem) capacity_bytes and peak_share, the figure the
    "capacity" bottleneck is judged on.

    The same numbers as grouping ``_labelled(trace)`` by device (max, first, size),
    with numpy: a few devices over up to millions of rows, where the pandas merge and
    named aggregation cost more than the arithmetic.
    """
    mem = trace.memory
    out: dict[str, dict] = {}
    if mem.empty:
        return out
    rank = mem["rank"].to_numpy()
    dev_type = mem["device_type"].to_numpy()
    dev_id = mem["device_id"].to_numpy()
    multi = len(trace.ranks) > 1 if rank_labels is None else rank_labels
    # label of each distinct (rank, type, id), then one group per distinct label
    combo = np.zeros(rank.size, dtype=np.int64)
    for col in (rank, dev_type, dev_id) if multi else (dev_type, dev_id):
        codes, uniq = pd.factorize(col)
        combo = combo * len(uniq) + codes
    combo = pd.factorize(combo)[0]
    n_combo = int(combo.max()) + 1
    first_of_combo = np.full(n_combo, rank.size, dtype=np.int64)
    np.minimum.at(first_of_combo, combo, np.arange(rank.size))
    labels = [
        (f"rank{int(rank[i])}/" if multi else "") + _device_label(dev_type[i], dev_id[i])
        for i in first_of_combo.tolist()
    ]
    names = sorted(set(labels))  # groupby(sort=True) order
    group_of_combo = np.array([names.index(lab) for lab in labels], dtype=np.int64)
    group = group_of_combo[combo]

    allocated = mem["total_allocated"].to_numpy()
    missing = allocated < 0
    if missing.any():  # old traces: rebuild allocated from the signed deltas, per device
        order = np.argsort(group, kind="stable")
        running = np.cumsum(mem["bytes"].to_numpy()[order])
        g_sorted = group[order]
        start = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
        before = np.r_[0, running][start]  # running total before each group's first row
        running = running - np.repeat(before, np.diff(np.r_[start, g_sorted.size]))
        rebuilt = np.empty_like(running)
        rebuilt[order] = running
        allocated = np.where(missing, rebuilt, allocated)

    n = len(names)
    peak_alloc = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    peak_res = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(peak_alloc, group, allocated)
    np.maximum.at(peak_res, group, mem["total_reserved"].to_numpy())
    events = np.bincount(group, minlength=n)
    first = np.full(n, group.size, dtype=np.int64)
    np.minimum.at(first, group, np.arange(group.size))
    for g, device in enumerate(names):
        entry = {
            "peak_allocated_bytes": int(max(peak_alloc[g], 0)),
            "peak_reserved_bytes": int(max(peak_res[g], 0)),
            "events": int(events[g]),
        }
        row = first[g]
        if dev_type[row] != 0:
            cap = _capacity(trace, int(rank[row]), int(dev_id[row]))
            if cap:
                entry["capacity_bytes"] = cap
                entry["peak_share"] = max(entry["peak_allocated_bytes"], 0) / cap
        out[device] = entry
    return out


def memory_curve(trace, max_points: int = 2000) -> pd.DataFrame:
    """Allocated/reserved over time per device, at most ``max_points`` rows per device.

    Downsampling takes, per time bucket, the *maximum* of each series, so the curve
    keeps every peak (a plot that loses the peak would understate the capacity
    problem it is shown for). Columns: rank, device, ts (ns), allocated, reserved.
    """
    mem = _labelled(trace)
    cols = ["rank", "device", "ts", "allocated", "reserved"]
    if mem.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols}).astype({"device": object})
    frames = []
    for device, g in mem.groupby("device", sort=True):
        ts = g["ts"].to_numpy()
        alloc = g["total_allocated"].to_numpy()
        res = np.maximum(g["total_reserved"].to_numpy(), 0)
        if ts.size > max_points:
            lo, hi = ts.min(), ts.max()
            width = max((hi - lo) // max_points + 1, 1)
            bucket = (ts - lo) // width
            starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
            ts = ts[starts]
            alloc = np.maximum.reduceat(alloc, starts)
            res = np.maximum.reduceat(res, starts)
        frames.append(
            pd.DataFrame(
                {
                    "rank": np.int64(g["rank"].iloc[0]),
                    "device": device,
                    "ts": ts,
                    "allocated": alloc,
                    "reserved": res,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)[cols]


def load_memory_timeline(path: str | Path) -> pd.DataFrame:
    """Read an ``export_memory_timeline(..."*.raw.json.gz")`` file into columns.

    Rows are ``[timestamp_ns, action, bytes, category]``; bytes are already signed
    (a destroy is negative; a version bump is a -n/+n pair moving bytes between
    categories). Timestamp -1 marks memory that existed before profiling started.
    Columns: ts (int64 ns, -1 kept), action (code), action_name, bytes, category
    (code), category_name.
    """
    path = Path(path)
    data = bounded_read.read_capped(path)  # a ReadError (a ValueError) says why, in one line
    try:
        rows = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON memory timeline ({exc})") from None
    if not isinstance(rows, list) or (rows and not isinstance(rows[0], list)):
        raise ValueError(f"{path}: not a raw memory timeline (expected rows of 4 numbers)")
    try:
        arr = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"{path}: not a raw memory timeline (expected rows of 4 numbers)"
        ) from None
    cat = arr[:, 3]
    bad = (cat < 0) | (cat >= len(TIMELINE_CATEGORIES)) | ~np.isin(arr[:, 1], list(ACTIONS))
    if bad.any():  # another torch's categories or actions: not read as if they were ours
        row = arr[int(np.flatnonzero(bad)[0])].tolist()
        raise ValueError(
            f"{path}: a memory timeline row this torch does not know ({row}): "
            "from another torch version?"
        )
    return pd.DataFrame(
        {
            "ts": arr[:, 0],
            "action": arr[:, 1].astype(np.int8),
            "action_name": pd.Categorical.from_codes(
                arr[:, 1] - 1, categories=list(ACTIONS.values())
            ),
            "bytes": arr[:, 2],
            "category": cat.astype(np.int8),
            "category_name": pd.Categorical.from_codes(cat, categories=TIMELINE_CATEGORIES),
        }
    )


def memory_timeline_by_category(df: pd.DataFrame) -> pd.DataFrame:
    """Bytes live per category after each timestamp, as torch's own plot stacks them.

    Follows ``MemoryProfileTimeline._coalesce_timeline``: timestamps are truncated to
    whole microseconds and events at the same microsecond are applied together (so a
    free right after an allocation does not show as a spike); pre-existing memory
    (ts -1) is placed at the first real timestamp. Columns: ts (ns, microsecond
    resolution), one per category, total. ``.attrs["peak_bytes"]`` holds the peaks
    (see :func:`memory_timeline_peaks`).
    """
    ts = df["ts"].to_numpy()
    # torch: int(t / 1000) in floating point; reproduce it, not exact integer division
    us = np.where(ts == -1, -1, np.trunc(ts.astype(np.float64) / 1000).astype(np.int64))
    real = us[us > 0]
    t_min = int(real.min()) if real.size else 0
    us = np.where(us < 0, t_min, us)
    # keep event order within a microsecond; group consecutive equal times as torch does
    change = np.r_[True, us[1:] != us[:-1]]
    group = np.cumsum(change) - 1
    n_groups = int(group[-1]) + 1 if group.size else 0
    deltas = np.zeros((n_groups, len(TIMELINE_CATEGORIES)), dtype=np.int64)
    np.add.at(deltas, (group, df["category"].to_numpy().astype(np.int64)), df["bytes"].to_numpy())
    live = np.cumsum(deltas, axis=0)
    out = pd.DataFrame(live, columns=list(TIMELINE_CATEGORIES))
    out.insert(0, "ts", us[change] * 1000)
    out["total"] = live.sum(axis=1)
    out.attrs["peak_bytes"] = memory_timeline_peaks(out)
    return out


def memory_timeline_peaks(by_category: pd.DataFrame) -> dict[str, int]:
    """Peak bytes per category and of the total (the plot's highest point)."""
    cols = [*TIMELINE_CATEGORIES, "total"]
    if by_category.empty:
        return dict.fromkeys(cols, 0)
    return {c: int(by_category[c].max()) for c in cols}
