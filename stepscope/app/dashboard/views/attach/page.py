"""Attach: record a process that is already running (``?run=ID`` follows one attach).

The page lists the processes one could attach to (``attach_pick``); the click starts
``stepscope attach`` in a process of its own (``attach_start``, over
``collectors.attach.attach_session``) and puts the run it records into in the URL, the way
Optimize does with an experiment: the recording goes on if the page is closed, and a
reload (or another browser) shows the same one, with its progress and its Stop button
(``attach_follow``). Recordings under way are also listed from the store, so one
started from the command line can be followed here too.

A job started with ``stepscope run`` is recorded already, and better (its steps, data
wait, traces on request): for it the page offers that run and a capture first, and a
second, stacks-only recording only as "Attach anyway".
"""

from __future__ import annotations

import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.views.attach import attach_start
from stepscope.app.dashboard.views.attach.attach_follow import follow
from stepscope.app.dashboard.views.attach.attach_pick import pick

home = data.store_home()

attach_start.attachers().reap()
st.title("Attach")
st.caption(
    "Record a process that is already running, without restarting it: its Python stacks "
    "(py-spy) and system figures are read from outside, and where gdb can put them in, "
    "stepscope run's collectors record its steps, requests and captures for the attach's "
    "time, then come out. Then what was recorded is diagnosed."
)

run_ref = ui.query_int("run")
if run_ref is not None:
    follow(home, run_ref)
    if st.button("Attach to another process", key="attach_new", icon=":material/add:"):
        ui.set_query(run=None)
        st.rerun()
    st.stop()

pending = st.session_state.get("attach_pending")
if pending is not None:
    attach_start.waiting(home, pending)
    st.stop()
pick(home)
