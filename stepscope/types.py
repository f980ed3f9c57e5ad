"""The plain types every layer shares: a finding, its evidence and fixes, the job's context.

They sit below everything else (no stepscope import) so that the store can return them,
the analyzers make them, the fixes read them and the CLI and dashboard show them, all
with the same fields instead of JSON dicts whose keys each reader spells for itself.
The store keeps them as JSON (``to_json``/``from_json``); nothing here imports torch or
pandas, because the bootstrap imports stepscope inside the user's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: The run config's key for the step a job died of an exception in (the step timer's
#: count at that moment, 0-based: 0 is before any step completed). Written by the
#: bootstrap's excepthook, read by the diagnosis: the one step of a job that died in its
#: first is the step cut short, and no share of step time can be read from it.
FAILED_IN_STEP = "failed_in_step"

#: The phases of a training step (``analyzers/steps/phases.py``, the step timer) as shown.
PHASE_LABELS = {
    "data_wait": "data wait",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "communication": "exposed communication",
    "sync": "host-device sync",
    "other": "other",
}


def phase_label(phase: str | None) -> str | None:
    """'forward+backward' -> 'forward and backward'; None stays None."""
    if phase is None:
        return None
    return " and ".join(PHASE_LABELS.get(p, p) for p in phase.split("+"))


class BottleneckClass(StrEnum):
    """The four bottleneck classes (docs/architecture.md). A StrEnum: it is stored and compared as its value."""

    IO = "io"
    COMPUTE = "compute"
    MEMORY = "memory"
    COMMUNICATION = "communication"

    @property
    def label(self) -> str:
        """The one name shown for the class, in the CLI and the dashboard alike."""
        return "I/O" if self is BottleneckClass.IO else self.value


def class_label(value: str) -> str:
    """``BottleneckClass(value).label``, or the value itself when it is not a class."""
    try:
        return BottleneckClass(value).label
    except ValueError:
        return str(value)


@dataclass(frozen=True)
class EvidenceItem:
    """One number a finding rests on, said in words, with where it was read."""

    text: str
    value: float | None
    source: str

    @classmethod
    def of(cls, text: str, value: float | None, source: str) -> EvidenceItem:
        """NaN is no reading; values are rounded to what a report can show."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return cls(text, None, source)
        return cls(text, round(float(value), 4), source)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "value": self.value, "source": self.source}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EvidenceItem:
        return cls(str(d.get("text", "")), d.get("value"), str(d.get("source", "")))


def gains_nothing(predicted_speedup: float | None) -> bool:
    """A bound of 1.00x or less (as shown, two decimals): the diagnosis expects nothing
    from the fix on its own."""
    return predicted_speedup is not None and round(predicted_speedup, 2) <= 1.0


@dataclass
class FixAdvice:
    """A fix recommended for one finding, with its predicted gain for this run."""

    id: str
    title: str
    why: str
    predicted_speedup: float | None
    basis: str
    auto: bool
    changes_numerics: bool
    needs_consent: bool
    snippet: str
    typical: tuple[float, float] | None = None
    typical_source: str | None = None
    unverified_requirements: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # values to try (the plan's start)
    evidence: str | None = None  # why those values
    finding: str | None = None  # 'class/subtype' that recommended it, over a run's findings

    @property
    def gains_nothing(self) -> bool:
        """Predicted at 1.00x or less: listed after the fixes that may help and never
        pre-ticked (issue 39: a "≤ 1.00x" fix listed first, ticked)."""
        return gains_nothing(self.predicted_speedup)

    def order_key(self) -> tuple[bool, float]:
        """Best first: the largest predicted bound, then fixes with no bound (measure
        them), then those predicted to gain nothing."""
        return self.gains_nothing, -(self.predicted_speedup or 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "why": self.why,
            "predicted_speedup": self.predicted_speedup,
            "basis": self.basis,
            "typical": None if self.typical is None else list(self.typical),
            "typical_source": self.typical_source,
            "auto": self.auto,
            "changes_numerics": self.changes_numerics,
            "needs_consent": self.needs_consent,
            "unverified_requirements": list(self.unverified_requirements),
            "snippet": self.snippet,
            "params": dict(self.params),
            "evidence": self.evidence,
            "finding": self.finding,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FixAdvice:
        typical = d.get("typical")
        return cls(
            id=str(d["id"]),
            title=str(d.get("title", d["id"])),
            why=str(d.get("why", "")),
            predicted_speedup=d.get("predicted_speedup"),
            basis=str(d.get("basis") or ""),
            auto=bool(d.get("auto")),
            changes_numerics=bool(d.get("changes_numerics")),
            needs_consent=bool(d.get("needs_consent")),
            snippet=str(d.get("snippet") or ""),
            typical=None if not typical else (float(typical[0]), float(typical[1])),
            typical_source=d.get("typical_source"),
            unverified_requirements=list(d.get("unverified_requirements") or []),
            params=dict(d.get("params") or {}),
            evidence=d.get("evidence"),
            finding=d.get("finding"),
        )


@dataclass(frozen=True)
class SkippedFix:
    """A fix of the finding's area that was not recommended, and why."""

    id: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "reason": self.reason}


@dataclass
class Finding:
    """One bottleneck of a run: its class and subtype, what it costs, and how sure we are.

    ``share`` is of step time (0..1); ``weight`` the part of it a fix can give back
    (waiting can go entirely, useful kernel work only in part), so ``cost`` orders the
    findings. ``level`` is the evidence the diagnosis had ('trace', 'steps', ...).
    """

    klass: BottleneckClass
    subtype: str
    title: str
    share: float | None
    confidence: float
    evidence: list[EvidenceItem]
    weight: float = 1.0
    fixes: list[FixAdvice] = field(default_factory=list)
    skipped: list[SkippedFix] = field(default_factory=list)
    extra_cost: float = 0.0  # findings without a time share that still rank (an OOM)
    level: str | None = None
    # The phase of the step it lives in ('data_wait', 'forward', 'backward', 'optimizer',
    # 'communication', 'sync', or 'forward+backward'); None where no phase owns it (capacity).
    phase: str | None = None

    def __post_init__(self) -> None:
        self.klass = BottleneckClass(self.klass)

    @property
    def key(self) -> str:
        """'class/subtype': how the fixes name what they address."""
        return f"{self.klass.value}/{self.subtype}"

    @property
    def label(self) -> str:
        return self.klass.label

    @property
    def cost(self) -> float:
        return (self.share or 0.0) * self.weight + self.extra_cost

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.klass.value,
            "subtype": self.subtype,
            "title": self.title,
            "share": None if self.share is None else round(self.share, 4),
            "cost": round(self.cost, 4),
            "confidence": round(self.confidence, 2),
            "level": self.level,
            "phase": self.phase,
            "evidence": [e.to_json() for e in self.evidence],
            "fixes": [f.to_json() for f in self.fixes],
            "skipped_fixes": [s.to_json() for s in self.skipped],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finding:
        """From ``to_json`` or a row of the store's findings table."""
        share = d.get("share")
        cost = d.get("cost")
        weight = 1.0 if not share or cost is None else float(cost) / float(share)
        return cls(
            klass=BottleneckClass(d["class"]),
            subtype=str(d["subtype"]),
            title=str(d["title"]),
            share=None if share is None else float(share),
            confidence=float(d.get("confidence") or 0.0),
            evidence=[EvidenceItem.from_json(e) for e in d.get("evidence") or []],
            weight=weight,
            fixes=[FixAdvice.from_json(f) for f in d.get("fixes") or []],
            skipped=[
                SkippedFix(str(s["id"]), str(s["reason"])) for s in d.get("skipped_fixes") or []
            ],
            level=d.get("level"),
            phase=d.get("phase"),
        )


@dataclass
class JobContext:
    """What the run is known to have; None = unknown."""

    cuda: bool | None = None
    vendor: str | None = None  # 'nvidia' | 'amd' | None
    capability: float | None = None  # CUDA compute capability, e.g. 8.0
    device_name: str | None = None
    training: bool | None = None
    dataloader: bool | None = None
    conv2d: bool | None = None
    ddp: bool | None = None
    dataparallel: bool | None = None
    cpu_count: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # runs.facts as recorded

    @property
    def loaders(self) -> list[dict[str, Any]]:
        return list(self.facts.get("dataloaders") or [])

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.facts.get("model") or {})

    @property
    def optimizer(self) -> dict[str, Any]:
        return dict(self.facts.get("optimizer") or {})

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.facts.get("settings") or {})


__all__ = [
    "PHASE_LABELS",
    "phase_label",
    "BottleneckClass",
    "JobContext",
    "EvidenceItem",
    "Finding",
    "FixAdvice",
    "SkippedFix",
    "class_label",
]
