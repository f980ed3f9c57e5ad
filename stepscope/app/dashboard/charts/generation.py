"""A generation run's figures: request distributions, token latency against position, and
the prefill / decode / other split of each request.

Times are milliseconds, as on the other step charts. The position chart is the KV-cache
picture: a decode that keeps its cache costs about the same per token at every position,
one that re-runs the whole context (nanoGPT's ``sample.py``) grows with it; the median
over requests draws the line, each request's own tokens stay faint behind it so that a
spread (or one slow request) is seen too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stepscope.app.dashboard.charts.style import layout, mark_times

REQUEST_COLOR = "#4C78A8"
# the request's phases (``analyzers/steps/generation.py``), drawn in this order, bottom first
PHASE_COLORS = {"prefill": "#F58518", "decode": "#4C78A8", "other": "#BAB0AC"}
LATENCY_COLOR = "#4C78A8"
FORWARD_COLOR = "#E45756"
# the faint per-request points: at most this many (a long run's are sampled, seeded)
MAX_TOKEN_POINTS = 20_000
MARKED = (("p50", "dot"), ("p99", "longdash"))
# fewer requests than this are drawn as points, not as a histogram
HISTOGRAM_FROM = 20


def distribution_chart(
    seconds: np.ndarray | pd.Series, figures: Mapping[str, float] | None, what: str
) -> go.Figure:
    """One per-request figure (ms) over the timed requests, with its p50 and p99 as
    vertical lines; ``what`` names it on the axis ("request latency"). A histogram from
    ``HISTOGRAM_FROM`` requests on; below that each request is a point (a histogram of
    three values is one bar, and says nothing)."""
    values = np.asarray(seconds, dtype=float)
    values = values[np.isfinite(values)] * 1e3
    fig = go.Figure()
    if values.size >= HISTOGRAM_FROM:
        fig.add_histogram(
            x=values,
            name=what,
            marker_color=REQUEST_COLOR,
            opacity=0.8,
            hovertemplate="%{x} ms: %{y} requests<extra></extra>",
        )
        fig.update_yaxes(title="requests")
    else:
        fig.add_scatter(
            x=values,
            y=np.zeros(values.size),
            name=what,
            mode="markers",
            marker={"color": REQUEST_COLOR, "size": 10, "opacity": 0.7},
            hovertemplate="%{x:.2f} ms<extra></extra>",
        )
        fig.update_yaxes(visible=False, range=[-1, 1])
    marks = [(n, v, dash) for n, dash in MARKED if (v := (figures or {}).get(n)) is not None]
    mark_times(fig, marks, "x")
    fig.update_xaxes(title=f"{what} (ms)")
    return layout(fig, 280, showlegend=False)


def position_chart(tokens: pd.DataFrame, profile: pd.DataFrame) -> go.Figure:
    """Per decoded token: its inter-token latency (ms) at its position (the context it
    was computed over), every request's faint; the median over requests per position of
    the inter-token latency and of the forward's own time as lines.

    ``tokens``: ``token_latencies``; ``profile``: ``position_profile`` of it.
    """
    points = tokens
    if len(points) > MAX_TOKEN_POINTS:
        points = points.sample(n=MAX_TOKEN_POINTS, random_state=0)
    fig = go.Figure()
    fig.add_scatter(
        name="each request's tokens",
        x=points["position"].to_numpy(dtype=float),
        y=points["latency_s"].to_numpy(dtype=float) * 1e3,
        mode="markers",
        marker={"color": LATENCY_COLOR, "size": 5, "opacity": 0.3},
        customdata=points["request"].to_numpy(),
        hovertemplate="request %{customdata}, position %{x}: %{y:.2f} ms<extra></extra>",
    )
    for column, name, colour in (
        ("latency_s", "median inter-token latency", LATENCY_COLOR),
        ("forward_s", "median forward time", FORWARD_COLOR),
    ):
        fig.add_scatter(
            name=name,
            x=profile["position"].to_numpy(dtype=float),
            y=profile[column].to_numpy(dtype=float) * 1e3,
            mode="lines",
            line={"color": colour, "width": 2},
            customdata=profile["requests"].to_numpy(),
            hovertemplate="position %{x}: %{y:.2f} ms (%{customdata} requests)<extra></extra>",
        )
    fig.update_xaxes(title="position (context length, tokens)")
    fig.update_yaxes(title="per token (ms)", rangemode="tozero")
    return layout(fig, 340)


def split_chart(requests: pd.DataFrame) -> go.Figure:
    """Each finished request's time as stacked bars (ms): prefill (the first forward),
    decode (the other forwards) and other (sampling, the loop's own work).

    ``requests``: ``requests_frame`` rows of the finished requests, in order.
    """
    labels = _request_labels(requests)
    fig = go.Figure()
    for phase, colour in PHASE_COLORS.items():
        fig.add_bar(
            name=phase,
            x=labels,
            y=requests[f"{phase}_s"].fillna(0.0).to_numpy(dtype=float) * 1e3,
            marker_color=colour,
            hovertemplate=f"request %{{x}}: {phase} %{{y:.1f}} ms<extra></extra>",
        )
    fig.update_layout(barmode="stack", bargap=0.15 if len(labels) <= 60 else 0.0)
    fig.update_xaxes(title="request", type="category")
    fig.update_yaxes(title="time (ms)")
    return layout(fig, 340)


def _request_labels(requests: pd.DataFrame) -> list[str]:
    """'3' for one rank, 'r1 #3' when several ranks' requests share the axis."""
    if requests["rank"].nunique() > 1:
        return [f"r{r} #{q}" for r, q in zip(requests["rank"], requests["request"], strict=True)]
    return [str(q) for q in requests["request"]]


__all__ = ["distribution_chart", "position_chart", "split_chart"]
