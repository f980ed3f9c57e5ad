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

What a fix says fits the job (``Fix.fitting``, ``fixes/fitting.py``): the snippet of its
kind (no ``loss.backward()`` for an inference loop) and a literature figure only where it
was measured on the job's device and kind; where none was, no bound is quoted and the
basis says so (a Tensor Core figure is no bound for a CPU).

A fix that acts on one phase of the step (``Fix.phases``: the optimizer step, the data
wait, the forward and backward) is bounded by that phase's share where the finding spans
other phases or none: a fused optimizer can remove at most the optimizer step's 0.8 %,
never half of a compute finding's 100 %. ``s`` is then min(finding's share, the phases'
share), and the basis names the share it used. The phases' shares are the trace's
(``analyzers/steps/phases.py``) or, on a CPU job, the step timer's (``step_stats.phases``); on
a GPU the step timer's forward and backward are kernel launches, no bound.

Two kinds of fix need more than "not known to be unmet":

* **CUDA-only fixes** (TF32, cudnn.benchmark, pinned memory, ...) need the job to have
  reported CUDA (or NVML to have seen it on a GPU). A run that says nothing about its
  device (no step reached, an attached process) gets none: advising TF32 to a CPU job
  is worse than saying nothing.
* **Fixes with their own evidence** (``Fix.advise``): the thread count is offered only
  with evidence that it is wrong, and with the count that evidence points to
  (``fixes/catalog/cpu_threads.py``); removing syncs can win back only the syncs' own time
  (``fixes/catalog/avoid_syncs.py``).
"""

from __future__ import annotations

from stepscope import fixes as catalog
from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import pct, step_phase_shares
from stepscope.fixes.base import Advice, Fitting, Fix
from stepscope.types import Finding, FixAdvice, SkippedFix, phase_label

MAX_BOUND = 20.0  # a bound above this says nothing more than "large"
# Requirements only a GPU meets (ROCm's torch.cuda included): such a fix is recommended
# only to a job known to use CUDA, never to one whose device is unknown.
CUDA_ONLY = frozenset({"cuda", "tf32", "bf16_tensor_cores"})


def predict(
    fix: Fix,
    share: float | None,
    removes: float | None = None,
    *,
    fitting: Fitting | None = None,
    phase: str | None = None,
) -> tuple[float | None, str]:
    """(upper bound of the speed-up, how it was derived); ``removes`` overrides the fix's
    own fraction for this finding (``Advice.removes``); ``fitting``: what the fix says to
    this job (its figure, or why none fits; default: the fix's own figure); ``phase``: the
    label of the phase whose share ``share`` is, named in the basis."""
    fitting = fitting or Fitting(fix.snippet, fix.typical)
    if share is None or share <= 0:
        return None, "no share of step time to bound it (capacity: it makes room, not speed)"
    if fitting.typical is None and fitting.no_figure:
        return None, fitting.no_figure
    s = min(share, 0.999)
    if fitting.typical is not None:
        k = fitting.typical.hi
        bound = 1.0 / ((1.0 - s) + s / k)
        part = f"the {phase}'s {pct(s)} of the step" if phase else f"{pct(s)} of the step"
        basis = f"Amdahl: {part} sped up by at most {k:g}x"
    elif (removes := fix.removes if removes is None else removes) > 0:
        removed = s * removes
        bound = 1.0 / (1.0 - removed)
        what = "all" if removes >= 1 else f"up to {100 * removes:.0f} % of"
        part = f"the {phase}'s {pct(s)}" if phase else f"the {pct(s)} share"
        basis = f"Amdahl: removes {what} {part}"
    else:
        return None, "does not speed the step up by itself"
    return round(min(bound, MAX_BOUND), 2), basis


def phase_bound(fix: Fix, finding: Finding, ev: Evidence) -> tuple[float | None, str | None]:
    """(share of the step the fix's phases take, their label) where it bounds the fix's
    gain on this finding; (None, None) where it does not.

    It does where the fix acts on named phases and the finding has no phase or lives in
    others (a fused optimizer on a compute finding); a finding in the fix's own phases
    already read that phase at its best evidence (the data wait with outliers left out).
    The shares are the trace's phases, or the step timer's on a CPU job (on a GPU the
    host's forward and backward are launches: the device's time is elsewhere).
    """
    if not fix.phases:
        return None, None
    if finding.phase and set(finding.phase.split("+")) & set(fix.phases):
        return None, None
    shares, source = step_phase_shares(ev)
    if not shares or (source != "trace phases" and ev.context.cuda is not False):
        return None, None
    present = [p for p in fix.phases if p in shares]
    if not present:
        return None, None
    share = float(sum(shares[p] for p in present))
    named = [p for p in present if shares[p] > 0] or present
    return share, phase_label("+".join(named))


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
        phase_share, phase = phase_bound(fix, finding, ev) if share else (None, None)
        if phase_share is not None and phase_share <= 0:
            finding.skipped.append(SkippedFix(fix.id, f"no {phase} in this job's steps"))
            continue
        if phase_share is not None and share is not None and phase_share < share:
            share = phase_share
        else:
            phase = None
        fitting = fix.fitting(ctx)
        predicted, basis = predict(fix, share, advice.removes, fitting=fitting, phase=phase)
        typical = fitting.typical
        chosen.append(
            FixAdvice(
                id=fix.id,
                title=fitting.title or fix.title,
                why=fitting.why or fix.why,
                predicted_speedup=predicted,
                basis=basis,
                typical=None if typical is None else (typical.lo, typical.hi),
                typical_source=None if typical is None else typical.source,
                auto=fix.auto,
                changes_numerics=fix.changes_numerics,
                needs_consent=fix.needs_consent,
                unverified_requirements=unknown,
                snippet=advice.snippet or fitting.snippet,
                params=dict(advice.params),  # the values to try, for the plan
                evidence=advice.evidence,
            )
        )
    chosen.sort(key=FixAdvice.order_key)  # predicted <= 1.00x after the rest
    finding.fixes = chosen
