"""Results stored before leave-one-out: a combination that beat the kept fixes.

Until leave-one-out (``leave_one_out.py``), an arm holding the kept fixes and more that
measured clearly faster than their best candidate became the best, with what it beat in
``best["over"]``, and its extra fixes were kept without saying which of them earned the
gain. Experiments stored then are still shown; this reads that field for their answer.
"""

from __future__ import annotations

from typing import Any


def over_text(best: dict[str, Any]) -> str | None:
    """'1.86x (1.62-2.13) over dataloader_workers' for a best that beat the kept fixes'
    best candidate; None otherwise (and for a result stored before it)."""
    over = best.get("over")
    if not over or not over["fixes"]:  # over the baseline: the best's own ratio says it
        return None
    lo, hi = over["ci"]
    return f"{over['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) over {over['candidate']}"


__all__ = ["over_text"]
