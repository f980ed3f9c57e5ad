"""What this dashboard lets its visitors do: actions, and the host's process list.

A dashboard on the loopback address serves the one user at this machine. One that
listens beyond it (``--allow-remote``) serves whoever reaches the port, and every
action it offers (Apply and compare, a sweep, Cancel, Capture, Attach, Stop,
TensorBoard) starts, stops or signals a process as the dashboard's own user. So a
remote-bound dashboard offers them only when started with ``--allow-actions`` together
with ``--require-login`` (and its ``--allow-users``): the visitor who clicks has signed
in and is on the list (``sign_in.gate`` turns everyone else away before any page). The
Attach page's list of the host's processes, command lines included, is shown on the
same terms. The bind address is read from Streamlit's own option, so a dashboard started
some other way (``streamlit run``, which binds every address by default) fails closed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import streamlit as st

from stepscope.app.cli.dashboard import ENV_ALLOW_ACTIONS, LOOPBACK
from stepscope.app.dashboard import sign_in
from stepscope.app.ownership import refusal, rerun_refusal

ACTIONS_OFF = (
    "actions are off on a dashboard that listens beyond this machine (start it with "
    "--allow-actions --require-login --allow-users to allow them)"
)


def bound_locally() -> bool:
    """Whether only this machine can reach the dashboard (its server.address)."""
    return st.get_option("server.address") in LOOPBACK


def actions_refusal() -> str | None:
    """Why this dashboard starts, stops and signals nothing for its visitors; None when
    it may."""
    if bound_locally():
        return None
    if os.environ.get(ENV_ALLOW_ACTIONS) == "1" and sign_in.required():
        return None
    return ACTIONS_OFF


def action_refusal(run: Mapping[str, Any]) -> str | None:
    """Why no action may be taken for ``run`` here: actions are off, or the run is not
    this user's own, signed, on this host (``ownership.refusal``)."""
    return actions_refusal() or refusal(run)


def rerun_action_refusal(run: Mapping[str, Any]) -> str | None:
    """``action_refusal`` for re-running ``run``'s command (``ownership.rerun_refusal``)."""
    return actions_refusal() or rerun_refusal(run)


def may_list_processes() -> bool:
    """The host's processes are listed on a local dashboard, or to signed-in visitors on
    the allowed list (the gate has let only those in)."""
    return bound_locally() or sign_in.required()


__all__ = [
    "ACTIONS_OFF",
    "action_refusal",
    "actions_refusal",
    "bound_locally",
    "may_list_processes",
    "rerun_action_refusal",
]
