"""The batch-size sweep's curve: throughput and p99 latency against the batch size.

Two y axes over one x axis (the batch size, log 2: the factors double), so that the knee
shows where the throughput flattens while the tail latency keeps climbing. Intervals are
error bars; the knee is marked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from stepscope.app.dashboard.charts.style import SIDE_COLORS, layout


def _bars(values: list[float], cis: list[Any], scale: float) -> dict[str, Any]:
    hi = [(ci[1] * scale - v) if ci else 0.0 for v, ci in zip(values, cis, strict=True)]
    lo = [(v - ci[0] * scale) if ci else 0.0 for v, ci in zip(values, cis, strict=True)]
    return {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo}


def sweep_curve(
    rows: Sequence[Mapping[str, Any]], knee: Mapping[str, Any] | None = None
) -> go.Figure | None:
    """Samples/s (left) and p99 latency per batch in ms (right) per batch size; None when
    no batch size was measured."""
    done = [r for r in rows if r.get("samples_per_s") and r.get("batch_size")]
    if not done:
        return None
    x = [int(r["batch_size"]) for r in done]
    sps = [float(r["samples_per_s"]) for r in done]
    p99 = [float(r["p99_s"]) * 1000 for r in done]
    fig = go.Figure()
    fig.add_scatter(
        x=x,
        y=sps,
        name="samples/s",
        mode="lines+markers",
        line={"color": SIDE_COLORS[0]},
        error_y=_bars(sps, [r.get("samples_per_s_ci") for r in done], 1.0),
        hovertemplate="batch %{x}: %{y:.4g} samples/s<extra></extra>",
    )
    fig.add_scatter(
        x=x,
        y=p99,
        name="p99 latency per batch (ms)",
        mode="lines+markers",
        yaxis="y2",
        line={"color": SIDE_COLORS[1], "dash": "dot"},
        error_y=_bars(p99, [r.get("p99_ci") for r in done], 1000.0),
        hovertemplate="batch %{x}: p99 %{y:.3g} ms<extra></extra>",
    )
    if knee and knee.get("batch_size") in x:
        fig.add_vline(
            x=knee["batch_size"],
            line_dash="dash",
            line_color="#54A24B",
            annotation_text=f"knee: batch {knee['batch_size']}",
        )
    fig.update_xaxes(title="batch size", type="log", tickvals=x)
    return layout(
        fig,
        360,
        yaxis={"title": "samples/s", "rangemode": "tozero"},
        yaxis2={
            "title": "p99 per batch (ms)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
    )


def generation_curve(
    rows: Sequence[Mapping[str, Any]], knee: Mapping[str, Any] | None = None
) -> go.Figure | None:
    """A generation sweep: tokens/s (left) and request p99 in ms (right) per batch size;
    None when no batch size was measured."""
    done = [r for r in rows if r.get("tokens_per_s") and r.get("batch_size")]
    if not done:
        return None
    x = [int(r["batch_size"]) for r in done]
    tps = [float(r["tokens_per_s"]) for r in done]
    p99 = [float(r["request_p99_s"]) * 1000 for r in done]
    base = next((r["tokens_per_s"] for r in done if r["batch_size"] == 1), None)
    cis = [
        [c * base for c in r["ci"]] if base and r.get("ci") and r["batch_size"] != 1 else None
        for r in done
    ]
    fig = go.Figure()
    fig.add_scatter(
        x=x,
        y=tps,
        name="tokens/s",
        mode="lines+markers",
        line={"color": SIDE_COLORS[0]},
        error_y=_bars(tps, cis, 1.0),
        hovertemplate="batch %{x}: %{y:.4g} tokens/s<extra></extra>",
    )
    fig.add_scatter(
        x=x,
        y=p99,
        name="request p99 (ms)",
        mode="lines+markers",
        yaxis="y2",
        line={"color": SIDE_COLORS[1], "dash": "dot"},
        hovertemplate="batch %{x}: request p99 %{y:.3g} ms<extra></extra>",
    )
    if knee and knee.get("batch_size") in x:
        fig.add_vline(
            x=knee["batch_size"],
            line_dash="dash",
            line_color="#54A24B",
            annotation_text=f"knee: batch {knee['batch_size']}",
        )
    fig.update_xaxes(title="batch size", type="log", tickvals=x)
    return layout(
        fig,
        360,
        yaxis={"title": "tokens/s", "rangemode": "tozero"},
        yaxis2={
            "title": "request p99 (ms)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
    )


def peak_curve(
    rows: Sequence[Mapping[str, Any]],
    largest: Mapping[str, Any] | None,
    curves: Sequence[Mapping[str, Any]] | None = None,
) -> go.Figure | None:
    """A training sweep's peak memory per batch size (GB), the line fitted to it, the
    limit, and the batch sizes that ran out of memory marked on the limit; each memory
    fix's curve (``curves``) beside it; None without two measured peaks."""
    done = [r for r in rows if r.get("peak_bytes") and r.get("batch_size")]
    if len(done) < 2:
        return None
    x = [int(r["batch_size"]) for r in done]
    fig = go.Figure()
    fig.add_scatter(
        x=x,
        y=[float(r["peak_bytes"]) / 1e9 for r in done],
        name="peak memory (GB)",
        mode="markers",
        marker={"color": SIDE_COLORS[0], "size": 9},
        hovertemplate="batch %{x}: peak %{y:.3g} GB<extra></extra>",
    )
    largest = largest or {}
    limit, fit = largest.get("limit_bytes"), largest.get("fit")
    out = [int(r["batch_size"]) for r in rows if r.get("failure") == "oom" and r.get("batch_size")]
    if fit:
        ends = [min(x), max([*x, *out])]
        fig.add_scatter(
            x=ends,
            y=[(fit["fixed_bytes"] + fit["per_sample_bytes"] * b) / 1e9 for b in ends],
            name="fitted: fixed + bytes per sample",
            mode="lines",
            line={"color": SIDE_COLORS[1], "dash": "dot"},
            hoverinfo="skip",
        )
    if limit:
        fig.add_hline(
            y=limit / 1e9,
            line_dash="dash",
            line_color="#E45756",
            annotation_text=f"limit {limit / 1e9:.3g} GB",
        )
        if out:
            fig.add_scatter(
                x=out,
                y=[limit / 1e9] * len(out),
                name="ran out of memory",
                mode="markers",
                marker={"color": "#E45756", "symbol": "x", "size": 11},
                hovertemplate="batch %{x}: ran out of memory<extra></extra>",
            )
    for i, curve in enumerate(curves or []):
        points = [r for r in curve.get("rows") or [] if r.get("peak_bytes") and r.get("batch_size")]
        if not points:
            continue
        fig.add_scatter(
            x=[int(r["batch_size"]) for r in points],
            y=[float(r["peak_bytes"]) / 1e9 for r in points],
            name=f"with {' + '.join(curve.get('fixes') or [])} (GB)",
            mode="markers+lines",
            marker={"color": CURVE_COLORS[i % len(CURVE_COLORS)], "size": 8, "symbol": "diamond"},
            line={"color": CURVE_COLORS[i % len(CURVE_COLORS)], "width": 1},
            hovertemplate="batch %{x}: peak %{y:.3g} GB<extra></extra>",
        )
    fig.update_xaxes(title="batch size")
    return layout(fig, 320, yaxis={"title": "peak memory (GB)", "rangemode": "tozero"})


#: a memory fix's curve, one colour each (the job as it is keeps SIDE_COLORS[0])
CURVE_COLORS = ("#54A24B", "#B279A2", "#9D755D")

__all__ = ["generation_curve", "peak_curve", "sweep_curve"]
