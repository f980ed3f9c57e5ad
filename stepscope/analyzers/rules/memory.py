"""Memory rules: bandwidth-bound kernels or operators, and device memory running out.

Each rule is a plain function ``Evidence -> Finding | None`` for one subtype of
the taxonomy (docs/architecture.md). Capacity has no share of step time: an out-of-memory error ranks
first through the finding's ``extra_cost``.
"""

from __future__ import annotations

from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import (
    basis_evidence,
    cpu_classes,
    has_gpu_trace,
    kernel_time_share,
    model_phase,
    optimizer_finding_share,
    pct,
    roofline_split,
    work_share,
)
from stepscope.analyzers.rules.thresholds import (
    CAPACITY_HIGH,
    FRAGMENTATION_RATIO,
    KERNEL_MIN,
    PRODUCTIVE_WEIGHT,
)
from stepscope.types import EvidenceItem, Finding


def memory_bandwidth(ev: Evidence) -> Finding | None:
    if ev.trace is None:
        return None
    if has_gpu_trace(ev):
        share, fraction = kernel_time_share(ev, ("elementwise", "reduction", "normalization"))
        source = "kernel"
    else:
        classes = cpu_classes(ev)
        fraction = classes["pointwise"]["fraction"]
        share = fraction * float(ev.trace.breakdown.get("CPU Exec", 0))
        source = "CPU op"
    evidence = [
        EvidenceItem.of(
            f"elementwise/normalisation/reduction {pct(share)} of step time ({pct(fraction)} of {source} time)",
            share,
            "trace",
        )
    ]
    split = roofline_split(ev)
    evidence.append(basis_evidence(split, "memory"))
    if split is not None:  # the roofline, not the names, says what is memory-bound
        share = work_share(ev)[0] * float(split["memory"])
    optimizer, phases = optimizer_finding_share(ev)
    if optimizer:
        # the optimizer step is elementwise work too: it has its own finding and fix
        share = max(0.0, share - optimizer)
        evidence.append(
            EvidenceItem.of(
                f"less the optimizer step ({pct(optimizer)}, its own finding): {pct(share)}",
                optimizer,
                phases,
            )
        )
    if share < KERNEL_MIN:
        return None
    gemm = (
        kernel_time_share(ev, ("gemm_conv",))[1]
        if source == "kernel"
        else cpu_classes(ev)["gemm_conv"]["fraction"]
    )
    evidence.append(EvidenceItem.of(f"GEMM/conv only {pct(gemm)} of {source} time", gemm, "trace"))
    return Finding(
        "memory",
        "bandwidth",
        "Memory bandwidth: unfused elementwise operations",
        share,
        0.8 if fraction >= 0.5 else 0.6,
        evidence,
        weight=PRODUCTIVE_WEIGHT,
        phase=model_phase(ev),
    )


def memory_capacity(ev: Evidence) -> Finding | None:
    error = str((ev.run or {}).get("error") or "")
    evidence: list[EvidenceItem] = []
    oom = "out of memory" in error.lower() or "OutOfMemoryError" in error
    if oom:
        evidence.append(EvidenceItem.of(f"the job failed: {error[:160]}", None, "run"))
    peak_share = None
    if ev.trace is not None and ev.trace.memory:
        for dev, m in ev.trace.memory.items():
            ps = m.get("peak_share")
            if ps is not None and (peak_share is None or ps > peak_share):
                peak_share = float(ps)
                reserved, allocated = (
                    m.get("peak_reserved_bytes") or 0,
                    m.get("peak_allocated_bytes") or 0,
                )
                if allocated and reserved / allocated >= FRAGMENTATION_RATIO:
                    evidence.append(
                        EvidenceItem.of(
                            f"{dev}: reserved {reserved / 2**30:.1f} GiB vs allocated {allocated / 2**30:.1f} GiB (fragmentation)",
                            reserved / allocated,
                            "trace",
                        )
                    )
    used, total = ev.system.get("gpu.mem_used_bytes.max"), ev.system.get("gpu.mem_total_bytes.max")
    if used and total:
        nvml_share = used / total
        if peak_share is None or nvml_share > peak_share:
            peak_share = nvml_share
            evidence.append(
                EvidenceItem.of(
                    f"GPU memory used up to {pct(nvml_share)} of the device", nvml_share, "NVML"
                )
            )
    elif peak_share is not None:
        evidence.append(
            EvidenceItem.of(
                f"peak allocated {pct(peak_share)} of device memory", peak_share, "trace"
            )
        )
    if not oom and (peak_share is None or peak_share < CAPACITY_HIGH):
        return None
    return Finding(
        "memory",
        "capacity",
        "Memory capacity: the job runs out of device memory"
        if oom
        else "Memory capacity: peak memory near the device's limit",
        None,
        0.95 if oom else 0.7,
        evidence,
        extra_cost=1.0 if oom else 0.0,
    )
