"""The readings of the evidence that several diagnosis rules share.

Which number stands for the data wait, the GPU's utilisation or a kernel class's share
depends on the evidence a run has (trace > steps > stacks > samples); reading it in one
place keeps the rules of different classes from disagreeing about it.
"""

from __future__ import annotations

from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.thresholds import OPTIMIZER_MIN
from stepscope.analyzers.steps.stacks import LABELS
from stepscope.analyzers.steps.step_stats import describe_wait_outliers
from stepscope.analyzers.trace.kernels import cpu_op_classes
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


def model_phase(ev: Evidence) -> str | None:
    """Where the model's own work is: forward and backward in a training job, the forward
    alone in a job that never ran backward (inference, generation); None where the run
    cannot tell (a finding names only phases the job is known to have)."""
    backward = has_backward(ev)
    return None if backward is None else "forward+backward" if backward else "forward"


def has_backward(ev: Evidence) -> bool | None:
    """Did the job's steps run a backward? No for requests (generation), forward steps
    (``latency``: an inference run) and a job known to train nothing; yes where the
    measured phases show one (the trace's, the step timer's; stack samples can miss a
    short phase) or the job reported training; no where those phases show none; else
    unknown (None)."""
    if ev.generation is not None or (ev.steps or {}).get("latency") is not None:
        return False
    if ev.context.training is False:
        return False
    shares, source = step_phase_shares(ev)
    measured = shares if shares and source != "stack samples" else {}
    if measured.get("backward"):
        return True
    if ev.context.training is True:
        return True
    return False if "backward" in measured else None


def process_cpu(ev: Evidence, stat: str) -> tuple[float | None, str]:
    """The process tree's CPU % (``stat``: mean, p95) and how to say it: what it asked
    for (CPU it got plus time its threads waited for a core) where the sampler read the
    run-queue waits, else what it got. On a machine shared with other work a busy job
    gets less than it asks for; asking is what tells computing from waiting."""
    demand = ev.system.get(f"proc.cpu_demand_percent.{stat}")
    if demand is not None:
        return demand, "asked for"
    return ev.system.get(f"proc.cpu_percent.{stat}"), "used"


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


def step_phase_shares(ev: Evidence) -> tuple[dict[str, float] | None, str]:
    """The step's phases as shares of step time, from the best evidence that has them:
    the trace's annotations (``phases.py``), the step timer's hooks, the stack samples."""
    if ev.trace is not None and ev.trace.phase_shares:
        return dict(ev.trace.phase_shares), "trace phases"
    phases = (ev.steps or {}).get("phases")
    if phases:
        return {name: float(p["share"]) for name, p in phases.items()}, "step timer"
    if ev.stacks is not None:
        shares = ev.stacks["shares"]
        named = {"data_wait": "data_loading", "sync": "sync", "other": "elsewhere"}
        phases = {p: named.get(p, p) for p in ("data_wait", "forward", "backward", "optimizer")}
        phases |= {"sync": "sync", "other": "elsewhere"}
        return {p: float(shares[s]) for p, s in phases.items()}, "stack samples"
    return None, ""


#: Kernel classes that are the device's work (not copies, sets or communication): the
#: roofline splits their time between compute-bound and memory-bound.
WORK_KERNEL_CLASSES = ("gemm_conv", "elementwise", "reduction", "normalization")


def roofline_split(ev: Evidence) -> dict[str, float | str] | None:
    """Of the counted operators' time, the fraction in compute-bound and in memory-bound
    classes, by the roofline (FLOPs and bytes from shapes, against the device's roofs);
    None where the trace recorded no shapes or no peak is known (the names decide then).
    """
    roof = ev.trace.roofline if ev.trace is not None else None
    if roof is None or roof.basis != "shapes" or roof.peak is None or roof.classes.empty:
        return None
    classes = roof.classes.dropna(subset=["bound"])
    total = float(classes["time_ns"].sum())
    if total <= 0:
        return None
    compute = classes[classes["bound"] == "compute"]
    return {
        "compute": float(compute["time_ns"].sum()) / total,
        "memory": 1.0 - float(compute["time_ns"].sum()) / total,
        "compute_classes": ", ".join(compute["op_class"]) or "none",
        "memory_classes": ", ".join(classes.loc[classes["bound"] == "memory", "op_class"])
        or "none",
        "peak": roof.peak.name,
        "mfu": roof.mfu if roof.mfu is not None else float("nan"),
    }


def work_share(ev: Evidence) -> tuple[float, str]:
    """Share of the step the device's (or the CPU's) own work takes: the time a roofline
    splits into compute-bound and memory-bound."""
    if has_gpu_trace(ev):
        return kernel_time_share(ev, WORK_KERNEL_CLASSES)[0], "kernel"
    classes = cpu_classes(ev)
    fraction = classes["gemm_conv"]["fraction"] + classes["pointwise"]["fraction"]
    return fraction * float(ev.trace.breakdown.get("CPU Exec", 0)), "CPU op"


def basis_evidence(split: dict[str, float | str] | None, bound: str) -> EvidenceItem:
    """Which basis classified the time as compute or memory, said in the finding."""
    if split is None:
        return EvidenceItem.of(
            "basis: kernel/operator names (no recorded shapes or no known peak for a roofline)",
            None,
            "trace",
        )
    return EvidenceItem.of(
        f"basis: roofline (FLOPs and bytes from recorded shapes, {split['peak']} roofs): "
        f"{bound}-bound classes ({split[bound + '_classes']}) {pct(float(split[bound]))} of "
        "the counted operators' time",
        float(split[bound]),
        "trace roofline",
    )


def optimizer_finding_share(ev: Evidence) -> tuple[float, str]:
    """The optimizer step's share where it has its own finding (``optimizer_step``), else
    0: the compute and bandwidth rules leave it out of theirs, not to count it twice."""
    shares, source = step_phase_shares(ev)
    share = float((shares or {}).get("optimizer") or 0.0)
    return (share, source) if share >= OPTIMIZER_MIN else (0.0, source)


def stack_phases(ev: Evidence, phases: tuple[str, ...]) -> str:
    """The phases the samples saw, with their shares: a phase of none is left out (an
    inference job is not told of its backward)."""
    shares = ev.stacks["shares"]
    seen = [p for p in phases if shares[p] > 0] or list(phases[:1])
    return ", ".join(f"{LABELS[p]} {pct(shares[p])}" for p in seen)
