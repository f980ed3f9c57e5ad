"""An experiment on a run that ran out of memory: which arms fit under its limit.

A baseline that runs out of memory has no speed to divide by, so its candidates are not
judged by ratios. Each one ran under the same limit (the run's ``--memory-limit``, or
the same device) and either completed its steps ("fits"), ran out again ("still runs
out") or failed otherwise, as any candidate can. An arm that fits is given in absolute
figures: its measured peak (``peak_memory.arm_peak``) and its speed (samples/s where
its steps know their batch, else steps/s). The arm kept is the fastest that fits; its
loss is not guarded (there is no baseline loss to compare it with), which the answer's
caller may say.
"""

from __future__ import annotations

from typing import Any

from stepscope.optim_runner.trials.failures import not_applied_error
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.trials.trials import Arm
from stepscope.optim_runner.verdict.peak_memory import arm_peak
from stepscope.optim_runner.verdict.verdict import NOT_APPLIED, figures

FITS = "fits"
RUNS_OUT = "still runs out"
ADVICE = (
    "try a smaller batch with gradient accumulation (the same samples per optimizer "
    "step), shorter sequences, or fewer saved activations"
)


def size_text(n: float | None) -> str:
    """Bytes in the decimal units ``--memory-limit 2.5GB`` is written in."""
    if n is None:
        return "?"
    if n >= 1e9:
        return f"{n / 1e9:.3g} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"  # a per-sample share of a peak


def fit_outcome(store: Any, arm: Arm) -> dict[str, Any]:
    """One candidate under the limit: ``fits`` True (completed its steps), False (ran
    out again) or None (failed otherwise, not applied), with its peak and speed."""
    out: dict[str, Any] = {
        "name": arm.name,
        "kind": arm.kind,
        "fixes": arm.fix_ids,
        "status": "failed" if arm.error else "completed",
        "error": arm.error,
        "failure": arm.failure,
        "failed_run": arm.failed_run,
        "runs": list(arm.runs),
        "not_applied": list(arm.not_applied),
        "fits": None,
        "fit": None,  # 'fits' | 'still runs out' | None
        "peak_bytes": None,
        "peak_basis": None,
        "samples_per_s": None,
        "steps_per_s": None,
        "speed": None,  # "3.2 steps/s"
        # the fields every candidate has; none of them applies without a baseline speed
        "against": None,
        "speedup": None,
        "ci": None,
        "verdict": None,
        "speedup_basis": None,
        "step_time": None,
        "quality_ok": None,
        "quality": None,
        "latency": None,
        "agreement": None,
        "peak_ratio": None,
        "trade": None,
        "stopped": arm.stopped,
    }
    if arm.not_applied and arm.error is None:
        out.update(status=NOT_APPLIED, error=not_applied_error(arm.not_applied))
        return out
    if arm.error is not None:
        if arm.failure == "oom":
            out.update(fits=False, fit=RUNS_OUT)
        return out
    if not arm.runs:
        return out
    figs = figures(store, arm.runs)
    peak, basis = arm_peak(store, arm.runs)
    median = figs.median_step
    out.update(
        fits=True,
        fit=FITS,
        peak_bytes=peak,
        peak_basis=basis,
        samples_per_s=figs.samples_per_s,
        steps_per_s=round(1.0 / median, 3) if median else None,
        warmup=figs.warmup(),
    )
    out["speed"] = speed_text(out)
    return out


def fit_status(outcome: dict[str, Any]) -> str:
    """'fits', 'still runs out', 'not applied: ...' or the failure's kind, in words."""
    if outcome.get("status") == NOT_APPLIED:
        return str(outcome.get("error") or "not applied")
    if outcome.get("fit"):
        return str(outcome["fit"])
    return str(outcome.get("failure") or outcome.get("status") or "-")


def speed_text(outcome: dict[str, Any]) -> str | None:
    """ "41.0 samples/s", or "3.2 steps/s" where the steps do not know their batch."""
    if outcome.get("samples_per_s"):
        return f"{outcome['samples_per_s']:.3g} samples/s"
    if outcome.get("steps_per_s"):
        return f"{outcome['steps_per_s']:.3g} steps/s"
    return None


def _speed_key(outcome: dict[str, Any]) -> tuple[float, float]:
    """Faster first: samples/s where known, else steps/s; fewer fixes break a tie."""
    return (
        outcome.get("samples_per_s") or outcome.get("steps_per_s") or 0.0,
        -len(outcome["fixes"]),
    )


def fastest_fit(outcomes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest arm that fits; None when none does."""
    fitting = [o for o in outcomes if o.get("fits")]
    return max(fitting, key=_speed_key) if fitting else None


def fit_per_fix(
    planned: list[PlannedFix],
    arms: list[Arm],
    outcomes: dict[str, dict[str, Any]],
    kept: list[str],
) -> dict[str, dict[str, Any]]:
    """Each fix's row of the result: the arm it ran alone in (with the fix it needs), and
    whether that arm fits; nothing measured against a baseline (there was none)."""
    by_fixes = {tuple(sorted(a.fix_ids)): a.name for a in arms}
    rows = {}
    for fix in planned:
        own = by_fixes.get(tuple(sorted([fix.id] + ([fix.needs] if fix.needs else []))))
        outcome = outcomes.get(own) or {} if own else {}
        rows[fix.id] = {
            "id": fix.id,
            "params": fix.params,
            "why_params": fix.why_params,
            "predicted": fix.predicted_speedup,
            "predicted_basis": fix.basis,
            "finding": fix.finding,
            "measured": None,
            "ci": None,
            "verdict": None,
            "against": "baseline",
            "candidate": own,
            "status": outcome.get("fit") or outcome.get("status") or "not measured",
            "fits": outcome.get("fits"),
            "error": outcome.get("error"),
            "quality_ok": None,
            "changes_numerics": fix.changes_numerics,
            "kept": fix.id in kept,
            "note": None,
        }
    return rows


def runs_out_text(limit_bytes: float | None) -> str:
    under = f"under {size_text(limit_bytes)}" if limit_bytes else "on its device"
    return f"the baseline runs out of memory {under}"


def fit_answer(
    limit_bytes: float | None, outcomes: list[dict[str, Any]]
) -> tuple[dict | None, str]:
    """The arm kept (the fastest that fits) and the answer line that says so."""
    top = fastest_fit(outcomes)
    head = runs_out_text(limit_bytes)
    if top is None:
        return None, f"{head}; none of the candidates fits: {ADVICE}"
    figures_text = ", ".join(
        x
        for x in (
            f"peak {size_text(top['peak_bytes'])}" if top["peak_bytes"] else None,
            top["speed"],
        )
        if x
    )
    return top, f"{head}; fits with: {', '.join(top['fixes'])} ({figures_text})"


__all__ = [
    "ADVICE",
    "FITS",
    "RUNS_OUT",
    "fastest_fit",
    "fit_answer",
    "fit_status",
    "fit_outcome",
    "fit_per_fix",
    "runs_out_text",
    "size_text",
    "speed_text",
]
