"""The run page's hardware sections: MFU beside the headline, the phases of each step,
and the roofline tab.

Each takes what it shows (a TraceReport, the run's steps) and handles its own empty
state in one line that says what is missing and what to do: a run without a trace still
gets its phases from the step timer, a CPU job without a calibration is told to run
``stepscope calibrate``, a capture without shapes to record them.
"""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import streamlit as st

from stepscope.analyzers.hardware.roofline import NO_CALIBRATION, Roofline
from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.analyzers.steps.phases import PHASES
from stepscope.app.dashboard.charts.hardware import (
    REST_LABEL,
    flops_unit,
    mean_shares,
    phase_bars,
    phase_table,
    plottable,
    roofline_chart,
)
from stepscope.app.dashboard.tables import (
    fmt_int,
    fmt_seconds,
    fmt_share,
    fmt_sig,
    fmt_text,
    in_words,
)
from stepscope.app.formats import fmt_num, fmt_pct, fmt_s
from stepscope.store.calibration import host_name
from stepscope.types import PHASE_LABELS

CALIBRATE_S = 3  # stepscope calibrate's default budget
CALIBRATE_TIMEOUT_S = 120


# -- MFU -------------------------------------------------------------------------------
def peak_line(roof: Roofline) -> str:
    """'V100 SXM2 float32 15.7 TFLOP/s': the denominator of MFU, as the headline says it."""
    name = roof.peak.name if roof.peak is not None else "no peak"
    tflops = roof.compute_tflops
    if tflops is not None and tflops < 1:  # a CPU: GFLOP/s reads better than 0.0133 TFLOP/s
        return f"{name} {roof.dtype} {fmt_num(tflops * 1e3)} GFLOP/s"
    return f"{name} {roof.dtype} {fmt_num(tflops)} TFLOP/s"


def no_mfu_reason(roof: Roofline) -> str:
    """Why a trace has no MFU, with what to do, in one line."""
    if roof.basis != "shapes":
        return roof.basis
    if roof.peak is None:
        return roof.note  # choose_peak's reason: "no calibration ... run `stepscope calibrate`"
    missing = [w for w in roof.warnings if "no compute roof" in w]
    if missing:
        return missing[0]
    return "the profiled steps have no duration"


def mfu_headline(
    report: TraceReport | None, home: str | None = None, run_host: str | None = None
) -> None:
    """MFU of the profiled steps beside the headline figures, or why there is none (and,
    when the reason is a missing calibration of this host, the button that makes it).
    Nothing without a trace: MFU needs the FLOPs a capture's shapes give."""
    if report is None:
        return
    roof = report.roofline
    if roof is None:  # the roofline section itself failed: its warning is on the page
        st.caption(":material/info: No MFU: the roofline could not be computed (see above).")
        return
    if roof.mfu is None:
        st.caption(f":material/info: No MFU: {no_mfu_reason(roof)}.")
        if roof.basis == "shapes" and roof.peak is None and roof.note == NO_CALIBRATION:
            calibrate_offer(home, run_host)
        return
    help_text = roof.note
    if roof.peak is not None and roof.peak.note:
        help_text += f". {roof.peak.note}"
    left, right = st.columns([1, 5])
    left.metric("MFU", fmt_pct(roof.mfu), help=help_text)
    right.caption(
        f"MFU {fmt_pct(roof.mfu, digits=0)} of {peak_line(roof)}: the model FLOPs of the "
        "profiled steps (from the recorded shapes) over their time, against the "
        + (
            "host's measured matmul peak"
            if roof.peak and roof.peak.vendor == "CPU"
            else "datasheet peak"
        )
        + "."
    )


def calibrate_offer(home: str | None, run_host: str | None) -> None:
    """Run ``stepscope calibrate`` from the page (a few seconds), then redraw: the trace's
    analysis is cached on the calibration's stamp, so the MFU and roofs appear. Only for a
    run recorded on this host: a calibration is this machine's peak, not another's."""
    if home is None:
        return
    if run_host and run_host != host_name():
        st.caption(f"Calibrate on {run_host}, where the run was recorded: `stepscope calibrate`.")
        return
    if not st.button("Calibrate this host", icon=":material/speed:", key="calibrate"):
        return
    with st.spinner(
        f"Measuring this host's matmul peak and memory bandwidth (about {CALIBRATE_S} s)…"
    ):
        done = subprocess.run(
            [sys.executable, "-m", "stepscope.app.cli", "--home", home, "calibrate"],
            capture_output=True,
            text=True,
            timeout=CALIBRATE_TIMEOUT_S,
        )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        st.error(f"Calibration failed: {lines[-1] if lines else f'exit code {done.returncode}'}")
        return
    st.rerun()


# -- phases ------------------------------------------------------------------------------
def shares_line(shares: dict[str, float], has_split: bool = True) -> str:
    """'data wait 33.4 % · forward 24.6 % · ...', phases under half a percent left out."""
    parts = []
    for p in PHASES:
        share = shares.get(p, 0.0)
        if share >= 0.005:
            label = REST_LABEL if p == "other" and not has_split else PHASE_LABELS[p]
            parts.append(f"{label} {fmt_pct(share)}")
    return " · ".join(parts)


def phase_section(steps: pd.DataFrame, report: TraceReport | None) -> None:
    """The phases of each step: from the trace when there is one (the device's view),
    else from the step timer (the host's clock)."""
    st.markdown("**Phases of each step**")
    if report is not None and report.phases is not None and len(report.phases):
        table, has_split = phase_table(report.phases, "trace")
        st.plotly_chart(phase_bars(table, has_split), key="phases_trace")
        st.caption(
            "From the profiler trace, each instant counted once: "
            + shares_line(mean_shares(table), has_split)
        )
        return
    if steps.empty:
        st.caption("No steps recorded yet.")
        return
    table, has_split = phase_table(steps, "timer")
    st.plotly_chart(phase_bars(table, has_split), key="phases_timer")
    mean = float(table["duration_s"].mean())
    line = shares_line(mean_shares(table), has_split)
    if has_split:
        st.caption(
            f"From the step timer (host clock, all {len(table)} steps, mean {fmt_s(mean)}): "
            + line
            + ". On a GPU the host's forward and backward are kernel launches; a trace "
            "shows the device's phases."
        )
    else:
        st.caption(
            f"From the step timer: {line}. This run recorded no forward, backward or "
            "optimizer times (recorded before stepscope timed them, or attached): only the "
            "data wait and the rest."
        )


# -- roofline ------------------------------------------------------------------------------
def roofline_section(report: TraceReport | None) -> None:
    """The roofline tab: the chart and its tables, or one line saying what is missing."""
    if report is None:
        st.info("The roofline comes from a profiler trace with shapes; this run has none.")
        return
    roof = report.roofline
    if roof is None:
        st.info("The roofline could not be computed for this trace (see the warnings above).")
        return
    if roof.basis != "shapes":
        st.info(f"No roofline: {roof.basis}.", icon=":material/info:")
        return
    if roof.peak is None:
        st.caption(f":material/info: No roofs: {roof.note}. The points are the achieved rates.")
    else:
        st.caption(f"Roofs: {roof.note}.")
    for w in roof.warnings:
        st.caption(f":material/warning: {w}")
    top = st.toggle("Show the top operators", value=True, key="roofline_top")
    fig = roofline_chart(roof, top_ops=top)
    if fig is None:
        st.info("No operator has both FLOPs and bytes counted: nothing to place on the chart.")
    else:
        st.plotly_chart(fig, key="roofline")
    copies = roof.classes[~roof.classes.index.isin(plottable(roof.classes).index)]
    if not copies.empty:
        names = ", ".join(copies["op_class"])
        st.caption(f"Not on the chart (no FLOPs; in the table): {names}.")
    st.dataframe(_roof_table(roof.classes, "op_class", "class"), hide_index=True, key="roof_cls")
    with st.expander(f"Top {len(roof.top_ops)} operators by time"):
        st.dataframe(_roof_table(roof.top_ops, "name", "operator"), hide_index=True, key="roof_ops")


def _roof_table(frame: pd.DataFrame, key: str, label: str) -> pd.DataFrame:
    unit, factor = flops_unit(frame["tflops"])
    table = pd.DataFrame(
        {
            label: frame[key],
            "time": frame["time_ns"] / 1e9,
            "share": frame["share"],
            unit: frame["tflops"] * factor,
            "GB/s": frame["gbs"],
            "FLOP/byte": frame["intensity"],
            "bound": frame["bound"],
            "% of roof": frame["pct_of_roof"],
            "calls": frame["count"],
        }
    )
    return in_words(
        table,
        {
            "time": fmt_seconds,
            "share": fmt_share,
            unit: fmt_sig,
            "GB/s": fmt_sig,
            "FLOP/byte": fmt_sig,
            "bound": fmt_text,
            "% of roof": fmt_share,
            "calls": fmt_int,
        },
    )


__all__ = ["mfu_headline", "no_mfu_reason", "peak_line", "phase_section", "roofline_section"]
