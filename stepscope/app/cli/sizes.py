"""Memory sizes as users type them: ``2.5GB``, ``2500MiB``, ``3000000000``.

Decimal units (KB, MB, GB, TB: powers of 1000) as disks and cloud instances are sold,
binary ones (KiB, MiB, GiB, TiB: powers of 1024) as torch's messages and ``free -h``
print them; a bare number is bytes. Anything else is refused in one line.
"""

from __future__ import annotations

import re

UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``text``; ValueError (its message one line naming the problem) when the
    number is missing, not positive, or the unit is not one of ``UNITS``."""
    match = _SIZE.match(text or "")
    if match is None:
        raise ValueError(f"{text!r} is not a size (examples: 2.5GB, 2500MiB, 3000000000)")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit not in UNITS:
        known = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
        raise ValueError(f"unknown unit {match.group(2)!r} in {text!r} (known: {known})")
    size = int(number * UNITS[unit])
    if size <= 0:
        raise ValueError(f"{text!r} must be more than 0 bytes")
    return size
