"""Numbers as people read them, shared by the terminal and the dashboard.

One module, free of heavy imports, so that `stepscope show` and the run page print the
same figure the same way (a median of 216.9 ms is "216.9 ms" in both places).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any


def missing(x: Any) -> bool:
    """None or NaN: what pandas hands back for an unknown figure."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_s(s: float | None, digits: int | None = None) -> str:
    """Seconds in µs / ms / s, or with a fixed number of ``digits`` in seconds."""
    if missing(s):
        return "—"
    if digits is not None:
        return f"{s:.{digits}f} s"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_num(x: float | None) -> str:
    return "—" if missing(x) else f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def fmt_time(t: float | None, clock: bool = False, short: bool = False) -> str:
    if missing(t):
        return "—"
    fmt = "%H:%M:%S" if clock else "%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S"
    return datetime.fromtimestamp(t).strftime(fmt)


def fmt_bytes(x: float | None, digits: int | None = None) -> str:
    """Binary units; ``digits`` significant digits for narrow places (metric tiles)."""
    if missing(x):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{x:.0f} B"
            return f"{x:.{digits}g} {unit}" if digits else f"{x:.1f} {unit}"
        x /= 1024
    return "—"  # unreachable: TiB takes everything left
