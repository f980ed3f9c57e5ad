"""Compute rules: the step is the host's overhead or the device's (or CPU's) own work.

Each rule is a plain function ``Evidence -> Finding | None`` for one subtype of
the taxonomy (docs/architecture.md). Without a trace, device compute is the step time that is not
data wait, read from the step timer, the stacks or the samples, and says so.
"""

from __future__ import annotations

import math

from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import (
    basis_evidence,
    cpu_classes,
    data_wait,
    gpu_util_samples,
    gpu_util_trace,
    has_gpu_trace,
    kernel_time_share,
    model_phase,
    optimizer_finding_share,
    outlier_note,
    pct,
    process_cpu,
    roofline_split,
    stack_phases,
    step_phase_shares,
    work_share,
)
from stepscope.analyzers.rules.thresholds import (
    COMPUTING_CPU_PERCENT,
    GPU_UTIL_BUSY,
    GPU_UTIL_LOW,
    HOST_MIN,
    INPUT_HIGH,
    KERNEL_MIN,
    OPTIMIZER_MIN,
    PRODUCTIVE_WEIGHT,
    TENSOR_CORE_MIN,
)
from stepscope.types import EvidenceItem, Finding, phase_label

MODEL_PHASES = ("forward", "backward", "optimizer")  # stack phases that are the model's work
# Most of an unfused optimizer step can go (a fused step, ``fixes/catalog/fused_optimizer.py``):
# its cost is nearly its share, unlike GEMM time (PRODUCTIVE_WEIGHT).
REMOVABLE_OPTIMIZER_WEIGHT = 0.9


def host_overhead(ev: Evidence) -> Finding | None:
    if has_gpu_trace(ev):
        util = gpu_util_trace(ev)
        if util is None or util >= GPU_UTIL_LOW:
            return None
        b = ev.trace.breakdown
        share = float(b.get("CPU Exec", 0) + b.get("Runtime", 0) + b.get("Other", 0))
        if share < HOST_MIN:
            return None
        kc = ev.trace.kernel_classes
        count = float(kc["count"].sum()) if not kc.empty else 0.0
        total = float(kc["total_ns"].sum()) if not kc.empty else 0.0
        evidence = [
            EvidenceItem.of(f"GPU busy only {pct(util)} of the step", util, "trace"),
            EvidenceItem.of(
                f"host-side time with the GPU idle {pct(share)}", share, "trace breakdown"
            ),
            EvidenceItem.of(
                f"kernel launches (runtime) {pct(float(b.get('Runtime', 0)))}",
                float(b.get("Runtime", 0)),
                "trace breakdown",
            ),
        ]
        if count:
            evidence.append(
                EvidenceItem.of(
                    f"{ev.per_step(count):,.0f} kernels per step, mean {total / count / 1e3:.1f} µs",
                    total / count / 1e3,
                    "trace",
                )
            )
        return Finding(
            "compute",
            "host_overhead",
            "Host overhead: the GPU waits for the CPU",
            share,
            0.8,
            evidence,
        )
    if ev.trace is not None:  # CPU-only trace: framework time and Python between ops
        classes = cpu_classes(ev)
        b = ev.trace.breakdown
        cpu_exec = float(b.get("CPU Exec", 0))
        other = float(b.get("Other", 0))
        share = other + classes["framework"]["fraction"] * cpu_exec
        if share < HOST_MIN:
            return None
        steps = max(1, int(ev.trace.summary["steps"]))
        n_ops = sum(v["count"] for v in classes.values())
        self_ns = sum(v["self_ns"] for v in classes.values())
        evidence = [
            EvidenceItem.of(
                f"framework ops (views, dispatch, autograd) {pct(classes['framework']['fraction'])} of op time",
                classes["framework"]["fraction"],
                "trace",
            ),
            EvidenceItem.of(
                f"Python between ops {pct(other)} of the step", other, "trace breakdown"
            ),
            EvidenceItem.of(
                f"{n_ops / steps:,.0f} operators per step, mean self time {self_ns / max(n_ops, 1) / 1e3:.1f} µs",
                self_ns / max(n_ops, 1) / 1e3,
                "trace",
            ),
        ]
        return Finding(
            "compute", "host_overhead", "Host overhead: many tiny operators", share, 0.75, evidence
        )
    util = gpu_util_samples(ev)
    thread = ev.system.get("proc.cpu_max_thread_percent.mean")
    if util is not None and util < GPU_UTIL_LOW and thread is not None and thread >= 90:
        data, _ = data_wait(ev)
        if data is not None and data >= INPUT_HIGH:
            return None  # the input rule explains the idle GPU
        share = 1 - util - (data or 0.0)
        evidence = [
            EvidenceItem.of(f"GPU utilisation {pct(util)} (NVML)", util, "NVML"),
            EvidenceItem.of(f"busiest thread at {thread:.0f} % of a core", thread, "psutil"),
        ]
        return Finding(
            "compute",
            "host_overhead",
            "Host overhead: one CPU thread feeds an idle GPU",
            share,
            0.5,
            evidence,
        )
    return None


def device_compute(ev: Evidence) -> Finding | None:
    split = roofline_split(ev)
    if has_gpu_trace(ev):
        share, fraction = kernel_time_share(ev, ("gemm_conv",))
        evidence = [
            EvidenceItem.of(
                f"GEMM/conv kernels {pct(share)} of step time ({pct(fraction)} of kernel time)",
                share,
                "trace",
            )
        ]
        if split is not None:
            share = work_share(ev)[0] * float(split["compute"])
            evidence += _roofline_evidence(split)
        if share < KERNEL_MIN:
            return None
        util = gpu_util_trace(ev) or 0.0
        evidence.append(EvidenceItem.of(f"GPU busy {pct(util)} of the step", util, "trace"))
        title = "Device compute: GEMM/convolution kernels"
        tc = (
            ev.trace.gpu["tensor_core_share_modern"].mean()
            if "tensor_core_share_modern" in ev.trace.gpu
            else None
        )
        cap = ev.context.capability
        if tc is not None and not math.isnan(tc):
            evidence.append(
                EvidenceItem.of(
                    f"Tensor Core kernels {pct(float(tc))} of kernel time", float(tc), "trace"
                )
            )
            if tc < TENSOR_CORE_MIN and (cap is None or cap >= 7.0) and ev.context.vendor != "amd":
                title = "Device compute: GEMM/conv without Tensor Cores"
        return Finding(
            "compute",
            "device_compute",
            title,
            share,
            0.8 if util >= GPU_UTIL_BUSY else 0.65,
            evidence,
            weight=PRODUCTIVE_WEIGHT,
            phase=model_phase(ev),
        )
    if ev.trace is not None:
        classes = cpu_classes(ev)
        cpu_exec = float(ev.trace.breakdown.get("CPU Exec", 0))
        share = classes["gemm_conv"]["fraction"] * cpu_exec
        evidence = [
            EvidenceItem.of(
                f"matmul/conv operators {pct(classes['gemm_conv']['fraction'])} of CPU op time",
                classes["gemm_conv"]["fraction"],
                "trace",
            ),
            EvidenceItem.of(
                f"CPU operators running {pct(cpu_exec)} of the step", cpu_exec, "trace breakdown"
            ),
        ]
        if split is not None:
            share = work_share(ev)[0] * float(split["compute"])
            evidence += _roofline_evidence(split)
        if share < KERNEL_MIN:
            return None
        return Finding(
            "compute",
            "device_compute",
            "CPU compute: matmul/convolution operators",
            share,
            0.8,
            evidence,
            weight=PRODUCTIVE_WEIGHT,
            phase=model_phase(ev),
        )
    # No trace: the step time that is not data wait is compute of some kind.
    data, _ = data_wait(ev)
    util = gpu_util_samples(ev)
    evidence = []
    if ev.steps is not None and data is not None:
        share = 1.0 - data
        evidence.append(
            EvidenceItem.of(f"not waiting for data {pct(share)} of step time", share, "step timer")
        )
        evidence.extend(outlier_note(ev, "step timer"))
        optimizer, source = optimizer_finding_share(ev)
        if optimizer:
            share -= optimizer
            evidence.append(
                EvidenceItem.of(
                    f"less the optimizer step ({pct(optimizer)}, its own finding)",
                    optimizer,
                    source,
                )
            )
        confidence = 0.45
    elif ev.stacks is not None:
        share = sum(ev.stacks["shares"][p] for p in MODEL_PHASES)
        phases = stack_phases(ev, MODEL_PHASES)
        evidence.append(
            EvidenceItem.of(f"main thread in the model: {phases}", share, "stack samples")
        )
        confidence = 0.6
        if ev.stacks.get("ddp"):
            evidence.append(
                EvidenceItem.of(
                    "DDP: its gradient all-reduce runs inside backward, in C++, where Python "
                    "stacks cannot tell it from compute; capture a trace to split them",
                    None,
                    "stack samples",
                )
            )
            confidence = 0.4
    else:
        cores = ev.context.cpu_count or 1
        cpu, verb = process_cpu(ev, "p95")
        if util is not None and util >= GPU_UTIL_BUSY:
            share, confidence = util, 0.5
        elif util is None and cpu is not None and cpu >= COMPUTING_CPU_PERCENT:
            mean, _ = process_cpu(ev, "mean")
            share, confidence = min(1.0, (mean or 0.0) / 100), 0.4
            evidence.append(
                EvidenceItem.of(
                    f"process tree {verb} {cpu:.0f} % CPU (95th percentile, {cores} cores)",
                    cpu,
                    "psutil",
                )
            )
        else:
            return None
    if share < KERNEL_MIN:
        return None
    if util is not None:
        evidence.append(EvidenceItem.of(f"GPU utilisation {pct(util)} (NVML)", util, "NVML"))
        confidence = 0.6 if util >= GPU_UTIL_BUSY else confidence
    evidence.append(
        EvidenceItem.of(
            "no profiler trace: capture one to split compute, memory bandwidth and host overhead",
            None,
            "stepscope",
        )
    )
    where = "GPU" if util is not None else "CPU" if ev.context.cuda is False else "device"
    return Finding(
        "compute",
        "device_compute",
        f"Compute ({where}): the rest of the step",
        share,
        confidence,
        evidence,
        weight=PRODUCTIVE_WEIGHT,
        phase=model_phase(ev),
    )


def _roofline_evidence(split: dict[str, float | str]) -> list[EvidenceItem]:
    items = [basis_evidence(split, "compute")]
    mfu = float(split["mfu"])
    if mfu == mfu:  # not NaN
        items.append(EvidenceItem.of(f"MFU {pct(mfu)} of {split['peak']}", mfu, "trace roofline"))
    return items


def optimizer_step(ev: Evidence) -> Finding | None:
    """The optimizer step's own phase: a per-parameter loop over many tensors.

    Its elementwise ops also show up as memory-bandwidth or host-overhead time; this
    finding names the phase and the fix for it (a fused step), and ``memory_bandwidth``
    leaves the optimizer's share out of its own.
    """
    shares, source = step_phase_shares(ev)
    share = (shares or {}).get("optimizer")
    if share is None or share < OPTIMIZER_MIN:
        return None
    evidence = [EvidenceItem.of(f"optimizer step {pct(share)} of the step", share, source)]
    parts = [p for p in ("forward", "backward") if shares.get(p)]  # only phases it has
    if parts:
        model = sum(float(shares[p]) for p in parts)
        together = " together" if len(parts) > 1 else ""
        text = f"{phase_label('+'.join(parts))}{together} {pct(model)}"
        evidence.append(EvidenceItem.of(text, model, source))
    opt = ev.context.optimizer
    if opt.get("class"):
        how = "fused" if opt.get("fused") else "foreach" if opt.get("foreach") else "default"
        tensors = opt.get("param_tensors")
        text = f"{opt['class']} ({how} implementation)" + (
            f" over {tensors:,} parameter tensors" if tensors else ""
        )
        evidence.append(EvidenceItem.of(text, tensors, "job facts"))
    confidence = 0.85 if source == "trace phases" else 0.7 if source == "step timer" else 0.55
    return Finding(
        "compute",
        "optimizer_step",
        "Optimizer step: a large share of every step",
        share,
        confidence,
        evidence,
        weight=REMOVABLE_OPTIMIZER_WEIGHT,
        phase="optimizer",
    )
