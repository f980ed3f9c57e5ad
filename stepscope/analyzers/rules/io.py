"""I/O rules: the loop waits for its data (input pipeline, storage, an idle process).

Each rule is a plain function ``Evidence -> Finding | None`` for one subtype of
the taxonomy (docs/architecture.md); the waiting process is ``io/input_pipeline`` too, read from the
system samples alone when a job has nothing else.
"""

from __future__ import annotations

from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import (
    data_wait,
    gpu_util_samples,
    gpu_util_trace,
    has_gpu_trace,
    outlier_note,
    pct,
    process_cpu,
)
from stepscope.analyzers.rules.thresholds import (
    INPUT_HIGH,
    INPUT_MIN,
    IOWAIT_HIGH,
    WAITING_CPU_PERCENT,
)
from stepscope.types import EvidenceItem, Finding


def input_pipeline(ev: Evidence) -> Finding | None:
    share, source = data_wait(ev)
    if share is None or share < INPUT_MIN:
        return None
    text = (
        f"main thread in data loading {pct(share)} of the samples"
        if source == "stack samples"
        else f"DataLoader wait {pct(share)} of step time"
    )
    evidence = [EvidenceItem.of(text, share, source), *outlier_note(ev, source)]
    if ev.trace is not None and source != "trace breakdown":
        dl = float(ev.trace.breakdown.get("DataLoader", 0.0))
        evidence.append(
            EvidenceItem.of(f"DataLoader {pct(dl)} of the profiled steps", dl, "trace breakdown")
        )
    util = gpu_util_trace(ev) if has_gpu_trace(ev) else gpu_util_samples(ev)
    if util is not None:
        evidence.append(
            EvidenceItem.of(
                f"GPU idle {pct(1 - util)}", 1 - util, "trace" if has_gpu_trace(ev) else "NVML"
            )
        )
    loaders = ev.context.loaders
    if loaders:
        workers = [ld.get("num_workers", 0) for ld in loaders]
        evidence.append(
            EvidenceItem.of(f"DataLoader num_workers={workers[0]}", workers[0], "job settings")
        )
    busiest = ev.system.get("proc.cpu_max_process_percent.mean")
    if busiest is not None and ev.system.get("proc.children.mean", 0) >= 1:
        evidence.append(
            EvidenceItem.of(f"busiest process (workers) at {busiest:.0f} % CPU", busiest, "psutil")
        )
    confidence = 0.9 if share >= INPUT_HIGH else 0.6
    label = "highly" if share >= INPUT_HIGH else "moderately"
    return Finding(
        "io",
        "input_pipeline",
        f"Input pipeline: the loop waits for data ({label} input-bound)",
        share,
        confidence,
        evidence,
        phase="data_wait",
    )


def storage(ev: Evidence) -> Finding | None:
    iowait = ev.system.get("system.iowait_percent.mean")
    if iowait is None or iowait < IOWAIT_HIGH:
        return None
    share, source = data_wait(ev)
    if share is not None and share < INPUT_MIN:
        return None  # the disk is busy, but not for this job's loop
    evidence = [EvidenceItem.of(f"CPU iowait {iowait:.0f} % on average", iowait / 100, "psutil")]
    read = ev.system.get("system.disk_read_bytes_per_s.mean")
    if read is not None:
        evidence.append(EvidenceItem.of(f"disk reads {read / 2**20:.1f} MiB/s", read, "psutil"))
    if share is not None:
        evidence.append(EvidenceItem.of(f"data wait {pct(share)} of step time", share, source))
        evidence.extend(outlier_note(ev, source))
    return Finding(
        "io",
        "storage",
        "Storage: reading the data waits on the disk",
        share if share is not None else iowait / 100,
        0.6,
        evidence,
        phase="data_wait",
    )


def waiting_process(ev: Evidence) -> Finding | None:
    """Samples only, no GPU: a process that barely uses the CPU is waiting on input."""
    if ev.level != "samples" or gpu_util_samples(ev) is not None:
        return None
    cpu, verb = process_cpu(ev, "mean")
    if cpu is None or cpu >= WAITING_CPU_PERCENT:
        return None
    evidence = [
        EvidenceItem.of(
            f"process tree {verb} {cpu:.0f} % CPU on average (less than a core) with no GPU",
            cpu,
            "psutil",
        )
    ]
    return Finding(
        "io",
        "input_pipeline",
        "Waiting: the process is mostly idle (input or I/O latency)",
        1 - cpu / 100,
        0.35,
        evidence,
    )
