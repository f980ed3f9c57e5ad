"""The Run page's "Where the peak goes": the categorised timeline, the peak's split,
the modules and the code whose blocks are live at the peak (``stepscope memory``'s
tables, ``analyzers/trace/memory_peak.py``), and on CUDA the allocator snapshot's
figures: reserved, allocated, unused, the largest free block, segments, why an
out-of-memory request failed, the job's lines holding the blocks
(``analyzers/trace/allocator_snapshot.py``)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.report.run_memory import NoMemoryData, run_memory
from stepscope.analyzers.rules.memory_state import peak_remedies
from stepscope.analyzers.trace.allocator_snapshot import AllocatorSnapshot
from stepscope.analyzers.trace.memory_peak import MemoryBreakdown
from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.charts.memory import category_timeline_chart
from stepscope.app.formats import fmt_bytes, fmt_pct


@st.cache_data(max_entries=16, show_spinner="Reading the memory timeline…")
def _breakdown(home: str, run_id: int, marker: tuple[Any, ...]) -> MemoryBreakdown | str:
    """The run's breakdown, or the line saying why there is none (cached per run state)."""
    with data.open_store(home) as store:
        try:
            return run_memory(store, run_id)
        except NoMemoryData as exc:
            return str(exc)


def peak_section(home: str, run_id: int, marker: tuple[Any, ...]) -> None:
    st.subheader("Where the peak goes")
    b = _breakdown(home, run_id, marker)
    if isinstance(b, str):
        st.info(b)
        return
    for problem in b.problems:
        st.warning(ui.no_links(problem), icon=":material/warning:")
    if b.peak_bytes is not None:
        head = f"Peak {fmt_bytes(b.peak_bytes)} on {b.device or 'the device'}"
        if b.reserved_unused_bytes and b.reserved_unused_at == "the peak":
            head += f", and {fmt_bytes(b.reserved_unused_bytes)} reserved by the allocator unused"
        st.caption(head)
    if not b.timeline.empty:
        st.plotly_chart(category_timeline_chart(b.timeline, b.peak_ts_ns), key="memory_categories")
    if len(b.peak):
        st.dataframe(
            pd.DataFrame(
                {
                    "category": b.peak["label"],
                    "at the peak": b.peak["bytes"].map(fmt_bytes),
                    "share": b.peak["share"].map(fmt_pct),
                    "max over the steps": b.peak["max_bytes"].map(fmt_bytes),
                }
            ),
            hide_index=True,
            key="memory_peak_table",
        )
        frees = peak_remedies(b.peak.to_dict("records"), b.device)
        if frees:
            st.caption("Would free (advice, from the peak's parts): " + "; ".join(frees) + ".")
    if b.allocator is not None:
        allocator_section(b.allocator)
    if b.peak_bytes is None and b.timeline.empty:
        return  # a snapshot alone: no capture's tables to show
    left, right = st.columns(2)
    with left:
        st.markdown("**Modules**: blocks allocated in their forward, live at the peak")
        if len(b.modules):
            st.dataframe(
                b.modules.assign(
                    bytes=b.modules["bytes"].map(fmt_bytes),
                    own_bytes=b.modules["own_bytes"].map(fmt_bytes),
                ),
                hide_index=True,
                key="memory_modules",
            )
        else:
            st.caption("No module scopes in the trace around the live blocks.")
    with right:
        st.markdown("**Code**: the job's innermost function (its def line), live at the peak")
        if len(b.lines):
            st.dataframe(
                b.lines.assign(bytes=b.lines["bytes"].map(fmt_bytes)),
                hide_index=True,
                key="memory_lines",
            )
        else:
            st.caption("No frame of the job's own code around the live blocks.")
    if b.attributed_bytes is not None:
        st.caption(
            f"Modules and code cover {fmt_bytes(b.attributed_bytes)} of the peak: the blocks "
            "allocated inside the capture (parameters and optimizer state made before it "
            "have no stack in the trace)."
        )


def allocator_section(a: AllocatorSnapshot) -> None:
    """The CUDA allocator snapshot's figures, at its moment (the capture's end or the
    out-of-memory error), and the job's lines holding its allocated blocks."""
    st.markdown(f"**CUDA allocator snapshot** at {a.moment} (cuda:{a.device})")
    cols = st.columns(5)
    figures = [
        ("Reserved", a.reserved_bytes, "the segments the allocator holds (memory_reserved)"),
        ("Allocated", a.allocated_bytes, "its active blocks (memory_allocated)"),
        ("Reserved unused", a.unused_bytes, "inactive blocks: cached, free for reuse"),
        (
            "Largest free block",
            a.largest_free_block_bytes,
            "a request larger than this needs a new segment, however much is free in total",
        ),
    ]
    for col, (label, value, why) in zip(cols, figures, strict=False):
        col.metric(label, fmt_bytes(value, 3), help=why)
    cols[4].metric("Segments", str(a.segments), help="cudaMalloc'd segments")
    explanation = a.explanation()
    if explanation:
        st.warning(f"Out of memory: {ui.no_links(explanation)}", icon=":material/memory:")
    if len(a.sites):
        st.dataframe(
            a.sites.assign(bytes=a.sites["bytes"].map(fmt_bytes)).rename(
                columns={"site": "the job's line (file:line in function)"}
            ),
            hide_index=True,
            key="allocator_sites",
        )
    if a.no_site_bytes:
        st.caption(
            f"{fmt_bytes(a.no_site_bytes)} allocated with no frame of the job's code (made "
            "before memory history was recorded, or by library code alone)."
        )
