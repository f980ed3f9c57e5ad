"""Shares of one step that overlap, said so.

Each finding's share is the part of the step its own fixes could give back, measured on
its own: a generation run's "no KV cache" time lies inside its decode time, and host
overhead spans both. Shown side by side they read as parts of one whole, and a page
that showed 84 + 56 + 26 + 18 % of one step contradicted itself (issue 39). Normalising
them would change what each one means (the time its fix can win), so they are kept and
the overlap is named: two shares that add up to more than 100 % cannot lie apart.
"""

from __future__ import annotations

from stepscope.types import Finding

WHOLE = 1.0


def overlap_note(findings: list[Finding]) -> str | None:
    """One line when the findings' shares add up to more than the step: the total and
    the pairs that certainly overlap (their two shares alone exceed 100 %); None when
    they fit in one step."""
    shared = [f for f in findings if f.share]
    total = sum(float(f.share or 0.0) for f in shared)
    if total <= WHOLE + 1e-9:
        return None
    pairs = [
        f"{a.title} ({a.share:.0%}) and {b.title} ({b.share:.0%})"
        for i, a in enumerate(shared)
        for b in shared[i + 1 :]
        if float(a.share or 0) + float(b.share or 0) > WHOLE
    ]
    which = (
        "; ".join(pairs) + " are parts of the same time"
        if pairs
        else "some of them are parts of the same time"
    )
    return (
        f"These shares overlap: together they are {total:.0%} of the step, as each is "
        f"the time its own fix could give back, measured on its own ({which}). Do not add them up."
    )
