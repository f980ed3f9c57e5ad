"""The sections of the run page, one function each, so the page script reads as its outline.

Every section takes what it shows as arguments (RunData, a TraceReport, findings) and
handles its own empty state: a run without a trace still gets a useful page, one that
says how to capture a trace.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.app import charts, data, tb_launch, ui
from stepscope.app.applied import applied_changes, state, trial_label

log = logging.getLogger("stepscope.dashboard")


# -- headline ------------------------------------------------------------------------
def headline(d: data.RunData) -> None:
    s = d.summary
    label, peak = data.peak_memory(d.samples)
    cols = st.columns(6)
    cols[0].metric("steps/s", ui.fmt_num(s["steps_per_s"]), help="per rank, timed steps only")
    cols[1].metric("samples/s", ui.fmt_num(s["samples_per_s"]), help="all ranks together")
    cols[2].metric("step time p50", ui.fmt_s(s["step_time_median_s"]))
    cols[3].metric("step time p95", ui.fmt_s(s["step_time_p95_s"]))
    cols[4].metric(
        "data wait",
        ui.fmt_pct(s["data_wait_share"]),
        help="share of step time blocked in the DataLoader's __next__",
    )
    cols[5].metric(label, ui.fmt_bytes(peak, digits=3))
    left_out = []
    if s["warmup_steps"]:
        left_out.append(f"{s['warmup_steps']} warm-up")
    if s["profiled_steps"]:
        left_out.append(f"{s['profiled_steps']} profiled")
    st.caption(
        f"{s['steps']} steps recorded, {s['timed_steps']} timed"
        + (f" ({' and '.join(left_out)} steps left out of the figures)" if left_out else "")
    )


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
            "views/optimize.py",
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


def step_charts(d: data.RunData, report: Any | None) -> None:
    """Breakdown per step (trace categories, else data wait / compute) and step time."""
    from stepscope.analyzers.breakdown import CATEGORIES

    left, right = st.columns(2)
    with left:
        if report is not None and len(report.per_step):
            st.markdown("**Step-time breakdown** · from the profiler trace")
            st.plotly_chart(charts.breakdown_bars(report.per_step, CATEGORIES), key="bd_trace")
            shares = [f"{c} {ui.fmt_pct(v)}" for c, v in report.breakdown.items() if v >= 0.005]
            st.caption(
                "Priority subtraction in torch-tb-profiler's categories, so the parts add up "
                "to the step: " + " · ".join(shares)
            )
        elif d.steps.empty:
            st.info("No steps recorded yet.")
        else:
            st.markdown("**Step-time breakdown** · from the step timer")
            st.plotly_chart(charts.wait_compute_bars(d.steps), key="bd_steps")
            st.caption(
                "Data wait is the time blocked in the DataLoader; the rest is everything "
                "else in the step. A profiler trace splits it further."
            )
    with right:
        if not d.steps.empty:
            st.markdown("**Step time over the run**")
            st.plotly_chart(
                charts.step_time_chart(
                    d.steps, d.summary["warmup_steps"], d.summary["step_time_median_s"]
                ),
                key="step_time",
            )


def attach_headline(d: data.RunData, view: data.StackView | None) -> None:
    """The headline of an attached run: it has no step timer, so no step figures; what
    it has is the process, how long it was watched and how many stack samples it gave."""
    cfg = d.run.get("config") or {}
    label, peak = data.peak_memory(d.samples)
    top = None
    if view is not None and not view.shares.empty and view.samples:
        top = view.shares.sort_values("share", ascending=False).iloc[0]
    end = d.run["ended_at"] or time.time()
    cols = st.columns(5)
    cols[0].metric("process", str(cfg.get("attached_pid", "—")))
    cols[1].metric(
        "recorded",
        f"{end - d.run['started_at']:.0f} s",
        help=f"of the {cfg.get('duration_s', 0):g} s asked for" if cfg.get("duration_s") else None,
    )
    cols[2].metric("stack samples", f"{view.all_samples:,}" if view is not None else "0")
    cols[3].metric(
        f"main thread in {top['label']}" if top is not None else "main thread",
        ui.fmt_pct(top["share"]) if top is not None else "—",
        help="the step phase with the most of the main thread's stack samples",
    )
    cols[4].metric(label, ui.fmt_bytes(peak, digits=3))
    reason = ATTACH_ENDS.get(str(d.run.get("stop_reason") or ""))
    st.caption(
        "Recorded by attaching to a running process: nothing was injected into it, so there "
        "is no step timer and no trace; its Python stacks and system figures were read "
        "from outside." + (f" {reason}" if reason else "")
    )


#: how an attach ended (runs.stop_reason), in words
ATTACH_ENDS = {
    "duration": "The attach ran for the whole duration asked for.",
    "process_ended": "The process ended while attached; everything until then was kept.",
    "detached": "It was stopped early (detached); what was recorded until then was kept.",
}


def stacks_section(view: data.StackView, key: str = "stacks") -> None:
    """Where the main thread spends its time: phase shares, the job's own hottest lines,
    and the shares per sampling window (stacks.classify_samples over the run's samples)."""
    st.subheader("Where the main thread spends its time")
    if view.samples == 0:
        st.info(
            f"{view.all_samples:,} stack samples were recorded, but none of a main thread "
            "that could be told apart: there is nothing to split into step phases.",
            icon=":material/info:",
        )
        return
    procs = f" of {view.processes} processes (ranks), averaged" if view.processes > 1 else ""
    st.caption(
        f"{view.samples:,} Python stack samples of the main thread{procs}, taken by py-spy "
        f"from outside the process over {view.duration_s:.0f} s ({view.windows} "
        f"window{'s' if view.windows != 1 else ''}); each goes to the step phase on its "
        "stack. DataLoader workers and other threads are left out."
    )
    left, right = st.columns([2, 3])
    with left:
        st.plotly_chart(charts.phase_shares_bar(view.shares), key=f"{key}_phases")
    with right:
        st.markdown("**Top lines of the job's own code**")
        from stepscope.analyzers.stacks import LABELS

        sites = view.sites
        st.dataframe(
            pd.DataFrame(
                {
                    "line": sites["site"],
                    "phase": [LABELS.get(c, c) for c in sites["category"]],
                    "samples": sites["samples"].astype(int),
                    "share (%)": sites["share"].astype(float) * 100,
                }
            ),
            hide_index=True,
            key=f"{key}_sites",
            column_config={
                "line": st.column_config.TextColumn(width="medium"),
                "share (%)": st.column_config.NumberColumn(format="%.1f"),
            },
        )
    st.markdown("**Over the recording**, per sampling window")
    st.plotly_chart(charts.phase_shares_over_time(view.over_time, view.t0), key=f"{key}_time")


# -- findings ----------------------------------------------------------------------------
def findings_section(home: str, run_id: int, found: list[dict[str, Any]]) -> None:
    st.subheader("Diagnosis")
    if not found:
        diagnose_button(home, run_id)
        return
    if any(fix.get("auto") for f in found for fix in f.get("fixes") or []):
        st.page_link(
            "views/optimize.py",
            label="Apply and compare…",
            icon=":material/science:",
            query_params={"run": str(run_id)},
            help="re-run the job with the automatic fixes applied, and measure the gain",
        )
    for i, f in enumerate(found):
        _finding(f, i)


def _finding(f: dict[str, Any], index: int) -> None:
    with st.container(border=True):
        cls = f.get("class", "")
        head = st.columns([6, 1, 1], vertical_alignment="center")
        with head[0]:
            st.badge(
                ui.class_label(cls),
                color=ui.CLASS_COLOR.get(cls, "gray"),  # type: ignore[arg-type]
            )
            st.markdown(f"**{f['title']}**  \n{f.get('subtype', '').replace('_', ' ')}")
        head[1].metric("share of step", ui.fmt_pct(f.get("share"), 0))
        head[2].metric("confidence", ui.fmt_pct(f.get("confidence"), 0))
        evidence = f.get("evidence") or []
        if evidence:
            st.markdown(
                "\n".join(
                    f"- {e.get('text', '')}"
                    + (f" <small>· {e['source']}</small>" if e.get("source") else "")
                    for e in evidence
                ),
                unsafe_allow_html=True,
            )
        st.caption(f"evidence level: {f.get('level', '—')}")
        fixes = f.get("fixes") or []
        if fixes:
            # the top finding's fixes are what the user came for; the others stay folded
            with st.expander(
                f"{len(fixes)} fix{'es' if len(fixes) > 1 else ''}", expanded=index == 0
            ):
                for fix in fixes:
                    _fix(fix)


def _fix(fix: dict[str, Any]) -> None:
    bits = []
    if fix.get("predicted_speedup"):
        bits.append(f"predicted up to **{fix['predicted_speedup']:.2f}x**")
    typical = fix.get("typical")
    if typical and len(typical) == 2:
        src = f" ({fix['typical_source']})" if fix.get("typical_source") else ""
        bits.append(f"typically {typical[0]:g}-{typical[1]:g}x{src}")
    bits.append("no code change needed" if fix.get("auto") else "needs a code change")
    if fix.get("changes_numerics"):
        bits.append("changes numerics")
    st.markdown(
        f":material/build: **{fix.get('title', fix.get('id', 'fix'))}** · " + " · ".join(bits)
    )
    if fix.get("basis"):
        st.caption(fix["basis"])
    if fix.get("snippet"):
        st.code(fix["snippet"], language="python")


def diagnose_button(home: str, run_id: int) -> None:
    """The Diagnose action of a run without findings (the Run and Optimize pages)."""
    try:
        from stepscope.analyzers.diagnosis import diagnose_run
    except ImportError:
        st.info(
            "This run has not been diagnosed, and this stepscope has no diagnosis module "
            "yet (`stepscope.analyzers.diagnosis`).",
            icon=":material/info:",
        )
        return
    done = st.session_state.get(f"diagnosed_{run_id}")
    reason = st.session_state.get(f"diagnosed_reason_{run_id}")
    if reason:
        st.info(f"Nothing to diagnose: {reason}", icon=":material/info:")
        return
    if done is not None:
        st.success(
            "Diagnosed: no bottleneck worth reporting was found in this run.",
            icon=":material/check:",
        )
    st.caption("This run has not been diagnosed yet.")
    if st.button("Diagnose", key="diagnose", icon=":material/troubleshoot:", type="primary"):
        try:
            with st.spinner("Diagnosing…"), data.open_store(home) as store:
                result = diagnose_run(store, run_id)
        except data.user_errors() as exc:
            ui.fail(f"diagnosis failed: {data.one_line(exc)}")
        except Exception as exc:  # a diagnosis bug must not take the page down
            log.exception("diagnosis of run %s failed", run_id)
            ui.fail(f"diagnosis failed ({type(exc).__name__}: {data.one_line(exc)})")
        st.session_state[f"diagnosed_{run_id}"] = len(getattr(result, "findings", []) or [])
        st.session_state[f"diagnosed_reason_{run_id}"] = getattr(result, "reason", None)
        st.rerun()


# -- trace sections --------------------------------------------------------------------------
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


def memory_section(report: Any, stamp: tuple | None) -> None:
    if report is None or stamp is None:
        st.info("The memory curve comes from a profiler trace; this run has none.")
        return
    mem = report.memory or {}
    if mem:
        rows = [
            {
                "device": dev,
                "peak allocated": ui.fmt_bytes(v.get("peak_allocated_bytes")),
                "peak reserved": ui.fmt_bytes(v.get("peak_reserved_bytes") or None),
                "capacity": ui.fmt_bytes(v.get("capacity_bytes")),
                "peak share": ui.fmt_pct(v.get("peak_share")),
            }
            for dev, v in mem.items()
        ]
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    curve = data.trace_memory_curve(stamp)
    if curve.empty:
        st.info("The trace holds no memory events (captured without profile_memory).")
        return
    st.plotly_chart(charts.memory_curve_chart(curve), key="memory_curve")


def kernels_ops_section(report: Any, top: int = 15) -> None:
    k, o = report.kernels_top, report.ops_top
    if k.empty:
        st.caption("No device kernels in the trace (a CPU-only job): operators only.")
        _ops_table(o, top)
        return
    left, right = st.columns(2)
    with left:
        st.markdown("**Top kernels** (device time)")
        st.dataframe(
            pd.DataFrame(
                {
                    "kernel": k["name"],
                    "class": k["class"],
                    "calls": k["count"],
                    "total (ms)": k["total_ns"] / 1e6,
                    "mean (µs)": k["mean_ns"] / 1e3,
                    "share (%)": k["share"] * 100,
                }
            ).head(top),
            hide_index=True,
            column_config=_number_formats(),
        )
    with right:
        _ops_table(o, top)


def _ops_table(o: pd.DataFrame, top: int) -> None:
    st.markdown("**Top operators** (CPU self time)")
    if o.empty:
        st.caption("No CPU operators in the trace.")
        return
    st.dataframe(
        pd.DataFrame(
            {
                "operator": o["name"],
                "calls": o["count"],
                "self (ms)": o["self_ns"] / 1e6,
                "total (ms)": o["total_ns"] / 1e6,
                "share (%)": o["share"] * 100,
            }
        ).head(top),
        hide_index=True,
        column_config=_number_formats(),
    )


def _number_formats() -> dict[str, Any]:
    fmt = st.column_config.NumberColumn
    return {
        "total (ms)": fmt(format="%.2f"),
        "self (ms)": fmt(format="%.2f"),
        "mean (µs)": fmt(format="%.1f"),
        "share (%)": fmt(format="%.1f"),
    }


def timeline_section(stamp: tuple) -> None:
    steps = data.trace_steps(stamp)
    steps = steps[steps["step"] >= 0] if (steps["step"] >= 0).any() else steps
    options = [(int(r), int(s)) for r, s in zip(steps["rank"], steps["step"], strict=True)]
    multi_rank = len({r for r, _ in options}) > 1

    def label(o: tuple[int, int]) -> str:
        step = "whole trace" if o[1] < 0 else f"step {o[1]}"
        return f"rank {o[0]} · {step}" if multi_rank else step

    pick = st.selectbox("profiled step", options, format_func=label, key="timeline_step")
    tl = data.trace_step_timeline(stamp, pick[0], pick[1])
    if tl.empty:
        st.info("No operators or kernels in this step.")
        return
    total, kept = tl.attrs.get("total", len(tl)), tl.attrs.get("kept", len(tl))
    st.caption(
        "CPU threads and device streams as lanes, nested ranges stacked; "
        + (
            f"the {kept:,} longest of {total:,} events are drawn (shorter ones are not "
            "visible at this zoom)."
            if kept < total
            else f"all {total:,} events."
        )
        + " Python-tracer ranges are left out."
    )
    st.plotly_chart(charts.step_timeline_chart(tl), key="timeline")


# -- files and actions -----------------------------------------------------------------------
def downloads(paths: list[str], missing: list[str]) -> None:
    st.markdown("**Kineto trace files** (open unchanged in Perfetto, TensorBoard or HTA)")
    for i, p in enumerate(paths):
        path = Path(p)
        st.download_button(
            f"{path.name} ({ui.fmt_bytes(path.stat().st_size)})",
            data=functools.partial(path.read_bytes),
            file_name=path.name,
            mime="application/gzip" if path.name.endswith(".gz") else "application/json",
            on_click="ignore",
            icon=":material/download:",
            key=f"download_{i}",
        )
    for p in missing:
        st.warning(f"{p}: recorded but no longer on disk", icon=":material/warning:")


@st.cache_resource
def _tensorboards() -> dict[str, tb_launch.TensorBoard]:
    """TensorBoards started by this dashboard, one per folder, shared by all sessions."""
    import atexit

    started: dict[str, tb_launch.TensorBoard] = {}
    atexit.register(lambda: [tb.stop() for tb in started.values()])
    return started


def tensorboard_action(run_dir: str, has_trace: bool) -> None:
    st.markdown("**TensorBoard** (torch-tb-profiler's views)")
    reason = tb_launch.unavailable_reason()
    if reason is None and not has_trace:
        reason = "this run has no trace for it to show"
    running = _tensorboards().get(run_dir)
    if running is not None and not running.alive():
        _tensorboards().pop(run_dir, None)
        running = None
    clicked = st.button(
        "Open in TensorBoard",
        key="tensorboard",
        icon=":material/open_in_browser:",
        disabled=reason is not None,
        help=reason or "starts TensorBoard on this run's folder, on 127.0.0.1",
    )
    if reason is not None:
        st.caption(f"Not available: {reason}.")
        return
    if clicked and running is None:
        with st.spinner("Starting TensorBoard…"):
            tb = tb_launch.start_tensorboard(run_dir)
            ok = tb_launch.wait_listening(tb)
        if not ok:
            tb.stop()
            ui.fail(f"TensorBoard did not start: {tb_launch.last_log_line(tb) or 'no output'}")
        _tensorboards()[run_dir] = tb
        running = tb
    if running is not None:
        st.link_button(f"TensorBoard at {running.url}", running.url, icon=":material/link:")
    st.caption(tb_launch.PLUGIN_NOTE)


def capture_action(run_dir: str) -> None:
    """Only offered for a running job: it is the job that reads the request."""
    from stepscope.collectors.control import request_capture

    with st.container(border=True):
        c1, c2 = st.columns([1, 3], vertical_alignment="bottom")
        k = int(c1.number_input("steps", min_value=1, max_value=100, value=3, key="capture_k"))
        if c2.button(f"Capture {k} steps", key="capture", icon=":material/radio_button_checked:"):
            request_id = request_capture(run_dir, k)
            st.success(
                f"Asked the job to profile its next {k} step(s) (request {request_id[:8]}); "
                "the trace appears here when they are done."
            )


def events_section(events: pd.DataFrame) -> None:
    if events.empty:
        st.caption("Nothing logged.")
        return
    st.dataframe(
        pd.DataFrame(
            {
                "time": [datetime.fromtimestamp(t) for t in events["t"]],
                "rank": events["rank"].astype("Int64"),
                "level": events["level"],
                "source": events["source"],
                "message": events["message"],
            }
        ),
        hide_index=True,
    )
