"""A big trace's event array, cut into pieces that parse on their own.

``orjson.loads`` of a whole trace holds every event as a Python dict at once: about 8x
the file's size (8.3 GB for a 1 GB trace), more than the machines that analyse such
traces can spare. The loader parses a big file a piece at a time instead, builds each
piece's columns, and lets the piece's dicts go before the next one is parsed, so the
parsed JSON costs one piece at a time (``CHUNK_BYTES`` of text), not the whole file.

Where to cut without a JSON parser: a raw newline cannot occur inside a JSON string, so
a newline followed by the first event's indentation and ``{`` starts a line that holds
the next event (Kineto writes one event per block at two spaces, other writers one per
line at none); a nested object on its own line sits deeper. A file whose events share a
line (compact JSON) has no such cut, and any piece that does not parse as a list of
events makes the loader parse the whole file the usual way, so a cut can cost time,
never a wrong result.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson

from stepscope.analyzers.trace.typed_events import decode_events

#: Files smaller than this are parsed whole (one call is fastest, and their dicts fit).
MIN_BYTES = 64 << 20
#: About this much JSON text per piece.
CHUNK_BYTES = 64 << 20
#: How many closing brackets from the end are tried as the event array's end.
MAX_TAIL_TRIES = 64

_KEY = re.compile(rb'"traceEvents"\s*:\s*\[\s*')


class NoCut(ValueError):
    """The file cannot be cut safely: parse it whole."""


def _array_end(data: bytes | bytearray, open_at: int) -> tuple[int, dict[str, Any]]:
    """The index of the ``]`` closing the event array, and the document without its
    events (``traceEvents`` then holds ``[]``): the one candidate that parses."""
    head = data[:open_at]
    at = len(data)
    for _ in range(MAX_TAIL_TRIES):
        at = data.rfind(b"]", open_at, at)
        if at < 0:
            break
        try:
            doc = orjson.loads(head + b"[]" + data[at + 1 :])
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            return at, doc
    raise NoCut("no end of the event array found")


def event_pieces(data: bytes | bytearray) -> tuple[dict[str, Any], Iterator[list]]:
    """The document without its events, and the events piece by piece (lists of
    ``typed_events.Event`` records, or of dicts for a piece that does not fit them).

    Raises ``NoCut`` where the layout gives no safe cut; the iterator raises it for a
    piece that does not parse (the caller then parses the file whole).
    """
    key = _KEY.search(data)
    if key is None or key.end() >= len(data) or data[key.end()] != ord("{"):
        raise NoCut("no event array of objects")
    first = key.end()
    line = data.rfind(b"\n", 0, first)
    indent = data[line + 1 : first]
    if line < key.start() or indent.strip():
        raise NoCut("the first event does not start a line")
    close, doc = _array_end(data, data.rindex(b"[", key.start(), key.end()))
    sep = b"\n" + indent + b"{"
    return doc, _pieces(data, first, close, sep)


def _pieces(data: bytes | bytearray, start: int, close: int, sep: bytes) -> Iterator[list]:
    while start < close:
        cut = data.find(sep, min(start + CHUNK_BYTES, close), close)
        end = close if cut < 0 else cut + 1
        text = data[start:end].rstrip()
        if text.endswith(b","):
            text = text[:-1]
        piece = b"[" + text + b"]"
        del text
        events = decode_events(piece)  # typed records; dicts where a piece does not fit
        if events is None:
            try:
                events = orjson.loads(piece)
            except orjson.JSONDecodeError as exc:
                raise NoCut(f"a piece does not parse ({exc})") from None
        del piece
        yield events
        start = end
