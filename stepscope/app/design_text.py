"""How an experiment's design reads in a report: rounds run, arms stopped, trials repeated.

Plain text from the result's ``design`` and ``repeated`` (``optim_runner/experiment/design.py``,
``repeats.py``), for the CLI's report and any page that shows a result. A result stored
before the adaptive design has neither: every function then says nothing (None, []).
"""

from __future__ import annotations

from typing import Any

# What a phase of its own is doing, for progress lines (the first round's "trials" and a
# sweep's phases say nothing more than the arm and its trial).
PHASES = {
    "confirm": "confirming the kept fixes",
    "leave_one_out": "leave-one-out from the fastest set",
    "largest_batch": "confirming the largest batch that fits",
}


def trials_phrase(result: dict[str, Any]) -> str:
    """'3 trials' (every trial ran, or an older result) or 'up to 3 trials' (adaptive)."""
    design = result.get("design") or {}
    prefix = "up to " if design.get("mode") == "adaptive" else ""
    return f"{prefix}{result['trials']} trials"


def stopped_status(candidate: dict[str, Any], result: dict[str, Any]) -> str | None:
    """A stopped candidate's status cell: 'stopped (2 of 3 trials)', or 'not run' for one
    stopped before its first trial; None otherwise."""
    if not candidate.get("stopped"):
        return None
    runs = len(candidate.get("runs") or [])
    return f"stopped ({runs} of {result['trials']} trials)" if runs else "not run"


def stopped_lines(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(arm, why) for each arm stopped early, in the order of the candidates."""
    stopped = (result.get("design") or {}).get("stopped") or {}
    return list(stopped.items())


def design_line(result: dict[str, Any]) -> str | None:
    """One line: how many rounds ran of the most, and why it ended early."""
    design = result.get("design")
    if not design:
        return None
    rounds, most = design.get("rounds"), design.get("max_rounds")
    if design.get("mode") == "full":
        text = f"full design: {rounds} of {most} rounds, every candidate in every round"
    else:
        budget = design.get("budget_min")
        text = f"adaptive design: {rounds} of at most {most} rounds ran"
        text += f" (budget {budget:g} min)" if budget else ""
    if design.get("ended"):
        text += f"; ended early: {design['ended']}"
    confirm = design.get("confirm") or {}
    if confirm.get("ended"):
        text += f"; confirmation: {confirm['ended']}"
    elif confirm:
        text += f"; confirmation: {confirm.get('rounds')} of {confirm.get('max_rounds')} rounds"
    loo = result.get("leave_one_out") or {}
    if loo.get("steps"):
        trials = sum(1 for step in loo["steps"] for r in step["removals"] if r.get("arm"))
        text += f"; leave-one-out from {loo['from']}: {len(loo['steps'])} step(s), {trials} arms"
    return text


def repeat_line(result: dict[str, Any]) -> str | None:
    """One line on trials run again because other work competed for the cores."""
    repeated = result.get("repeated")
    if not repeated or not (repeated.get("count") or repeated.get("note")):
        return None
    count = int(repeated.get("count") or 0)
    plural, them = ("", "it") if count == 1 else ("s", "them")
    text = (
        f"{count} trial{plural} repeated: other work competed for the cores during {them} "
        "(kept in the store, not counted)"
    )
    if repeated.get("note"):
        text += f"; {repeated['note']}"
    return text


__all__ = [
    "PHASES",
    "design_line",
    "repeat_line",
    "stopped_lines",
    "stopped_status",
    "trials_phrase",
]
