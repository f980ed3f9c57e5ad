"""Memory rules: bandwidth-bound kernels or operators, and device memory running out.

Each rule is a plain function ``Evidence -> Finding | None`` for one subtype of
the taxonomy (docs/architecture.md). Capacity has no share of step time: an out-of-memory error ranks
first through the finding's ``extra_cost`` (``OOM_COST``), its evidence read from the OOM
record the job wrote where it ran out (``collectors/injob/oom_record.py``): the bytes
asked, the bytes in use, the limit, the step and the user's line that asked. On CUDA,
where the allocator's snapshot was dumped at the error, one more line says why the
request failed (``analyzers/trace/allocator_snapshot.py``): it fitted in the free total
but in no free block (fragmentation, which expandable segments answer), or the memory
was full, with the job's lines holding most of it.
"""

from __future__ import annotations

from typing import Any

from stepscope.analyzers.rules.diagnosed import OOM_TITLE
from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.memory_state import model_state_evidence
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
from stepscope.errors import is_out_of_memory
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
    run = ev.run or {}
    error = str(run.get("error") or "")
    records = oom_records(run)
    evidence: list[EvidenceItem] = []
    oom = bool(records) or is_out_of_memory(error)
    if oom:
        evidence += oom_evidence(records[0] if records else {}, error)
        evidence += snapshot_evidence(ev)
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
    where = "device" if records and records[0].get("cuda_total_bytes") else "process"
    if not records and "cuda" in error.lower():
        where = "device"
    return Finding(
        "memory",
        "capacity",
        f"{OOM_TITLE} {where} memory"
        if oom
        else "Memory capacity: peak memory near the device's limit",
        None,
        0.95 if oom else 0.7,
        evidence,
        extra_cost=OOM_COST if oom else 0.0,
    )


# An out-of-memory error outranks every finding with a share of step time (shares add up
# to about 1): a job that does not run has no step time worth speeding up.
OOM_COST = 10.0


def oom_records(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's out-of-memory records (``collectors/injob/oom_record.py``), first first."""
    records = (run.get("config") or {}).get("oom") or []
    return [r for r in records if isinstance(r, dict)]


def oom_before_first_step(run: dict[str, Any]) -> bool:
    """The job ran out of memory before it completed a step: its one recorded step, if
    any, is the step it died in, and no share of step time can be read from it."""
    records = oom_records(run)
    return bool(records) and records[0].get("step") in (0, None)


def oom_evidence(record: dict[str, Any], error: str) -> list[EvidenceItem]:
    """What ran out, by how much, where: one line each, from the OOM record."""
    items = [EvidenceItem.of(f"the job failed: {error[:160]}", None, "run")]
    asked = record.get("bytes_asked")
    if asked:
        items.append(
            EvidenceItem.of(f"the failing allocation asked for {_size(asked)}", asked, "oom")
        )
    total = record.get("cuda_total_bytes")
    if total:
        allocated, reserved = record.get("cuda_allocated_bytes"), record.get("cuda_reserved_bytes")
        items.append(
            EvidenceItem.of(
                f"in use then: {_size(allocated)} allocated, {_size(reserved)} reserved "
                f"of the device's {_size(total)}",
                allocated,
                "oom",
            )
        )
    elif record.get("rss_bytes") is not None:
        space = record.get("address_space_bytes")
        mapped = f" ({_size(space)} of address space mapped)" if space else ""
        items.append(
            EvidenceItem.of(
                f"in use then: {_size(record['rss_bytes'])} resident{mapped}",
                record["rss_bytes"],
                "oom",
            )
        )
    limit = record.get("limit_bytes")
    if limit:
        items.append(
            EvidenceItem.of(
                f"the limit: {_size(limit)} of address space (RLIMIT_AS, --memory-limit)",
                limit,
                "oom",
            )
        )
    step = record.get("step")
    if step is not None:
        done = "before any step completed" if step == 0 else f"after {step} completed steps"
        items.append(EvidenceItem.of(f"in step {step}, {done}", step, "oom"))
    if record.get("source"):
        items.append(EvidenceItem.of(f"asked by {record['source']}", None, "oom"))
    return items + model_state_evidence(record)


def snapshot_evidence(ev: Evidence) -> list[EvidenceItem]:
    """Why the request failed, from the allocator snapshot dumped at the error; or why
    that snapshot was not read."""
    if ev.allocator_problem:
        text = f"the allocator snapshot was not read: {ev.allocator_problem}"
        return [EvidenceItem.of(text, None, "snapshot")]
    snapshot = ev.allocator
    explanation = None if snapshot is None else snapshot.explanation()
    if snapshot is None or explanation is None:
        return []
    value = snapshot.largest_free_block_bytes if snapshot.fragmented else snapshot.free_total_bytes
    return [EvidenceItem.of(f"the allocator snapshot: {explanation}", value, "snapshot")]


def _size(n: Any) -> str:
    """``192.0 MiB (201326592 bytes)``: torch's units, and the exact count to grep for."""
    if n is None:
        return "unknown"
    n = int(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"
