"""From a finding to the fixes that address it, each with a predicted gain.

A fix is recommended only when the job can take it (no requirement known to be
unmet) and does not have it already; every fix left out is listed with the reason,
so the user sees that it was considered.

The prediction is an upper bound, never a promise (Amdahl's law over the finding's
share ``s`` of the step):

* a fix that removes waiting removes at most ``removes`` of it:
  ``1 / (1 - s * removes)``; removing a 30 % data wait bounds the step at 0.7x, ≤ 1.43x;
* a fix that speeds up work (mixed precision, compilation) speeds its part up by at
  most the top of its literature range ``k``: ``1 / ((1 - s) + s / k)``; the range and
  its source are shown beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope.optim_runner import catalog
from stepscope.optim_runner.catalog.base import Fix

if TYPE_CHECKING:
    from stepscope.analyzers.diagnosis import Finding
    from stepscope.analyzers.evidence import Evidence

MAX_BOUND = 20.0  # a bound above this says nothing more than "large"


def predict(fix: Fix, share: float | None) -> tuple[float | None, str]:
    """(upper bound of the speed-up, how it was derived)."""
    if share is None or share <= 0:
        return None, "no share of step time to bound it (capacity: it makes room, not speed)"
    s = min(share, 0.999)
    if fix.typical is not None:
        k = fix.typical.hi
        bound = 1.0 / ((1.0 - s) + s / k)
        basis = f"Amdahl: {100 * s:.0f} % of the step sped up by at most {k:g}x"
    elif fix.removes > 0:
        removed = s * fix.removes
        bound = 1.0 / (1.0 - removed)
        what = "all" if fix.removes >= 1 else f"up to {100 * fix.removes:.0f} % of"
        basis = f"Amdahl: removes {what} the {100 * s:.0f} % share"
    else:
        return None, "does not speed the step up by itself"
    return round(min(bound, MAX_BOUND), 2), basis


def recommend(finding: Finding, ev: Evidence) -> None:
    """Fill ``finding.fixes`` (best first) and ``finding.skipped``."""
    ctx = ev.context
    chosen: list[dict[str, Any]] = []
    for fix in catalog.for_problem(finding.klass, finding.subtype):
        unmet, unknown = fix.requirement_status(ctx)
        if unmet:
            finding.skipped.append({"id": fix.id, "reason": "needs " + ", ".join(unmet)})
            continue
        if fix.in_effect(ctx) is True:
            finding.skipped.append({"id": fix.id, "reason": "already in effect"})
            continue
        share = finding.share
        if fix.id == "avoid_syncs" and finding.subtype != "host_device":
            from stepscope.analyzers.diagnosis import sync_time_share

            share = sync_time_share(ev)  # only the syncs' own time can be won back
            if share < 0.01:
                finding.skipped.append({"id": fix.id, "reason": "no synchronising calls found"})
                continue
        predicted, basis = predict(fix, share)
        entry: dict[str, Any] = {
            "id": fix.id,
            "title": fix.title,
            "why": fix.why,
            "predicted_speedup": predicted,
            "basis": basis,
            "typical": None if fix.typical is None else [fix.typical.lo, fix.typical.hi],
            "typical_source": None if fix.typical is None else fix.typical.source,
            "auto": fix.auto,
            "changes_numerics": fix.changes_numerics,
            "needs_consent": fix.needs_consent,
            "unverified_requirements": unknown,
            "snippet": _snippet(fix, finding),
        }
        chosen.append(entry)
    chosen.sort(key=lambda f: f["predicted_speedup"] or 0.0, reverse=True)
    finding.fixes = chosen


def _snippet(fix: Fix, finding: Finding) -> str:
    """The catalog snippet, plus the operators that synced for the sync advice."""
    if fix.id != "avoid_syncs":
        return fix.snippet
    ops = [e["text"] for e in finding.evidence if "synchronised" in e["text"]]
    if not ops:
        return fix.snippet
    return "# synchronised in this run:\n" + "".join(f"#   {t}\n" for t in ops) + fix.snippet
