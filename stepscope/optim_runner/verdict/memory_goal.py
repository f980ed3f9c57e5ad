"""The memory goal's words: ``--goal`` and ``--max-slowdown`` as the options read them.

Apart from ``peak_memory.py`` (which reads runs, with NumPy) because the experiment's
options are declared with the CLI's parser, and ``stepscope --help`` must stay light.
"""

from __future__ import annotations

import re

GOALS = ("time", "memory")
DEFAULT_MAX_SLOWDOWN = 1.5  # at most 1.5x slower per sample, for --goal memory
_SLOWDOWN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(x|%)?\s*$", re.IGNORECASE)


def parse_max_slowdown(text: str | float) -> float:
    """The most an arm may be slower, as a factor: ``"1.5x"`` (1.5 times the baseline's
    time per sample), ``"50%"`` or ``"0.5"`` (the same, written as ``check``'s slowdowns
    are); ValueError in one line. A bare number of 1 or more is refused, as ``check``
    does: "2" could mean 2x or 200 %."""
    match = _SLOWDOWN.match(str(text))
    if match is None:
        raise ValueError(f"max slowdown {text!r}: write a factor (1.5x) or a percentage (50%)")
    value, unit = float(match.group(1)), (match.group(2) or "").lower()
    if unit == "x":
        if value < 1:
            raise ValueError(f"max slowdown {text!r}: a factor of 1x or more (1.5x)")
        return value
    if unit == "%":
        return 1.0 + value / 100.0
    if value >= 1:
        raise ValueError(
            f"max slowdown {text!r}: a factor (1.5x), a percentage (50%) or a fraction (0.5)"
        )
    return 1.0 + value


__all__ = ["DEFAULT_MAX_SLOWDOWN", "GOALS", "parse_max_slowdown"]
