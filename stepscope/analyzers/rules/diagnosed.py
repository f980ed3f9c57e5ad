"""A diagnosis as the store keeps it: the ``Diagnosis`` type, its marker, reading it back.

Apart from ``diagnosis.py`` (the rules, the evidence, the trace's analysis), because
reading a saved diagnosis needs none of them: `stepscope show` prints a run's verdict
from its saved findings and marker, and importing the rules would load pandas and the
trace analyzers (about 0.5 s, most of what `show` took). Only a run that ended after it
was last diagnosed is diagnosed now, and only then are the rules imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepscope.types import Finding

if TYPE_CHECKING:
    from stepscope.analyzers.report.trace_report import TraceReport

__all__ = [
    "DIAGNOSED",
    "LEVEL_TEXT",
    "OOM_TITLE",
    "Diagnosis",
    "is_oom_finding",
    "saved_diagnosis",
]

# What a diagnosis at each level rests on, as the verdict and the Run page say it.
LEVEL_TEXT = {
    "trace": "a profiler trace and the steps",
    "steps": "the steps and system samples (no trace)",
    "stacks": "Python stacks and system samples",
    "samples": "system samples only",
}

DIAGNOSED = "diagnosed"  # the run config's key: when, at what level, why not (a reason)

# The title every out-of-memory finding starts with (``rules.memory`` builds them): with
# its key, what tells one read back from the store from a peak near the limit.
OOM_TITLE = "Memory capacity: the job ran out of"


@dataclass
class Diagnosis:
    level: str
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)
    # Why there is nothing to diagnose (a run whose job recorded no step); also in warnings.
    reason: str | None = None
    # Why the run's capture was left out (it covered no complete step); also in warnings.
    capture_note: str | None = None

    def __post_init__(self) -> None:
        for finding in self.findings:
            finding.level = self.level

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.findings]


def is_oom_finding(finding: Finding) -> bool:
    """The finding says the job ran out of memory (as built by ``rules.memory``, or read
    back from the store, where only its key and title tell it from a peak near the limit)."""
    return finding.key == "memory/capacity" and finding.title.startswith(OOM_TITLE)


def saved_diagnosis(
    store: Any, run_id: int, report: TraceReport | None = None, read_trace: bool = True
) -> Diagnosis | None:
    """The run's diagnosis as saved, made now where the run ended after it was last
    diagnosed (a job whose launcher was killed before its verdict, a run recorded before
    verdicts, one diagnosed while it ran); None for a running run never diagnosed.
    ``report``: the run's trace, where the caller has analysed it already; ``read_trace``
    False: the caller holds the trace back, so a diagnosis made now leaves it out and is
    not saved (the one with the trace is made once it is read)."""
    run = store.run(run_id)
    marker = (run.get("config") or {}).get(DIAGNOSED)
    ended = run.get("ended_at")
    if run["status"] != "running" and (marker is None or (ended and marker["at"] < ended)):
        # local: the rules and the trace analyzers (pandas), for a run diagnosed now only
        from stepscope.analyzers.rules import diagnosis

        whole = report is not None or read_trace
        return diagnosis.diagnose_run(
            store, run_id, report=report, save=whole, read_trace=read_trace
        )
    if marker is None:
        return None
    reason = marker.get("reason")
    return Diagnosis(
        marker.get("level") or "none",
        store.findings(run_id),
        reason=reason,
        capture_note=marker.get("capture"),
    )
