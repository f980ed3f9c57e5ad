"""Reading a stored pickle of plain data without executing anything in it.

torch writes the CUDA allocator's snapshot (``torch.cuda.memory._dump_snapshot``, the
``memory_snapshot`` artifacts) with ``pickle.dump`` of nested dicts, lists and tuples
of str, int, float, bool and None. A pickle is a program, though: it may name any
importable callable and have the loader call it (an object whose ``__reduce__`` returns
``(os.system, ("...",))``). The store is shared by a team, and whoever can write a
run's row or its artifact folder chooses the file, so ``pickle.load`` (or
``torch.load`` without ``weights_only``) on it runs their code as the reader: the
dashboard's user, a CI job. Nothing stepscope reads is loaded that way.

``load_plain_pickle`` reads with an ``Unpickler`` whose ``find_class`` refuses every
global. Every callable or class a pickle can reach comes through ``find_class``
(``GLOBAL``, ``STACK_GLOBAL``, ``INST``, the extension codes of ``copyreg``, which
stepscope never registers); without one, ``REDUCE``, ``NEWOBJ`` and ``BUILD`` have
nothing to call, because no plain value is callable. ``persistent_load`` refuses
too. A refused file is one line naming it and the global it asked for; a truncated
or foreign file is one line as well. The file's size is capped before it is read
(``$STEPSCOPE_MAX_SNAPSHOT_BYTES``, 1 GiB): a pickle's objects take several times
its bytes in memory.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

from stepscope.store.bounded_read import ReadError, fmt_size, parse_size

__all__ = ["ENV_VAR", "PlainPickleError", "load_plain_pickle", "max_pickle_bytes"]

ENV_VAR = "STEPSCOPE_MAX_SNAPSHOT_BYTES"
DEFAULT_MAX_BYTES = 1 << 30
_SHOWN = 80  # characters of a refused global's name kept in the message


class PlainPickleError(ReadError):
    """A stored pickle that is not read; the message is one line: '<path>: <problem>'."""


class _Refused(pickle.UnpicklingError):
    """The pickle asked for something other than plain data."""


class _PlainUnpickler(pickle.Unpickler):
    """pickle's own (C) unpickler, with no global and no persistent id allowed."""

    def find_class(self, module: str, name: str) -> Any:
        shown = repr(f"{module}.{name}")[:_SHOWN]  # repr: a name with a newline stays one line
        raise _Refused(
            f"refused: the pickle names the global {shown}, and loading it would run code "
            "(an allocator snapshot holds only plain data); nothing in it was executed"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("refused: the pickle holds a persistent id (not plain data)")


def max_pickle_bytes() -> int:
    """The cap on one pickle's size: ``$STEPSCOPE_MAX_SNAPSHOT_BYTES``, else 1 GiB."""
    text = os.environ.get(ENV_VAR, "").strip()
    return parse_size(text, ENV_VAR) if text else DEFAULT_MAX_BYTES


def load_plain_pickle(path: str | os.PathLike[str], cap: int | None = None) -> Any:
    """The plain data a local pickle holds; ``PlainPickleError`` (one line naming the
    file) for a file that names a global, is truncated, is not a pickle, or is larger
    than ``cap`` (default ``max_pickle_bytes()``)."""
    cap = max_pickle_bytes() if cap is None else cap
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > cap:
                raise PlainPickleError(
                    f"{path}: too large: {fmt_size(size)}, over the cap of {fmt_size(cap)} "
                    f"({ENV_VAR}); not read"
                )
            data = fh.read()
    except OSError as exc:
        raise PlainPickleError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise PlainPickleError(f"{path}: {exc}") from None
    except EOFError:
        raise PlainPickleError(f"{path}: not a complete pickle (truncated)") from None
    except Exception as exc:  # garbage makes the unpickler raise almost anything
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        if "truncated" in text:
            raise PlainPickleError(f"{path}: not a complete pickle (truncated)") from None
        raise PlainPickleError(f"{path}: not a pickle stepscope can read ({text})") from None
