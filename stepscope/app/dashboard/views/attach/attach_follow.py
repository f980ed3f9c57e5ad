"""The Attach page on one attach (``?run=ID``): its progress and Stop while it records,
then how it ended, where the main thread spent its time, and the top finding.

Everything is read from the attach's run, so an attach started from the command line
is followed the same way as one started by the page.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.app.dashboard import data, stack_data, ui
from stepscope.app.dashboard.access import actions_refusal
from stepscope.app.dashboard.views.run.stack_sections import ATTACH_ENDS
from stepscope.app.formats import fmt_pct
from stepscope.collectors.attach.attach import DEFAULT_DURATION_S, stop_attach
from stepscope.collectors.attach.attach_session import process_alive
from stepscope.types import Finding


@st.fragment(run_every=data.LIVE_REFRESH_S)
def _live_progress(home: str, run_id: int) -> None:
    """Seconds recorded out of the duration and the stack samples so far, redrawn every
    couple of seconds; the whole page once the attach has ended."""
    with ui.errors_as_one_line():
        run = data.run_header(home, run_id)
        samples = stack_data.stack_sample_count(home, run_id)
        with data.open_store(home) as store:
            steps = store.step_count(run_id)[0]
    if run["status"] != "running":
        st.rerun(scope="app")
    duration = float((run.get("config") or {}).get("duration_s") or DEFAULT_DURATION_S)
    elapsed = max(0.0, time.time() - float(run["started_at"]))
    mode = stack_data.inject_mode(run)
    counted = f" · {steps:,} steps" if mode == "injected" else ""
    st.progress(
        min(1.0, elapsed / duration),
        text=f"{elapsed:.0f} of {duration:g} s{counted} · {samples:,} stack samples so far",
    )
    st.caption(
        "Stack samples are stored a sampling window (a few seconds) at a time, so their "
        "count moves in steps; py-spy reads the process's memory from outside without "
        "stopping it."
        + (" Steps arrive as the job's collectors write them (every second)." if counted else "")
    )


def _mode_line(run: dict[str, Any]) -> None:
    """Which of the two an attach is (``collectors/attach/inject.py``), and why."""
    inject = (run.get("config") or {}).get("inject") or {}
    if inject.get("mode") == "injected":
        st.caption(
            f":material/input: stepscope run's collectors are in the process ({ui.no_links(inject.get('how'))}):"
            " its steps, requests and captures are recorded; they come out at the end."
        )
    elif inject.get("mode") == "stacks":
        st.caption(
            f":material/visibility: Recorded from outside only (stacks and system figures): "
            f"{ui.no_links(inject.get('why') or 'no reason recorded')}."
        )
    elif run["status"] == "running":
        st.caption(":material/hourglass_top: Putting stepscope's collectors into the process…")


def _stop_button(home: str, run_id: int) -> None:
    """SIGINT to the attach: it ends its sampling window, keeps it, and diagnoses."""
    asked = st.session_state.get(f"detach_asked_{run_id}", False)
    off = actions_refusal()
    if st.button(
        "Stop",
        key="attach_stop",
        icon=":material/stop_circle:",
        disabled=asked or off is not None,
        help=off
        or (
            "detaching: the last window is being written"
            if asked
            else "detach now, keep what was recorded (the process goes on)"
        ),
    ):
        with ui.errors_as_one_line(), data.open_store(home) as store:
            sent = stop_attach(store, run_id)
        st.session_state[f"detach_asked_{run_id}"] = sent
        st.rerun()  # sent or not (it had just ended), the page shows what is true now
    if asked:
        st.info(
            "Detaching: the collectors leave the process and the sampling window under way "
            "is written, then what was recorded is diagnosed. The process goes on.",
            icon=":material/hourglass_bottom:",
        )


@st.fragment(run_every=1.0)
def _wait_diagnosis(home: str, run_id: int, attacher: int, attacher_started: float | None) -> None:
    """The attach has ended its run and is diagnosing it (a second or two)."""
    with ui.errors_as_one_line():
        found = data.findings(home, run_id)
    if found or not process_alive(attacher, attacher_started):
        st.rerun(scope="app")
    st.info("Diagnosing what was recorded…", icon=":material/troubleshoot:")


def _top_finding(found: list[Finding]) -> None:
    """The first finding as its headline; the others and all fixes are the Run page's."""
    f = found[0]
    with st.container(border=True):
        head = st.columns([6, 1], vertical_alignment="center")
        with head[0]:
            st.badge(f.label, color=ui.CLASS_COLOR.get(f.klass, "gray"))  # type: ignore[arg-type]
            st.markdown(f"**{f.title}**")
            evidence = f.evidence[0].text if f.evidence else ""
            if evidence:
                st.caption(evidence)
        head[1].metric("share", fmt_pct(f.share, 0))
    more = len(found) - 1
    fixes = sum(len(x.fixes) for x in found)
    st.caption(
        f"The top finding; {more} more and {fixes} fixes on the Run page."
        if more
        else f"{fixes} fixes for it on the Run page."
    )


def _result(home: str, run: dict[str, Any]) -> None:
    """The attach has ended: how, what the main thread did, the top finding, the way on."""
    run_id = int(run["id"])
    with ui.errors_as_one_line():
        events = data.run_data(home, run_id, data.run_marker(run)).events
        view = stack_data.stack_view(home, run_id, data.run_marker(run))
        found = data.findings(home, run_id)
    status = run["status"]
    if status in ("failed", "killed", "lost", "interrupted"):
        st.warning(
            f"The attach ended {status}: {ui.failure_line(run)}. What it recorded until then "
            "is kept.",
            icon=":material/warning:",
        )
    reason = str(run.get("stop_reason") or "")
    ends = ATTACH_ENDS.get(reason)
    if ends and reason == "process_ended":  # not an error, but not what was asked either
        st.info(ends, icon=":material/info:")
    elif ends:
        st.success(ends, icon=":material/check_circle:")
    for level, message in _attach_messages(events):
        (st.warning if level == "warning" else st.caption)(message)
    if view is not None and view.samples:
        shown = view.shares[view.shares["share"] >= 0.005]
        st.markdown(
            "**Main thread**: "
            + " · ".join(f"{r.label} {fmt_pct(r.share)}" for r in shown.itertuples())
        )
    elif view is None:
        st.caption("No stack samples were recorded: the diagnosis rests on the system samples.")
    if found:
        _top_finding(found)
    elif process_alive(run.get("pid"), run.get("pid_started_at")):
        _wait_diagnosis(home, run_id, int(run["pid"]), run.get("pid_started_at"))
    elif status in ("completed", "stopped"):
        st.info("No bottleneck worth reporting was found in what was recorded.")
    else:  # the attach did not get to its diagnosis
        st.info("Not diagnosed: the Run page has a Diagnose button for what was recorded.")
    st.page_link(
        "views/run/page.py",
        label=f"Open run {run_id}: where the time goes, the diagnosis and its fixes",
        icon=":material/open_in_new:",
        query_params={"run": str(run_id)},
    )


def _attach_messages(events: pd.DataFrame) -> list[tuple[str, str]]:
    """The attach's own one-line messages after its first ('attached to ...'), which the
    caption above already says."""
    if events.empty:
        return []
    mine = events[events["source"] == "attach"]
    rows = list(zip(mine["level"], mine["message"], strict=True))
    return [(str(lv), str(m)) for lv, m in rows if not str(m).startswith("attached to process")]


def follow(home: str, run_id: int) -> None:
    """One attach, running or ended, from its run (the URL's ``?run=``)."""
    with ui.errors_as_one_line():  # RunNotFound too: "no run with id N in HOME"
        run = data.run_header(home, run_id)
    if not stack_data.is_attach(run):
        st.warning(f"Run {run_id} was not recorded by an attach.", icon=":material/info:")
        st.page_link(
            "views/run/page.py",
            label=f"Open run {run_id}",
            icon=":material/open_in_new:",
            query_params={"run": str(run_id)},
        )
        return
    cfg = run.get("config") or {}
    st.subheader(f"Run {run_id} · {run['name']}")
    ui.status_badge(run["status"])
    started = datetime.fromtimestamp(run["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
    st.caption(
        f"attached to process {cfg.get('attached_pid', '?')} at {started}, "
        f"for {cfg.get('duration_s', 0):g} s at most"
    )
    st.code(ui.fmt_command(run["command"]), language="bash")
    _mode_line(run)
    if run["status"] == "running":
        _live_progress(home, run_id)
        _stop_button(home, run_id)
        st.caption(
            "The attach runs in a process of its own: this page can be closed and reopened "
            "(the URL names the run)."
        )
    else:
        _result(home, run)
