"""Who runs this process: the login name recorded with each run and tag, and compared
with a run's own before its command is replayed (``app/ownership.py``). Its own module so
that every table of the store can record it without importing another (runs.py and
tags.py were a circle)."""

from __future__ import annotations

import getpass


def current_user() -> str | None:
    """Who runs this: recorded with each run, since a shared store has many users."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name, no passwd entry (some containers)
        return None
