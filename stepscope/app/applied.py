"""What an experiment's trial run applied (or could not), as the CLI and dashboard say it.

The job's bootstrap writes one entry per change into the run's ``config["applied"]``:
``{"fix", "change", "applied", "verified"}``, where ``change`` is a sentence such as
``num_workers 0 -> 4 (the job set 0)`` and ``verified`` says whether the job checked the
change took effect (None: not checkable, or recorded by an older stepscope that had no
such check). One reader here, so that the terminal and the page say the same thing and
old runs (no ``verified``, or no list at all) read the same way everywhere.
"""

from __future__ import annotations

from typing import Any

from stepscope.app.design_text import PHASES


def applied_changes(config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The run's applied entries, each with every key present; [] for a run that is
    not a trial (or whose job never got as far as applying anything)."""
    entries = (config or {}).get("applied") or []
    out = []
    for e in entries:
        if not isinstance(e, dict):
            continue
        out.append(
            {
                "fix": str(e.get("fix") or "?"),
                "change": str(e.get("change") or ""),
                "applied": bool(e.get("applied", True)),
                "verified": e.get("verified"),
            }
        )
    return out


def state(entry: dict[str, Any]) -> str:
    """One word or two for the entry: did it apply, and did the job see it take effect."""
    if not entry["applied"]:
        return "not applied"
    if entry["verified"] is True:
        return "applied, verified"
    if entry["verified"] is False:
        return "applied, not in effect"
    return "applied"


def not_applied_text(candidate: dict[str, Any]) -> str:
    """'not applied: dataloader_workers: <why>' for an experiment's candidate whose fixes
    did not take effect in the job: it was never measured, so it is never called faster,
    slower or unchanged. The CLI's table and the Optimize page say it in these words."""
    parts = [
        f"{item.get('fix') or '?'}: {item.get('why') or 'no reason recorded'}"
        for item in candidate.get("not_applied") or []
    ]
    return "not applied: " + ("; ".join(parts) if parts else "no reason recorded")


def trial_label(config: dict[str, Any] | None) -> str | None:
    """'experiment 3, arm all, trial 2' for a trial run; None for any other run."""
    cfg = config or {}
    if cfg.get("experiment") is None:
        return None
    trial = cfg.get("trial")
    return (
        f"experiment {cfg['experiment']}, arm {cfg.get('arm', '?')}"
        + ("" if trial is None else f", trial {int(trial) + 1}")
        + (f" ({PHASES[cfg['phase']]})" if cfg.get("phase") in PHASES else "")
    )


__all__ = ["applied_changes", "not_applied_text", "state", "trial_label"]
