"""One run's steps: the breakdown of each step, and step time over the run."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stepscope.analyzers.steps.latency import process_keys
from stepscope.analyzers.steps.step_stats import evaluation_mask
from stepscope.app.dashboard.charts.style import (
    CATEGORY_COLORS,
    layout,
    mark_times,
    step_labels,
    time_unit,
)


def breakdown_bars(per_step: pd.DataFrame, categories: Sequence[str]) -> go.Figure:
    """Stacked bars per step, ms per category (the trace engine's breakdown.per_step).

    Categories that are zero in every step are left out of the legend: a CPU job has
    no Kernel/Memcpy, and eight empty legend entries say nothing.
    """
    x = step_labels(per_step)
    fig = go.Figure()
    for cat in categories:
        if cat not in per_step or not per_step[cat].any():
            continue
        fig.add_bar(
            name=cat,
            x=x,
            y=per_step[cat].to_numpy() / 1e6,
            marker_color=CATEGORY_COLORS.get(cat),
            hovertemplate=f"{cat}: %{{y:.2f}} ms<extra>step %{{x}}</extra>",
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="profiled step", type="category")
    fig.update_yaxes(title="ms")
    return layout(fig, 320)


# one colour per process (Tableau 10, the timed series' first colour kept for one process)
PROCESS_COLOURS = (
    "#4C78A8", "#F58518", "#54A24B", "#B279A2", "#72B7B2", "#EECA3B", "#9D755D", "#FF9DA6",
)  # fmt: skip


def step_time_chart(steps: pd.DataFrame, warmup_steps: int, median_s: float | None) -> go.Figure:
    """Step time over the run; warm-up and profiled steps (left out of the figures) marked.
    In ms, s or minutes by the longest step (``style.time_unit``). Each process (rank,
    training worker) has a colour of its own, and a process that only evaluated beside
    the training ones (``step_stats.evaluation_mask``) is named so."""
    fig = go.Figure()
    keys = process_keys(steps)
    many_ranks = steps["rank"].nunique() > 1
    longest = (steps["end_s"] - steps["start_s"]).max() if len(steps) else None
    unit, factor = time_unit(None if longest is None else float(longest))
    evaluating = evaluation_mask(steps) if len(steps) else pd.Series(dtype=bool)
    groups = steps.assign(_evaluation=evaluating).sort_values([*keys, "step"]).groupby(keys)
    for i, (key, g) in enumerate(groups):
        rank, worker = (*key, 0)[:2]
        g = g.reset_index(drop=True)
        ms = (g["end_s"] - g["start_s"]).to_numpy() * factor
        kind = np.where(
            g.index < warmup_steps,
            "warm-up",
            np.where(g["profiled"].fillna(0).astype(bool), "profiled", "timed"),
        )
        if g["_evaluation"].all():
            kind = np.full(len(g), "evaluation (another process)")
        prefix = f"rank {rank} " if many_ranks else ""
        prefix += f"worker {worker} " if worker else ""
        process_colour = PROCESS_COLOURS[i % len(PROCESS_COLOURS)]
        for label, colour, symbol in (
            ("timed", process_colour, "circle"),
            ("evaluation (another process)", process_colour, "diamond-open"),
            ("warm-up", "#BAB0AC", "circle-open"),
            ("profiled", "#E45756", "x"),
        ):
            sel = kind == label
            if not sel.any():
                continue
            fig.add_scatter(
                name=prefix + label,
                x=g.loc[sel, "step"],
                y=ms[sel],
                mode="markers+lines" if label == "timed" else "markers",
                marker={"color": colour, "size": 6, "symbol": symbol},
                line={"width": 1, "color": colour},
                hovertemplate=f"step %{{x}}: %{{y:.1f}} {unit}<extra>{prefix}{label}</extra>",
            )
    if median_s is not None:
        mark_times(fig, [("median", median_s, "dot")], "y", factor)
    fig.update_xaxes(title="step")
    fig.update_yaxes(title=f"step time ({unit})", rangemode="tozero")
    return layout(fig, 300)
