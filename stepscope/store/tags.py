"""Tags: names people give runs, kept in the store (``stepscope tag RUN NAME``).

A CI job checks every pull request against "main-baseline"; the main branch's job moves
that name to its newest run. So a tag is a pointer that moves, not a run's name (many
runs share a name, and ``resolve_run`` takes a name to its newest run): one run per
tag, set and moved by whoever has the store, with who and where kept beside it, since
a shared store's tags are set from many hosts.

A part of ``RunStore`` (see ``store.py``); ``resolve_run`` (``runs.py``) reads tags
through ``tagged_run``, so every command that takes a run takes a tag.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from stepscope.store.db import q
from stepscope.store.identity import current_user

if TYPE_CHECKING:
    import pandas as pd

    from stepscope.store.db import Connection, Db

# What ``resolve_run`` reads before tags: a tag spelled like these could never be reached.
RESERVED = ("last", "latest")
TAG_COLUMNS = ["name", "run_id", "run_name", "created_at", "user", "host"]


class TagError(ValueError):
    """A tag name that cannot be used, or a tag that does not exist."""


def check_tag_name(name: str) -> str:
    """``name`` stripped, or TagError: a tag must be reachable wherever a run is typed,
    so it cannot look like a run id or ``last``, nor hold spaces (shell quoting in CI)."""
    text = name.strip()
    if not text:
        raise TagError("a tag needs a name")
    if text.isdigit():
        raise TagError(f"tag {text!r}: a number reads as a run id; choose a name")
    if text.lower() in RESERVED:
        raise TagError(f"tag {text!r}: {text!r} already means the newest run; choose a name")
    if any(c.isspace() for c in text):
        raise TagError(f"tag {text!r}: no spaces in a tag name")
    return text


def tagged_run(conn: Connection, name: str) -> int | None:
    """The run ``name`` tags, or None: the one query ``resolve_run`` shares."""
    found = q(conn, "SELECT run_id FROM tags WHERE name=:name", {"name": name}).scalar()
    return None if found is None else int(found)


class TagsTable:
    """Tags: set, moved, listed and deleted by `stepscope tag`; read by ``resolve_run``."""

    _db: Db

    def set_tag(self, name: str, run_id: int) -> int | None:
        """Point tag ``name`` at ``run_id``; returns the run it was on before (None: a new
        tag). The caller resolves ``run_id`` first: a missing run fails on its key."""

        name = check_tag_name(name)
        with self._db.begin() as conn:
            before = tagged_run(conn, name)
            q(
                conn,
                'INSERT INTO tags(name, run_id, created_at, "user", host)'
                " VALUES (:name, :run_id, :t, :user, :host)"
                " ON CONFLICT(name) DO UPDATE SET run_id=excluded.run_id,"
                ' created_at=excluded.created_at, "user"=excluded."user", host=excluded.host',
                {
                    "name": name,
                    "run_id": int(run_id),
                    "t": time.time(),
                    "user": current_user(),
                    "host": socket.gethostname(),
                },
            )
        return before

    def tag(self, name: str) -> int | None:
        """The run tag ``name`` is on, or None."""
        with self._db.connect() as conn:
            return tagged_run(conn, name.strip())

    def delete_tag(self, name: str) -> int:
        """Remove tag ``name``; returns the run it was on. TagError if there is none."""
        with self._db.begin() as conn:
            run_id = tagged_run(conn, name.strip())
            if run_id is None:
                raise TagError(f"no tag {name.strip()!r}")
            q(conn, "DELETE FROM tags WHERE name=:name", {"name": name.strip()})
        return run_id

    def tags(self, run_id: int | None = None) -> pd.DataFrame:
        """Every tag (or ``run_id``'s), by name, with its run's name (columns TAG_COLUMNS)."""
        sql, params = _tags_query(run_id)
        return self._db.frame(sql, **params)

    def tag_rows(self, run_id: int | None = None) -> list[dict[str, Any]]:
        """``tags()`` as one dict per tag (SQL NULL is None): `stepscope tag --list`
        answers without importing pandas."""
        sql, params = _tags_query(run_id)
        return self._db.rows(sql, **params)


def _tags_query(run_id: int | None) -> tuple[str, dict[str, Any]]:
    """The SQL and parameters of ``tags`` and ``tag_rows``."""
    sql = (
        'SELECT t.name, t.run_id, r.name AS run_name, t.created_at, t."user", t.host'
        " FROM tags t JOIN runs r ON r.id = t.run_id"
    )
    params: dict[str, Any] = {}
    if run_id is not None:
        sql += " WHERE t.run_id = :run_id"
        params["run_id"] = int(run_id)
    return sql + " ORDER BY t.name", params
