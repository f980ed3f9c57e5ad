"""What every dashboard chart shares: colours fixed per category, and the layout.

Colours are fixed per category so a category looks the same on every chart and both
sides of a comparison.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from stepscope.app.formats import fmt_s

#: trace-engine categories (breakdown.CATEGORIES) plus the steps table's two parts
CATEGORY_COLORS = {
    "Kernel": "#4C78A8",
    "Memcpy": "#72B7B2",
    "Memset": "#B279A2",
    "Communication": "#54A24B",
    "Runtime": "#E45756",
    "DataLoader": "#F58518",
    "CPU Exec": "#9D755D",
    "Other": "#BAB0AC",
    "data wait": "#F58518",
    "compute": "#4C78A8",
}
#: step phases of the stack samples (analyzers.steps.stacks), coloured like the trace categories
#: they correspond to: data loading as DataLoader, the model's work in blues, syncs red
PHASE_COLORS = {
    "data_loading": "#F58518",
    "forward": "#4C78A8",
    "backward": "#72B7B2",
    "optimizer": "#B279A2",
    "sync": "#E45756",
    "elsewhere": "#BAB0AC",
    "idle": "#E8E8E8",
}
#: the two sides of a comparison
SIDE_COLORS = ("#4C78A8", "#F58518")


def layout(fig: go.Figure, height: int, **kw: Any) -> go.Figure:
    fig.update_layout(
        height=height,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        **kw,
    )
    return fig


# a time axis in ms up to this many seconds, then in s, then (from 10 min) in minutes:
# a job of 58 s steps read "80k" on an axis in ms
TIME_UNITS = (("ms", 1e3, 10.0), ("s", 1.0, 600.0), ("min", 1 / 60, float("inf")))


def time_unit(longest_s: float | None) -> tuple[str, float]:
    """The unit a time axis reads in for values up to ``longest_s`` seconds, and its
    factor from seconds."""
    for unit, factor, below in TIME_UNITS:
        if longest_s is None or longest_s != longest_s or longest_s < below:
            return unit, factor
    return TIME_UNITS[-1][0], TIME_UNITS[-1][1]


def mark_times(
    fig: go.Figure, marks: list[tuple[str, float, str]], axis: str = "x", factor: float = 1e3
) -> None:
    """Lines at ``(name, seconds, dash)`` on a chart in ms (``factor``: seconds to the
    axis's unit), labelled by ``fmt_s`` (as every figure on the page) and stacked one
    under the other so that close values (a p50 next to a p95) never print on top of
    each other."""
    for i, (name, value_s, dash) in enumerate(marks):
        text = f"{name} {fmt_s(value_s)}"
        value_s = value_s * factor / 1e3  # the lines below place it at value_s * 1e3
        if axis == "x":
            fig.add_vline(x=value_s * 1e3, line_dash=dash)
            fig.add_annotation(
                x=value_s * 1e3,
                yref="paper",
                y=1 - 0.1 * i,
                text=text,
                showarrow=False,
                xanchor="left",
                xshift=3,
                bgcolor="rgba(255,255,255,0.7)",
            )
        else:
            fig.add_hline(y=value_s * 1e3, line_dash=dash)
            fig.add_annotation(
                y=value_s * 1e3,
                xref="paper",
                x=0.02 + 0.2 * i,
                text=text,
                showarrow=False,
                yanchor="bottom",
                xanchor="left",
                bgcolor="rgba(255,255,255,0.7)",
            )


def step_labels(frame: pd.DataFrame) -> list[str]:
    """'12' for one rank, 'r1 #12' when several ranks share the axis."""
    if frame["rank"].nunique() > 1:
        return [f"r{r} #{s}" for r, s in zip(frame["rank"], frame["step"], strict=True)]
    return [str(s) for s in frame["step"]]
