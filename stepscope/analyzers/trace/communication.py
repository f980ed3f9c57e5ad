"""How much of a step goes to collectives, whether it hides behind compute, and who waits.

* **share**: time covered by communication inside the step windows over the steps'
  total time. On a device that is NCCL/RCCL kernels (HTA's ``^nccl.*Kernel``); on a
  rank without device events (a CPU-only job) it is the host-side collectives, the
  ``gloo:all_reduce``-style annotations and ``c10d::`` operators.
* **overlap**: the fraction of communication time during which a compute kernel runs,
  as HTA 0.5.0's ``get_comm_comp_overlap`` (same kernel classes and event selection,
  see :mod:`.hta_rules`); on the CPU, compute is any non-collective operator.
* **per_rank / skew**: a collective ends on every rank at about the same time, when the
  last rank arrives; so inside a step the rank that spent the *least* time in
  collectives is the one the others waited for (the straggler), and every other
  rank's extra collective time is its wait. This uses durations only, never clocks
  compared across hosts, which are not synchronised.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.trace import intervals
from stepscope.analyzers.trace.breakdown import cat_mask
from stepscope.analyzers.trace.hta_rules import (
    COMMUNICATION,
    COMPUTATION,
    DEVICE_CATS,
    hta_device_events,
    kernel_types,
)
from stepscope.analyzers.trace.temporal import cpu_comm_mask

__all__ = ["combine_communication", "communication_parts", "communication_summary"]


def _comm_and_compute(trace) -> dict[int, dict]:
    """Per rank: basis, comm (s, e) and compute (s, e) arrays in exact ns."""
    ev = trace.events
    ranks = ev["rank"].to_numpy()
    ts = ev["ts"].to_numpy()
    end = ev["end"].to_numpy()
    is_dev = cat_mask(ev, DEVICE_CATS)
    ktype = np.full(len(ev), -1, dtype=np.int8)
    if is_dev.any():
        # types per distinct name, then indexed by every row's code: the same values as
        # typing the device rows alone, without filtering the name column first
        ktype[is_dev] = kernel_types(ev["name"])[is_dev]
    host_comm = cpu_comm_mask(ev)
    host_ops = cat_mask(ev, ("cpu_op",))
    out = {}
    for rank in trace.ranks:
        on = ranks == rank
        dev = on & is_dev
        if dev.any():
            comm = dev & (ktype == COMMUNICATION)
            comp = dev & (ktype == COMPUTATION)
            basis = "device"
        else:
            comm = on & host_comm
            comp = on & host_ops & ~host_comm
            basis = "cpu"
        out[int(rank)] = {
            "basis": basis,
            "comm": (ts[comm], end[comm]),
            "compute": (ts[comp], end[comp]),
        }
    return out


def _hta_overlap(trace, dev: pd.DataFrame | None = None) -> dict[int, tuple[int, int]]:
    """(overlap ns, comm ns) per rank for device ranks, with HTA's selection and rounding."""
    dev = hta_device_events(trace.events) if dev is None else dev
    if dev.empty:
        return {}
    ktype = kernel_types(dev["name"])
    r = dev["rank"].to_numpy()
    s, e = dev["ts"].to_numpy(), dev["end"].to_numpy()
    out = {}
    for rank in np.unique(r):
        on = r == rank
        comm = intervals.merge(s[on & (ktype == COMMUNICATION)], e[on & (ktype == COMMUNICATION)])
        comp = intervals.merge(s[on & (ktype == COMPUTATION)], e[on & (ktype == COMPUTATION)])
        both = intervals.intersect(comm, comp)
        out[int(rank)] = (int((both[1] - both[0]).sum()), int((comm[1] - comm[0]).sum()))
    return out


def _per_step(trace, parts: dict[int, dict]) -> pd.DataFrame:
    """One row per (rank, step): step ns, collective ns inside the step window."""
    rows = []
    merged = {rank: intervals.merge(*p["comm"]) for rank, p in parts.items()}  # once per rank
    for st in trace.steps.itertuples(index=False):
        p = parts.get(int(st.rank))
        if p is None:
            continue
        comm = intervals.clip_to_windows(
            merged[int(st.rank)], np.array([st.start]), np.array([st.end])
        )
        comm_ns = int((comm[1] - comm[0]).sum())
        first = int(comm[0][0] - st.start) if comm[0].size else -1
        rows.append(
            (int(st.rank), int(st.step), int(st.end - st.start), comm_ns, first, p["basis"])
        )
    df = pd.DataFrame(
        rows,
        columns=["rank", "step", "step_ns", "comm_ns", "first_comm_offset_ns", "basis"],
    )
    df["share"] = np.where(df["step_ns"] > 0, df["comm_ns"] / df["step_ns"].clip(lower=1), 0.0)
    return df


def _skew(per_rank: pd.DataFrame) -> pd.DataFrame | None:
    """Per step seen by several ranks: the straggler and how long the others waited."""
    multi = per_rank.groupby("step")["rank"].transform("nunique") > 1
    df = per_rank[multi & (per_rank["step"] >= 0)]
    if df.empty:
        return None
    g = df.groupby("step")
    idx_min = g["comm_ns"].idxmin()
    idx_max = g["comm_ns"].idxmax()
    out = pd.DataFrame(
        {
            "step": idx_min.index.to_numpy(),
            "straggler_rank": df.loc[idx_min.to_numpy(), "rank"].to_numpy(),
            "most_waiting_rank": df.loc[idx_max.to_numpy(), "rank"].to_numpy(),
            "min_comm_ns": g["comm_ns"].min().to_numpy(),
            "max_comm_ns": g["comm_ns"].max().to_numpy(),
            "mean_step_ns": g["step_ns"].mean().to_numpy(),
        }
    )
    out["skew_ns"] = out["max_comm_ns"] - out["min_comm_ns"]
    out["skew_share"] = out["skew_ns"] / out["mean_step_ns"].clip(lower=1)
    return out


def communication_parts(trace, dev: pd.DataFrame | None = None) -> dict:
    """What each rank contributes on its own: its collective time per step, its
    (overlap ns, comm ns) and basis. ``combine_communication`` does the cross-rank part,
    so ranks analysed in separate processes merge into the same summary."""
    parts = _comm_and_compute(trace)
    hta = _hta_overlap(trace, dev)
    overlap: dict[int, tuple[int, int]] = {}
    for rank, p in parts.items():
        if p["basis"] == "device":
            overlap[rank] = hta.get(rank, (0, 0))
        else:
            comm = intervals.merge(*p["comm"])
            both = intervals.intersect(comm, intervals.merge(*p["compute"]))
            overlap[rank] = (int((both[1] - both[0]).sum()), int((comm[1] - comm[0]).sum()))
    return {
        "per_rank": _per_step(trace, parts),
        "overlap": overlap,
        "basis": {r: p["basis"] for r, p in parts.items()},
    }


def combine_communication(pieces: list[dict]) -> dict:
    """The summary of several ranks' ``communication_parts`` (see communication_summary)."""
    frames = [p["per_rank"] for p in pieces]
    per_rank = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    comm_ns = int(per_rank["comm_ns"].sum())
    step_ns = int(per_rank["step_ns"].sum())
    overlap_by_rank: dict[int, float | None] = {}
    over_ns = total_comm = 0
    basis: dict[int, str] = {}
    for piece in pieces:
        basis.update(piece["basis"])
        for rank, (o, c) in piece["overlap"].items():
            overlap_by_rank[rank] = o / c if c else None
            over_ns += o
            total_comm += c

    skew = _skew(per_rank)
    per_rank["wait_ns"] = per_rank["comm_ns"] - per_rank.groupby("step")["comm_ns"].transform("min")
    per_rank["is_straggler"] = False
    if skew is not None:
        stragglers = set(zip(skew["step"], skew["straggler_rank"], strict=True))
        per_rank["is_straggler"] = [
            (s, r) in stragglers for s, r in zip(per_rank["step"], per_rank["rank"], strict=True)
        ]
    return {
        "share": comm_ns / step_ns if step_ns else 0.0,
        "overlap": over_ns / total_comm if total_comm else None,
        "overlap_by_rank": overlap_by_rank,
        "comm_ns": comm_ns,
        "step_ns": step_ns,
        "basis": basis,
        "per_rank": per_rank,
        "skew": skew,
    }


def communication_summary(trace, dev: pd.DataFrame | None = None) -> dict:
    """Communication share, overlap with compute, per-rank times and skew.

    Returns a dict with ``share`` (0..1 of step time, all ranks), ``overlap`` (0..1,
    None without communication), ``overlap_by_rank``, ``comm_ns``, ``step_ns``,
    ``basis`` (per rank: "device" or "cpu"), ``per_rank`` (DataFrame per rank and step:
    step_ns, comm_ns, share, wait_ns, is_straggler) and ``skew`` (DataFrame per step
    with the straggler, or None with a single rank). ``dev`` is
    ``hta_device_events(trace.events)`` when the caller already has it.
    """
    return combine_communication([communication_parts(trace, dev)])
