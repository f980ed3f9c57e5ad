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

Two kinds of fix need more than "not known to be unmet":

* **CUDA-only fixes** (TF32, cudnn.benchmark, pinned memory, ...) need the job to have
  reported CUDA (or NVML to have seen it on a GPU). A run that says nothing about its
  device (no step reached, an attached process) gets none: advising TF32 to a CPU job
  is worse than saying nothing.
* **Fixes with their own evidence** (``Fix.advise``): the thread count is offered only
  with evidence that it is wrong, and with the count that evidence points to
  (``fixes/cpu_threads.py``); removing syncs can win back only the syncs' own time
  (``fixes/avoid_syncs.py``).
"""

from __future__ import annotations

from stepscope import fixes as catalog
from stepscope.analyzers.evidence import Evidence
from stepscope.fixes.base import Advice, Fix
from stepscope.types import Finding, FixAdvice, SkippedFix

MAX_BOUND = 20.0  # a bound above this says nothing more than "large"
# Requirements only a GPU meets (ROCm's torch.cuda included): such a fix is recommended
# only to a job known to use CUDA, never to one whose device is unknown.
CUDA_ONLY = frozenset({"cuda", "tf32", "bf16_tensor_cores"})


def predict(
    fix: Fix, share: float | None, removes: float | None = None
) -> tuple[float | None, str]:
    """(upper bound of the speed-up, how it was derived); ``removes`` overrides the fix's
    own fraction for this finding (``Advice.removes``)."""
    if share is None or share <= 0:
        return None, "no share of step time to bound it (capacity: it makes room, not speed)"
    s = min(share, 0.999)
    if fix.typical is not None:
        k = fix.typical.hi
        bound = 1.0 / ((1.0 - s) + s / k)
        basis = f"Amdahl: {100 * s:.0f} % of the step sped up by at most {k:g}x"
    elif (removes := fix.removes if removes is None else removes) > 0:
        removed = s * removes
        bound = 1.0 / (1.0 - removed)
        what = "all" if removes >= 1 else f"up to {100 * removes:.0f} % of"
        basis = f"Amdahl: removes {what} the {100 * s:.0f} % share"
    else:
        return None, "does not speed the step up by itself"
    return round(min(bound, MAX_BOUND), 2), basis


def recommend(finding: Finding, ev: Evidence, present: frozenset[str] = frozenset()) -> None:
    """Fill ``finding.fixes`` (best first) and ``finding.skipped``.

    ``present``: the keys of all the diagnosis's findings; a fix whose ``primary``
    problem is among them is advised for that finding only.
    """
    ctx = ev.context
    chosen: list[FixAdvice] = []
    for fix in catalog.for_problem(finding.klass, finding.subtype):
        if fix.primary in present and fix.primary != finding.key:
            finding.skipped.append(
                SkippedFix(fix.id, f"advised for {fix.primary}, its own finding")
            )
            continue
        unmet, unknown = fix.requirement_status(ctx)
        if unmet:
            finding.skipped.append(SkippedFix(fix.id, "needs " + ", ".join(unmet)))
            continue
        if ctx.cuda is not True and CUDA_ONLY & set(fix.requires):
            why = "needs cuda (the job did not report using CUDA)"
            finding.skipped.append(SkippedFix(fix.id, why))
            continue
        if fix.in_effect(ctx) is True:
            finding.skipped.append(SkippedFix(fix.id, "already in effect"))
            continue
        advice = fix.advise(finding, ev) if fix.advise else Advice()
        if isinstance(advice, str):  # the fix's own evidence says it does not apply here
            finding.skipped.append(SkippedFix(fix.id, advice))
            continue
        share = finding.share if advice.share is None else advice.share
        predicted, basis = predict(fix, share, advice.removes)
        chosen.append(
            FixAdvice(
                id=fix.id,
                title=fix.title,
                why=fix.why,
                predicted_speedup=predicted,
                basis=basis,
                typical=None if fix.typical is None else (fix.typical.lo, fix.typical.hi),
                typical_source=None if fix.typical is None else fix.typical.source,
                auto=fix.auto,
                changes_numerics=fix.changes_numerics,
                needs_consent=fix.needs_consent,
                unverified_requirements=unknown,
                snippet=advice.snippet or fix.snippet,
                params=dict(advice.params),  # the values to try, for the plan
                evidence=advice.evidence,
            )
        )
    chosen.sort(key=lambda f: f.predicted_speedup or 0.0, reverse=True)
    finding.fixes = chosen
