"""The run page's sections for a run recorded by attaching to a process: no step timer
and no trace, but the process's stack samples, split into step phases."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from stepscope.analyzers.steps.stacks import LABELS
from stepscope.app.dashboard import data
from stepscope.app.dashboard.charts import stacks as stack_charts
from stepscope.app.dashboard.stack_data import StackView
from stepscope.app.formats import fmt_bytes, fmt_pct


def attach_headline(d: data.RunData, view: StackView | None) -> None:
    """The headline of an attached run: it has no step timer, so no step figures; what
    it has is the process, how long it was watched and how many stack samples it gave."""
    cfg = d.run.get("config") or {}
    label, peak = data.peak_memory(d.samples)
    top = None
    if view is not None and not view.shares.empty and view.samples:
        top = view.shares.sort_values("share", ascending=False).iloc[0]
    end = d.run["ended_at"] or time.time()
    cols = st.columns(5)
    cols[0].metric("process", str(cfg.get("attached_pid", "—")))
    cols[1].metric(
        "recorded",
        f"{end - d.run['started_at']:.0f} s",
        help=f"of the {cfg.get('duration_s', 0):g} s asked for" if cfg.get("duration_s") else None,
    )
    cols[2].metric("stack samples", f"{view.all_samples:,}" if view is not None else "0")
    cols[3].metric(
        f"main thread in {top['label']}" if top is not None else "main thread",
        fmt_pct(top["share"]) if top is not None else "—",
        help="the step phase with the most of the main thread's stack samples",
    )
    cols[4].metric(label, fmt_bytes(peak, digits=3))
    reason = ATTACH_ENDS.get(str(d.run.get("stop_reason") or ""))
    st.caption(
        "Recorded by attaching to a running process: nothing was injected into it, so there "
        "is no step timer and no trace; its Python stacks and system figures were read "
        "from outside." + (f" {reason}" if reason else "")
    )


#: how an attach ended (runs.stop_reason), in words
ATTACH_ENDS = {
    "duration": "The attach ran for the whole duration asked for.",
    "process_ended": "The process ended while attached; everything until then was kept.",
    "detached": "It was stopped early (detached); what was recorded until then was kept.",
}


def stacks_section(view: StackView, key: str = "stacks") -> None:
    """Where the main thread spends its time: phase shares, the job's own hottest lines,
    and the shares per sampling window (stacks.classify_samples over the run's samples)."""
    st.subheader("Where the main thread spends its time")
    if view.samples == 0:
        st.info(
            f"{view.all_samples:,} stack samples were recorded, but none of a main thread "
            "that could be told apart: there is nothing to split into step phases.",
            icon=":material/info:",
        )
        return
    procs = f" of {view.processes} processes (ranks), averaged" if view.processes > 1 else ""
    st.caption(
        f"{view.samples:,} Python stack samples of the main thread{procs}, taken by py-spy "
        f"from outside the process over {view.duration_s:.0f} s ({view.windows} "
        f"window{'s' if view.windows != 1 else ''}); each goes to the step phase on its "
        "stack. DataLoader workers and other threads are left out."
    )
    left, right = st.columns([2, 3])
    with left:
        st.plotly_chart(stack_charts.phase_shares_bar(view.shares), key=f"{key}_phases")
    with right:
        st.markdown("**Top lines of the job's own code**")
        sites = view.sites
        st.dataframe(
            pd.DataFrame(
                {
                    "line": sites["site"],
                    "phase": [LABELS.get(c, c) for c in sites["category"]],
                    "samples": sites["samples"].astype(int),
                    "share (%)": sites["share"].astype(float) * 100,
                }
            ),
            hide_index=True,
            key=f"{key}_sites",
            column_config={
                "line": st.column_config.TextColumn(width="medium"),
                "share (%)": st.column_config.NumberColumn(format="%.1f"),
            },
        )
    st.markdown("**Over the recording**, per sampling window")
    st.plotly_chart(stack_charts.phase_shares_over_time(view.over_time, view.t0), key=f"{key}_time")
