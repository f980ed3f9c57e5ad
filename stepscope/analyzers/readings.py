"""The readings of the evidence that several diagnosis rules share.

Which number stands for the data wait, the GPU's utilisation or a kernel class's share
depends on the evidence a run has (trace > steps > stacks > samples); reading it in one
place keeps the rules of different classes from disagreeing about it.
"""

from __future__ import annotations

from stepscope.analyzers.evidence import Evidence
from stepscope.analyzers.kernels import cpu_op_classes
from stepscope.analyzers.stacks import LABELS
from stepscope.analyzers.step_stats import describe_wait_outliers
from stepscope.types import EvidenceItem


def pct(x: float) -> str:
    """A share as the evidence says it: one decimal only below 10 %, where it matters."""
    return f"{100 * x:.0f} %" if x >= 0.1 else f"{100 * x:.1f} %"


def has_gpu_trace(ev: Evidence) -> bool:
    return ev.trace is not None and bool(ev.trace.summary.get("has_device"))


def gpu_util_trace(ev: Evidence) -> float | None:
    if not has_gpu_trace(ev) or ev.trace.gpu.empty:
        return None
    return float(ev.trace.gpu["gpu_utilization"].mean())


def gpu_util_samples(ev: Evidence) -> float | None:
    value = ev.system.get("gpu.util_percent.mean")
    return None if value is None else value / 100.0


def kernel_time_share(ev: Evidence, classes: tuple[str, ...]) -> tuple[float, float]:
    """(share of step time, fraction of kernel time) of the kernel classes."""
    kc = ev.trace.kernel_classes
    if kc.empty:
        return 0.0, 0.0
    rows = kc[kc["class"].isin(classes)]
    fraction = float(rows["share"].sum())
    return min(1.0, ev.per_step(float(rows["total_ns"].sum())) / ev.mean_step()), fraction


def cpu_classes(ev: Evidence) -> dict[str, dict[str, float]]:
    return cpu_op_classes(ev.trace.ops_top)


def data_wait(ev: Evidence) -> tuple[float | None, str]:
    if ev.steps and ev.steps.get("data_wait_share") is not None:
        return float(ev.steps["data_wait_share"]), "step timer"
    if ev.trace is not None:
        return float(ev.trace.breakdown.get("DataLoader", 0.0)), "trace breakdown"
    if ev.stacks is not None:
        return float(ev.stacks["shares"]["data_loading"]), "stack samples"
    return None, ""


def outlier_note(ev: Evidence, source: str) -> list[EvidenceItem]:
    """The waits the step timer's share left out as outliers, as evidence (or nothing).

    Said wherever that share decides a finding, so that a job whose one long pause was
    left out can see it was, and how long the other steps waited.
    """
    if source != "step timer" or not ev.steps:
        return []
    note = describe_wait_outliers(ev.steps)
    if note is None:
        return []
    raw = ev.steps.get("data_wait_share_raw")
    return [EvidenceItem.of(note, ev.steps["data_wait_outliers"]["max_s"], "step timer")] + (
        [EvidenceItem.of(f"with them the wait would be {pct(raw)} of step time", raw, "step timer")]
        if raw is not None
        else []
    )


def stack_phases(ev: Evidence, phases: tuple[str, ...]) -> str:
    shares = ev.stacks["shares"]
    return ", ".join(f"{LABELS[p]} {pct(shares[p])}" for p in phases)
