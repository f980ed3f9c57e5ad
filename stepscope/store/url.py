"""Where the run store's database lives: a SQLite file (the default) or a PostgreSQL server.

The home folder (``$STEPSCOPE_HOME``) always stays local: run folders, control files and
the calibration cache live there. The store URL only chooses the database, so that many
hosts can share one (SQLite's WAL must not sit on a network filesystem; a server can).
Resolution order: an explicit ``url`` > ``$STEPSCOPE_STORE`` > ``<home>/stepscope.db``.

Passwords in a URL are never printed nor recorded: every message uses ``redacted``, and
a driver's error passes through ``StoreUrl.hide``. No SQLAlchemy here: resolving a URL
must stay cheap (it runs in every job process; ``sqlalchemy.engine.url`` costs 0.16 s to
import), so ``split_url`` reads the password itself. ``urllib.parse`` cannot: a raw ``/``,
``?`` or ``#`` in a password ends its authority early and shows the rest. Here the user
ends at the first ``:`` and the password at the LAST ``@`` of the URL, so nothing a
password may hold ever shows; the price is that an ``@`` in the database name or the
query must be written ``%40`` (SQLAlchemy unquotes both), or it reads as the password's
end. The URL handed to SQLAlchemy has the password percent-encoded, so it connects with
the password the display hid (a raw ``@`` in it included).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

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
    password: str | None = field(default=None, repr=False)  # as written, for ``hide``

    def hide(self, text: str) -> str:
        """``text`` (a driver's error) with the password replaced by ``***``, in every
        form it may take there: as written, decoded, encoded."""
        return hide_password(text, self.password)


@dataclass(frozen=True)
class UrlParts:
    """A URL cut where its password begins and ends (``split_url``)."""

    head: str  # 'scheme://'
    user: str  # as written
    password: str | None  # as written (None: no password)
    rest: str  # host[:port][/database][?query], as written


def split_url(text: str) -> UrlParts | None:
    """The URL's user, password and the rest; None for text without a ``scheme://``.

    The password runs from the first ``:`` of the user information to the last ``@``
    whose user part holds no ``/`` (an ``@`` after a path with no user before it is
    the path's, as in ``scheme://host/db?x=a@b``), so a raw ``/ ? # @ :`` in a password
    never ends it early and never shows.
    """
    match = _SCHEME.match(text)
    if match is None:
        return None
    head, after = text[: match.end()], text[match.end() :]
    end = len(after)
    while (at := after.rfind("@", 0, end)) >= 0:
        user, colon, password = after[:at].partition(":")
        if "/" not in user:
            return UrlParts(head, user, password if colon else None, after[at + 1 :])
        end = at
    return UrlParts(head, "", None, after)


def redacted(url: str | os.PathLike[str] | None) -> str:
    """The URL with any password replaced by ``***`` (a plain path comes back as is):
    for a database URL, what SQLAlchemy's ``render_as_string(hide_password=True)``
    shows; for an S3 endpoint (``http://key:secret@host``) the same form."""
    if url is None:
        return ""
    text = str(url)
    parts = split_url(text)
    if parts is None or parts.password is None:
        return text
    return f"{parts.head}{parts.user}:***@{parts.rest}"


def hide_password(text: str, password: str | None) -> str:
    """``text`` with ``password`` (as written in a URL) replaced by ``***`` wherever it
    appears: as written, percent-decoded and percent-encoded, longest first. A form of
    one or two characters is left: it would star every ``:`` of a driver's message, and
    drivers do not echo passwords (this is the second guard, not the first)."""
    if not password:
        return text
    forms = {password, unquote(password), quote(unquote(password), safe="")}
    for form in sorted((f for f in forms if len(f) > 2), key=len, reverse=True):
        text = text.replace(form, "***")
    return text


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
        parts = split_url(text)
        assert parts is not None  # it has a scheme
        host, _, database = parts.rest.partition("?")[0].partition("/")
        port = host.rsplit("]", 1)[-1].partition(":")[2]  # [::1]:5432 or h:5432
        if not database.strip("/"):
            raise StoreError(
                f"store URL {redacted(text)}: name the database, as postgresql://user@host/db"
            )
        if port and not port.isdigit():
            raise StoreError(f"store URL {redacted(text)}: port {port!r} is not a number")
        user = parts.user + ("" if parts.password is None else ":" + _encoded(parts.password))
        userinfo = f"{user}@" if parts.password is not None or parts.user else ""
        display = redacted(f"postgresql://{text[match.end() :]}")
        full = f"postgresql+psycopg://{userinfo}{parts.rest}"
        return StoreUrl("postgresql", full, display, None, password=parts.password)
    raise StoreError(
        f"store URL {redacted(text)}: unknown scheme {scheme!r}; use a path, "
        "sqlite:///path or postgresql://user@host/db"
    )


def _encoded(password: str) -> str:
    """The password percent-encoded for SQLAlchemy, which decodes it: a raw ``@`` (or
    ``/``, ``?``, ``#``) would otherwise split it where SQLAlchemy's parser cuts."""
    return quote(unquote(password), safe="")
