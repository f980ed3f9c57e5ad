"""An attached job's stack samples: the step phases its main thread spent time in."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from stepscope.analyzers.steps.stacks import CATEGORIES as PHASES
from stepscope.analyzers.steps.stacks import LABELS as PHASE_LABELS
from stepscope.app.dashboard.charts.style import PHASE_COLORS, layout


def phase_shares_bar(shares: pd.DataFrame) -> go.Figure:
    """Share of the main thread's samples per step phase (stacks.phase_shares), one bar each.

    Every phase is drawn, zeros included, in a step's order: "no host-device syncs" is a
    finding too, and a fixed frame makes two attached runs look alike.
    """
    fig = go.Figure()
    fig.add_bar(
        y=list(shares["label"]),
        x=(shares["share"].astype(float) * 100).to_numpy(),
        orientation="h",
        marker_color=[PHASE_COLORS.get(c, "#888888") for c in shares["category"]],
        customdata=shares["samples"].to_numpy(),
        text=[f"{100 * v:.1f} %" for v in shares["share"]],
        textposition="outside",
        cliponaxis=False,
        hovertemplate="%{y}: %{x:.1f} % (%{customdata} samples)<extra></extra>",
    )
    fig.update_xaxes(title="% of the main thread's samples", range=[0, 110])
    fig.update_yaxes(autorange="reversed")
    return layout(fig, 60 + 38 * max(len(shares), 1), showlegend=False)


def phase_shares_over_time(over_time: pd.DataFrame, t0: float) -> go.Figure:
    """Phase shares per sampling window, stacked to 100 %, at seconds since the run's start.

    One bar per window, as wide as the window (a few seconds): a job that changes what
    it does (evaluation, a checkpoint, a slower epoch) shows as a change of colour.
    """
    fig = go.Figure()
    windows = over_time.drop_duplicates("t").sort_values("t")
    mid = ((windows["t"] + windows["t_end"]) / 2 - t0).to_numpy()
    width = ((windows["t_end"] - windows["t"]) * 0.92).to_numpy()
    span = [
        f"{a - t0:.0f}–{b - t0:.0f} s" for a, b in zip(windows["t"], windows["t_end"], strict=True)
    ]
    for cat in PHASES:
        g = over_time[over_time["category"] == cat]
        if g.empty or not (g["share"] > 0).any():
            continue
        share = g.set_index("t")["share"].reindex(windows["t"]).fillna(0.0).to_numpy()
        label = PHASE_LABELS.get(cat, cat)
        fig.add_bar(
            name=label,
            x=mid,
            y=share * 100,
            width=width,
            marker_color=PHASE_COLORS.get(cat),
            customdata=span,
            hovertemplate=f"{label}: %{{y:.1f}} %<extra>%{{customdata}}</extra>",
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="seconds since the start of the recording", rangemode="tozero")
    fig.update_yaxes(title="% of the window's samples", range=[0, 100])
    return layout(fig, 280)
