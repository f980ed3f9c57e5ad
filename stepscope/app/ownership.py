"""Whose run is it: the one rule for actions that execute something for a recorded run.

A shared store (PostgreSQL, a team dashboard) holds runs other people recorded on other
machines. Re-running a run's command (Apply and compare, `stepscope optimize`), asking
its job for a capture (a control file in its folder, read by the job), or signalling its
process are things stepscope does only for the user's own runs on this host, signed by
the user's key: a recorded command is someone else's text, a pid recorded on another
host names an unrelated process here, and a row's user and host columns are written by
whoever writes the row. Reading (figures, diagnosis) stays open to everyone.

The dashboard and the CLI both ask ``refusal`` and show its line as it is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from stepscope.store.identity import current_user
from stepscope.store.signing import signature_refusal

RULE = "stepscope acts only on your own runs on this host"


def this_user() -> str:
    """The user this process runs as (what a launcher records as the run's user), for
    messages: uid N where there is no login name (some containers)."""
    name = current_user()
    if name is not None:
        return name
    return f"uid {os.getuid()}" if hasattr(os, "getuid") else "an unknown user"


def this_host() -> str:
    return socket.gethostname()


def refusal(run: Mapping[str, Any]) -> str | None:
    """Why this process must not execute anything for ``run``; None when it may.

    Two gates, in the order a reader understands them: the row says it is someone else's
    (its ``user`` or ``host``), or it says it is ours but this user's key did not sign it
    as it stands (``store/signing.py``): whoever can write the store can write a row's
    user and host, never its signature.
    """
    user = _text(run.get("user"))
    host = _text(run.get("host"))
    me, here = this_user(), this_host()
    if user != current_user() or host != here:  # the very name the recorder wrote
        who = f"by {user} " if user is not None else "by an unknown user "
        where = f"on {host}" if host is not None else "on an unknown host"
        return f"recorded {who}{where}: {RULE} (you are {me} on {here})"
    return signature_refusal(run)


def is_own(run: Mapping[str, Any]) -> bool:
    return refusal(run) is None


def rerun_refusal(run: Mapping[str, Any]) -> str | None:
    """Why stepscope must not re-run ``run``'s command (Apply and compare, optimize).

    Besides ownership: a multi-node run's command is one node's launcher, and started
    alone it would wait for the other nodes' rendezvous until it timed out.
    """
    why = refusal(run)
    if why is None and _text(run.get("run_group")) is not None:
        why = (
            f"a multi-node run (group {run['run_group']}): its command is one node's, and a "
            "re-run of it alone would wait for the others; optimize a single-node run of the job"
        )
    return why


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):  # NaN from pandas
        return None
    text = str(value).strip()
    return text or None
