"""Small pieces every dashboard page shares: number formats, status badges, query params,
and turning a store/trace error into one line on the page.

The formats match the CLI's (`stepscope show`), so a number read on the terminal can
be found on the page as it is.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import streamlit as st

from stepscope.app.data import one_line, user_errors
from stepscope.app.formats import fmt_bytes as fmt_bytes
from stepscope.app.formats import fmt_num as fmt_num  # re-exported: pages use ui.fmt_*
from stepscope.app.formats import fmt_s as fmt_s
from stepscope.app.formats import missing

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
CLASS_LABEL = {"io": "I/O", "compute": "compute", "memory": "memory", "communication": "comm"}
CLASS_COLOR = {"io": "orange", "compute": "blue", "memory": "violet", "communication": "green"}

HOW_TO_START = "stepscope run -- python train.py"
HOW_TO_PROFILE = "stepscope run --profile-at 5 --profile-steps 3 -- python train.py"


# -- numbers -------------------------------------------------------------------------
def fmt_pct(share: float | None, digits: int = 1) -> str:
    return "—" if missing(share) else f"{share * 100:.{digits}f} %"


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


def class_label(cls: str) -> str:
    return CLASS_LABEL.get(cls, cls)


# -- widgets ---------------------------------------------------------------------------
def status_badge(status: str) -> None:
    colour, icon = STATUS_STYLE.get(status, ("gray", ":material/circle:"))
    st.badge(status, icon=icon, color=colour)  # type: ignore[arg-type]


def ratio_metric(where: Any, label: str, ci: Any, help: str | None = None) -> None:
    """A speed ratio as a metric tile: the ratio, its verdict as the coloured delta.

    ``ci`` is a ``stats.SpeedupCI``; ``where`` a column or ``st`` itself.
    """
    where.metric(
        label,
        f"{ci.ratio:.2f}x",
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


def guarded(fn: Callable[[], Any]) -> Any:
    with errors_as_one_line():
        return fn()
