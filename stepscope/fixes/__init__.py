"""The catalog of fixes: one declarative ``Fix`` per optimisation, grouped by area.

The diagnosis (``analyzers/recommend.py``) picks entries from here for each finding,
and the experiment runner applies the ``auto`` ones inside the job. An entry states
what it addresses, what it needs (``requires``: names checked by ``requirements``
against what the run is known to have) and how to tell that it is already in effect,
so that advice is never given to a job that cannot take it or already has it.

Typical gains are quoted only with their source; where none is quoted the prediction
is the Amdahl bound from the finding's share alone (see ``recommend.predict``).
"""

from __future__ import annotations

from stepscope.fixes import (
    compute,
    distributed,
    input_pipeline,
    memory,
    precision,
)
from stepscope.fixes.base import Fix, Typical

FIXES: dict[str, Fix] = {
    fix.id: fix
    for module in (input_pipeline, precision, compute, memory, distributed)
    for fix in module.FIXES
}


def get(fix_id: str) -> Fix:
    """The entry with this id; KeyError names the known ids (a typo in --fixes)."""
    try:
        return FIXES[fix_id]
    except KeyError:
        raise KeyError(f"unknown fix {fix_id!r}; known: {', '.join(sorted(FIXES))}") from None


def for_problem(klass: str, subtype: str) -> list[Fix]:
    """Entries addressing ``klass/subtype``, in catalog order (most direct first)."""
    key = f"{klass}/{subtype}"
    return [fix for fix in FIXES.values() if key in fix.addresses]


__all__ = ["FIXES", "Fix", "Typical", "for_problem", "get"]
