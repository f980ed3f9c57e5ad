"""Plotly figures for the dashboard: plain functions from DataFrames to figures.

No Streamlit in here, so each chart can be built (and checked) outside a page. Times
on screen are milliseconds for steps and seconds since the run's start for
timelines: the units people read off a profiler. Colours are fixed per category so a
category looks the same on every chart and both sides of a comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from stepscope.analyzers.stacks import CATEGORIES as PHASES
from stepscope.analyzers.stacks import LABELS as PHASE_LABELS

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
#: step phases of the stack samples (analyzers.stacks), coloured like the trace categories
#: they correspond to: data loading as DataLoader, the model's work in blues, syncs red
PHASE_COLORS = {
    "data_loading": "#F58518",
    "forward": "#4C78A8",
    "backward": "#72B7B2",
    "optimizer": "#B279A2",
    "sync": "#E45756",
    "elsewhere": "#BAB0AC",
}
#: the two sides of a comparison
SIDE_COLORS = ("#4C78A8", "#F58518")
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

#: system panels: (title, unit, [(sample column or gpu suffix, label)]); GPU panels
#: are repeated for every gpuN scope found in the samples
SYSTEM_PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "CPU %",
        "pct",
        [
            ("proc.cpu_percent", "job"),
            ("proc.cpu_max_thread_percent", "busiest thread"),
            ("system.cpu_percent", "machine"),
        ],
    ),
    ("memory", "bytes", [("proc.rss_bytes", "job RSS")]),
    (
        "disk",
        "rate",
        [
            ("proc.read_bytes_per_s", "job read"),
            ("system.disk_read_bytes_per_s", "machine read"),
            ("system.disk_write_bytes_per_s", "machine write"),
        ],
    ),
]
GPU_PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("GPU util %", "pct", [("util_percent", "util")]),
    (
        "GPU memory",
        "bytes",
        [("mem_used_bytes", "used"), ("job_mem_used_bytes", "job")],
    ),
    ("GPU power", "watts", [("power_w", "power")]),
]
_UNIT_SCALE = {
    "pct": (1.0, "%"),
    "bytes": (2**20, "MiB"),
    "rate": (2**20, "MiB/s"),
    "watts": (1, "W"),
}


def _layout(fig: go.Figure, height: int, **kw: Any) -> go.Figure:
    fig.update_layout(
        height=height,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        **kw,
    )
    return fig


def _step_labels(frame: pd.DataFrame) -> list[str]:
    """'12' for one rank, 'r1 #12' when several ranks share the axis."""
    if frame["rank"].nunique() > 1:
        return [f"r{r} #{s}" for r, s in zip(frame["rank"], frame["step"], strict=True)]
    return [str(s) for s in frame["step"]]


# -- one run -------------------------------------------------------------------------
def breakdown_bars(per_step: pd.DataFrame, categories: Sequence[str]) -> go.Figure:
    """Stacked bars per step, ms per category (the trace engine's breakdown.per_step).

    Categories that are zero in every step are left out of the legend: a CPU job has
    no Kernel/Memcpy, and eight empty legend entries say nothing.
    """
    x = _step_labels(per_step)
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
    return _layout(fig, 320)


def wait_compute_bars(steps: pd.DataFrame) -> go.Figure:
    """Per step: time blocked on the DataLoader and the rest, from the step timer."""
    df = steps.sort_values(["rank", "step"])
    total = (df["end_s"] - df["start_s"]).clip(lower=0).to_numpy()
    wait = np.minimum(df["data_wait_s"].fillna(0).to_numpy(), total)
    x = _step_labels(df)
    fig = go.Figure()
    fig.add_bar(
        name="data wait",
        x=x,
        y=wait * 1e3,
        marker_color=CATEGORY_COLORS["data wait"],
        hovertemplate="data wait: %{y:.1f} ms<extra>step %{x}</extra>",
    )
    fig.add_bar(
        name="compute",
        x=x,
        y=(total - wait) * 1e3,
        marker_color=CATEGORY_COLORS["compute"],
        hovertemplate="rest of the step: %{y:.1f} ms<extra>step %{x}</extra>",
    )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="step", type="category")
    fig.update_yaxes(title="ms")
    return _layout(fig, 320)


def step_time_chart(steps: pd.DataFrame, warmup_steps: int, median_s: float | None) -> go.Figure:
    """Step time over the run; warm-up and profiled steps (left out of the figures) marked."""
    fig = go.Figure()
    for rank, g in steps.sort_values(["rank", "step"]).groupby("rank"):
        g = g.reset_index(drop=True)
        ms = (g["end_s"] - g["start_s"]).to_numpy() * 1e3
        kind = np.where(
            g.index < warmup_steps,
            "warm-up",
            np.where(g["profiled"].fillna(0).astype(bool), "profiled", "timed"),
        )
        prefix = f"rank {rank} " if steps["rank"].nunique() > 1 else ""
        for label, colour in (
            ("timed", "#4C78A8"),
            ("warm-up", "#BAB0AC"),
            ("profiled", "#E45756"),
        ):
            sel = kind == label
            if not sel.any():
                continue
            fig.add_scatter(
                name=prefix + label,
                x=g.loc[sel, "step"],
                y=ms[sel],
                mode="markers+lines" if label == "timed" else "markers",
                marker={"color": colour, "size": 6},
                line={"width": 1},
                hovertemplate="step %{x}: %{y:.1f} ms<extra>" + label + "</extra>",
            )
    if median_s is not None:
        fig.add_hline(
            y=median_s * 1e3,
            line_dash="dot",
            annotation_text=f"median {median_s * 1e3:.1f} ms",
            annotation_position="top left",
        )
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="step time (ms)", rangemode="tozero")
    return _layout(fig, 300)


def _panels(columns: Sequence[str]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """SYSTEM_PANELS and GPU_PANELS reduced to the series present in ``columns``."""
    cols = set(columns)
    out = []
    for title, unit, series in SYSTEM_PANELS:
        present = [(c, label) for c, label in series if c in cols]
        if present:
            out.append((title, unit, present))
    gpus = sorted({c.split(".")[0] for c in cols if c.startswith("gpu")})
    for title, unit, series in GPU_PANELS:
        present = [
            (f"{gpu}.{suffix}", f"{gpu} {label}" if len(gpus) > 1 else label)
            for gpu in gpus
            for suffix, label in series
            if f"{gpu}.{suffix}" in cols
        ]
        if present:
            out.append((title, unit, present))
    return out


def system_timelines(
    sides: Mapping[str, tuple[pd.DataFrame, float]],
    compact: bool | None = None,
    height_per_panel: int = 170,
) -> go.Figure | None:
    """CPU, memory, disk and GPU panels on one shared time axis (seconds since start).

    ``sides`` maps a label to (wide samples, the run's start time): one entry for a
    run's page, two for a comparison. ``compact`` (the default for two sides) keeps
    the job's own series only, one colour per run, so two runs overlaid stay readable.
    Each panel's name and unit is its y-axis title, which leaves the top of the figure
    to the legend. None when there are no samples at all.
    """
    compact = len(sides) > 1 if compact is None else compact
    columns: set[str] = set()
    for wide, _ in sides.values():
        columns.update(wide.columns)
    panels = _panels(sorted(columns))
    if compact:
        panels = [(title, unit, series[:1]) for title, unit, series in panels]
    if not panels:
        return None
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.03)
    shown: set[str] = set()
    for row, (title, unit, series) in enumerate(panels, start=1):
        scale, unit_label = _UNIT_SCALE[unit]
        fig.update_yaxes(title_text=f"{title} ({unit_label})", row=row, col=1)
        for side_i, (side, (wide, t0)) in enumerate(sides.items()):
            t = wide.index.to_numpy(dtype=float) - t0
            for col, label in series:
                if col not in wide:
                    continue
                y = wide[col].to_numpy(dtype=float) / scale
                ok = np.isfinite(y)
                name = side if compact else label
                fig.add_scatter(
                    x=t[ok],
                    y=y[ok],
                    name=name,
                    legendgroup=name,
                    showlegend=name not in shown,
                    mode="lines",
                    line={"color": SIDE_COLORS[side_i % 2] if compact else None, "width": 1.5},
                    row=row,
                    col=1,
                    hovertemplate=f"{label}: %{{y:.3g}} {unit_label}<extra>{side}</extra>",
                )
                shown.add(name)
    fig.update_xaxes(title="seconds since start", row=len(panels), col=1)
    return _layout(fig, 60 + height_per_panel * len(panels), hovermode="x")


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
    return _layout(fig, 300)


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
    return _layout(fig, max(260, int(40 + 22 * y0)))


# -- stack samples (attached processes) ----------------------------------------------------
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
    return _layout(fig, 60 + 38 * max(len(shares), 1), showlegend=False)


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
    return _layout(fig, 280)


# -- two runs ---------------------------------------------------------------------------
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
    return _layout(fig, 80 + 50 * max(len(cats), 1))


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
    return _layout(fig, 340, showlegend=False)


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
    return _layout(fig, 300)


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
    return _layout(fig, 120 + 40 * len(rows))
