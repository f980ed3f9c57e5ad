"""The answer `stepscope run` prints when the job ends: the diagnosis in a few lines.

A user who runs a job under stepscope came for this, so it comes without another command:
the first finding (class, share of step time, confidence, the evidence it rests on),
its top fixes with their predicted gains, and the next command. It is printed on stderr
after the job's own output, as the launcher's lines are, so a job's piped stdout stays
the job's. The findings are saved with the run (``diagnose_run``), so `show` and the
dashboard have them without asking. A diagnosis that fails says so in one line; the
job's exit code is never touched.
"""

from __future__ import annotations

import sys
from typing import Any

from stepscope.analyzers.rules.diagnosis import LEVEL_TEXT, Diagnosis, diagnose_run
from stepscope.app.formats import fmt_pct
from stepscope.errors import one_line_error
from stepscope.store import RunStore
from stepscope.types import Finding

TOP_FIXES = 3


def print_verdict(run_id: int, home: Any = None) -> None:
    """Diagnose the ended run, save its findings, print the verdict (never raises)."""
    try:
        with RunStore(home) as store:
            if store.run(run_id)["status"] == "running":
                return  # one node of a multi-node run: the last one to end answers
            if store.step_count(run_id)[0] == 0:
                return  # the launcher's line said "0 steps"; `show` says why
            diagnosis = diagnose_run(store, run_id, save=True)
    except Exception as exc:
        _say(f"no verdict for run {run_id}: {one_line_error(type(exc), exc)}")
        return
    for line in verdict_lines(run_id, diagnosis):
        _say(line)


def verdict_lines(run_id: int, diagnosis: Diagnosis, more: str = "show") -> list[str]:
    """The verdict as lines (without the 'stepscope: ' prefix); ``more``: the verb that
    prints every finding in full (`show` at the job's end, `analyze` inside `show`)."""
    if diagnosis.reason:
        return [f"no verdict: {diagnosis.reason}"]
    basis = LEVEL_TEXT.get(diagnosis.level, diagnosis.level)
    if not diagnosis.findings:
        return [f"verdict: no bottleneck above the thresholds (from {basis})"]
    first = diagnosis.findings[0]
    lines = [f"verdict: {headline(first)} (from {basis})"]
    lines += [f"  evidence: {e.text}" for e in first.evidence[:2]]
    for fix in first.fixes[:TOP_FIXES]:
        gain = "" if fix.predicted_speedup is None else f" up to {fix.predicted_speedup:.2f}x"
        how = "applied by stepscope" if fix.auto else "a code change"
        lines.append(f"  fix: {fix.id}{gain} ({how}): {fix.title}")
    others = len(diagnosis.findings) - 1
    if others:
        plural = "s" * (others > 1)
        lines.append(f"  and {others} more finding{plural}: stepscope {more} {run_id}")
    if any(fix.auto for fix in first.fixes):
        lines.append(f"  next: stepscope optimize {run_id}  (measures the fixes on this job)")
    else:
        lines.append(f"  next: stepscope {more} {run_id}  (each finding, its evidence and fixes)")
    return lines


def headline(finding: Finding) -> str:
    share = "" if finding.share is None else f", {fmt_pct(finding.share, 0)} of step time"
    return (
        f"{finding.label} / {finding.subtype}: {finding.title}{share}, "
        f"confidence {finding.confidence:.2f}"
    )


def _say(line: str) -> None:
    sys.stderr.write(f"stepscope: {line}\n")
    sys.stderr.flush()
