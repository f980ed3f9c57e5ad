"""The step's phases per step, and the roofline: plain functions, data in, figure out.

Why plain functions: a test checks a figure (its traces, log axes, the roofs' corner at
the ridge, a colour per phase) without Streamlit. The phases come from a trace
(``analyzers.steps.phases.step_phases``, ns) or from the step timer's rows (seconds: the
columns of ``collectors/steps/step_accounting.py``); ``phase_table`` turns either into one
shape, so one chart draws both. The roofline takes ``analyzers.hardware.roofline.Roofline``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stepscope.analyzers.hardware.roofline import Roofline
from stepscope.analyzers.steps.phases import PHASES
from stepscope.app.dashboard.charts.style import CATEGORY_COLORS, PHASE_COLORS, layout, step_labels
from stepscope.types import PHASE_LABELS

#: One colour per step phase, the same as the stack samples' phases and the trace
#: categories they correspond to (style.py): data wait as DataLoader, the model's work
#: in blues, syncs red, exposed communication as the Communication category.
STEP_PHASE_COLORS = {
    "data_wait": PHASE_COLORS["data_loading"],
    "forward": PHASE_COLORS["forward"],
    "backward": PHASE_COLORS["backward"],
    "optimizer": PHASE_COLORS["optimizer"],
    "communication": CATEGORY_COLORS["Communication"],
    "sync": PHASE_COLORS["sync"],
    "other": PHASE_COLORS["elsewhere"],
}
#: The step timer's columns for each phase it records (seconds, exclusive host time).
TIMER_COLUMNS = {
    "data_wait": "data_wait_s",
    "forward": "forward_s",
    "backward": "backward_s",
    "optimizer": "optimizer_s",
}
#: The label of "other" when the step timer has no forward/backward/optimizer columns:
#: then it is everything but the data wait.
REST_LABEL = "rest of the step"
#: Roofline markers: area proportional to time, the largest this many px across.
MAX_MARKER_PX = 48
MIN_MARKER_PX = 6
#: Decades of margin around the points and the ridge on the roofline's axes.
AXIS_MARGIN = 1.0


# -- phases ---------------------------------------------------------------------------
def phase_table(per_step: pd.DataFrame, source: str) -> tuple[pd.DataFrame, bool]:
    """(rank, step, duration_s and one column per phase in seconds, has_split).

    ``source`` "trace": ``step_phases`` rows (ns), every phase. "timer": the steps table;
    forward/backward/optimizer only where every row has them (NULL on runs recorded
    before they were, absent on attached runs), else ``has_split`` is False and "other"
    is all but the data wait. "other" is the step minus the timer's phases, never < 0,
    as ``step_stats.step_phases`` computes it.
    """
    if source == "trace":
        out = per_step[["rank", "step"]].copy()
        out["duration_s"] = per_step["duration"].to_numpy(dtype=float) / 1e9
        for p in PHASES:
            out[p] = per_step[p].to_numpy(dtype=float) / 1e9
        return out.reset_index(drop=True), True
    df = per_step.sort_values(["rank", "step"])
    out = df[["rank", "step"]].copy()
    total = (df["end_s"] - df["start_s"]).clip(lower=0).to_numpy(dtype=float)
    out["duration_s"] = total
    split = [c for p, c in TIMER_COLUMNS.items() if p != "data_wait"]
    has_split = all(c in df for c in split) and bool(df[split].notna().all(axis=None))
    used = 0.0
    for p in PHASES:
        col = TIMER_COLUMNS.get(p)
        if col is None or col not in df or (p != "data_wait" and not has_split):
            out[p] = 0.0
            continue
        out[p] = df[col].fillna(0).clip(lower=0).to_numpy(dtype=float)
        used = used + out[p].to_numpy()
    out["other"] = np.clip(total - used, 0.0, None)
    return out.reset_index(drop=True), has_split


def mean_shares(table: pd.DataFrame) -> dict[str, float]:
    """Phase -> share of the mean step (0..1), over all rows: mean phase / sum of the
    means (equal to the mean step; the step timer's phases can overrun a step by jitter)."""
    means = {p: float(table[p].mean()) for p in PHASES if p in table}
    total = sum(means.values())
    return {p: (m / total if total > 0 else 0.0) for p, m in means.items()}


def phase_bars(table: pd.DataFrame, has_split: bool = True) -> go.Figure:
    """Stacked bars per step, ms per phase (``phase_table``'s frame), one colour each.

    Phases zero in every step are left out of the legend (a CPU job has no exposed
    communication). Without the split, "other" reads "rest of the step".
    """
    x = step_labels(table)
    fig = go.Figure()
    for p in PHASES:
        if p not in table or not table[p].any():
            continue
        label = REST_LABEL if p == "other" and not has_split else PHASE_LABELS[p]
        fig.add_bar(
            name=label,
            x=x,
            y=table[p].to_numpy(dtype=float) * 1e3,
            marker_color=STEP_PHASE_COLORS[p],
            hovertemplate=f"{label}: %{{y:.2f}} ms<extra>step %{{x}}</extra>",
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="step", type="category")
    fig.update_yaxes(title="ms")
    return layout(fig, 320)


# -- roofline -------------------------------------------------------------------------
def plottable(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows a log-log chart can place: FLOPs and bytes both counted (copies have no
    FLOPs; their bandwidth is in the table, not on the chart)."""
    ok = (frame["intensity"] > 0) & (frame["tflops"] > 0) & np.isfinite(frame["intensity"])
    return frame[ok]


# FLOP/s units, largest first, with the factor from TFLOP/s: a CPU job's 60 MFLOP/s
# read "60µ" TFLOP/s on the axis and 5.93e-08 in the table
FLOPS_UNITS = (("TFLOP/s", 1.0), ("GFLOP/s", 1e3), ("MFLOP/s", 1e6), ("kFLOP/s", 1e9))


def flops_unit(tflops: Any) -> tuple[str, float]:
    """The largest FLOP/s unit in which the biggest of ``tflops`` is at least 1, and its
    factor from TFLOP/s; TFLOP/s when there is nothing to read."""
    values = np.asarray(tflops, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    if not values.size:
        return FLOPS_UNITS[0]
    top = float(values.max())
    for unit, factor in FLOPS_UNITS:
        if top * factor >= 1.0:
            return unit, factor
    return FLOPS_UNITS[-1]


def roof_lines(roof: Roofline, x_lo: float, x_hi: float) -> dict[str, tuple[list, list]]:
    """The roofs as polylines over [x_lo, x_hi] (FLOP/byte): "memory" (bandwidth x
    intensity) up to the ridge, "compute" flat from the ridge, and "vector" (the fp32
    roof of elementwise/normalisation/copy) from its own ridge when it differs.

    TFLOP/s = GB/s x FLOP/byte / 1e3. Missing roofs are missing keys.
    """
    bw, top = roof.memory_gbs, roof.compute_tflops
    out: dict[str, tuple[list, list]] = {}
    if bw and top:
        ridge = top * 1e3 / bw
        lo, hi = min(x_lo, ridge), max(x_hi, ridge)
        out["memory"] = ([lo, ridge], [bw * lo / 1e3, top])
        out["compute"] = ([ridge, hi], [top, top])
        vec = roof.vector_tflops
        if vec and vec != top:
            v_ridge = vec * 1e3 / bw
            out["vector"] = ([v_ridge, max(hi, v_ridge)], [vec, vec])
    return out


def _axis_range(values: list[float]) -> tuple[float, float]:
    logs = np.log10([v for v in values if v and v > 0] or [1.0])
    return float(logs.min() - AXIS_MARGIN), float(logs.max() + AXIS_MARGIN)


def _sizes(time_ns: pd.Series, biggest: float) -> np.ndarray:
    """Marker diameters with area proportional to time (the largest: MAX_MARKER_PX)."""
    if biggest <= 0:
        return np.full(len(time_ns), MIN_MARKER_PX, dtype=float)
    d = MAX_MARKER_PX * np.sqrt(time_ns.to_numpy(dtype=float) / biggest)
    return np.maximum(d, MIN_MARKER_PX)


def _hover(frame: pd.DataFrame, name_col: str, unit: str, factor: float) -> list[str]:
    rows = []
    for r in frame.to_dict("records"):
        pct = r.get("pct_of_roof")
        bound = r.get("bound")
        roof = "no roof" if pct is None or pct != pct else f"{pct * 100:.1f} % of the {bound} roof"
        rows.append(
            f"<b>{r[name_col]}</b><br>{r['intensity']:.3g} FLOP/byte · {r['tflops'] * factor:.3g} {unit}"
            f"<br>{roof}<br>time {r['time_ns'] / 1e6:.1f} ms ({r['share'] * 100:.1f} %)"
            f" · {r['flops'] / 1e9:,.1f} GFLOP · {r['gbs']:.3g} GB/s · {int(r['count'])} calls"
        )
    return rows


def roofline_chart(roof: Roofline, top_ops: bool = True) -> go.Figure | None:
    """Achieved TFLOP/s against arithmetic intensity, log-log, with the roofs.

    One point per operator class; with ``top_ops`` a second trace with the top operators
    by time. Marker area is time (over both traces, so sizes compare). None when nothing
    has both FLOPs and bytes (no shapes). Without a peak, the points alone.
    """
    classes = plottable(roof.classes)
    ops = plottable(roof.top_ops) if top_ops else roof.top_ops.iloc[0:0]
    if classes.empty and ops.empty:
        return None
    xs = [*classes["intensity"], *ops["intensity"]]
    ys = [*classes["tflops"], *ops["tflops"]]
    for v in (roof.compute_tflops, roof.vector_tflops):
        if v and roof.memory_gbs:
            xs.append(v * 1e3 / roof.memory_gbs)
            ys.append(v)
    unit, factor = flops_unit([*classes["tflops"], *ops["tflops"]])
    ys = [y * factor for y in ys]
    x_lo, x_hi = _axis_range(xs)
    y_lo, y_hi = _axis_range(ys)
    fig = go.Figure()
    styles = {
        "memory": ("memory roof", "solid"),
        "compute": ("compute roof", "solid"),
        "vector": ("vector roof (elementwise, norms)", "dot"),
    }
    for key, (x, y) in roof_lines(roof, 10**x_lo, 10**x_hi).items():
        label, dash = styles[key]
        fig.add_scatter(
            name=label,
            x=x,
            y=[v * factor for v in y],
            mode="lines",
            line={"color": "#444444", "dash": dash, "width": 2},
            hovertemplate=f"{label}: %{{y:.3g}} {unit} at %{{x:.3g}} FLOP/byte<extra></extra>",
        )
    biggest = float(max([*classes["time_ns"], *ops["time_ns"], 0]))
    fig.add_scatter(
        name="operator classes",
        x=classes["intensity"],
        y=classes["tflops"] * factor,
        mode="markers+text",
        text=classes["op_class"],
        textposition="top center",
        marker={"size": _sizes(classes["time_ns"], biggest), "color": "#4C78A8", "opacity": 0.8},
        hovertext=_hover(classes, "op_class", unit, factor),
        hovertemplate="%{hovertext}<extra></extra>",
    )
    if not ops.empty:
        fig.add_scatter(
            name="top operators",
            x=ops["intensity"],
            y=ops["tflops"] * factor,
            mode="markers",
            marker={"size": _sizes(ops["time_ns"], biggest), "color": "#F58518", "opacity": 0.6},
            hovertext=_hover(ops, "name", unit, factor),
            hovertemplate="%{hovertext}<extra></extra>",
        )
    # plain numbers on the ticks: SI prefixes ("100µ") beside a unit read as a unit
    ticks = {"exponentformat": "none", "tickformat": ",~g"}
    fig.update_xaxes(
        type="log", range=[x_lo, x_hi], title="arithmetic intensity (FLOP/byte)", **ticks
    )
    fig.update_yaxes(type="log", range=[y_lo, y_hi], title=f"achieved {unit}", **ticks)
    return layout(fig, 460)


__all__ = [
    "FLOPS_UNITS",
    "STEP_PHASE_COLORS",
    "flops_unit",
    "mean_shares",
    "phase_bars",
    "phase_table",
    "plottable",
    "roof_lines",
    "roofline_chart",
]
