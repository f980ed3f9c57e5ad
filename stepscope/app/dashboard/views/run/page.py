"""Run: one run's figures, diagnosis, charts, trace views and actions (``?run=ID``).

``?run=`` takes what the CLI takes: an id, a name or ``last``, so a link can be typed.
While the job runs, the headline and step charts redraw themselves every couple of
seconds; the trace analyses are cached per trace file and run once.
"""

from __future__ import annotations

import time
from datetime import datetime

import streamlit as st

from stepscope.app.dashboard import data, stack_data, trace_data, ui
from stepscope.app.dashboard.views.run import (
    findings_view,
    generation_view,
    memory_view,
    nodes_section,
    run_actions,
    stack_sections,
    trace_sections,
)
from stepscope.app.dashboard.views.run import hardware_sections as hw
from stepscope.app.dashboard.views.run import run_sections as sec
from stepscope.store import RunNotFound

home = data.store_home()

with ui.errors_as_one_line():
    choices = data.run_choices(home)
if choices.empty:
    st.title("Run")
    st.info("No runs yet. Start one with:", icon=":material/rocket_launch:")
    st.code(ui.HOW_TO_START, language="bash")
    st.stop()

ref = st.query_params.get("run")
with ui.errors_as_one_line():
    try:
        with data.open_store(home) as store:
            run_id = store.resolve_run(ref) if ref else int(choices["id"].iloc[0])
    except RunNotFound as exc:
        st.title("Run")
        st.page_link("views/runs/page.py", label="All runs", icon=":material/arrow_back:")
        ui.fail(f"{data.one_line(exc)}")
ui.set_query(run=run_id)
run_actions.remember_run(run_id)  # the sidebar's Optimize opens on this run

ui.sidebar_run_picker(home, choices, run_id, with_status=True)
run_actions.compare_with_link(home, run_id)  # a run of the same command first

with ui.errors_as_one_line():
    header = data.run_header(home, run_id)
    d = data.run_data(home, run_id, data.run_marker(header))
run = d.run
live = run["status"] == "running"

st.title(f"Run {run_id} · {run['name']}")
ui.status_badge(run["status"])
started = datetime.fromtimestamp(run["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
end = run["ended_at"] if run["ended_at"] else time.time()
st.caption(
    f"started {started} · {end - run['started_at']:.1f} s"
    + (" so far" if live else "")
    + (f" · by {run['user']}" if run.get("user") else "")
    + f" · host {run['host']} · folder `{d.run_dir}`"
)
st.code(ui.fmt_command(run["command"]), language="bash")
if ui.stop_line(run):
    st.caption(ui.stop_line(run))
sec.applied_section(run)
if run["status"] in ("failed", "killed"):
    st.error(f"{run['status']}: {ui.failure_line(run)}", icon=":material/error:")
elif run["status"] in ("lost", "interrupted"):  # stopped by someone, not broken
    st.warning(f"{run['status']}: {ui.failure_line(run)}", icon=":material/warning:")
attached = stack_data.is_attach(run)
# an attach from outside only has no step timer in the job, and so no Capture
steps_in_job = not attached or stack_data.inject_mode(run) == "injected"
if live and attached:
    st.page_link(
        "views/attach/page.py",
        label="Attaching now: follow it (progress, Stop)",
        icon=":material/link:",
        query_params={"run": str(run_id)},
    )
if live and steps_in_job:
    run_actions.capture_action(d.run_dir, run)


@st.fragment(run_every=data.LIVE_REFRESH_S if live else None)
def live_headline() -> None:
    """The headline figures: what changes while the job runs."""
    with ui.errors_as_one_line():
        h = data.run_header(home, run_id)
        dd = data.run_data(home, run_id, data.run_marker(h))
    if live and h["status"] != "running":
        st.rerun(scope="app")  # finished: redraw everything once, then stop refreshing
    if attached and dd.steps.empty:
        stack_sections.attach_headline(dd, stack_data.stack_view(home, run_id, data.run_marker(h)))
        return
    with ui.errors_as_one_line():  # a generation job leads with its requests' figures
        generation_view.headline(home, run_id, data.run_marker(h), live)
    sec.headline(dd, report)


@st.fragment(run_every=data.LIVE_REFRESH_S if live else None)
def live_stacks() -> None:
    """Where the main thread spends its time; nothing at all for a run without stack
    samples (only attached runs have them)."""
    with ui.errors_as_one_line():
        marker = data.run_marker(data.run_header(home, run_id))
        view = stack_data.stack_view(home, run_id, marker)
    if view is not None:
        stack_sections.stacks_section(view)
    elif live and attached:
        st.subheader("Where the main thread spends its time")
        st.info("No stack samples yet: they arrive a sampling window (a few seconds) at a time.")


@st.fragment(run_every=data.LIVE_REFRESH_S if live else None)
def live_step_charts() -> None:
    with ui.errors_as_one_line():
        dd = data.run_data(home, run_id, data.run_marker(data.run_header(home, run_id)))
    sec.step_charts(dd, report)
    if report is not None:
        hw.phase_section(dd.steps, report)
    sec.latency_section(dd)  # inference runs only


# -- trace ------------------------------------------------------------------------------
paths, missing = trace_data.trace_files(d)
report = None
stamp = None
held = False  # a trace not analysed: too big to do unasked (a click may), or refused
if paths:
    try:
        stamp = trace_data.file_stamp(paths)
        held = not trace_sections.analysis_allowed(stamp)
        if held:
            stamp = None
        else:
            report = trace_data.trace_report(stamp, home, trace_data.calibration_stamp(home))
    except data.user_errors() as exc:
        st.error(f"The trace could not be analysed: {data.one_line(exc)}", icon=":material/error:")
        stamp = None
    else:
        for w in report.warnings if report is not None else []:
            st.caption(f":material/warning: {w}")

live_headline()
hw.mfu_headline(report, home, run.get("host"))

diagnosis = None  # a failed diagnosis says why in one line, and offers the button again
with ui.errors_as_one_line():
    diagnosis = data.diagnosis(home, run_id, report, read_trace=not held)
findings_view.findings_section(home, run_id, diagnosis)
generation_view.generation_section(home, run_id, live)  # runs that served requests only

if steps_in_job:  # an attach from outside has no step timer: its stack samples stand in
    st.subheader("Steps")
    if report is None and not paths:
        sec.no_trace_hint(run_id, live)
    live_step_charts()
    nodes_section.nodes_section(home, run_id, data.run_marker(header), d.steps, report)
live_stacks()

tabs = st.tabs(
    ["System", "Memory", "Kernels & operators", "Roofline", "Step timeline", "Files & tools", "Log"]
)
with tabs[0]:
    fig = nodes_section.system_figure(
        home, run_id, data.run_marker(header), d.samples, float(run["started_at"])
    )
    if fig is None:
        st.info("No system samples were recorded for this run.")
    else:
        st.plotly_chart(fig, key="system")
with tabs[1], ui.errors_as_one_line():
    if held:
        st.info(trace_sections.HELD_BACK)
    else:
        trace_sections.memory_section(report, stamp)
        memory_view.peak_section(home, run_id, data.run_marker(header))
with tabs[2]:
    if held:
        st.info(trace_sections.HELD_BACK)
    elif report is None:
        st.info("Kernels and operators come from a profiler trace; this run has none.")
    else:
        trace_sections.kernels_ops_section(report)
with tabs[3]:
    if held:
        st.info(trace_sections.HELD_BACK)
    else:
        hw.roofline_section(report)
with tabs[4]:
    if held:
        st.info(trace_sections.HELD_BACK)
    elif stamp is None:
        st.info("The step timeline comes from a profiler trace; this run has none.")
    else:
        with ui.errors_as_one_line():
            trace_sections.timeline_section(stamp)
with tabs[5]:
    if paths or missing:
        trace_sections.downloads(paths, missing)
    else:
        st.caption("No trace files.")
    run_actions.tensorboard_action(d.run_dir, has_trace=bool(paths))
with tabs[6]:
    sec.events_section(d.events)
