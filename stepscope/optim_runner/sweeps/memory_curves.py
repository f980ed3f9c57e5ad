"""A training sweep's memory curves: the batch each memory fix allows, measured.

The largest batch that fits is what a memory fix is for: checkpointing that frees 40 % of
the peak matters as the batch it lets the job run at. So a training sweep given memory
fixes (``optimize RUN --sweep batch --fixes activation_checkpointing``) runs every batch
size again with each fix applied, in the same interleaved rounds, and each curve gets its
own fitted line, confirming runs and largest batch (``sweep._TrainingSweep``). Only fixes
that free memory draw a curve: a speed fix's batch limit is the job's own.
"""

from __future__ import annotations

from stepscope import fixes as catalog
from stepscope.optim_runner.trials.plan import CAPACITY, PlannedFix
from stepscope.optim_runner.trials.trials import Arm

FIXES_FOR_TRAINING = (
    "--fixes with --sweep batch is for a training job's memory fixes (one curve each)"
)


def memory_curve_fixes(fixes: list[str] | None) -> list[str]:
    """The fixes a training sweep draws a curve for: each must free memory (it addresses
    memory/capacity); ValueError in one line for one that does not, or is unknown."""
    out: list[str] = []
    for fix_id in fixes or []:
        try:
            fix = catalog.get(fix_id)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        if CAPACITY not in fix.addresses:
            freeing = sorted(f.id for f in catalog.FIXES.values() if CAPACITY in f.addresses)
            raise ValueError(
                f"{fix_id} frees no memory: a batch sweep draws curves for memory fixes "
                f"({', '.join(freeing)})"
            )
        out.append(fix_id)
    return list(dict.fromkeys(out))


def with_fixes(arm: Arm, extra: list[str]) -> Arm:
    """``arm`` with the memory fixes ``extra`` applied too (a fix's curve); itself when
    none. The job as it is at x1 becomes a candidate with the fix (not a baseline)."""
    if not extra:
        return arm
    fixes = [*arm.fixes, *(PlannedFix(fix_id, why_params="the sweep's curve") for fix_id in extra)]
    kind = "alone" if arm.kind == "baseline" else arm.kind
    return Arm(f"{arm.name} + {'+'.join(extra)}", kind, fixes, command=arm.command)


__all__ = ["FIXES_FOR_TRAINING", "memory_curve_fixes", "with_fixes"]
