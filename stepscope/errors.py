"""Errors said in one line: the form every layer reports a failure in (a run's error,
a fix that could not be applied, a trial that crashed), and how to tell one that ran out of
memory."""

from __future__ import annotations

import re
import traceback
from typing import Any


def one_line_error(exc_type: Any, exc: Any) -> str:
    """``ZeroDivisionError: division by zero``: the last line a traceback would print."""
    lines = traceback.format_exception_only(exc_type, exc)
    text = next((ln.strip() for ln in reversed(lines) if ln.strip()), exc_type.__name__)
    return text.splitlines()[0][:500]


# How torch says a job ran out of memory: CUDA's ``torch.OutOfMemoryError`` ("CUDA out of
# memory. Tried to allocate 20.00 GiB ...") and the CPU allocator's RuntimeError under a
# process memory limit ("DefaultCPUAllocator: can't allocate memory: you tried to
# allocate 201326592 bytes"), which never says "out of memory".
OOM_MARKERS = ("out of memory", "outofmemoryerror", "can't allocate memory")
_SIZE_UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_ASKED = (
    re.compile(r"you tried to allocate (\d+) bytes", re.IGNORECASE),
    re.compile(r"tried to allocate ([\d.]+) ?(bytes|b|kib|mib|gib|tib)\b", re.IGNORECASE),
)


def is_out_of_memory(text: str | None) -> bool:
    """Whether an error line says the job ran out of memory (CUDA's or the CPU's)."""
    lowered = str(text or "").lower()
    return any(marker in lowered for marker in OOM_MARKERS)


def bytes_asked(text: str | None) -> int | None:
    """The failing allocation's size in bytes, read from torch's OOM message; None if
    the message does not say (CUDA rounds it to two decimals of its unit)."""
    for pattern in _ASKED:
        match = pattern.search(str(text or ""))
        if match is None:
            continue
        unit = match.group(2).lower() if match.lastindex and match.lastindex > 1 else "b"
        return int(round(float(match.group(1)) * _SIZE_UNITS[unit]))
    return None
