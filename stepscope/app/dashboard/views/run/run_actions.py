"""The run page's actions: ask a running job for a profiler capture, open the run
in TensorBoard (started by this dashboard, one per run folder), compare it with a run of
the same command; and the run a session last looked at, which pages opened from the
sidebar start on."""

from __future__ import annotations

import atexit
from collections.abc import Collection, Mapping
from typing import Any

import streamlit as st

from stepscope.app.dashboard import access, compare_pair, data, ui
from stepscope.app.dashboard.views.run import tensorboard
from stepscope.collectors.capture.control import request_capture


@st.cache_resource
def _tensorboards() -> dict[str, tensorboard.TensorBoard]:
    """TensorBoards started by this dashboard, one per folder, shared by all sessions."""
    started: dict[str, tensorboard.TensorBoard] = {}
    atexit.register(lambda: [tb.stop() for tb in started.values()])
    return started


def tensorboard_action(run_dir: str, has_trace: bool) -> None:
    st.markdown("**TensorBoard** (torch-tb-profiler's views)")
    reason = tensorboard.unavailable_reason() or access.actions_refusal()
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
            tb = tensorboard.start_tensorboard(run_dir)
            ok = tensorboard.wait_listening(tb)
        if not ok:
            tb.stop()
            ui.fail(f"TensorBoard did not start: {tensorboard.last_log_line(tb) or 'no output'}")
        _tensorboards()[run_dir] = tb
        running = tb
    if running is not None:
        st.link_button(f"TensorBoard at {running.url}", running.url, icon=":material/link:")
    st.caption(tensorboard.PLUGIN_NOTE)


def capture_action(run_dir: str, run: Mapping[str, Any]) -> None:
    """Only offered for a running job: it is the job that reads the request.

    Disabled, with the reason, for a run recorded by another user or on another host, or
    not signed (``ownership``): its folder and its job are not this dashboard's to drive;
    and where actions are off (``access``).
    """
    refused = access.action_refusal(run)
    with st.container(border=True):
        c1, c2 = st.columns([1, 3], vertical_alignment="bottom")
        k = int(c1.number_input("steps", min_value=1, max_value=100, value=3, key="capture_k"))
        clicked = c2.button(
            f"Capture {k} steps",
            key="capture",
            icon=":material/radio_button_checked:",
            disabled=refused is not None,
            help=refused,
        )
        if refused is not None:
            st.caption(f"Not available: {refused}.")
        elif clicked:
            request_id = request_capture(run_dir, k)
            st.success(
                f"Asked the job to profile its next {k} step(s) (request {request_id[:8]}); "
                "the trace appears here when they are done."
            )


# -- the run last looked at ------------------------------------------------------------------
#: session key of the run a page of this session last showed
LAST_RUN_KEY = "stepscope_last_run"


def remember_run(run_id: int) -> None:
    """Note the run a page shows: a page opened from the sidebar (no ``?run=`` in the URL,
    since switching pages drops the query) opens on it, not on whichever run is newest."""
    st.session_state[LAST_RUN_KEY] = int(run_id)


def last_run(ids: Collection[int]) -> int | None:
    """The run this session last looked at, if it is still among ``ids``."""
    value = st.session_state.get(LAST_RUN_KEY)
    return int(value) if isinstance(value, int) and value in ids else None


def compare_with_link(home: str, run_id: int) -> None:
    """The sidebar's "Compare with…": this run and its partner (``compare_pair``: a run of
    the same command first), baseline as A. The label names the partner and how close it
    is, so a click never lands on an unrelated job unannounced."""
    with ui.errors_as_one_line():
        relations = data.run_relations(home)
    found = compare_pair.compare_with(run_id, relations)
    if found is not None:
        label, a, b = found
        st.sidebar.page_link(
            "views/compare/page.py",
            label=label,
            icon=":material/compare_arrows:",
            query_params={"a": str(a), "b": str(b)},
        )
