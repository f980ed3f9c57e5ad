"""Where the run store's database lives: a SQLite file (the default) or a PostgreSQL server.

The home folder (``$STEPSCOPE_HOME``) always stays local: run folders, control files and
the calibration cache live there. The store URL only chooses the database, so that many
hosts can share one (SQLite's WAL must not sit on a network filesystem; a server can).
Resolution order: an explicit ``url`` > ``$STEPSCOPE_STORE`` > ``<home>/stepscope.db``.

Passwords in a URL are never printed nor recorded: every message uses ``redacted``.
No SQLAlchemy here: resolving a URL must stay cheap (it runs in every job process).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ENV_VAR = "STEPSCOPE_STORE"
DB_FILE = "stepscope.db"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")


class StoreError(RuntimeError):
    """The store cannot be opened or read: locked, corrupt, unreachable, or too new."""


@dataclass(frozen=True)
class StoreUrl:
    """A resolved store location.

    ``sqlalchemy`` is the URL handed to ``create_engine`` (may hold a password);
    ``display`` is the same with the password replaced, for every message and record.
    """

    backend: str  # 'sqlite' | 'postgresql'
    sqlalchemy: str
    display: str
    path: Path | None  # the database file, for SQLite


def redacted(url: str | os.PathLike[str] | None) -> str:
    """The URL with any password replaced by ``***`` (a plain path comes back as is)."""
    if url is None:
        return ""
    text = str(url)
    if not _SCHEME.match(text):
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", text)
    if parts.password is None:
        return text
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def resolve_store_url(
    home: str | os.PathLike[str], url: str | os.PathLike[str] | None = None
) -> StoreUrl:
    """Turn ``url`` (or ``$STEPSCOPE_STORE``, or the home's file) into a ``StoreUrl``.

    Accepts a plain path, ``sqlite:///path`` and ``postgresql://user@host/db`` (also
    ``postgres://``), mapped to the psycopg 3 driver; anything else is a StoreError.
    """
    text = str(url) if url is not None else os.environ.get(ENV_VAR, "").strip()
    if not text:
        path = Path(home).expanduser() / DB_FILE
        return StoreUrl("sqlite", f"sqlite:///{path}", str(path), path)
    match = _SCHEME.match(text)
    if not match:  # a plain path: a file, or a folder to put stepscope.db in
        path = Path(text).expanduser()
        if path.is_dir():
            path = path / DB_FILE
        path = path.absolute()
        return StoreUrl("sqlite", f"sqlite:///{path}", str(path), path)
    scheme = match.group(1).lower()
    if scheme in ("sqlite", "sqlite+pysqlite"):
        rest = text[match.end() :]
        if not rest.startswith("/") or rest == "/":
            raise StoreError(
                f"store URL {redacted(text)}: give a file, as sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        raw = rest[1:]  # sqlite:///x.db -> x.db (relative); sqlite:////abs -> /abs
        path = Path(raw).expanduser().absolute()
        return StoreUrl("sqlite", f"sqlite:///{path}", str(path), path)
    if scheme in _PG_SCHEMES:
        rest = text[match.end() :]
        full = f"postgresql+psycopg://{rest}"
        parts = urlsplit(full)
        if not parts.path.strip("/"):
            raise StoreError(
                f"store URL {redacted(text)}: name the database, as postgresql://user@host/db"
            )
        return StoreUrl("postgresql", full, redacted(f"postgresql://{rest}"), None)
    raise StoreError(
        f"store URL {redacted(text)}: unknown scheme {scheme!r}; use a path, "
        "sqlite:///path or postgresql://user@host/db"
    )
