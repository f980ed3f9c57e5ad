"""How every CLI verb writes: one rich Console factory, markup escaping, run statuses
in colour, and JSON for scripts.

Why one factory: rich falls back to 80 columns when its stream is not a terminal, so
``stepscope runs | cat`` (or a CI log, or ``| grep``) wrapped every cell over several
lines. On a terminal the console is rich's usual one (the terminal's width, colour);
on a pipe or a file it is as wide as the longest line (``PIPE_WIDTH``), without colour,
and with the padding rich leaves at line ends stripped, so each table row is one line
that ``grep``, ``awk`` and ``cut`` can take apart. ``table`` keeps a table's title on
one line as well (rich wraps titles to the table's width, whatever the console's).

Why ``esc``: rich reads ``[...]`` in a string as markup, so the trial run
``nanogpt [baseline #1]`` printed as ``nanogpt``. Every string that comes from the user
or the store (run names, commands, errors, log lines, paths, kernel names) goes
through ``esc`` before rich sees it; the CLI's own markup stays markup.

Why ``print_json`` here: `runs`, `show`, `attach --list` all print store rows, and
pandas hands back numpy scalars and NaN, which ``json`` refuses or writes as ``NaN``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# Wide enough for any command line or log message a run records: a row never wraps.
PIPE_WIDTH = 100_000


def console(
    *,
    stderr: bool = False,
    quiet: bool = False,
    highlight: bool = False,
    file: IO[str] | None = None,
) -> Console:
    """A console on stdout (or stderr, or ``file``): rich's own on a terminal, a wide
    plain one anywhere else."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    tty = Console(file=stream, quiet=quiet, highlight=highlight)
    if tty.is_terminal:  # includes FORCE_COLOR and friends: rich's own decision
        return tty
    return Console(
        file=_RstripLines(stream),
        quiet=quiet,
        highlight=highlight,
        width=PIPE_WIDTH,
        no_color=True,
        color_system=None,
    )


def table(title: str | None = None, **kwargs: Any) -> Table:
    """A rich Table whose title (markup) stays on one line: rich wraps a title to the
    table's width, so ``runs in /a/long/home`` over a narrow table came out a word a line."""
    if title is None:
        return Table(**kwargs)
    text = Text.from_markup(title, overflow="ignore")
    text.no_wrap = True
    return Table(title=text, **kwargs)


def esc(value: Any) -> str:
    """``value`` as text rich prints verbatim (``[baseline #1]`` is not a tag)."""
    return escape("" if value is None else str(value))


def say(con: Console, line: str) -> None:
    """One line of plain text, never read as markup or highlighted."""
    con.print(line, markup=False, highlight=False, soft_wrap=True)


def status_text(status: str) -> str:
    """A run's status in its colour (markup): red for failed, yellow for stopped by someone."""
    colour = {
        "running": "cyan",
        "completed": "green",
        "stopped": "green",
        "failed": "red",
        "killed": "red",
        "lost": "yellow",
        "interrupted": "yellow",
    }.get(status, "white")
    return f"[{colour}]{esc(status)}[/{colour}]"


def jsonable(obj: Any) -> Any:
    """pandas hands back numpy scalars and NaN; JSON wants plain numbers and null."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):
        obj = obj.item()  # numpy scalar
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(data), indent=2) + "\n")


class _RstripLines:
    """A text stream that drops the spaces rich pads lines with (table titles are
    padded to the table's width), line by line; a line not ended yet is held until
    it ends or the stream is flushed."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        if lines:
            self._stream.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(self._pending)
            self._pending = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"


__all__ = ["PIPE_WIDTH", "console", "esc", "jsonable", "print_json", "say", "status_text", "table"]
