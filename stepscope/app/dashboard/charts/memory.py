"""The memory timeline by category: what the bytes were for, stacked, over the capture."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from stepscope.analyzers.trace.memory import TIMELINE_CATEGORIES
from stepscope.analyzers.trace.memory_peak import CATEGORY_LABELS
from stepscope.app.dashboard.charts.style import layout

#: at most this many points per category: a bucket keeps its highest total's row, so
#: the peak the breakdown is read at is always drawn
MAX_POINTS = 2000


def _thin(timeline: pd.DataFrame) -> pd.DataFrame:
    if len(timeline) <= MAX_POINTS:
        return timeline
    bucket = pd.Series(range(len(timeline)), index=timeline.index) * MAX_POINTS // len(timeline)
    keep = timeline.groupby(bucket.to_numpy())["total"].idxmax()
    return timeline.loc[sorted(keep)]


def category_timeline_chart(timeline: pd.DataFrame, peak_ts: int | None = None) -> go.Figure:
    """A stacked area per category (MiB) over ms since the capture's first event; a
    dashed line at the peak the breakdown is read at."""
    tl = _thin(timeline)
    t0 = int(tl["ts"].min()) if len(tl) else 0
    x = (tl["ts"].to_numpy() - t0) / 1e6
    fig = go.Figure()
    for cat in TIMELINE_CATEGORIES:
        if not (tl[cat] > 0).any():
            continue
        fig.add_scatter(
            x=x,
            y=tl[cat].to_numpy() / 2**20,
            name=CATEGORY_LABELS[cat],
            mode="lines",
            stackgroup="memory",
            line={"shape": "hv", "width": 0.5},
            hovertemplate="%{y:.2f} MiB<extra>" + CATEGORY_LABELS[cat] + "</extra>",
        )
    if peak_ts is not None and len(tl):
        fig.add_vline(x=(peak_ts - t0) / 1e6, line={"dash": "dash", "width": 1})
    fig.update_xaxes(title="ms since the capture's first event")
    fig.update_yaxes(title="MiB", rangemode="tozero")
    return layout(fig, 340)
