"""Host-device synchronisations: which runtime calls made the host wait, and which
operator of the job issued them.

A sync inside the loop (``loss.item()``, ``.cpu()``, a data-dependent shape) stops the
host from queueing the next kernels. The runtime call alone (``cudaStreamSynchronize``)
does not tell the user what to change, so each one is attributed to the innermost CPU
operator around it on the same thread (``aten::item``, ``aten::nonzero``, ...), which
is the name the "fewer syncs" advice quotes.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.breakdown import cat_mask
from stepscope.analyzers.trace.load import Trace

# Runtime calls that block the host until the device is done (CUDA and HIP). cudaMemcpy
# without Async is synchronous with respect to the host as well.
SYNC_CALL = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyWithStream)$"
)

COLUMNS = ["call", "op", "count", "total_ns"]
MAX_WALK_BACK = 5000  # operators looked at per sync before it counts as outside any


def host_device_syncs(trace: Trace) -> pd.DataFrame:
    """One row per (runtime call, issuing operator): count and time the host waited."""
    ev = trace.events
    runtime = np.flatnonzero(cat_mask(ev, ("cuda_runtime", "cuda_driver")))
    if runtime.size == 0:
        return pd.DataFrame(columns=COLUMNS)
    # match the few distinct names once, not every row (a 1 M-event trace has ~10^5 calls)
    names = ev["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        names = names.astype("category")
    categories = names.cat.categories
    sync_name = np.fromiter(
        (bool(SYNC_CALL.match(str(c))) for c in categories), bool, len(categories)
    )
    codes = names.cat.codes.to_numpy()[runtime]
    is_sync = (codes >= 0) & sync_name[np.maximum(codes, 0)]
    if not is_sync.any():
        return pd.DataFrame(columns=COLUMNS)
    syncs = ev.iloc[runtime[is_sync]][["pid", "tid", "name", "ts", "end", "dur"]]
    is_op = cat_mask(ev, ("cpu_op",))
    rows = []
    for (pid, tid), group in syncs.groupby(["pid", "tid"], observed=True, sort=False):
        on_thread = is_op & (ev["pid"].to_numpy() == pid) & (ev["tid"].to_numpy() == tid)
        thread_ops = ev.loc[on_thread, ["ts", "end", "name"]].sort_values("ts")
        starts = thread_ops["ts"].to_numpy()
        ends = thread_ops["end"].to_numpy()
        op_names = thread_ops["name"].astype(str).to_numpy()
        for s in group.itertuples(index=False):
            rows.append((str(s.name), _innermost(starts, ends, op_names, s.ts, s.end), s.dur))
    df = pd.DataFrame(rows, columns=["call", "op", "dur"])
    out = (
        df.groupby(["call", "op"], sort=False)["dur"]
        .agg(count="count", total_ns="sum")
        .reset_index()
        .sort_values("total_ns", ascending=False, ignore_index=True)
    )
    return out[COLUMNS]


def _innermost(starts: np.ndarray, ends: np.ndarray, names: np.ndarray, ts: int, end: int) -> str:
    """The latest-starting operator that contains [ts, end]; '' when none does."""
    i = int(np.searchsorted(starts, ts, side="right")) - 1
    stop = max(-1, i - MAX_WALK_BACK)
    while i > stop:
        if ends[i] >= end:
            return str(names[i])
        i -= 1
    return ""
