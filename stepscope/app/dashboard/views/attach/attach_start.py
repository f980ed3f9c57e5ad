"""The Attach page's click: start an attach in a process of its own, then follow its run.

What the attach process does and how it is found again is
``collectors.attach.attach_session``; here is only the waiting on the page. The click waits a
few seconds for the run to appear (most attaches have one by then); after that the
page polls, and the URL names the run as soon as there is one, so a reload (or another
browser) shows the same recording.
"""

from __future__ import annotations

import time
from typing import Any

import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.collectors.attach.attach import AttachError
from stepscope.collectors.attach.attach_session import Attachers, PendingAttach, resolve

#: how long the click waits for the attach to create its run before the page polls
START_WAIT_S = 8.0


@st.cache_resource
def attachers() -> Attachers:
    """Attach processes started by this dashboard, shared by all sessions (so that
    whichever session looks next reaps the ones that ended)."""
    return Attachers()


def outcome(home: str, pending: PendingAttach) -> tuple[str, Any]:
    """``attach_session.resolve``, with a store problem ending the page in one line."""
    with ui.errors_as_one_line():
        return resolve(home, pending, attachers())


def start(home: str, pid: int, duration_s: float, name: str) -> None:
    """The Attach click: start the attach, then follow its run (or say why not, once)."""
    try:
        pending = attachers().start(pid, duration_s, name or None, home)
    except (AttachError, *data.user_errors()) as exc:
        st.session_state["attach_error"] = f"Cannot attach: {data.one_line(exc)}"
        st.session_state.pop("attach_candidates", None)  # the list is stale: scan again
        st.rerun()
    st.session_state["attach_pending"] = pending
    deadline = time.monotonic() + START_WAIT_S
    with st.spinner(f"Attaching to process {pid}…"):
        while (now := outcome(home, pending))[0] == "waiting" and time.monotonic() < deadline:
            time.sleep(0.2)
    _settle(now)


def _settle(result: tuple[str, Any]) -> None:
    """Leave the waiting state when the attach has a run (follow it) or has failed."""
    kind, value = result
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
def waiting(home: str, pending: PendingAttach) -> None:
    """The attach process is starting (imports, py-spy): poll until it has a run."""
    result = outcome(home, pending)
    if result[0] != "waiting":
        st.session_state.pop("attach_pending", None)
        if result[0] == "run":
            ui.set_query(run=int(result[1]))
        else:
            st.session_state["attach_error"] = result[1]
        st.rerun(scope="app")
    st.info(f"Starting the attach to process {pending.target}…", icon=":material/hourglass_top:")
