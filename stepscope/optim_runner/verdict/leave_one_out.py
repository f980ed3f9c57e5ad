"""Leave-one-out from the fastest set: the smallest set of fixes that keeps its gain, and
what each fix in it earns.

Each fix is first measured alone against the baseline. That cannot say what a fix earns
once another bottleneck is gone: on the demo's input-bound job all six fixes together
measured 4.36x (4.10-4.66) while the workers alone gave 3.70x, and torch_compile,
channels_last and fused_optimizer each measured *slower* alone (0.87-0.92x), against a
baseline that waits on its loader 79 % of the time. Told "keep the workers" beside "all
six are clearly fastest", a user cannot tell which of the five others pay.

So, from the fastest set measured, each fix is taken out in turn (with the fixes in the
set that need it: no persistent workers without workers), each of those arms run
interleaved with the set itself, and compared with it directly:

* **Needed**: the set without it is clearly slower (the interval of its ratio to the set
  lies below 1), or it failed, or its guard (loss, outputs, tokens) broke: a fix whose
  removal breaks the job is not one to drop.
* **Dropped**: removing it changed nothing measurable (the interval contains 1), or made
  the set faster.
* **Repeat** on what is left until every remaining fix is needed. When several are
  dropped at once, the set without all of them is a new arm, measured again beside the
  set it came from: two fixes that each stand in for the other (either one suffices)
  would otherwise both be dropped. If that smaller set is clearly slower, only the one
  whose removal cost least is dropped.
* **Each kept fix's share** is the set with it against the set without it (the inverse
  of the leave-one-out ratio), with its interval; for a set of one fix, its speed-up
  over the baseline.

Plain functions over figures (no store, no trials): ``experiment/leave_one_out.py`` runs
the arms.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.verdict.verdict import FASTER, best_from


@dataclass(frozen=True)
class Removal:
    """One leave-one-out arm against the set it was taken from.

    ``ratio``/``lo``/``hi``: the set without ``unit`` over the set (< 1: slower without
    it); None when not measured. ``error``: why it counts as needed regardless (it failed,
    its guard broke, it could not be measured).
    """

    fix: str
    unit: tuple[str, ...]  # the fix and the fixes of the set that need it
    arm: str | None  # the leave-one-out arm's name (None: the baseline stood in)
    ratio: float | None
    lo: float | None
    hi: float | None
    error: str | None = None

    @property
    def measured(self) -> bool:
        return self.ratio is not None and self.lo is not None and self.hi is not None

    @property
    def needed(self) -> bool:
        """Kept: the set is clearly slower without it, or it cannot be told."""
        if self.error is not None or not self.measured:
            return True
        return (self.hi or 0.0) < 1.0

    @property
    def cost(self) -> float:
        """How much slower the set is without it (> 1: slower); for picking the cheapest."""
        return 1.0 / self.ratio if self.ratio else float("inf")

    def share(self) -> dict[str, Any] | None:
        """The set with the fix over the set without it: '1.14x (1.08-1.20)'."""
        if not self.measured:
            return None
        lo, hi = 1.0 / (self.hi or 1.0), 1.0 / (self.lo or 1.0)
        return {"ratio": round(1.0 / (self.ratio or 1.0), 4), "ci": [round(lo, 4), round(hi, 4)]}

    def text(self) -> str:
        """Why it is kept or dropped, in one phrase."""
        if self.error is not None:
            return f"needed: without it the job {self.error}"
        share = self.share()
        if share is None:
            return "needed: the set without it could not be measured"
        lo, hi = share["ci"]
        figure = f"{share['ratio']:.2f}x ({lo:.2f}-{hi:.2f})"
        if self.arm is None:  # a set of one fix: the baseline is the set without it
            return f"it alone gives {figure} over the baseline"
        it = "it"
        if len(self.unit) > 1:  # the fixes that need it leave with it
            it = f"it (with {', '.join(self.unit[1:])}, which need it)"
        if self.needed:
            return f"removing {it} costs {figure}"
        if lo > 1.0 or hi < 1.0:
            return f"removing {it} made the set faster: {figure} with it"
        return f"removing {it} changed nothing measurable: {figure} with it"

    def to_json(self) -> dict[str, Any]:
        return {
            "fix": self.fix,
            "removed": list(self.unit),
            "arm": self.arm,
            "ratio": self.ratio,
            "ci": None if not self.measured else [self.lo, self.hi],
            "error": self.error,
            "needed": self.needed,
            "share": self.share(),
            "text": self.text(),
        }


def units(fixes: Iterable[PlannedFix]) -> dict[str, tuple[str, ...]]:
    """For each fix of a set, what leaves the set with it: itself and the fixes of the set
    that need it (persistent workers leave with the workers)."""
    listed = list(fixes)
    return {
        f.id: (f.id, *(g.id for g in listed if g.needs == f.id and g.id != f.id)) for f in listed
    }


def without(fixes: Iterable[PlannedFix], removed: Iterable[str]) -> list[PlannedFix]:
    """The set without ``removed`` (in its order)."""
    gone = set(removed)
    return [f for f in fixes if f.id not in gone]


def removal_from(
    fix: str, unit: tuple[str, ...], arm: str | None, outcome: dict[str, Any]
) -> Removal:
    """A Removal from ``verdict.evaluate``'s outcome of the arm without ``unit``, measured
    against the set. A failed arm, a broken guard or too few steps count as needed."""
    error = None
    if outcome.get("status") != "completed":
        how = outcome.get("failure") or outcome.get("status")
        error = f"failed ({how}): {outcome.get('error')}"
    elif outcome.get("quality_ok") is False:
        error = f"broke its guard: {(outcome.get('quality') or {}).get('reason')}"
    lo, hi = outcome.get("ci") or (None, None)
    return Removal(fix, unit, arm, outcome.get("speedup"), lo, hi, error)


def alone_removal(fix: str, unit: tuple[str, ...], outcome: dict[str, Any]) -> Removal:
    """For a set of one fix: the baseline is the set without it; its outcome against the
    baseline, read the other way round."""
    lo, hi = outcome.get("ci") or (None, None)
    ratio = outcome.get("speedup")
    if ratio is None or lo is None or hi is None:
        return Removal(fix, unit, None, None, None, None)
    return Removal(fix, unit, None, 1.0 / ratio, 1.0 / hi, 1.0 / lo)


def to_drop(removals: list[Removal]) -> list[Removal]:
    """The removals that changed nothing measurable (their fixes leave the set)."""
    return [r for r in removals if not r.needed]


def cheapest(removals: list[Removal]) -> Removal:
    """The droppable removal that cost least (for when dropping all of them at once did
    not keep the gain)."""
    return min(removals, key=lambda r: r.cost)


def fastest_set(outcomes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The arm to leave fixes out of: the fastest measured arm (clearly faster than the
    baseline, its guard kept) when it holds more than one fix; None otherwise (a single
    fix is its own answer)."""
    pool = [
        o
        for o in outcomes
        if o["status"] == "completed" and o["verdict"] == FASTER and o["quality_ok"] is not False
    ]
    top = max(pool, key=lambda o: o["speedup"], default=None)
    return top if top is not None and len(top["fixes"]) > 1 else None


def loo_best(record: dict[str, Any]) -> dict[str, Any]:
    """The result's ``best`` from the phase's record: the set it ended with, its figures
    against the baseline, and what leave-one-out dropped."""
    outcome = record["outcome"]
    # the confirmation arm (the kept fixes, measured beside baseline trials of their own)
    # with nothing dropped from it is still that arm
    confirmed = record["from"] == "confirm" and not record["dropped"]
    return {
        **best_from(record["fixes"], outcome, confirmed=confirmed),
        "candidate": record["set"],
        "leave_one_out": {
            "from": record["from"],
            "from_speedup": record["from_speedup"],
            "from_ci": record["from_ci"],
            "dropped": sorted(record["dropped"]),
            "unsettled": record["unsettled"],
        },
    }


def keep_set(per_fix: dict[str, dict[str, Any]], record: dict[str, Any]) -> None:
    """The per-fix rows after leave-one-out: kept means in the set it ended with; each
    says what it earns there (``in_set``) or why it was dropped, with its reference."""
    kept = set(record["fixes"])
    for fix_id, entry in per_fix.items():
        entry["kept"] = fix_id in kept
        share = record["shares"].get(fix_id)
        dropped = record["dropped"].get(fix_id)
        if fix_id in kept and share is not None:
            entry["in_set"] = {**share, "against": f"{record['set']} without it"}
            entry["loo_note"] = share_note(entry, share)
        elif dropped is not None:
            entry["in_set"] = {**dropped, "against": f"{dropped['from']} without it"}
            entry["loo_note"] = dropped_note(dropped, dropped["from"])


def loo_text(best: dict[str, Any]) -> str | None:
    """How the kept set was found, for the answer line: 'leave-one-out from all (4.36x,
    4.10-4.66): torch_compile, channels_last dropped (removing each changed nothing
    measurable)'; None when leave-one-out did not run (or a result stored before it)."""
    loo = best.get("leave_one_out")
    if not loo:
        return None
    lo, hi = loo["from_ci"] or (None, None)
    figure = f"{loo['from_speedup']:.2f}x" + (f", {lo:.2f}-{hi:.2f}" if lo is not None else "")
    text = f"leave-one-out from {loo['from']} ({figure}): "
    if loo["dropped"]:
        text += f"{', '.join(loo['dropped'])} dropped (removing each changed nothing measurable)"
    else:
        text += "every fix of it is needed"
    if loo.get("unsettled"):
        text += f"; not settled: {loo['unsettled']}"
    return text


def in_set_text(fix: dict[str, Any]) -> str:
    """A per-fix row's 'in the kept set' cell: what the set earns with it ('1.14x
    (1.08-1.20)'), 'dropped', or '-' where leave-one-out did not reach it."""
    in_set = fix.get("in_set")
    if not in_set:
        return "-"
    if not fix.get("kept"):
        return "dropped"
    share = in_set.get("share") or {}
    if share.get("ratio") is None:
        return "needed"
    lo, hi = share["ci"]
    return f"{share['ratio']:.2f}x ({lo:.2f}-{hi:.2f})"


def share_note(fix: dict[str, Any], removal: dict[str, Any]) -> str:
    """A kept fix's row note: what it measured alone, and what it earns in the kept set.
    '0.87x alone (slower); in the kept set, removing it costs 1.14x (1.08-1.20)'."""
    alone = ""
    if fix.get("measured") is not None:
        ref = "" if fix.get("against") in (None, "baseline") else f" over {fix['against']}"
        alone = f"{fix['measured']:.2f}x alone{ref} ({fix.get('verdict')}); "
    return f"{alone}in the kept set, {removal['text']}"


def dropped_note(removal: dict[str, Any], reference: str) -> str:
    """A dropped fix's row note: 'dropped from all: removing it changed nothing ...'."""
    return f"dropped from {reference}: {removal['text']}"


__all__ = [
    "Removal",
    "alone_removal",
    "cheapest",
    "dropped_note",
    "fastest_set",
    "in_set_text",
    "keep_set",
    "loo_best",
    "loo_text",
    "removal_from",
    "share_note",
    "to_drop",
    "units",
    "without",
]
