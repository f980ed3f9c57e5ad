"""Reading a stored JSON artifact (a profiler trace, a memory timeline, a trial's tokens or
prompts) with a cap on its size once decompressed.

Whoever can write a run's row names the files stepscope reads, and gzip inflates up to
about a thousand times: a 300 KB ``.json.gz`` of one repeated event took 726 MB to
analyse, and the dashboard analyses the trace a row names when its page is viewed. So
every reader of such a file goes through ``read_capped``: it decompresses a piece at a
time and stops as soon as the JSON passes the cap (``$STEPSCOPE_MAX_TRACE_BYTES``, 4 GiB
by default), so memory never holds more than the cap plus a few pieces of 1 MiB (the one
being filled in, zlib's own buffers; measured in tests/test_trace_cap.py); a file that is
not gzipped is capped by its size on disk, before it is read. The error is one line naming
the file, the size reached and the cap.

Streaming costs nothing against ``gzip.decompress`` (measured on the shared traces: the
same or a little faster; zlib checks the CRC and length itself). The JSON comes back as
a ``bytearray`` when it was gzipped: turning it into ``bytes`` would copy it, and orjson,
``re`` and slicing take it as they take bytes.
"""

from __future__ import annotations

import io
import os
import re
import zlib
from collections.abc import Iterator
from typing import BinaryIO

ENV_VAR = "STEPSCOPE_MAX_TRACE_BYTES"
#: The default cap: more JSON than this in one file is refused (parsed whole, JSON costs
#: about 8x its size in Python objects; the loader parses big files a piece at a time).
DEFAULT_MAX_BYTES = 4 << 30
#: Decompressed bytes per step: what memory may hold beyond the cap. Small pieces are
#: faster than big ones: their buffers are reused instead of mapped afresh, and a small
#: compressed read leaves little input to carry over (256 KiB in, 1 MiB out decompressed
#: the shared traces as fast as ``gzip.decompress``; 1 MiB in, 16 MiB out 1.6x slower).
PIECE_BYTES = 1 << 20
#: Compressed bytes read per step.
READ_BYTES = 256 << 10

_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 31  # a gzip header and trailer around the deflate stream
_MAX_RATIO = 1032  # deflate's largest: a 258-byte match in about 2 bits
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TRUNCATED = "Compressed file ended before the end-of-stream marker was reached"


class ReadError(ValueError):
    """A stored file that cannot be read; the message is one line: '<path>: <problem>'."""


class TooLarge(ReadError):
    """A file whose JSON is larger than the cap."""


def parse_size(text: str, name: str) -> int:
    """``"512M"``, ``"4GiB"``, ``"1000000"`` as bytes (binary units); ``name`` is what
    the one-line error calls the setting."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ReadError(f"{name}={text!r}: not a size (bytes, or a number with K, M or G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def max_json_bytes() -> int:
    """The cap on one file's JSON: ``$STEPSCOPE_MAX_TRACE_BYTES``, else 4 GiB."""
    text = os.environ.get(ENV_VAR, "").strip()
    return parse_size(text, ENV_VAR) if text else DEFAULT_MAX_BYTES


def fmt_size(n: float) -> str:
    """Binary units, as the pages print sizes (``app.formats.fmt_bytes``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def too_large(name: object, size: int, cap: int, so_far: bool) -> TooLarge:
    """The one line for a file over the cap (``so_far``: decompression stopped there)."""
    reached = "of JSON decompressed so far" if so_far else "of JSON"
    return TooLarge(
        f"{name}: too large: {fmt_size(size)} {reached}, over the cap of {fmt_size(cap)} "
        f"({ENV_VAR})"
    )


def read_capped(path: str | os.PathLike[str], cap: int | None = None) -> bytes | bytearray:
    """A local file's JSON text, decompressed if it is gzipped, at most ``cap`` bytes
    (default ``max_json_bytes()``); ``ReadError`` (one line) for what cannot be read."""
    cap = max_json_bytes() if cap is None else cap
    try:
        with open(path, "rb") as fh:
            return _read_stream(path, fh, cap, os.fstat(fh.fileno()).st_size)
    except OSError as exc:
        raise ReadError(f"{path}: cannot read ({exc.strerror or exc})") from None


def capped_bytes(name: object, data: bytes, cap: int | None = None) -> bytes | bytearray:
    """``read_capped`` for bytes already in memory (an object fetched from S3)."""
    cap = max_json_bytes() if cap is None else cap
    return _read_stream(name, io.BytesIO(data), cap, len(data))


def json_size(path: str | os.PathLike[str], cap: int | None = None) -> int:
    """How many bytes of JSON the file holds, counted by decompressing it without keeping
    it (the size on disk for a file that is not gzipped); ``TooLarge`` as soon as the
    count passes ``cap`` (default ``max_json_bytes()``), as ``read_capped`` would. Cheap
    in memory (a piece at a time), not in time: 2 to 3 s per GiB on 2 cores. The gzip
    trailer's size is no answer: it holds the last member's size modulo 4 GiB, and a
    writer can put anything there."""
    cap = max_json_bytes() if cap is None else cap
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            if head != _GZIP_MAGIC:
                size = os.fstat(fh.fileno()).st_size
                if size > cap:
                    raise too_large(path, size, cap, so_far=False)
                return size
            total = 0
            for piece in _inflated(path, fh, head):
                total += len(piece)
                if total > cap:
                    raise too_large(path, total, cap, so_far=True)
            return total
    except OSError as exc:
        raise ReadError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_stream(name: object, fh: BinaryIO, cap: int, size: int) -> bytes | bytearray:
    head = fh.read(2)
    if head != _GZIP_MAGIC:
        if size > cap:
            raise too_large(name, size, cap, so_far=False)
        fh.seek(0)  # read whole in one call: ``head + rest`` would copy it all once more
        data = fh.read()
        if len(data) > cap:  # it grew since it was measured
            raise too_large(name, len(data), cap, so_far=False)
        return data
    # One buffer of the size the file says it inflates to, filled in place: a buffer
    # grown piece by piece keeps up to an eighth spare, and each growth may copy it all.
    out = bytearray(_expected_size(fh, size, cap))
    used = 0
    for piece in _inflated(name, fh, head):
        end = used + len(piece)
        if end > cap:
            raise too_large(name, end, cap, so_far=True)
        out[used:end] = piece  # beyond the buffer's end (a size that lied), it grows
        used = end
    del out[used:]
    return out


def _expected_size(fh: BinaryIO, size: int, cap: int) -> int:
    """The gzip trailer's size of the JSON (ISIZE, the last 4 bytes), as the buffer's
    first size only: a writer can put anything there, so it is trusted no further than
    the cap and deflate's largest ratio (1032:1) of the file's size."""
    if size < 20:  # smaller than a gzip header and trailer
        return 0
    at = fh.tell()
    fh.seek(-4, os.SEEK_END)
    claimed = int.from_bytes(fh.read(4), "little")
    fh.seek(at)
    return min(claimed, cap, size * _MAX_RATIO)


def _inflated(name: object, fh: BinaryIO, data: bytes) -> Iterator[bytes]:
    """The gzip stream's decompressed bytes, ``PIECE_BYTES`` at most at a time; every
    member of a multi-member file, as ``gzip.decompress`` reads them. ``data``: what was
    already read from ``fh``."""
    inflater = zlib.decompressobj(_GZIP_WBITS)
    while True:
        fed = data or fh.read(READ_BYTES)
        try:
            piece = inflater.decompress(fed, PIECE_BYTES)
        except zlib.error as exc:
            raise ReadError(f"{name}: truncated or corrupt gzip ({exc})") from None
        if piece:
            yield piece
        if inflater.eof:  # a member ended: another may follow
            data = inflater.unused_data
            if len(data) < len(_GZIP_MAGIC):
                data += fh.read(READ_BYTES)
            if not data:
                return
            if not data.startswith(_GZIP_MAGIC):
                raise ReadError(f"{name}: truncated or corrupt gzip (not gzip data after a member)")
            inflater = zlib.decompressobj(_GZIP_WBITS)
            continue
        if not fed and not piece:
            raise ReadError(f"{name}: truncated or corrupt gzip ({_TRUNCATED})")
        data = inflater.unconsumed_tail
