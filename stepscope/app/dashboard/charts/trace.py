"""A profiler capture: the memory curve, and one step's timeline lanes
(``analyzers.steps.timeline.step_timeline``) as a flame chart."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stepscope.app.dashboard.charts.style import layout

_LANE_COLORS = {
    "cpu_op": "#9D755D",
    "user_annotation": "#B279A2",
    "cuda_runtime": "#E45756",
    "cuda_driver": "#FF9DA6",
    "kernel": "#4C78A8",
    "gpu_memcpy": "#72B7B2",
    "gpu_memset": "#54A24B",
    "gpu_user_annotation": "#BAB0AC",
}


def memory_curve_chart(curve: pd.DataFrame) -> go.Figure:
    """Allocated (and reserved, where the allocator reports it) per device over the capture."""
    fig = go.Figure()
    t0 = int(curve["ts"].min()) if len(curve) else 0
    for device, g in curve.groupby("device", sort=True):
        t = (g["ts"].to_numpy() - t0) / 1e6
        fig.add_scatter(
            x=t,
            y=g["allocated"].to_numpy() / 2**20,
            name=f"{device} allocated",
            mode="lines",
            line={"shape": "hv"},
            hovertemplate="%{y:.1f} MiB<extra>%{x:.1f} ms</extra>",
        )
        if (g["reserved"] > 0).any():
            fig.add_scatter(
                x=t,
                y=g["reserved"].to_numpy() / 2**20,
                name=f"{device} reserved",
                mode="lines",
                line={"shape": "hv", "dash": "dot"},
                hovertemplate="%{y:.1f} MiB<extra>%{x:.1f} ms</extra>",
            )
    fig.update_xaxes(title="ms since the capture's first allocation")
    fig.update_yaxes(title="MiB", rangemode="tozero")
    return layout(fig, 300)


def step_timeline_chart(tl: pd.DataFrame) -> go.Figure:
    """Flame-chart lanes: one band per host thread / device stream, nested ranges stacked.

    One bar trace per event category (bars with a base), so the legend doubles as a
    filter; hover shows the name and duration.
    """

    # host threads first, then device streams in number order, GPU annotations last
    def lane_order(name: str) -> tuple[int, int, str]:
        kind, _, num = name.partition(" ")
        rank = {"thread": 0, "stream": 1}.get(kind, 2)
        return (rank, int(num) if num.lstrip("-").isdigit() else 0, name)

    lanes = sorted(tl["lane"].unique(), key=lane_order)
    depth_max = {ln: int(tl.loc[tl["lane"] == ln, "depth"].max()) + 1 for ln in lanes}
    # each lane gets a band whose height grows with its nesting, capped for readability
    heights = {ln: min(depth_max[ln], 8) for ln in lanes}
    offsets, y0 = {}, 0.0
    for ln in lanes:
        offsets[ln] = y0
        y0 += heights[ln] + 0.6
    fig = go.Figure()
    depth = tl["depth"].clip(upper=7).to_numpy()
    y = np.array([offsets[ln] for ln in tl["lane"]]) + depth + 0.5
    for cat in tl["cat"].unique():
        sel = (tl["cat"] == cat).to_numpy()
        names = tl.loc[sel, "name"].to_numpy()
        durs = tl.loc[sel, "dur_ms"].to_numpy()
        fig.add_bar(
            name=cat,
            orientation="h",
            base=tl.loc[sel, "start_ms"].to_numpy(),
            x=durs,
            y=y[sel],
            width=0.9,
            marker_color=_LANE_COLORS.get(cat, "#888888"),
            customdata=np.stack([names, durs], axis=1),
            hovertemplate="%{customdata[0]}<br>%{customdata[1]:.3f} ms<extra>" + cat + "</extra>",
        )
    fig.update_yaxes(
        tickvals=[offsets[ln] + heights[ln] / 2 for ln in lanes],
        ticktext=lanes,
        autorange="reversed",
        showgrid=False,
    )
    fig.update_xaxes(title="ms since the step's start")
    fig.update_layout(barmode="overlay", bargap=0)
    return layout(fig, max(260, int(40 + 22 * y0)))
