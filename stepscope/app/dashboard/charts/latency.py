"""An inference run's latency: its distribution, and how it moved over the run.

The histogram is over the timed steps only (warm-up and profiled steps would put a
compile or a profiler's overhead in the tail); the chart over time shows every step, the
left-out ones marked, because a slow warm-up or a drift is what that chart is for.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stepscope.analyzers.steps.latency import wall_times
from stepscope.app.dashboard.charts.style import layout, mark_times

ITERATION_COLOR = "#4C78A8"
MODEL_COLOR = "#72B7B2"
# the percentile lines drawn on both charts, and their dashes
MARKED = (("p50", "dot"), ("p95", "dash"), ("p99", "longdash"))


def latency_histogram(
    iteration_s: np.ndarray, model_s: np.ndarray | None, lat: Mapping[str, float | None]
) -> go.Figure:
    """Histogram of the timed steps' latency (ms), the model call's beside it when known,
    with p50/p95/p99 of the iteration as vertical lines."""
    fig = go.Figure()
    fig.add_histogram(
        x=np.asarray(iteration_s) * 1e3,
        name="iteration",
        marker_color=ITERATION_COLOR,
        opacity=0.75,
        hovertemplate="%{x} ms: %{y} steps<extra>iteration</extra>",
    )
    if model_s is not None:
        fig.add_histogram(
            x=np.asarray(model_s) * 1e3,
            name="model call",
            marker_color=MODEL_COLOR,
            opacity=0.6,
            hovertemplate="%{x} ms: %{y} steps<extra>model call</extra>",
        )
    mark_times(fig, _marks(lat, MARKED), "x")
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title="latency (ms)")
    fig.update_yaxes(title="steps")
    return layout(fig, 320)


def latency_over_time(
    steps: pd.DataFrame, timed_index: pd.Index, lat: Mapping[str, float | None], t0: float
) -> go.Figure:
    """Each step's latency (ms) at its end, in seconds since ``t0`` (the run's start);
    steps left out of the figures (not in ``timed_index``) in grey; p50 and p99 as
    horizontal lines."""
    df = steps.sort_values(["end_s"])
    x = (df["end_s"] - t0).to_numpy(dtype=float)
    y = wall_times(df) * 1e3
    timed = df.index.isin(timed_index)
    fig = go.Figure()
    for label, sel, colour in (
        ("timed", timed, ITERATION_COLOR),
        ("left out (warm-up, profiled)", ~timed, "#BAB0AC"),
    ):
        if not sel.any():
            continue
        fig.add_scatter(
            name=label,
            x=x[sel],
            y=y[sel],
            mode="markers",
            marker={"color": colour, "size": 5},
            customdata=df["step"].to_numpy()[sel],
            hovertemplate="step %{customdata} at %{x:.2f} s: %{y:.1f} ms<extra></extra>",
        )
    mark_times(fig, _marks(lat, (MARKED[0], MARKED[2])), "y")
    fig.update_xaxes(title="time since the run started (s)")
    fig.update_yaxes(title="latency (ms)", rangemode="tozero")
    return layout(fig, 320)


def _marks(
    lat: Mapping[str, float | None], marked: tuple[tuple[str, str], ...]
) -> list[tuple[str, float, str]]:
    return [(n, v, dash) for n, dash in marked if (v := lat.get(f"{n}_s")) is not None]


__all__ = ["latency_histogram", "latency_over_time"]
