"""Small pieces every dashboard page shares: status badges and marks, class colours,
query params, and turning a store/trace error into one line on the page.

Numbers are formatted by ``app.formats``, the CLI's formatter too (`stepscope show`), so
a number read on the terminal can be found on the page as it is; class names are
``BottleneckClass.label``, the same in both programs.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import streamlit as st

from stepscope.app.dashboard.data import one_line, run_choices, user_errors
from stepscope.app.formats import fmt_ratio, missing
from stepscope.optim_runner.speedup.stats import SpeedupCI

#: status -> (badge colour, icon): running is the only live one, so it alone is blue
STATUS_STYLE: dict[str, tuple[str, str]] = {
    "running": ("blue", ":material/sync:"),
    "completed": ("green", ":material/check_circle:"),
    "stopped": ("green", ":material/stop_circle:"),
    "failed": ("red", ":material/error:"),
    "killed": ("red", ":material/cancel:"),
    "lost": ("orange", ":material/help:"),
    "interrupted": ("orange", ":material/pause_circle:"),
}
#: plain-text marks for table cells (no markdown in dataframe cells)
STATUS_MARK = {
    "running": "● running",
    "completed": "✓ completed",
    "stopped": "✓ stopped",
    "failed": "✗ failed",
    "killed": "✗ killed",
    "lost": "? lost",
    "interrupted": "‖ interrupted",
}
#: a finding's badge colour, by its class (``BottleneckClass``, equal to these strings)
CLASS_COLOR = {"io": "orange", "compute": "blue", "memory": "violet", "communication": "green"}

HOW_TO_START = "stepscope run -- python train.py"
HOW_TO_PROFILE = "stepscope run --profile-at 5 --profile-steps 3 -- python train.py"


# -- text ------------------------------------------------------------------------------
def no_links(text: Any) -> str:
    """Text read from a shared store, its square brackets markdown-escaped: anyone who
    records a run writes there, and a markdown image or link in it would make the page
    fetch (or offer) an outside address."""
    return str(text).replace("[", "\\[").replace("]", "\\]")


def fmt_command(command: Any) -> str:
    if isinstance(command, list):
        return shlex.join(str(c) for c in command)
    return "" if missing(command) else str(command)


def failure_line(run: dict[str, Any]) -> str:
    """Why a run ended badly, in one line: its recorded error, else its exit code."""
    lines = str(run.get("error") or "").strip().splitlines()
    if lines:
        return lines[0]
    if run.get("exit_code") is not None:
        return f"exit code {run['exit_code']}"
    return "no error recorded"


def stop_line(run: dict[str, Any]) -> str | None:
    """Why a run that stepscope ended ("stopped") ended, in words; None for any other run."""
    if run.get("status") != "stopped":
        return None
    reason = str(run.get("stop_reason") or "")
    limit = (run.get("config") or {}).get("max_steps")
    if reason == "max_steps":
        return (
            f"stopped by stepscope at its step limit ({limit} steps)"
            if limit
            else ("stopped by stepscope at its step limit")
        )
    if reason == "sweep":
        return "stopped by stepscope once the batch sweep had its requests"
    return f"stopped by stepscope ({reason})" if reason else "stopped by stepscope"


# -- widgets ---------------------------------------------------------------------------
def status_badge(status: str) -> None:
    colour, icon = STATUS_STYLE.get(status, ("gray", ":material/circle:"))
    st.badge(status, icon=icon, color=colour)  # type: ignore[arg-type]


def ratio_metric(where: Any, label: str, ci: SpeedupCI, help: str | None = None) -> None:
    """A speed ratio as a metric tile: the ratio, its verdict as the coloured delta.

    ``where`` is a column or ``st`` itself.
    """
    where.metric(
        label,
        fmt_ratio(ci.ratio),
        delta=ci.verdict,
        delta_color={"faster": "green", "slower": "red"}.get(ci.verdict, "gray"),
        delta_arrow={"faster": "up", "slower": "down"}.get(ci.verdict, "off"),
        help=help,
    )


def query_int(name: str) -> int | None:
    """An integer query parameter (``?run=3``); None when absent or not a number."""
    raw = st.query_params.get(name)
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


def set_query(**values: int | None) -> None:
    """Keep the URL in step with what is shown, so the page can be linked to."""
    for key, value in values.items():
        if value is None:
            if key in st.query_params:
                del st.query_params[key]
        elif st.query_params.get(key) != str(value):
            st.query_params[key] = str(value)


def fail(message: str) -> NoReturn:
    """Show one line and end this page's run (never a traceback)."""
    st.error(message, icon=":material/error:")
    st.stop()


@contextmanager
def errors_as_one_line() -> Iterator[None]:
    """Store/trace problems the user can act on end the page with one line."""
    try:
        yield
    except user_errors() as exc:
        fail(one_line(exc))


def sidebar_run_picker(
    home: str, choices: Any, run_id: int, with_status: bool = False, **query: int | None
) -> None:
    """The sidebar's run selector: picking another run reruns the page on it.

    ``choices``: ``data.run_choices`` (read again when ``run_id`` was recorded after it);
    ``query``: other URL parameters to set with the new run (None clears one).
    """
    with errors_as_one_line():
        if run_id not in set(choices["id"]):  # recorded between the two reads
            choices = run_choices(home)
    ids = [int(i) for i in choices["id"]]
    names = dict(zip(ids, choices["name"], strict=True))
    statuses = dict(zip(ids, choices["status"], strict=True))
    picked = st.sidebar.selectbox(
        "run",
        ids,
        index=ids.index(run_id),
        format_func=lambda i: f"#{i} {names[i]}" + (f" ({statuses[i]})" if with_status else ""),
    )
    if picked != run_id:
        set_query(run=picked, **query)
        st.rerun()
