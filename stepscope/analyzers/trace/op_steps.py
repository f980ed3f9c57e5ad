"""Every operator call and kernel in a step, with its time: what a diff of two runs reads.

Operators are ``cpu_op`` events by *self* time (nested operators, runtime calls and
annotations excluded, as ``kernels.top_ops``), so one slower matmul shows up once, under
its own name, not again under every operator that encloses it. Device work (kernels,
copies, sets) counts its duration. Each event belongs to the step window it starts in:
an operator to its host ``ProfilerStep#``, device work to the step's device-side window
(``breakdown.adjusted_steps``, where the kernels it launched ran). Events outside every
step (the profiler's warm-up, the capture's tail) are left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.breakdown import adjusted_steps, cat_mask, name_mask
from stepscope.analyzers.trace.kernels import HOST_TREE_CATS, _self_times
from stepscope.analyzers.trace.load import Trace

COLUMNS = ["rank", "step", "kind", "name", "time_ns", "event"]
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def _in_steps(rank: np.ndarray, ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step each event starts in; -1 outside every step of its rank."""
    out = np.full(ts.size, -1, dtype=np.int64)
    for r, st in steps[steps["step"] >= 0].groupby("rank"):
        st = st.sort_values("start")
        rows = np.flatnonzero(rank == r)
        t = ts[rows]
        j = np.searchsorted(st["start"].to_numpy(), t, side="right") - 1
        ok = (j >= 0) & (t < st["end"].to_numpy()[np.maximum(j, 0)])
        out[rows[ok]] = st["step"].to_numpy()[j[ok]]
    return out


def _calls(
    kind: str,
    rank: np.ndarray,
    step: np.ndarray,
    names: np.ndarray,
    time_ns: np.ndarray,
    event: np.ndarray,
) -> pd.DataFrame:
    keep = step >= 0
    return pd.DataFrame(
        {
            "rank": rank[keep],
            "step": step[keep],
            "kind": kind,
            "name": names[keep],
            "time_ns": time_ns[keep],
            "event": event[keep],
        }
    )


def op_calls(trace: Trace, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per call inside a step: ``rank, step, kind, name, time_ns, event`` (its
    row in ``trace.events``, where its args can be found).

    ``kind`` is "operator" (self time) or "kernel" (device work); see the module
    docstring for which step an event counts in. ``steps``: ``adjusted_steps(trace)``
    when the caller has it.
    """
    ev = trace.events
    steps = adjusted_steps(trace) if steps is None else steps
    host_steps = steps[["rank", "step"]].assign(
        start=steps["host_start"].to_numpy(), end=steps["host_end"].to_numpy()
    )
    frames = []
    host = np.flatnonzero(cat_mask(ev, HOST_TREE_CATS))
    if host.size:
        cols = [ev[c].to_numpy()[host] for c in ("rank", "pid", "tid", "ts", "dur", "end")]
        self_ns = _self_times(*cols)
        is_op = cat_mask(ev, ("cpu_op",)) & ~name_mask(
            ev["name"], lambda n: n.startswith("ProfilerStep#")
        )
        ops = is_op[host]
        rank, ts = cols[0][ops], cols[3][ops]
        names = ev["name"].to_numpy()[host][ops]
        frames.append(
            _calls(
                "operator", rank, _in_steps(rank, ts, host_steps), names, self_ns[ops], host[ops]
            )
        )
    dev = np.flatnonzero(cat_mask(ev, DEVICE_WORK))
    if dev.size:
        rank, ts = ev["rank"].to_numpy()[dev], ev["ts"].to_numpy()[dev]
        names = ev["name"].to_numpy()[dev]
        dur = ev["dur"].to_numpy()[dev]
        frames.append(_calls("kernel", rank, _in_steps(rank, ts, steps), names, dur, dev))
    if not frames:
        return pd.DataFrame({c: [] for c in COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    out["name"] = out["name"].astype(str)
    return out[COLUMNS]


def step_windows(steps: pd.DataFrame) -> pd.DataFrame:
    """The (rank, step) windows the calls are counted in: a name absent from one of
    them spent 0 ns there, which a per-step mean must count."""
    return steps.loc[steps["step"] >= 0, ["rank", "step"]].reset_index(drop=True)
