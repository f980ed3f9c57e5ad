"""The biggest changes between two runs, operator by operator (the Compare page).

A bar per name, its change of time per step B - A, with the 95 % interval as error
bars: a bar whose interval crosses zero is noise, however long the bar. Bars are
coloured by status (``analyzers/report/op_diff.py``): what got slower in reds, what
got faster in greens, so the eye finds the regression before reading a label.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from stepscope.analyzers.report.op_diff import FASTER, GONE, NEW, SAME, SLOWER
from stepscope.app.dashboard.charts.style import layout
from stepscope.app.formats import fmt_signed_s

#: one colour per status: slower and new in reds, faster and gone in greens
STATUS_COLORS = {
    SLOWER: "#E45756",
    NEW: "#B8323A",
    FASTER: "#54A24B",
    GONE: "#2E7D32",
    SAME: "#BAB0AC",
}
#: how many bars: the top of the table answers "where did the time go"
TOP = 15
#: a kernel's templated name is hundreds of characters; the axis shows its start
MAX_LABEL = 48


def _labels(rows: pd.DataFrame) -> list[str]:
    """Axis labels, unique (plotly merges equal category labels into one bar): a name
    cut to ``MAX_LABEL``, with its kind where two rows would read the same."""
    short = [n if len(n) <= MAX_LABEL else n[: MAX_LABEL - 1] + "…" for n in rows["name"]]
    seen: dict[str, int] = {}
    for s in short:
        seen[s] = seen.get(s, 0) + 1
    out = []
    for s, kind in zip(short, rows["kind"], strict=True):
        label = f"{s} ({kind})" if seen[s] > 1 else s
        while label in out:  # the same name and kind twice: never from one diff
            label += " "
        out.append(label)
    return out


def _signed(ns: float) -> str:
    return fmt_signed_s(ns / 1e9)


def _hover(diff: float, lo: float, hi: float, step_ns_a: float) -> str:
    """'+948 µs per step (+9.3 % of A's step); 95 % interval +510 µs … +1.4 ms'."""
    text = f"{_signed(diff)} per step"
    if step_ns_a > 0:
        text += f" ({100 * diff / step_ns_a:+.1f} % of A's step)"
    if np.isfinite(lo) and np.isfinite(hi):
        text += f"; 95 % interval {_signed(lo)} … {_signed(hi)}"
    return text


def biggest_changes(rows: pd.DataFrame, step_ns_a: float, top: int = TOP) -> go.Figure | None:
    """Horizontal bars of the ``top`` rows of ``rows`` (``op_diff.COLUMNS``) by the size
    of their change, in ms per step, biggest at the top; None when there are none.

    ``step_ns_a``: A's mean step, so that the hover says what share of it a change is.
    """
    if rows.empty:
        return None
    order = rows["diff_ns"].abs().sort_values(ascending=False, kind="stable").index
    shown = rows.loc[order[:top]].reset_index(drop=True)
    shown = shown.assign(label=_labels(shown))
    fig = go.Figure()
    for status, color in STATUS_COLORS.items():
        part = shown[shown["status"] == status]
        if part.empty:
            continue
        diff = part["diff_ns"].to_numpy(float)
        lo, hi = part["lo_ns"].to_numpy(float), part["hi_ns"].to_numpy(float)
        known = np.isfinite(lo) & np.isfinite(hi)
        plus = np.where(known, np.maximum(hi - diff, 0.0), 0.0) / 1e6
        minus = np.where(known, np.maximum(diff - lo, 0.0), 0.0) / 1e6
        text = [_hover(d, a, b, step_ns_a) for d, a, b in zip(diff, lo, hi, strict=True)]
        fig.add_bar(
            name=status,
            x=diff / 1e6,
            y=part["label"],
            orientation="h",
            marker_color=color,
            error_x={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus},
            customdata=np.column_stack([part["name"], part["kind"], text]),
            hovertemplate="%{customdata[0]} (%{customdata[1]})<br>%{customdata[2]}"
            "<extra>" + status + "</extra>",
        )
    fig.add_vline(x=0, line_color="#888")
    fig.update_xaxes(title="change of time per step, B - A (ms)", zeroline=False)
    fig.update_yaxes(
        categoryorder="array", categoryarray=list(shown["label"]), autorange="reversed"
    )
    return layout(fig, 120 + 28 * len(shown), barmode="overlay")
