"""The Attach page before an attach: the processes one could attach to, the choice,
the duration and name, and the button.

A job started with ``stepscope run`` is recorded already, and better (its steps, data
wait, traces on request): for it the page offers that run and a capture first, and a
second, stacks-only recording only as "Attach anyway".
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.app.dashboard import data, stack_data, ui
from stepscope.app.dashboard.access import action_refusal, actions_refusal, may_list_processes
from stepscope.app.dashboard.tables import fmt_sig, unknown_in_words
from stepscope.app.dashboard.views.attach.attach_start import start
from stepscope.app.dashboard.views.run.run_actions import capture_action
from stepscope.app.formats import fmt_time
from stepscope.app.ownership import is_own
from stepscope.collectors.attach.attach import DEFAULT_DURATION_S
from stepscope.collectors.attach.process_list import candidates
from stepscope.store import RunNotFound

MAX_DURATION_S = 24 * 3600


def _candidates(home: str, refresh: bool) -> tuple[list[dict[str, Any]], float]:
    """The processes one could attach to, scanned once per session and on Refresh (a
    scan measures CPU over a fraction of a second: not for every click on the page)."""
    held = st.session_state.get("attach_candidates")
    if refresh or held is None:
        with st.spinner("Looking for processes…"):
            held = {"rows": candidates(Path(home)), "at": time.time()}
        st.session_state["attach_candidates"] = held
    return held["rows"], held["at"]


def busiest(rows: list[dict[str, Any]]) -> int:
    """The pid to offer first: the busiest by CPU (then GPU memory) of the processes no
    stepscope run records, else of all; the newest among equals (the list's order)."""
    free = [r for r in rows if r["run_id"] is None] or rows
    best = max(
        free,
        key=lambda r: (float(r["cpu_percent"] or 0.0), float(r["gpu_mem_bytes"] or 0.0)),
    )
    return int(best["pid"])


def _mib(value: Any) -> float | None:
    return None if value is None else float(value) / 2**20


def _table(rows: list[dict[str, Any]], attaching: dict[int, int]) -> pd.DataFrame:
    def mark(r: dict[str, Any]) -> str:
        if r["run_id"] is not None:
            return f"stepscope run {r['run_id']}"
        if r["pid"] in attaching:
            return f"attaching: run {attaching[r['pid']]}"
        return ""

    has_gpu = any(r["gpu_mem_bytes"] is not None for r in rows)
    table = pd.DataFrame(
        {
            "pid": [r["pid"] for r in rows],
            "user": [r["user"] or "?" for r in rows],
            # a figure we may not read (another user's process) is unknown: a dash
            "CPU %": pd.Series([r["cpu_percent"] for r in rows], dtype="float64"),
            "memory (MiB)": pd.Series([_mib(r["rss_bytes"]) for r in rows], dtype="float64"),
            # NVML lists the processes that hold GPU memory: any other holds none
            "GPU memory (MiB)": pd.Series(
                [_mib(r["gpu_mem_bytes"] or 0.0) for r in rows], dtype="float64"
            ),
            "stepscope": [mark(r) for r in rows],
            "command": [r["command"] for r in rows],
            "started": [fmt_time(r["started_at"], clock=True) for r in rows],
        },
        columns=[
            "pid",
            "user",
            "CPU %",
            "memory (MiB)",
            *(["GPU memory (MiB)"] if has_gpu else []),  # no GPU here: no column
            "stepscope",
            "command",
            "started",
        ],
    )
    return unknown_in_words(table, {"CPU %": fmt_sig, "memory (MiB)": fmt_sig})


def _known_run(home: str, row: dict[str, Any], duration: int, name: str) -> None:
    """A `stepscope run` job: its run and a capture first, a second recording last."""
    run_id = int(row["run_id"])
    try:
        with data.open_store(home) as store:
            run = store.run(run_id)
            run_dir = str(store.home / "runs" / str(run_id))
    except RunNotFound:
        run = None
    if run is None:  # the store was emptied under the job: attach is all there is
        _plain(home, row, duration, name)
        return
    st.info(
        f"Process {row['pid']} is the job of **run {run_id}** ({run['name']}), started with "
        "`stepscope run`: its steps, data wait and system figures are recorded there "
        "already, and a profiler trace is one click away.",
        icon=":material/info:",
    )
    st.page_link(
        "views/run/page.py",
        label=f"Open run {run_id}",
        icon=":material/open_in_new:",
        query_params={"run": str(run_id)},
    )
    if run["status"] == "running":
        st.markdown(f"**Capture** a profiler trace of the next steps of run {run_id}:")
        capture_action(run_dir, run)
    refused = action_refusal(run)
    with st.expander("Attach anyway (a second, stacks-only recording)"):
        st.caption(
            "Records this process's Python stacks and system figures into a new run of "
            f"their own, beside run {run_id}; the run's own figures are the better ones."
        )
        if st.button(
            "Attach anyway",
            key="attach_anyway",
            icon=":material/link:",
            disabled=refused is not None,
            help=refused,
        ):
            start(home, int(row["pid"]), float(duration), name)
        if refused is not None:
            st.caption(f"Not available: {refused}.")


def _plain(home: str, row: dict[str, Any], duration: int, name: str) -> None:
    if not row["python"]:
        st.caption(
            f":material/warning: process {row['pid']} does not look like Python: only its "
            "system figures can be recorded (py-spy reads Python stacks)."
        )
    off = actions_refusal()
    if st.button(
        f"Attach to {row['pid']} for {duration} s",
        key="attach",
        type="primary",
        icon=":material/link:",
        disabled=off is not None,
        help=off
        or "records it in the background into a new run; stepscope's collectors go into "
        "the process for that time and come out after (it runs on)",
    ):
        start(home, int(row["pid"]), float(duration), name)
    if off is not None:
        st.caption(f"Not available: {off}.")


def pick(home: str) -> None:
    """The processes, the choice, the duration and name, and the Attach button."""
    has_store = os.environ.get("STEPSCOPE_STORE") or (Path(home) / "stepscope.db").exists()
    live = stack_data.running_attaches(home) if has_store else []
    # a shared store lists other hosts' attaches too: their pids mean nothing here
    live = [r for r in live if is_own(r)]
    if live:
        st.markdown("**Attaching now**")
        for r in live:
            cfg = r.get("config") or {}
            elapsed = time.time() - float(r["started_at"])
            st.page_link(
                "views/attach/page.py",
                label=(
                    f"Run {r['id']} · process {cfg.get('attached_pid', '?')} · "
                    f"{elapsed:.0f} of {cfg.get('duration_s', 0):g} s"
                ),
                icon=":material/sync:",
                query_params={"run": str(r["id"])},
            )
    st.subheader("Processes")
    if not may_list_processes():  # command lines are not for whoever reaches the port
        st.info(
            "The processes of this host are listed on a dashboard bound to this machine, "
            "or to signed-in users of one started with --require-login --allow-users.",
            icon=":material/lock:",
        )
        return
    top = st.columns([1, 4], vertical_alignment="center")
    refresh = top[0].button("Refresh", key="attach_refresh", icon=":material/refresh:")
    rows, scanned = _candidates(home, refresh)
    top[1].caption(
        f"Python processes, and any holding a GPU, scanned at "
        f"{datetime.fromtimestamp(scanned).strftime('%H:%M:%S')}; stepscope's own are left "
        "out, and arguments that look like secrets are shown as ***."
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
    table = _table(rows, attaching)
    figures = ("CPU %", "memory (MiB)", "GPU memory (MiB)")
    numeric = [c for c in figures if c in table and pd.api.types.is_numeric_dtype(table[c])]
    event = st.dataframe(
        table,
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key="attach_table",
        column_config={
            "pid": st.column_config.NumberColumn(format="%d", width="small"),
            **{c: st.column_config.NumberColumn(format="%.0f") for c in numeric},
            "command": st.column_config.TextColumn(width="large"),
        },
    )
    chosen_rows = event.selection.rows if event else []
    if chosen_rows and chosen_rows[0] < len(pids):
        row_pid = pids[chosen_rows[0]]
        if st.session_state.get("attach_table_pid") != row_pid:  # a new click in the table
            st.session_state["attach_table_pid"] = row_pid
            st.session_state["attach_pid"] = row_pid
    if st.session_state.get("attach_pid") not in pids:
        # first visit, or gone since: the busiest process not recorded yet, the one a
        # slow job is (the list is newest first: the newest is often an editor's helper)
        st.session_state["attach_pid"] = busiest(rows)
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
        _known_run(home, row, duration, name)
    else:
        _plain(home, row, duration, name)
