"""This user's signing key: the secret that says "I recorded this run", kept outside the store.

A shared store is written by every job of a team, so a row's own ``user`` and ``host``
columns prove nothing: whoever writes the row writes them too. What a row cannot carry is
a secret only its recorder holds. Each user has one key, 32 random bytes in
``~/.config/stepscope/key`` (``$XDG_CONFIG_HOME`` is honoured; ``$STEPSCOPE_KEY`` names
another file), created on first use with mode 0600 in a folder of mode 0700, the way ssh
keeps its keys. A key file that others can read, or that another user owns, is refused
(``KeyFileError``): a key anyone can read signs for anyone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from functools import lru_cache
from pathlib import Path

KEY_ENV = "STEPSCOPE_KEY"
KEY_BYTES = 32


class KeyFileError(OSError):
    """The key cannot be read, created or trusted; the message is one line naming it."""


def key_path() -> Path:
    """Where this user's key lives: ``$STEPSCOPE_KEY``, else the XDG config folder."""
    named = os.environ.get(KEY_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(config).expanduser() / "stepscope" / "key"


def user_key(create: bool = True) -> bytes:
    """This user's key, created when missing (``create``). Raises KeyFileError."""
    return _key_at(str(key_path()), create)


def key_id(key: bytes) -> str:
    """A short public name of a key (12 hex digits of its SHA-256): shown to say *which*
    key signed a run without showing the key."""
    return hashlib.sha256(key).hexdigest()[:12]


@lru_cache(maxsize=4)
def _key_at(path_text: str, create: bool) -> bytes:
    path = Path(path_text)
    try:
        path.stat()
    except FileNotFoundError:
        if not create:
            raise KeyFileError(
                f"{path}: no signing key yet (it is made by the first `run`)"
            ) from None
        _create(path)
    except OSError as exc:  # a folder of another user's on the way: not ours to use
        raise KeyFileError(f"{path}: cannot read the signing key ({exc.strerror or exc})") from None
    return _read(path)


def _create(path: Path) -> None:
    """Write a new key atomically: to a private temporary file, then linked into place,
    so two processes starting at once end with one key (the second link fails)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(KEY_BYTES) + "\n")
            with contextlib.suppress(FileExistsError):  # another process made it first
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise KeyFileError(
            f"{path}: cannot create the signing key ({exc.strerror or exc})"
        ) from None


def _read(path: Path) -> bytes:
    try:
        info = path.stat()
        text = path.read_text().strip()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read the signing key ({exc.strerror or exc})") from None
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise KeyFileError(f"{path}: the signing key belongs to another user (uid {info.st_uid})")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"{path}: the signing key is readable by others (mode {stat.S_IMODE(info.st_mode):o});"
            f" chmod 600 {path}"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < KEY_BYTES:
        raise KeyFileError(f"{path}: not a stepscope signing key ({KEY_BYTES * 2} hex digits)")
    return key


def forget_cached_keys() -> None:
    """Read the key file again next time (a test that swaps ``$STEPSCOPE_KEY``)."""
    _key_at.cache_clear()


__all__ = ["KEY_ENV", "KeyFileError", "forget_cached_keys", "key_id", "key_path", "user_key"]
