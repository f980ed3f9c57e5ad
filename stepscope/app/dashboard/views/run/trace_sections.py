"""The run page's sections that a profiler trace adds: memory, kernels and operators,
a step's timeline, and the trace files themselves; and the line that stands for them
while a big trace waits for its "Analyse this trace" click (``analysis_allowed``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.app.dashboard import trace_data
from stepscope.app.dashboard.charts import trace as trace_charts
from stepscope.app.formats import fmt_bytes, fmt_pct

#: what a trace's tabs say while it is held back (``analysis_allowed`` said why above)
HELD_BACK = "The trace is not analysed: the line at the top of the page says why."


def analysis_allowed(stamp: tuple, what: str = "The trace") -> bool:
    """Whether the page may analyse the trace of ``stamp`` now (``trace_data.trace_gate``).
    If not, it has said why in one line: a trace past the dashboard's size, with its size
    and the "Analyse this trace" button (a click allows it for the session); a file past
    the loader's cap or unreadable, without one. ``what`` names the trace in the line."""
    gate = trace_data.trace_gate(stamp)
    if gate.refused is not None:
        st.error(f"{what} is not analysed: {gate.refused}", icon=":material/error:")
        return False
    if not gate.ask:
        return True
    key = trace_data.click_key(stamp)
    if st.session_state.get(key):
        return True
    st.info(
        f"{what} holds {fmt_bytes(gate.json_bytes)} of JSON, more than the dashboard "
        f"analyses unasked ({fmt_bytes(gate.ask_above)}, {trace_data.ASK_ABOVE_ENV}).",
        icon=":material/info:",
    )
    st.button(  # the click's rerun finds the key set before it draws this line again
        "Analyse this trace",
        key=f"{key}_button",
        icon=":material/play_arrow:",
        on_click=st.session_state.__setitem__,
        args=(key, True),
    )
    return False


def memory_section(report: TraceReport | None, stamp: tuple | None) -> None:
    if report is None or stamp is None:
        st.info("The memory curve comes from a profiler trace; this run has none.")
        return
    mem = report.memory or {}
    if mem:
        rows = [
            {
                "device": dev,
                "peak allocated": fmt_bytes(v.get("peak_allocated_bytes")),
                "peak reserved": fmt_bytes(v.get("peak_reserved_bytes") or None),
                "capacity": fmt_bytes(v.get("capacity_bytes")),
                "peak share": fmt_pct(v.get("peak_share")),
            }
            for dev, v in mem.items()
        ]
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    curve = trace_data.trace_memory_curve(stamp)
    if curve.empty:
        st.info("The trace holds no memory events (captured without profile_memory).")
        return
    st.plotly_chart(trace_charts.memory_curve_chart(curve), key="memory_curve")


def kernels_ops_section(report: TraceReport, top: int = 15) -> None:
    k, o = report.kernels_top, report.ops_top
    if k.empty:
        st.caption("No device kernels in the trace (a CPU-only job): operators only.")
        _ops_table(o, top)
        return
    left, right = st.columns(2)
    with left:
        st.markdown("**Top kernels** (device time)")
        st.dataframe(
            pd.DataFrame(
                {
                    "kernel": k["name"],
                    "class": k["class"],
                    "calls": k["count"],
                    "total (ms)": k["total_ns"] / 1e6,
                    "mean (µs)": k["mean_ns"] / 1e3,
                    "share (%)": k["share"] * 100,
                }
            ).head(top),
            hide_index=True,
            column_config=_number_formats(),
        )
    with right:
        _ops_table(o, top)


def _ops_table(o: pd.DataFrame, top: int) -> None:
    st.markdown("**Top operators** (CPU self time)")
    if o.empty:
        st.caption("No CPU operators in the trace.")
        return
    st.dataframe(
        pd.DataFrame(
            {
                "operator": o["name"],
                "calls": o["count"],
                "self (ms)": o["self_ns"] / 1e6,
                "total (ms)": o["total_ns"] / 1e6,
                "share (%)": o["share"] * 100,
            }
        ).head(top),
        hide_index=True,
        column_config=_number_formats(),
    )


def _number_formats() -> dict[str, Any]:
    fmt = st.column_config.NumberColumn
    return {
        "total (ms)": fmt(format="%.2f"),
        "self (ms)": fmt(format="%.2f"),
        "mean (µs)": fmt(format="%.1f"),
        "share (%)": fmt(format="%.1f"),
    }


def timeline_section(stamp: tuple) -> None:
    steps = trace_data.trace_steps(stamp)
    steps = steps[steps["step"] >= 0] if (steps["step"] >= 0).any() else steps
    options = [(int(r), int(s)) for r, s in zip(steps["rank"], steps["step"], strict=True)]
    multi_rank = len({r for r, _ in options}) > 1

    def label(o: tuple[int, int]) -> str:
        step = "whole trace" if o[1] < 0 else f"step {o[1]}"
        return f"rank {o[0]} · {step}" if multi_rank else step

    pick = st.selectbox("profiled step", options, format_func=label, key="timeline_step")
    tl = trace_data.trace_step_timeline(stamp, pick[0], pick[1])
    if tl.empty:
        st.info("No operators or kernels in this step.")
        return
    total, kept = tl.attrs.get("total", len(tl)), tl.attrs.get("kept", len(tl))
    st.caption(
        "CPU threads and device streams as lanes, nested ranges stacked; "
        + (
            f"the {kept:,} longest of {total:,} events are drawn (shorter ones are not "
            "visible at this zoom)."
            if kept < total
            else f"all {total:,} events."
        )
        + " Python-tracer ranges are left out."
    )
    st.plotly_chart(trace_charts.step_timeline_chart(tl), key="timeline")


def downloads(paths: list[str], missing: list[str]) -> None:
    st.markdown("**Kineto trace files** (open unchanged in Perfetto, TensorBoard or HTA)")
    for i, p in enumerate(paths):
        path = Path(p)
        st.download_button(
            f"{path.name} ({fmt_bytes(path.stat().st_size)})",
            data=functools.partial(path.read_bytes),
            file_name=path.name,
            mime="application/gzip" if path.name.endswith(".gz") else "application/json",
            on_click="ignore",
            icon=":material/download:",
            key=f"download_{i}",
        )
    for p in missing:
        st.warning(f"{p}: recorded but no longer on disk", icon=":material/warning:")
