"""System samples over time: CPU, memory, disk and GPU panels on one time axis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from stepscope.app.dashboard.charts.style import SIDE_COLORS, layout

#: system panels: (title, unit, [(sample column or gpu suffix, label)]); GPU panels
#: are repeated for every gpuN scope found in the samples
SYSTEM_PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "CPU",
        "cores",
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
    "cores": (100.0, "cores busy"),
    "bytes": (2**20, "MiB"),
    "rate": (2**20, "MiB/s"),
    "watts": (1, "W"),
}


def _values(wide: pd.DataFrame, col: str, unit: str) -> np.ndarray:
    """One series in its panel's unit. CPU is in cores busy, one scale for all: psutil
    gives a process (and a thread) in % of one core, up to 100 per core, but the machine
    in % of all its cores, so the machine's figure is multiplied by its core count (a job
    at 200 % on 2 cores and a machine at 100 % are both 2 cores busy)."""
    y = wide[col].to_numpy(dtype=float)
    if unit == "cores" and col.startswith("system."):
        if "system.cpu_count" not in wide:  # no core count: no honest figure in cores
            return np.full(len(y), np.nan)
        y = y * wide["system.cpu_count"].ffill().bfill().to_numpy(dtype=float)
    return y


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
                y = _values(wide, col, unit) / scale
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
    return layout(fig, 60 + height_per_panel * len(panels), hovermode="x")
