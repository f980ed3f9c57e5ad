"""The run page's multi-node parts: ranks grouped by node, and system charts per host.

A run of one launcher on one host shows neither (its page stays as it was); a run whose
ranks ran on several hosts gets a table of ranks by node, with each rank's step time
against the fastest and its wait in the collectives when a trace has them, and one
set of system curves per host (each launcher's sampler writes its own host's rows).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from stepscope.analyzers.steps.nodes import node_count, ranks_by_node
from stepscope.app.dashboard import data
from stepscope.app.dashboard.charts.system import system_timelines
from stepscope.app.dashboard.tables import fmt_int, fmt_one_decimal, unknown_in_words


@st.cache_data(max_entries=64, show_spinner=False)
def _placement(
    home: str, run_id: int, marker: tuple[Any, ...]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ranks, members) of the run: which host each rank ran on, each node's launcher."""
    with data.open_store(home) as store:
        return store.ranks(run_id), store.members(run_id)


@st.cache_data(max_entries=16, show_spinner=False)
def _samples_by_host(home: str, run_id: int, marker: tuple[Any, ...]) -> dict[str, pd.DataFrame]:
    """Wide samples per host, only when the run's samples come from several hosts."""
    with data.open_store(home) as store:
        long = store.samples(run_id)
    if long.empty or "host" not in long or long["host"].nunique() < 2:
        return {}
    out = {}
    for host, g in long.groupby("host"):
        wide = g.assign(column=g["scope"] + "." + g["metric"]).pivot_table(
            index="t", columns="column", values="value", aggfunc="last"
        )
        out[str(host)] = wide
    return out


def nodes_section(
    home: str, run_id: int, marker: tuple[Any, ...], steps: pd.DataFrame, report: Any
) -> None:
    """Ranks by node, for a run of several ranks (nothing for one rank)."""
    ranks, members = _placement(home, run_id, marker)
    comm = getattr(report, "communication", None) if report is not None else None
    table = ranks_by_node(ranks, steps, members, comm.get("per_rank") if comm else None)
    if len(table) < 2:
        return
    nodes = node_count(table)
    st.subheader("Ranks by node")
    st.caption(
        f"{len(table)} ranks on {nodes} node{'s' if nodes != 1 else ''}. A node whose ranks "
        "all step slower than the fastest, or that the others wait for in the collectives, "
        "is the one holding the job back."
    )
    # in collectives: the whole time of the rank's collectives (the diagnosis's share);
    # of it, waiting: the part spent for the slowest rank to arrive (0 when all arrive
    # together, as two ranks of one host do): both said, so neither reads as the other
    shown = pd.DataFrame(
        {
            "node": [n if isinstance(n, str) else "?" for n in table["node"]],
            # floats with NaN for unknowns: turned to words ("—") where one is missing
            "node rank": table["node_rank"].astype(float),
            "rank": table["rank"],
            "pid": table["pid"].astype(float),
            "steps": table["steps"],
            "median step (ms)": table["median_step_s"].astype(float) * 1e3,
            "vs fastest": table["vs_fastest"].astype(float),
            "in collectives (ms/step)": table["comm_s"].astype(float) * 1e3,
            "of it waiting for other ranks (ms/step)": table["wait_s"].astype(float) * 1e3,
        }
    )
    ms = {c: fmt_one_decimal for c in shown.columns if c.endswith("(ms/step)")}
    words = {"node rank": fmt_int, "pid": fmt_int, "median step (ms)": fmt_one_decimal, **ms}
    st.dataframe(
        unknown_in_words(shown, words),
        hide_index=True,
        key="ranks_by_node",
        column_config={
            "node rank": st.column_config.NumberColumn(format="%d"),
            "pid": st.column_config.NumberColumn(format="%d"),
            "median step (ms)": st.column_config.NumberColumn(format="%.2f"),
            "vs fastest": st.column_config.NumberColumn(format="%.2fx"),
            **{c: st.column_config.NumberColumn(format="%.2f") for c in ms},
        },
    )
    if table["comm_s"].isna().all():
        st.caption("No collective times: they come from a profiler trace, and this run has none.")


def system_figure(
    home: str, run_id: int, marker: tuple[Any, ...], samples: pd.DataFrame, started_at: float
) -> go.Figure | None:
    """The system charts: one set of curves per host when several sampled the run."""
    per_host = _samples_by_host(home, run_id, marker)
    if per_host:
        return system_timelines({host: (wide, started_at) for host, wide in per_host.items()})
    return system_timelines({"run": (samples, started_at)})
