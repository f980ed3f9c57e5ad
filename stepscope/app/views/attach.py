"""Attach: record a process that is already running (``?run=ID`` follows one attach).

The page lists the processes one could attach to (``process_list.candidates``); the
click starts ``stepscope attach`` in a process of its own (``attach.start_attach``) and
puts the run it records into in the URL, the way Optimize does with an experiment: the
recording goes on if the page is closed, and a reload (or another browser) shows the
same one, with its progress and its Stop button. Recordings under way are also listed
from the store, so one started from the command line can be followed here too.

A job started with ``stepscope run`` is recorded already, and better (its steps, data
wait, traces on request): for it the page offers that run and a capture first, and a
second, stacks-only recording only as "Attach anyway".
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import streamlit as st

from stepscope.app import data, ui
from stepscope.app import run_sections as sec
from stepscope.collectors.attach import (
    DEFAULT_DURATION_S,
    AttachError,
    attach_log,
    attach_run_of,
    start_attach,
    stop_attach,
)
from stepscope.store import RunNotFound

#: how long the click waits for the attach to create its run before the page polls
START_WAIT_S = 8.0
#: after this long without a run, the attach is taken as failed (its log says why)
START_TIMEOUT_S = 60.0
MAX_DURATION_S = 24 * 3600

home = data.store_home()


# -- the attach processes ------------------------------------------------------------------
@st.cache_resource
def _attachers() -> dict[int, subprocess.Popen]:
    """Attach processes started by this dashboard, by pid, shared by all sessions.

    Kept so that they are reaped (``poll``) when they end, whichever session looks next:
    an unreaped one would stay a zombie, which the store takes as alive no longer but
    which still clutters the process table for as long as the dashboard runs.
    """
    return {}


def _reap() -> None:
    for pid, proc in list(_attachers().items()):
        if proc.poll() is not None:
            _attachers().pop(pid, None)


def _alive(pid: int | None, started_at: float | None = None) -> bool:
    """Whether a process runs (not a zombie, not a newer process under a reused pid)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(int(pid))
        if started_at is not None and abs(proc.create_time() - float(started_at)) > 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def _log_line(target: int) -> str:
    """The last line the attach wrote to its log (``attach.attach_log``)."""
    path = attach_log(home, target)
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return "it wrote no log"
    last = next((ln for ln in reversed(lines) if ln), "")
    return last.removeprefix("stepscope: ") or "it wrote nothing to its log"


def _resolve(pending: dict[str, Any]) -> tuple[str, Any]:
    """What became of an attach started by the click: ('run', id) once it records,
    ('failed', one line) if it ended or never started, else ('waiting', None)."""
    with ui.errors_as_one_line(), data.open_store(home) as store:
        run_id = attach_run_of(store, pending["attacher"], pending["since"])
    if run_id is not None:
        return "run", run_id
    proc = _attachers().get(pending["attacher"])
    ended = proc.poll() is not None if proc is not None else not _alive(pending["attacher"])
    if ended:
        with ui.errors_as_one_line(), data.open_store(home) as store:
            run_id = attach_run_of(store, pending["attacher"], pending["since"])
        if run_id is not None:  # it created its run just before ending
            return "run", run_id
        return (
            "failed",
            f"Attach to process {pending['target']} failed: {_log_line(pending['target'])}",
        )
    if time.time() - pending["since"] > START_TIMEOUT_S:
        log = attach_log(home, pending["target"])
        return "failed", (
            f"The attach to process {pending['target']} did not start within "
            f"{START_TIMEOUT_S:.0f} s; its log: {log}"
        )
    return "waiting", None


def _start(pid: int, duration_s: float, name: str) -> None:
    """The Attach click: start the attach, then follow its run (or say why not, once)."""
    since = time.time()
    try:
        proc = start_attach(pid, duration_s=duration_s, name=name or None, home=home)
    except (AttachError, *data.user_errors()) as exc:
        st.session_state["attach_error"] = f"Cannot attach: {data.one_line(exc)}"
        st.session_state.pop("attach_candidates", None)  # the list is stale: scan again
        st.rerun()
    _attachers()[proc.pid] = proc
    pending = {"attacher": proc.pid, "since": since, "target": pid}
    st.session_state["attach_pending"] = pending
    deadline = time.monotonic() + START_WAIT_S
    with st.spinner(f"Attaching to process {pid}…"):
        while (outcome := _resolve(pending))[0] == "waiting" and time.monotonic() < deadline:
            time.sleep(0.2)
    _settle(outcome)


def _settle(outcome: tuple[str, Any]) -> None:
    """Leave the waiting state when the attach has a run (follow it) or has failed."""
    kind, value = outcome
    if kind == "waiting":
        st.rerun()  # the page polls from here on
    st.session_state.pop("attach_pending", None)
    if kind == "run":
        ui.set_query(run=int(value))
    else:
        st.session_state["attach_error"] = value
        st.session_state.pop("attach_candidates", None)
    st.rerun()


@st.fragment(run_every=0.5)
def _waiting(pending: dict[str, Any]) -> None:
    """The attach process is starting (imports, py-spy): poll until it has a run."""
    outcome = _resolve(pending)
    if outcome[0] != "waiting":
        st.session_state.pop("attach_pending", None)
        if outcome[0] == "run":
            ui.set_query(run=int(outcome[1]))
        else:
            st.session_state["attach_error"] = outcome[1]
        st.rerun(scope="app")
    st.info(f"Starting the attach to process {pending['target']}…", icon=":material/hourglass_top:")


# -- following one attach (?run=ID) ------------------------------------------------------------
@st.fragment(run_every=data.LIVE_REFRESH_S)
def _live_progress(run_id: int) -> None:
    """Seconds recorded out of the duration and the stack samples so far, redrawn every
    couple of seconds; the whole page once the attach has ended."""
    with ui.errors_as_one_line():
        run = data.run_header(home, run_id)
        samples = data.stack_sample_count(home, run_id)
    if run["status"] != "running":
        st.rerun(scope="app")
    duration = float((run.get("config") or {}).get("duration_s") or DEFAULT_DURATION_S)
    elapsed = max(0.0, time.time() - float(run["started_at"]))
    st.progress(
        min(1.0, elapsed / duration),
        text=f"{elapsed:.0f} of {duration:g} s · {samples:,} stack samples so far",
    )
    st.caption(
        "Stack samples are stored a sampling window (a few seconds) at a time, so their "
        "count moves in steps. Nothing is injected into the process: py-spy reads its "
        "memory from outside without stopping it."
    )


def _stop_button(run_id: int) -> None:
    """SIGINT to the attach: it ends its sampling window, keeps it, and diagnoses."""
    asked = st.session_state.get(f"detach_asked_{run_id}", False)
    if st.button(
        "Stop",
        key="attach_stop",
        icon=":material/stop_circle:",
        disabled=asked,
        help="detaching: the last window is being written"
        if asked
        else "detach now, keep what was recorded (the process goes on)",
    ):
        with ui.errors_as_one_line(), data.open_store(home) as store:
            sent = stop_attach(store, run_id)
        st.session_state[f"detach_asked_{run_id}"] = sent
        st.rerun()  # sent or not (it had just ended), the page shows what is true now
    if asked:
        st.info(
            "Detaching: the sampling window under way is written, then what was recorded "
            "is diagnosed. The process goes on untouched.",
            icon=":material/hourglass_bottom:",
        )


@st.fragment(run_every=1.0)
def _wait_diagnosis(run_id: int, attacher: int, attacher_started: float | None) -> None:
    """The attach has ended its run and is diagnosing it (a second or two)."""
    with ui.errors_as_one_line():
        found = data.findings(home, run_id)
    if found or not _alive(attacher, attacher_started):
        st.rerun(scope="app")
    st.info("Diagnosing what was recorded…", icon=":material/troubleshoot:")


def _top_finding(found: list[dict[str, Any]]) -> None:
    """The first finding as its headline; the others and all fixes are the Run page's."""
    f = found[0]
    with st.container(border=True):
        cls = f.get("class", "")
        head = st.columns([6, 1], vertical_alignment="center")
        with head[0]:
            st.badge(ui.class_label(cls), color=ui.CLASS_COLOR.get(cls, "gray"))  # type: ignore[arg-type]
            st.markdown(f"**{f['title']}**")
            evidence = (f.get("evidence") or [{}])[0].get("text")
            if evidence:
                st.caption(evidence)
        head[1].metric("share", ui.fmt_pct(f.get("share"), 0))
    more = len(found) - 1
    fixes = sum(len(x.get("fixes") or []) for x in found)
    st.caption(
        f"The top finding; {more} more and {fixes} fixes on the Run page."
        if more
        else f"{fixes} fixes for it on the Run page."
    )


def _result(run: dict[str, Any]) -> None:
    """The attach has ended: how, what the main thread did, the top finding, the way on."""
    run_id = int(run["id"])
    with ui.errors_as_one_line():
        events = data.run_data(home, run_id, data.run_marker(run)).events
        view = data.stack_view(home, run_id, data.run_marker(run))
        found = data.findings(home, run_id)
    status = run["status"]
    if status in ("failed", "killed", "lost", "interrupted"):
        st.warning(
            f"The attach ended {status}: {ui.failure_line(run)}. What it recorded until then "
            "is kept.",
            icon=":material/warning:",
        )
    reason = str(run.get("stop_reason") or "")
    ends = sec.ATTACH_ENDS.get(reason)
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
            + " · ".join(f"{r.label} {ui.fmt_pct(r.share)}" for r in shown.itertuples())
        )
    elif view is None:
        st.caption("No stack samples were recorded: the diagnosis rests on the system samples.")
    if found:
        _top_finding(found)
    elif _alive(run.get("pid"), run.get("pid_started_at")):
        _wait_diagnosis(run_id, int(run["pid"]), run.get("pid_started_at"))
    elif status in ("completed", "stopped"):
        st.info("No bottleneck worth reporting was found in what was recorded.")
    else:  # the attach did not get to its diagnosis
        st.info("Not diagnosed: the Run page has a Diagnose button for what was recorded.")
    st.page_link(
        "views/run.py",
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


def follow(run_id: int) -> None:
    """One attach, running or ended, from its run (the URL's ``?run=``)."""
    with ui.errors_as_one_line():  # RunNotFound too: "no run with id N in HOME"
        run = data.run_header(home, run_id)
    if not data.is_attach(run):
        st.warning(f"Run {run_id} was not recorded by an attach.", icon=":material/info:")
        st.page_link(
            "views/run.py",
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
    if run["status"] == "running":
        _live_progress(run_id)
        _stop_button(run_id)
        st.caption(
            "The attach runs in a process of its own: this page can be closed and reopened "
            "(the URL names the run)."
        )
    else:
        _result(run)


# -- picking a process ----------------------------------------------------------------------
def _candidates(refresh: bool) -> tuple[list[dict[str, Any]], float]:
    """The processes one could attach to, scanned once per session and on Refresh (a
    scan measures CPU over a fraction of a second: not for every click on the page)."""
    from stepscope.collectors.process_list import candidates

    held = st.session_state.get("attach_candidates")
    if refresh or held is None:
        with st.spinner("Looking for processes…"):
            held = {"rows": candidates(Path(home)), "at": time.time()}
        st.session_state["attach_candidates"] = held
    return held["rows"], held["at"]


def _mib(value: Any) -> float | None:
    return None if value is None else float(value) / 2**20


def _table(rows: list[dict[str, Any]], attaching: dict[int, int]) -> pd.DataFrame:
    def mark(r: dict[str, Any]) -> str:
        if r["run_id"] is not None:
            return f"stepscope run {r['run_id']}"
        if r["pid"] in attaching:
            return f"attaching: run {attaching[r['pid']]}"
        return ""

    return pd.DataFrame(
        {
            "pid": [r["pid"] for r in rows],
            "user": [r["user"] or "?" for r in rows],
            # float columns: a figure we may not read (another user's process) is NaN,
            # shown empty, and the numbers stay sortable
            "CPU %": pd.Series([r["cpu_percent"] for r in rows], dtype="float64"),
            "memory (MiB)": pd.Series([_mib(r["rss_bytes"]) for r in rows], dtype="float64"),
            "GPU memory (MiB)": pd.Series(
                [_mib(r["gpu_mem_bytes"]) for r in rows], dtype="float64"
            ),
            "stepscope": [mark(r) for r in rows],
            "command": [r["command"] for r in rows],
            "started": [
                datetime.fromtimestamp(r["started_at"]) if r["started_at"] else None for r in rows
            ],
        },
        columns=[
            "pid",
            "user",
            "CPU %",
            "memory (MiB)",
            "GPU memory (MiB)",
            "stepscope",
            "command",
            "started",
        ],
    )


def _known_run(row: dict[str, Any], duration: int, name: str) -> None:
    """A `stepscope run` job: its run and a capture first, a second recording last."""
    run_id = int(row["run_id"])
    try:
        with data.open_store(home) as store:
            run = store.run(run_id)
            run_dir = str(store.home / "runs" / str(run_id))
    except RunNotFound:
        run = None
    if run is None:  # the store was emptied under the job: attach is all there is
        _plain(row, duration, name)
        return
    st.info(
        f"Process {row['pid']} is the job of **run {run_id}** ({run['name']}), started with "
        "`stepscope run`: its steps, data wait and system figures are recorded there "
        "already, and a profiler trace is one click away.",
        icon=":material/info:",
    )
    st.page_link(
        "views/run.py",
        label=f"Open run {run_id}",
        icon=":material/open_in_new:",
        query_params={"run": str(run_id)},
    )
    if run["status"] == "running":
        st.markdown(f"**Capture** a profiler trace of the next steps of run {run_id}:")
        sec.capture_action(run_dir)
    with st.expander("Attach anyway (a second, stacks-only recording)"):
        st.caption(
            "Records this process's Python stacks and system figures into a new run of "
            f"their own, beside run {run_id}; the run's own figures are the better ones."
        )
        if st.button("Attach anyway", key="attach_anyway", icon=":material/link:"):
            _start(int(row["pid"]), float(duration), name)


def _plain(row: dict[str, Any], duration: int, name: str) -> None:
    if not row["python"]:
        st.caption(
            f":material/warning: process {row['pid']} does not look like Python: only its "
            "system figures can be recorded (py-spy reads Python stacks)."
        )
    if st.button(
        f"Attach to {row['pid']} for {duration} s",
        key="attach",
        type="primary",
        icon=":material/link:",
        help="records it in the background into a new run; the process is not changed",
    ):
        _start(int(row["pid"]), float(duration), name)


def pick() -> None:
    """The processes, the choice, the duration and name, and the Attach button."""
    live = data.running_attaches(home) if (Path(home) / "stepscope.db").exists() else []
    if live:
        st.markdown("**Attaching now**")
        for r in live:
            cfg = r.get("config") or {}
            elapsed = time.time() - float(r["started_at"])
            st.page_link(
                "views/attach.py",
                label=(
                    f"Run {r['id']} · process {cfg.get('attached_pid', '?')} · "
                    f"{elapsed:.0f} of {cfg.get('duration_s', 0):g} s"
                ),
                icon=":material/sync:",
                query_params={"run": str(r["id"])},
            )
    st.subheader("Processes")
    top = st.columns([1, 4], vertical_alignment="center")
    refresh = top[0].button("Refresh", key="attach_refresh", icon=":material/refresh:")
    rows, scanned = _candidates(refresh)
    top[1].caption(
        f"Python processes, and any holding a GPU, scanned at "
        f"{datetime.fromtimestamp(scanned).strftime('%H:%M:%S')}; stepscope's own are left out."
    )
    error = st.session_state.pop("attach_error", None)
    if error:
        st.error(error, icon=":material/error:")
    if not rows:
        st.info(
            "No Python or GPU process to attach to. Start your job, then Refresh; or start "
            "it under stepscope, which records it from its first step:",
            icon=":material/search_off:",
        )
        st.code(ui.HOW_TO_START, language="bash")
        return
    attaching = {int((r.get("config") or {}).get("attached_pid") or 0): int(r["id"]) for r in live}
    pids = [int(r["pid"]) for r in rows]
    event = st.dataframe(
        _table(rows, attaching),
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key="attach_table",
        column_config={
            "pid": st.column_config.NumberColumn(format="%d", width="small"),
            "CPU %": st.column_config.NumberColumn(format="%.0f"),
            "memory (MiB)": st.column_config.NumberColumn(format="%.0f"),
            "GPU memory (MiB)": st.column_config.NumberColumn(format="%.0f"),
            "command": st.column_config.TextColumn(width="large"),
            "started": st.column_config.DatetimeColumn(format="HH:mm:ss"),
        },
    )
    chosen_rows = event.selection.rows if event else []
    if chosen_rows and chosen_rows[0] < len(pids):
        row_pid = pids[chosen_rows[0]]
        if st.session_state.get("attach_table_pid") != row_pid:  # a new click in the table
            st.session_state["attach_table_pid"] = row_pid
            st.session_state["attach_pid"] = row_pid
    if st.session_state.get("attach_pid") not in pids:
        st.session_state.pop("attach_pid", None)  # gone since: fall back to the first
    by_pid = {int(r["pid"]): r for r in rows}
    pid = st.selectbox(
        "process",
        pids,
        key="attach_pid",
        format_func=lambda p: f"{p} · {by_pid[p]['command'][:90]}",
        help="or select its row in the table",
    )
    c1, c2 = st.columns([1, 3])
    duration = int(
        c1.number_input(
            "duration (s)",
            min_value=1,
            max_value=MAX_DURATION_S,
            value=int(DEFAULT_DURATION_S),
            step=5,
            key="attach_duration",
            help="it ends sooner if the process ends, or on Stop",
        )
    )
    name = c2.text_input(
        "run name (optional)", key="attach_name", placeholder="attach-<script>-<pid>"
    ).strip()
    row = by_pid[int(pid)]
    if row["run_id"] is not None:
        _known_run(row, duration, name)
    else:
        _plain(row, duration, name)


# -- the page ---------------------------------------------------------------------------------
_reap()
st.title("Attach")
st.caption(
    "Record a process that is already running, without restarting or changing it: its "
    "Python stacks (py-spy) and system figures are read from outside, then diagnosed."
)

run_ref = ui.query_int("run")
if run_ref is not None:
    follow(run_ref)
    if st.button("Attach to another process", key="attach_new", icon=":material/add:"):
        ui.set_query(run=None)
        st.rerun()
    st.stop()

pending = st.session_state.get("attach_pending")
if pending is not None:
    _waiting(pending)
    st.stop()
pick()
