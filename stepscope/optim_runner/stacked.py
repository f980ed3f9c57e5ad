"""Fixes that pay only once others are applied: a measured combination beats the kept ones.

Each fix is judged alone against the baseline (``verdict.per_fix``), and the fixes kept
are those measured faster alone. That misses stacked bottlenecks: an imagenet-style job
that waits on its loader 80 % of each step shows nothing from ``torch_compile`` or
``channels_last`` alone, yet once the workers feed it the compute is what is left. In one
run its "all fixes" arm measured 8.15x against the workers' 4.39x, and the experiment
kept the workers alone.

So after the kept fixes' best candidate is found, every measured arm that holds all of
its fixes and more is compared with it directly (the larger's steps against the
smaller's, ``verdict.evaluate(..., against=)``); the fastest one that is clearly faster
than it becomes the best, and its extra fixes are kept with a note that says they were
measured together, not apart (which of them earns the gain would take leave-one-out
trials, which the experiment does not run).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from stepscope.optim_runner.verdict import FASTER


def wider_best(
    outcomes: list[dict[str, Any]],
    top: dict[str, Any] | None,
    against_top: Callable[[dict[str, Any]], dict[str, Any]],
    slower_alone: Collection[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the arm that beats ``top``, its figures against ``top``) for the fastest measured
    arm made of ``top``'s fixes and more that is clearly faster than ``top`` (with no
    ``top``: any arm clearly faster than the baseline, and its figures against it); None
    when none is.

    ``outcomes``: each arm's figures against the baseline; ``against_top(o)``: ``o``'s
    figures against ``top``'s arm; an arm holding a fix of ``slower_alone`` (measured
    slower on its own) is never taken: it would keep a fix that costs time."""
    mine = set(top["fixes"]) if top is not None else set()
    pool = sorted(
        (
            o
            for o in outcomes
            if o["name"] != "confirm"
            and o["status"] == "completed"
            and o["verdict"] == FASTER
            and o["quality_ok"] is not False
            and set(o["fixes"]) > mine
            and not set(o["fixes"]) & set(slower_alone)
        ),
        key=lambda o: o["speedup"],
        reverse=True,
    )
    for o in pool:
        if top is None:
            return o, o
        if o["speedup"] <= top["speedup"]:
            break
        over = against_top(o)
        if over.get("verdict") == FASTER:
            return o, over
    return None


def over_json(top: dict[str, Any] | None, over: dict[str, Any]) -> dict[str, Any]:
    """What the best beat, in the result's ``best["over"]`` (no ``top``: the baseline)."""
    return {
        "candidate": top["name"] if top is not None else "the baseline",
        "fixes": list(top["fixes"]) if top is not None else [],
        "speedup": over["speedup"],
        "ci": over["ci"],
    }


def keep_together(per_fix: dict[str, dict[str, Any]], best: dict[str, Any]) -> None:
    """Mark kept, with why, the fixes of a best that beat the kept ones (``best["over"]``)."""
    if not best.get("over"):
        return
    for fix_id in best["fixes"]:
        entry = per_fix.get(fix_id)
        if entry is None or entry["kept"]:
            continue
        entry["kept"] = True
        note = kept_together_note(entry, best)
        entry["note"] = "; ".join(x for x in (entry.get("note"), note) if x)


def over_text(best: dict[str, Any]) -> str | None:
    """'1.86x (1.62-2.13) over dataloader_workers' for a best that beat the kept fixes'
    best candidate; None otherwise (and for a result stored before it)."""
    over = best.get("over")
    if not over or not over["fixes"]:  # over the baseline: the best's own ratio says it
        return None
    lo, hi = over["ci"]
    return f"{over['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) over {over['candidate']}"


def kept_together_note(fix: dict[str, Any], best: dict[str, Any]) -> str:
    """Why a fix that did nothing measurable alone is kept: the arm holding it and the
    kept fixes measured faster than those fixes."""
    over = best["over"]
    extra = [f for f in best["fixes"] if f not in over["fixes"]]
    alone = (
        f"alone {fix['measured']:.2f}x ({fix['verdict']})"
        if fix.get("measured") is not None
        else f"alone: {fix.get('verdict') or fix.get('status')}"
    )
    lo, hi = over["ci"]
    return (
        f"kept with {best['candidate']}: {alone}, but {best['candidate']} measured "
        f"{over['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) over {over['candidate']}; it pays once "
        f"the others are applied (which of {', '.join(extra)} earns it was not measured apart)"
    )


__all__ = ["keep_together", "kept_together_note", "over_json", "over_text", "wider_best"]
