"""The sections of the run page, one function each, so the page script reads as its outline.

Every section takes what it shows as arguments (RunData, a TraceReport, findings) and
handles its own empty state: a run without a trace still gets a useful page, one that
says how to capture a trace. This module has the run's headline, its steps and its log;
beside it are ``findings_view`` (the diagnosis), ``trace_sections`` (what a profiler
trace adds), ``stack_sections`` (an attached run), ``run_actions`` (capture, TensorBoard).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.analyzers.steps.generation import is_generation
from stepscope.analyzers.steps.latency import wall_times
from stepscope.analyzers.steps.step_stats import timed_steps
from stepscope.analyzers.trace.breakdown import CATEGORIES
from stepscope.app.applied import applied_changes, state, trial_label
from stepscope.app.dashboard import data
from stepscope.app.dashboard.charts.latency import latency_histogram, latency_over_time
from stepscope.app.dashboard.charts.steps import breakdown_bars, step_time_chart
from stepscope.app.dashboard.views.run.hardware_sections import phase_section
from stepscope.app.formats import fmt_bytes, fmt_num, fmt_pct, fmt_s, missing, steps_recorded

# -- headline ------------------------------------------------------------------------
LATENCY_HELP = "each step one request or batch: its whole iteration, timed steps only"


def headline(d: data.RunData, report: TraceReport | None = None) -> None:
    """The run's figures from the step timer over its timed steps, led by what the kind of
    job is judged by: a training job's step time and samples/s, an inference job's latency
    p50/p99 and requests/s (a generation job's requests lead from ``generation_view``).
    Where a trace measured the data wait too, both figures are said with what each covers
    (they often differ: all timed steps against a few profiled ones)."""
    s = d.summary
    label, peak = data.peak_memory(d.samples)
    if is_generation(d.steps):
        # a step is a generate() request: its figures are the requests' own (above)
        st.metric(label, fmt_bytes(peak, digits=3))
        st.caption(f"{left_out_line(s, report)}. Each step is one generate() request.")
        return
    cols = st.columns(6)
    lat = s.get("latency")
    if lat is not None:
        cols[0].metric("latency p50", fmt_s(lat["p50_s"]), help=LATENCY_HELP)
        cols[1].metric("latency p99", fmt_s(lat["p99_s"]), help=LATENCY_HELP)
        cols[2].metric(
            "requests/s", fmt_num(lat["requests_per_s"]), help="all ranks and workers together"
        )
        cols[3].metric(
            "samples/s", fmt_num(lat["samples_per_s"]), help="all ranks and workers together"
        )
    else:
        cols[0].metric("step time p50", fmt_s(s["step_time_median_s"]))
        cols[1].metric(
            "samples/s", fmt_num(s["samples_per_s"]), help="all ranks and workers together"
        )
        cols[2].metric(
            "steps/s",
            fmt_num(s["steps_per_s"]),
            help="per process (rank or training worker), timed steps only",
        )
        cols[3].metric("step time p95", fmt_s(s["step_time_p95_s"]))
    cols[4].metric(
        "data wait",
        fmt_pct(s["data_wait_share"]),
        help="share of step time blocked in the DataLoader's __next__, by the step timer over "
        "the timed steps: the figure the diagnosis uses",
    )
    cols[5].metric(label, fmt_bytes(peak, digits=3))
    st.caption(left_out_line(s, report))
    trace_wait = data_wait_sources(s, report)
    if trace_wait:
        st.caption(trace_wait)


def left_out_line(s: dict[str, Any], report: TraceReport | None) -> str:
    """'40 steps recorded; 31 timed (4 warm-up and 5 profiled steps left out of the
    figures: 3 in the trace, 2 after it while the profiler wrote it out)': every row
    counted once over all processes, so the counts add up to the steps recorded, and the
    profiled steps split as the trace has them, so the 3 steps of its charts add up."""
    counts = s.get("left_out") or {}
    warmup = int(counts.get("warmup", s["warmup_steps"]) or 0)
    profiled = int(counts.get("profiled", s["profiled_steps"]) or 0)
    left_out = []
    if warmup:
        left_out.append(f"{warmup} warm-up")
    if profiled:
        left_out.append(f"{profiled} profiled")
    text = f"{steps_recorded(s)} recorded; {s['timed_steps']} timed"
    if not left_out:
        return text
    text += f" ({' and '.join(left_out)} steps left out of the figures"
    in_trace = _trace_steps(report)
    if profiled and 0 < in_trace < profiled:
        text += f": {in_trace} in the trace, {profiled - in_trace} after it while the profiler "
        text += "wrote it out"
    return text + ")"


def data_wait_sources(s: dict[str, Any], report: TraceReport | None) -> str | None:
    """Both data-wait figures side by side when a trace has one; None without a trace."""
    if report is None or s.get("data_wait_share") is None or "DataLoader" not in report.breakdown:
        return None
    in_trace = _trace_steps(report)
    return (
        f"data wait: {fmt_pct(s['data_wait_share'])} by the step timer over "
        f"{s['timed_steps']} timed steps (the diagnosis uses it) · "
        f"{fmt_pct(report.breakdown['DataLoader'])} in the profiler trace's "
        f"{in_trace} step{'' if in_trace == 1 else 's'}"
    )


def _trace_steps(report: TraceReport | None) -> int:
    """Profiled steps in the trace (one rank's: ranks profile the same steps)."""
    if report is None or report.per_step.empty:
        return 0
    per_step = report.per_step
    if "rank" in per_step:
        return int(per_step.groupby("rank").size().max())
    return int(len(per_step))


def applied_section(run: dict[str, Any]) -> None:
    """A trial run of an experiment: which experiment and arm, and what its fixes changed
    in the job (``num_workers 0 -> 4 (the job set 0)``); nothing for any other run."""
    config = run.get("config") or {}
    label = trial_label(config)
    changes = applied_changes(config)
    if label is None and not changes:
        return
    fixes = ", ".join(config.get("fixes") or []) or "none (a baseline trial)"
    st.markdown(f"**Trial run** of {label or 'an experiment'} · fixes: {fixes}")
    if config.get("experiment") is not None and run.get("parent_run_id") is not None:
        st.page_link(
            "views/optimize/page.py",
            label=f"Experiment {config['experiment']}: its result",
            icon=":material/science:",
            query_params={
                "run": str(int(run["parent_run_id"])),
                "experiment": str(config["experiment"]),
            },
        )
    if changes:
        st.dataframe(
            pd.DataFrame(
                [{"fix": c["fix"], "change": c["change"], "state": state(c)} for c in changes]
            ),
            hide_index=True,
            key="applied",
            column_config={"change": st.column_config.TextColumn(width="large")},
        )
    elif config.get("fixes"):
        st.caption("The job logged no change for its fixes.")


def step_charts(d: data.RunData, report: TraceReport | None) -> None:
    """Breakdown per step (trace categories, else the step timer's phases) and step time;
    a trace's own phases come after, full width (``hardware_sections.phase_section``)."""
    left, right = st.columns(2)
    with left:
        if report is not None and len(report.per_step):
            st.markdown("**Step-time breakdown** · from the profiler trace")
            st.plotly_chart(breakdown_bars(report.per_step, CATEGORIES), key="bd_trace")
            shares = [f"{c} {fmt_pct(v)}" for c, v in report.breakdown.items() if v >= 0.005]
            st.caption(
                "Priority subtraction in torch-tb-profiler's categories, so the parts add up "
                "to the step: " + " · ".join(shares)
            )
        elif d.steps.empty:
            st.info("No steps recorded yet.")
        else:  # no trace: the step timer's phases stand in for the breakdown
            phase_section(d.steps, None)
    with right:
        if not d.steps.empty:
            st.markdown("**Step time over the run**")
            st.plotly_chart(
                step_time_chart(
                    d.steps, d.summary["warmup_steps"], d.summary["step_time_median_s"]
                ),
                key="step_time",
            )


# fewer timed steps than this get no latency histogram, a line that says why
HISTOGRAM_FROM = 5


def latency_section(d: data.RunData) -> None:
    """An inference run (each step one request or batch): its latency percentiles,
    requests/s and samples/s, the latency histogram and latency over the run; nothing for
    a training run. What a request's latency holds: ``analyzers/steps/latency.py``."""
    lat = d.summary.get("latency")
    if lat is None:
        return
    st.markdown("**Latency** · inference: each step is one request or batch")
    st.caption(
        f"p50 {fmt_s(lat['p50_s'])} · p90 {fmt_s(lat['p90_s'])} · p95 {fmt_s(lat['p95_s'])} · "
        f"p99 {fmt_s(lat['p99_s'])} · max {fmt_s(lat['max_s'])}"
    )
    timed = timed_steps(d.steps)
    model = lat.get("model")
    model_s = timed["forward_s"].to_numpy(dtype=float) if model else None
    left, right = st.columns(2)
    with left:
        if len(timed) >= HISTOGRAM_FROM:
            st.plotly_chart(latency_histogram(wall_times(timed), model_s, lat), key="latency_hist")
        else:  # a histogram of two points is one or two bars, and says nothing
            st.caption(
                f"too few timed steps for a histogram ({len(timed)}; "
                f"{HISTOGRAM_FROM} or more): each is a point on the right"
            )
    with right:
        st.plotly_chart(
            latency_over_time(d.steps, timed.index, lat, float(d.run["started_at"])),
            key="latency_time",
        )
    caption = (
        f"Over {lat['count']} timed steps. Latency is the whole iteration (data wait, "
        "moving the batch, the model call and the loop's own work)"
    )
    if model:
        caption += (
            f"; the model call alone: p50 {fmt_s(model['p50_s'])}, p99 {fmt_s(model['p99_s'])}"
        )
    st.caption(caption + ".")


def no_trace_hint(run_id: int, running: bool) -> None:
    how = (
        f"use **Capture** above, or run `stepscope capture {run_id} --steps 3` while it runs"
        if running
        else "record it again with `stepscope run --profile-at 5 --profile-steps 3 -- ...`"
    )
    st.info(
        f"This run has no profiler trace, so the breakdown comes from the step timer only. "
        f"For the trace engine's categories, kernels, operators and a step timeline, {how}.",
        icon=":material/lightbulb:",
    )


def events_section(events: pd.DataFrame) -> None:
    if events.empty:
        st.caption("Nothing logged.")
        return
    st.dataframe(
        pd.DataFrame(
            {
                "time": [datetime.fromtimestamp(t) for t in events["t"]],
                # lines of stepscope's own process (samplers) belong to no rank
                "rank": ["stepscope" if missing(r) else str(int(r)) for r in events["rank"]],
                "level": events["level"],
                "source": events["source"],
                "message": events["message"],
            }
        ),
        hide_index=True,
    )
