"""Errors said in one line: the form every layer reports a failure in (a run's error,
a fix that could not be applied, a trial that crashed)."""

from __future__ import annotations

import traceback
from typing import Any


def one_line_error(exc_type: Any, exc: Any) -> str:
    """``ZeroDivisionError: division by zero``: the last line a traceback would print."""
    lines = traceback.format_exception_only(exc_type, exc)
    text = next((ln.strip() for ln in reversed(lines) if ln.strip()), exc_type.__name__)
    return text.splitlines()[0][:500]
