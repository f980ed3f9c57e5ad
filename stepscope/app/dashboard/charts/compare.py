"""Two runs side by side (the Compare page), and an experiment's fixes (Optimize)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stepscope.app.dashboard.charts.style import SIDE_COLORS, layout


def breakdown_compare(shares: Mapping[str, Mapping[str, float]], order: Sequence[str]) -> go.Figure:
    """Share of step time per category, one bar group per run (before/after)."""
    fig = go.Figure()
    cats = [c for c in order if any(s.get(c, 0) > 0 for s in shares.values())]
    for i, (side, s) in enumerate(shares.items()):
        fig.add_bar(
            name=side,
            y=cats,
            x=[100 * s.get(c, 0.0) for c in cats],
            orientation="h",
            marker_color=SIDE_COLORS[i % 2],
            hovertemplate="%{y}: %{x:.1f} %<extra>" + side + "</extra>",
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="% of step time", range=[0, 100])
    fig.update_yaxes(autorange="reversed")
    return layout(fig, 80 + 50 * max(len(cats), 1))


def step_time_distributions(times: Mapping[str, np.ndarray]) -> go.Figure:
    """Violin + box of each run's timed step times (ms): the spread behind the medians."""
    fig = go.Figure()
    for i, (side, t) in enumerate(times.items()):
        fig.add_violin(
            name=side,
            y=np.asarray(t) * 1e3,
            box_visible=True,
            meanline_visible=False,
            points="all",
            line_color=SIDE_COLORS[i % 2],
            hovertemplate="%{y:.1f} ms<extra>" + side + "</extra>",
        )
    fig.update_yaxes(title="step time (ms)", rangemode="tozero")
    return layout(fig, 340, showlegend=False)


def loss_overlay(steps: Mapping[str, pd.DataFrame]) -> go.Figure | None:
    """Rank-0 loss per step of each run on one axis; None when no run logged a loss."""
    fig = go.Figure()
    any_loss = False
    for i, (side, df) in enumerate(steps.items()):
        if df.empty or "loss" not in df:
            continue
        r0 = df[df["rank"] == df["rank"].min()].sort_values("step")
        r0 = r0[np.isfinite(r0["loss"].to_numpy(dtype=float))]
        if r0.empty:
            continue
        any_loss = True
        # the first run wide and pale, the second thin and dashed on top: runs with the
        # same losses (a fix that keeps numerics) must still show both lines
        fig.add_scatter(
            x=r0["step"],
            y=r0["loss"],
            name=side,
            mode="lines+markers",
            marker={"size": 7 if i == 0 else 4, "color": SIDE_COLORS[i % 2]},
            line={
                "color": SIDE_COLORS[i % 2],
                "width": 5 if i == 0 else 1.5,
                "dash": "solid" if i == 0 else "dash",
            },
            opacity=0.5 if i == 0 else 1.0,
            hovertemplate="step %{x}: %{y:.4g}<extra>" + side + "</extra>",
        )
    if not any_loss:
        return None
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="loss")
    return layout(fig, 300)


def fix_speedups(fixes: Sequence[Mapping[str, Any]]) -> go.Figure | None:
    """Per fix: the measured speed-up with its 95 % interval, and the predicted bounds.

    A bound is a ceiling, not an estimate, so it is drawn as a tick the bar should stay
    under; a bar beyond it means the diagnosis under-read the share it could win back.
    None when no fix was measured.
    """
    rows = [f for f in fixes if f.get("measured") is not None]
    if not rows:
        return None
    names = [f["id"] for f in rows]
    measured = [float(f["measured"]) for f in rows]
    lo = [
        m - float(f["ci"][0]) if f.get("ci") else 0.0 for m, f in zip(measured, rows, strict=True)
    ]
    hi = [
        float(f["ci"][1]) - m if f.get("ci") else 0.0 for m, f in zip(measured, rows, strict=True)
    ]
    colors = [
        "#54A24B" if f.get("kept") else "#E45756" if f.get("verdict") == "slower" else "#BAB0AC"
        for f in rows
    ]
    fig = go.Figure()
    fig.add_bar(
        x=measured,
        y=names,
        orientation="h",
        name="measured",
        marker_color=colors,
        error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
        hovertemplate="%{y}: %{x:.2f}x measured<extra></extra>",
    )
    for key, label, symbol in (
        ("predicted", "bound (diagnosis)", "line-ns"),
        ("predicted_in_experiment", "bound (these trials)", "diamond-tall"),
    ):
        xs = [f.get(key) for f in rows]
        if any(x is not None for x in xs):
            fig.add_scatter(
                x=xs,
                y=names,
                mode="markers",
                name=label,
                marker={"symbol": symbol, "size": 16, "color": "#333", "line": {"width": 2}},
                hovertemplate="%{y}: ≤ %{x:.2f}x<extra>" + label + "</extra>",
            )
    fig.add_vline(x=1.0, line_dash="dot", line_color="#888")
    fig.update_xaxes(title="speed-up (x), throughput", rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    return layout(fig, 120 + 40 * len(rows))
