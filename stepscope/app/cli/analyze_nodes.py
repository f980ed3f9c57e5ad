"""`stepscope analyze RUN`'s ranks-by-node section, for a run of several ranks.

Separate from ``analyze.py`` because it reads the run's rows (which host each rank ran
on, each node's launcher) besides the trace: a multi-node run's first question is
whether one node is the slow one.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.console import Console

from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.analyzers.steps.nodes import node_count, ranks_by_node
from stepscope.app.cli import term
from stepscope.app.cli.term import esc
from stepscope.app.formats import missing


def run_nodes(store: Any, run_id: int, report: TraceReport | None) -> pd.DataFrame:
    """The run's ranks by node (``analyzers.steps.nodes.ranks_by_node``)."""
    comm = report.communication if report is not None else None
    return ranks_by_node(
        store.ranks(run_id),
        store.steps(run_id),
        store.members(run_id),
        comm.get("per_rank") if comm else None,
    )


def nodes_json(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: None if missing(v) else v for k, v in row.items()} for row in table.to_dict("records")
    ]


def print_nodes(console: Console, table: pd.DataFrame) -> None:
    """Only for several ranks: one rank has nobody to be compared with."""
    if len(table) < 2:
        return
    nodes = node_count(table)
    t = term.table(
        title=f"Ranks by node ({nodes} node{'s' if nodes != 1 else ''}, {len(table)} ranks)"
    )
    for col in ("node", "rank", "pid", "steps", "median step ms", "vs fastest", "wait ms/step"):
        t.add_column(col, justify="left" if col == "node" else "right")
    for r in table.itertuples(index=False):
        node = "?" if r.node is None else r.node
        if not missing(r.node_rank):
            node = f"{node} (node {int(r.node_rank)})"
        t.add_row(
            esc(node),
            str(r.rank),
            "" if missing(r.pid) else str(int(r.pid)),
            str(r.steps),
            "-" if missing(r.median_step_s) else f"{r.median_step_s * 1e3:,.2f}",
            "-" if missing(r.vs_fastest) else f"{r.vs_fastest:.2f}x",
            "-" if missing(r.wait_s) else f"{r.wait_s * 1e3:,.2f}",
        )
    console.print(t)
