"""Did a trial's fixes take effect? Read from what the job itself reported.

The installer writes one entry per change into the trial run's ``config["applied"]``
(``fixes/install.py``): the fix, the change, whether it was applied and whether the
job's own object read back the new value (``verified``). A candidate whose fix did not
take effect has measured the baseline again; its figures would be reported as "no
change" or worse, "slower" (a real script's ``num_workers=args.workers`` kept at 0 was
once reported 0.96x). So such a candidate is "not applied", with the reason, and never
measured. Each fix answers for itself (``Fix.took_effect``).
"""

from __future__ import annotations

from typing import Any

from stepscope import fixes as catalog


def not_applied(fix_ids: list[str], config: dict[str, Any] | None) -> list[dict[str, str]]:
    """``[{"fix", "why"}]`` for each of ``fix_ids`` that did not take effect in the run."""
    entries = [e for e in ((config or {}).get("applied") or []) if isinstance(e, dict)]
    out = []
    for fix_id in fix_ids:
        why = catalog.get(fix_id).took_effect(entries)
        if why is not None:
            out.append({"fix": fix_id, "why": why})
    return out


__all__ = ["not_applied"]
