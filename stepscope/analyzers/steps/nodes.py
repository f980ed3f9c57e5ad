"""Ranks grouped by node: where each rank ran, how fast it stepped, and who waited.

A multi-node job is one run whose ranks ran on several hosts (``run_ranks``: rank, host,
pid, written by each rank at its first step; ``run_members``: each node's launcher, with
its node rank). A slow node shows as all its ranks stepping slower, or as the others
waiting for it in the collectives; so the table puts each rank beside its node, with
its own step times against the fastest rank's, and, where a trace has the collectives,
the per-rank wait from ``communication.communication_summary`` (durations only: clocks
on different hosts are not compared).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = [
    "node",
    "node_rank",
    "rank",
    "pid",
    "steps",
    "median_step_s",
    "vs_fastest",
    "comm_s",
    "wait_s",
    "straggler_steps",
]


def ranks_by_node(
    ranks: pd.DataFrame,
    steps: pd.DataFrame,
    members: pd.DataFrame | None = None,
    per_rank_comm: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per rank, sorted by node then rank (columns: ``COLUMNS``).

    ``ranks``: the store's run_ranks (rank, host, pid); a rank with steps but no row
    there (a job recorded before schema 5) has node None. ``members``: run_members (host,
    node_rank). ``per_rank_comm``: ``communication_summary(...)["per_rank"]`` (rank,
    step, comm_ns, wait_ns, is_straggler), per step of the trace. ``vs_fastest`` is the
    rank's median step time over the fastest rank's (1.0 for that rank); comm_s and
    wait_s are per traced step.
    """
    known = _ranks(ranks)
    counted = _step_figures(steps)
    all_ranks = sorted(set(known) | set(counted.index))
    if not all_ranks:
        return pd.DataFrame(columns=COLUMNS)
    node_ranks = _node_ranks(members)
    comm = _comm_figures(per_rank_comm)
    fastest = counted["median_step_s"].min() if len(counted) else np.nan
    rows = []
    for rank in all_ranks:
        host, pid = known.get(rank, (None, None))
        fig = counted.loc[rank] if rank in counted.index else None
        median = float(fig["median_step_s"]) if fig is not None else np.nan
        c = comm.loc[rank] if rank in comm.index else None
        rows.append(
            {
                "node": host,
                "node_rank": node_ranks.get(host) if host is not None else None,
                "rank": rank,
                "pid": pid,
                "steps": int(fig["steps"]) if fig is not None else 0,
                "median_step_s": median,
                "vs_fastest": median / fastest if fastest and fastest > 0 else np.nan,
                "comm_s": float(c["comm_s"]) if c is not None else np.nan,
                "wait_s": float(c["wait_s"]) if c is not None else np.nan,
                "straggler_steps": int(c["straggler_steps"]) if c is not None else None,
            }
        )
    out = pd.DataFrame(rows, columns=COLUMNS)
    order = out["node_rank"].astype("float").fillna(np.inf)
    return (
        out.assign(_o=order, _h=out["node"].fillna("~"))
        .sort_values(["_o", "_h", "rank"])
        .drop(columns=["_o", "_h"])
        .reset_index(drop=True)
    )


def node_count(table: pd.DataFrame) -> int:
    """How many nodes the ranks ran on (ranks of unknown node not counted)."""
    return int(table["node"].dropna().nunique()) if len(table) else 0


def _ranks(ranks: pd.DataFrame | None) -> dict[int, tuple[str | None, int | None]]:
    if ranks is None or ranks.empty:
        return {}
    out: dict[int, tuple[str | None, int | None]] = {}
    for r in ranks.itertuples(index=False):
        pid = getattr(r, "pid", None)
        out[int(r.rank)] = (
            str(r.host) if r.host is not None else None,
            int(pid) if pid is not None and pid == pid else None,
        )
    return out


def _step_figures(steps: pd.DataFrame | None) -> pd.DataFrame:
    """Per rank: steps recorded and the median step time (the first step, warm-up, left
    out when there are others)."""
    if steps is None or steps.empty:
        return pd.DataFrame(columns=["steps", "median_step_s"])
    df = steps.assign(duration=steps["end_s"] - steps["start_s"])
    out = {}
    for rank, g in df.groupby("rank"):
        timed = g[g["step"] > g["step"].min()] if len(g) > 1 else g
        out[int(rank)] = {"steps": len(g), "median_step_s": float(timed["duration"].median())}
    return pd.DataFrame.from_dict(out, orient="index")


def _node_ranks(members: pd.DataFrame | None) -> dict[str, int]:
    """host -> node rank, where the host's launcher said (one launcher per host)."""
    if members is None or members.empty or "node_rank" not in members:
        return {}
    out: dict[str, int] = {}
    for host, g in members.groupby("host"):
        values = g["node_rank"].dropna().unique()
        if len(values) == 1:
            out[str(host)] = int(values[0])
    return out


def _comm_figures(per_rank: pd.DataFrame | None) -> pd.DataFrame:
    if per_rank is None or per_rank.empty:
        return pd.DataFrame(columns=["comm_s", "wait_s", "straggler_steps"])
    g = per_rank.groupby("rank")
    return pd.DataFrame(
        {
            "comm_s": g["comm_ns"].mean() / 1e9,
            "wait_s": g["wait_ns"].mean() / 1e9,
            "straggler_steps": g["is_straggler"].sum(),
        }
    )
