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

from stepscope.analyzers.rules.diagnosed import LEVEL_TEXT, Diagnosis, is_oom_finding
from stepscope.app.formats import fmt_pct
from stepscope.errors import is_out_of_memory, one_line_error
from stepscope.store import RunStore
from stepscope.types import Finding

TOP_FIXES = 3
OOM_EVIDENCE = 9  # every line of an out-of-memory finding: what, how much, limit, where,
# what held it and what would free it


def print_verdict(run_id: int, home: Any = None) -> None:
    """Diagnose the ended run, save its findings, print the verdict (never raises)."""
    try:
        # local: the rules and the trace analyzers (pandas); `show` imports this module
        # for verdict_lines and diagnoses nothing it has saved
        from stepscope.analyzers.rules.diagnosis import diagnose_run

        with RunStore(home) as store:
            if store.run(run_id)["status"] == "running":
                return  # one node of a multi-node run: the last one to end answers
            run = store.run(run_id)
            if store.step_count(run_id)[0] == 0 and not ran_out_of_memory(run):
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
    first = diagnosis.findings[0] if diagnosis.findings else None
    if first is not None and is_oom_finding(first):
        return oom_lines(run_id, diagnosis, more)
    if diagnosis.reason:
        return [f"no verdict: {diagnosis.reason}"]
    basis = LEVEL_TEXT.get(diagnosis.level, diagnosis.level)
    if first is None:
        return [f"verdict: no bottleneck above the thresholds (from {basis})"]
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


def oom_lines(run_id: int, diagnosis: Diagnosis, more: str = "show") -> list[str]:
    """The verdict of a job that ran out of memory: what ran out, by how much, where, and
    the fixes that free memory (those that address memory/capacity), never a speed-up."""
    first = diagnosis.findings[0]
    lines = [f"verdict: out of memory. {first.title}"]
    evidence = first.evidence
    if any(e.source == "oom" for e in evidence):  # the job's traceback said the error above
        evidence = [e for e in evidence if e.source != "run"]
    lines += [f"  {e.text}" for e in evidence[:OOM_EVIDENCE]]
    for fix in first.fixes[:TOP_FIXES]:
        how = "applied by stepscope" if fix.auto else "a code change"
        lines.append(f"  frees memory: {fix.id} ({how}): {fix.title}")
    if not first.fixes:
        lines.append(
            "  frees memory: a smaller batch (with gradient accumulation to keep its size), "
            "shorter sequences, fewer saved activations"
        )
    lines.append(f"  next: stepscope {more} {run_id}  (every finding, its evidence and fixes)")
    return lines


def ran_out_of_memory(run: dict[str, Any]) -> bool:
    """The run's job died of an out-of-memory error (its record, or its error line)."""
    return bool((run.get("config") or {}).get("oom")) or is_out_of_memory(run.get("error"))


def headline(finding: Finding) -> str:
    share = "" if finding.share is None else f", {fmt_pct(finding.share, 0)} of step time"
    return (
        f"{finding.label} / {finding.subtype}: {finding.title}{share}, "
        f"confidence {finding.confidence:.2f}"
    )


def _say(line: str) -> None:
    sys.stderr.write(f"stepscope: {line}\n")
    sys.stderr.flush()
