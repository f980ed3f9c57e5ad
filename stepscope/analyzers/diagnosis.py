"""Bottleneck classification: evidence in, findings out, most costly first.

Each rule is a plain function ``Evidence -> Finding | None`` for one subtype of
DESIGN.md's taxonomy; it uses the strongest evidence the run has (trace > steps >
stacks > samples) and says which numbers it used. Thresholds are named constants with the
rule they come from; they were checked on the examples in ``examples/`` and the real
traces in ``../shared/traces`` (see tests/test_diagnosis.py).

Ordering: a finding's *cost* is the share of step time it could give back. Waiting
(data, communication, syncs, host overhead) can be removed entirely, so its cost is
its share; GEMM/conv and memory-bound kernel time is the useful work itself, which the
known fixes speed up by at most ~2x (mixed precision's upper end), so its cost is half
its share. This is why a ResNet whose step is 36 % GEMM and 33 % data wait is
input-bound first: the data wait is what can go.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope.analyzers.evidence import Evidence, from_trace, gather
from stepscope.analyzers.kernels import cpu_op_classes
from stepscope.analyzers.recommend import recommend
from stepscope.analyzers.stacks import LABELS
from stepscope.analyzers.step_stats import describe_wait_outliers
from stepscope.analyzers.trace_report import TraceReport
from stepscope.types import EvidenceItem, Finding

# -- thresholds ----------------------------------------------------------------------
# I/O: torch-tb-profiler flags DataLoader > 5 % of the step; XProf calls a job
# "moderately input-bound" from 5 % and "highly input-bound" from 20 %.
INPUT_MIN = 0.05
INPUT_HIGH = 0.20
# Storage: sustained iowait above 10 % of CPU time is the usual iostat/sar sign of a
# disk-bound reader (Brendan Gregg's USE method treats it as disk saturation).
IOWAIT_HIGH = 10.0  # percent
# GPU utilisation below 50 % is torch-tb-profiler's "low GPU utilisation" rule.
GPU_UTIL_LOW = 0.50
GPU_UTIL_BUSY = 0.80
# Host overhead worth a finding: 10 % of the step (the smallest share a launch-bound
# trace shows in Nsight Systems' "GPU starvation" analysis is of this order).
HOST_MIN = 0.10
# Compute and memory-bandwidth findings: their kernels (or CPU ops) take >= 10 % of
# the step. Below that, speeding them up cannot matter.
KERNEL_MIN = 0.10
# Productive work can be sped up at most ~2x by the catalog's fixes: cost = share / 2.
PRODUCTIVE_WEIGHT = 0.5
# Tensor Cores: tb-profiler flags GEMM/conv-heavy runs whose kernels use 0 % Tensor
# Cores; we use < 5 % of kernel time, on kernels from Volta (sm70) on.
TENSOR_CORE_MIN = 0.05
# Communication: tb-profiler flags > 10 %; from 5 % it is reported with less confidence.
COMM_MIN = 0.05
COMM_HIGH = 0.10
# Host-device copies and syncs: 5 % of the step.
HOST_DEVICE_MIN = 0.05
# Capacity: tb-profiler warns at peak memory > 90 % of the device; fragmentation when
# reserved is 1.5x allocated (PyTorch's memory docs on caching-allocator fragmentation).
CAPACITY_HIGH = 0.90
FRAGMENTATION_RATIO = 1.5
# Samples only: a CPU job whose process tree uses less than half a core on average
# is waiting, not computing; one that keeps a core 80 % busy (95th percentile, so
# that the start-up of an attached job does not hide it) is computing.
WAITING_CPU_PERCENT = 50.0
COMPUTING_CPU_PERCENT = 80.0

MODEL_PHASES = ("forward", "backward", "optimizer")  # stack phases that are the model's work
LEVEL_CONFIDENCE = {"trace": 1.0, "steps": 0.85, "stacks": 0.75, "samples": 0.6, "none": 0.3}
# Shares read from fewer timed steps than this are one step's accident (a torchrun job
# that stepped once was "highly input-bound" from a single 12 ms step): the findings
# stand, at half the confidence, and the diagnosis says why.
FEW_STEPS = 5
FEW_STEPS_FACTOR = 0.5


@dataclass
class Diagnosis:
    level: str
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)
    # Why there is nothing to diagnose (a run whose job recorded no step); also in warnings.
    reason: str | None = None

    def __post_init__(self) -> None:
        for finding in self.findings:
            finding.level = self.level

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.findings]


_ev = EvidenceItem.of


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.1 else f"{100 * x:.1f} %"


# -- shared readings -----------------------------------------------------------------
def _has_gpu_trace(ev: Evidence) -> bool:
    return ev.trace is not None and bool(ev.trace.summary.get("has_device"))


def _gpu_util_trace(ev: Evidence) -> float | None:
    if not _has_gpu_trace(ev) or ev.trace.gpu.empty:
        return None
    return float(ev.trace.gpu["gpu_utilization"].mean())


def _gpu_util_samples(ev: Evidence) -> float | None:
    value = ev.system.get("gpu.util_percent.mean")
    return None if value is None else value / 100.0


def _kernel_time_share(ev: Evidence, classes: tuple[str, ...]) -> tuple[float, float]:
    """(share of step time, fraction of kernel time) of the kernel classes."""
    kc = ev.trace.kernel_classes
    if kc.empty:
        return 0.0, 0.0
    rows = kc[kc["class"].isin(classes)]
    fraction = float(rows["share"].sum())
    return min(1.0, ev.per_step(float(rows["total_ns"].sum())) / ev.mean_step()), fraction


def _cpu_classes(ev: Evidence) -> dict[str, dict[str, float]]:
    return cpu_op_classes(ev.trace.ops_top)


def _data_wait(ev: Evidence) -> tuple[float | None, str]:
    if ev.steps and ev.steps.get("data_wait_share") is not None:
        return float(ev.steps["data_wait_share"]), "step timer"
    if ev.trace is not None:
        return float(ev.trace.breakdown.get("DataLoader", 0.0)), "trace breakdown"
    if ev.stacks is not None:
        return float(ev.stacks["shares"]["data_loading"]), "stack samples"
    return None, ""


def _outlier_note(ev: Evidence, source: str) -> list[dict[str, Any]]:
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
    return [_ev(note, ev.steps["data_wait_outliers"]["max_s"], "step timer")] + (
        [_ev(f"with them the wait would be {_pct(raw)} of step time", raw, "step timer")]
        if raw is not None
        else []
    )


def _stack_phases(ev: Evidence, phases: tuple[str, ...]) -> str:
    shares = ev.stacks["shares"]
    return ", ".join(f"{LABELS[p]} {_pct(shares[p])}" for p in phases)


# -- rules ---------------------------------------------------------------------------
def input_pipeline(ev: Evidence) -> Finding | None:
    share, source = _data_wait(ev)
    if share is None or share < INPUT_MIN:
        return None
    text = (
        f"main thread in data loading {_pct(share)} of the samples"
        if source == "stack samples"
        else f"DataLoader wait {_pct(share)} of step time"
    )
    evidence = [_ev(text, share, source), *_outlier_note(ev, source)]
    if ev.trace is not None and source != "trace breakdown":
        dl = float(ev.trace.breakdown.get("DataLoader", 0.0))
        evidence.append(_ev(f"DataLoader {_pct(dl)} of the profiled steps", dl, "trace breakdown"))
    util = _gpu_util_trace(ev) if _has_gpu_trace(ev) else _gpu_util_samples(ev)
    if util is not None:
        evidence.append(
            _ev(f"GPU idle {_pct(1 - util)}", 1 - util, "trace" if _has_gpu_trace(ev) else "NVML")
        )
    loaders = ev.context.loaders
    if loaders:
        workers = [ld.get("num_workers", 0) for ld in loaders]
        evidence.append(_ev(f"DataLoader num_workers={workers[0]}", workers[0], "job settings"))
    busiest = ev.system.get("proc.cpu_max_process_percent.mean")
    if busiest is not None and ev.system.get("proc.children.mean", 0) >= 1:
        evidence.append(_ev(f"busiest process (workers) at {busiest:.0f} % CPU", busiest, "psutil"))
    confidence = 0.9 if share >= INPUT_HIGH else 0.6
    label = "highly" if share >= INPUT_HIGH else "moderately"
    return Finding(
        "io",
        "input_pipeline",
        f"Input pipeline: the loop waits for data ({label} input-bound)",
        share,
        confidence,
        evidence,
    )


def storage(ev: Evidence) -> Finding | None:
    iowait = ev.system.get("system.iowait_percent.mean")
    if iowait is None or iowait < IOWAIT_HIGH:
        return None
    share, source = _data_wait(ev)
    if share is not None and share < INPUT_MIN:
        return None  # the disk is busy, but not for this job's loop
    evidence = [_ev(f"CPU iowait {iowait:.0f} % on average", iowait / 100, "psutil")]
    read = ev.system.get("system.disk_read_bytes_per_s.mean")
    if read is not None:
        evidence.append(_ev(f"disk reads {read / 2**20:.1f} MiB/s", read, "psutil"))
    if share is not None:
        evidence.append(_ev(f"data wait {_pct(share)} of step time", share, source))
        evidence.extend(_outlier_note(ev, source))
    return Finding(
        "io",
        "storage",
        "Storage: reading the data waits on the disk",
        share if share is not None else iowait / 100,
        0.6,
        evidence,
    )


def host_overhead(ev: Evidence) -> Finding | None:
    if _has_gpu_trace(ev):
        util = _gpu_util_trace(ev)
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
            _ev(f"GPU busy only {_pct(util)} of the step", util, "trace"),
            _ev(f"host-side time with the GPU idle {_pct(share)}", share, "trace breakdown"),
            _ev(
                f"kernel launches (runtime) {_pct(float(b.get('Runtime', 0)))}",
                float(b.get("Runtime", 0)),
                "trace breakdown",
            ),
        ]
        if count:
            evidence.append(
                _ev(
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
        classes = _cpu_classes(ev)
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
            _ev(
                f"framework ops (views, dispatch, autograd) {_pct(classes['framework']['fraction'])} of op time",
                classes["framework"]["fraction"],
                "trace",
            ),
            _ev(f"Python between ops {_pct(other)} of the step", other, "trace breakdown"),
            _ev(
                f"{n_ops / steps:,.0f} operators per step, mean self time {self_ns / max(n_ops, 1) / 1e3:.1f} µs",
                self_ns / max(n_ops, 1) / 1e3,
                "trace",
            ),
        ]
        return Finding(
            "compute", "host_overhead", "Host overhead: many tiny operators", share, 0.75, evidence
        )
    util = _gpu_util_samples(ev)
    thread = ev.system.get("proc.cpu_max_thread_percent.mean")
    if util is not None and util < GPU_UTIL_LOW and thread is not None and thread >= 90:
        data, _ = _data_wait(ev)
        if data is not None and data >= INPUT_HIGH:
            return None  # the input rule explains the idle GPU
        share = 1 - util - (data or 0.0)
        evidence = [
            _ev(f"GPU utilisation {_pct(util)} (NVML)", util, "NVML"),
            _ev(f"busiest thread at {thread:.0f} % of a core", thread, "psutil"),
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
    if _has_gpu_trace(ev):
        share, fraction = _kernel_time_share(ev, ("gemm_conv",))
        if share < KERNEL_MIN:
            return None
        util = _gpu_util_trace(ev) or 0.0
        evidence = [
            _ev(
                f"GEMM/conv kernels {_pct(share)} of step time ({_pct(fraction)} of kernel time)",
                share,
                "trace",
            ),
            _ev(f"GPU busy {_pct(util)} of the step", util, "trace"),
        ]
        title = "Device compute: GEMM/convolution kernels"
        tc = (
            ev.trace.gpu["tensor_core_share_modern"].mean()
            if "tensor_core_share_modern" in ev.trace.gpu
            else None
        )
        cap = ev.context.capability
        if tc is not None and not math.isnan(tc):
            evidence.append(
                _ev(f"Tensor Core kernels {_pct(float(tc))} of kernel time", float(tc), "trace")
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
        )
    if ev.trace is not None:
        classes = _cpu_classes(ev)
        cpu_exec = float(ev.trace.breakdown.get("CPU Exec", 0))
        share = classes["gemm_conv"]["fraction"] * cpu_exec
        if share < KERNEL_MIN:
            return None
        evidence = [
            _ev(
                f"matmul/conv operators {_pct(classes['gemm_conv']['fraction'])} of CPU op time",
                classes["gemm_conv"]["fraction"],
                "trace",
            ),
            _ev(f"CPU operators running {_pct(cpu_exec)} of the step", cpu_exec, "trace breakdown"),
        ]
        return Finding(
            "compute",
            "device_compute",
            "CPU compute: matmul/convolution operators",
            share,
            0.8,
            evidence,
            weight=PRODUCTIVE_WEIGHT,
        )
    # No trace: the step time that is not data wait is compute of some kind.
    data, _ = _data_wait(ev)
    util = _gpu_util_samples(ev)
    evidence = []
    if ev.steps is not None and data is not None:
        share = 1.0 - data
        evidence.append(
            _ev(f"not waiting for data {_pct(share)} of step time", share, "step timer")
        )
        evidence.extend(_outlier_note(ev, "step timer"))
        confidence = 0.45
    elif ev.stacks is not None:
        share = sum(ev.stacks["shares"][p] for p in MODEL_PHASES)
        phases = _stack_phases(ev, MODEL_PHASES)
        evidence.append(_ev(f"main thread in the model: {phases}", share, "stack samples"))
        confidence = 0.6
        if ev.stacks.get("ddp"):
            evidence.append(
                _ev(
                    "DDP: its gradient all-reduce runs inside backward, in C++, where Python "
                    "stacks cannot tell it from compute; capture a trace to split them",
                    None,
                    "stack samples",
                )
            )
            confidence = 0.4
    else:
        cores = ev.context.cpu_count or 1
        cpu = ev.system.get("proc.cpu_percent.p95")
        if util is not None and util >= GPU_UTIL_BUSY:
            share, confidence = util, 0.5
        elif util is None and cpu is not None and cpu >= COMPUTING_CPU_PERCENT:
            share, confidence = min(1.0, ev.system["proc.cpu_percent.mean"] / 100), 0.4
            evidence.append(
                _ev(f"process tree CPU {cpu:.0f} % (95th percentile, {cores} cores)", cpu, "psutil")
            )
        else:
            return None
    if share < KERNEL_MIN:
        return None
    if util is not None:
        evidence.append(_ev(f"GPU utilisation {_pct(util)} (NVML)", util, "NVML"))
        confidence = 0.6 if util >= GPU_UTIL_BUSY else confidence
    evidence.append(
        _ev(
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
    )


def memory_bandwidth(ev: Evidence) -> Finding | None:
    if ev.trace is None:
        return None
    if _has_gpu_trace(ev):
        share, fraction = _kernel_time_share(ev, ("elementwise", "reduction", "normalization"))
        source = "kernel"
    else:
        classes = _cpu_classes(ev)
        fraction = classes["pointwise"]["fraction"]
        share = fraction * float(ev.trace.breakdown.get("CPU Exec", 0))
        source = "CPU op"
    if share < KERNEL_MIN:
        return None
    evidence = [
        _ev(
            f"elementwise/normalisation/reduction {_pct(share)} of step time ({_pct(fraction)} of {source} time)",
            share,
            "trace",
        )
    ]
    gemm = (
        _kernel_time_share(ev, ("gemm_conv",))[1]
        if source == "kernel"
        else _cpu_classes(ev)["gemm_conv"]["fraction"]
    )
    evidence.append(_ev(f"GEMM/conv only {_pct(gemm)} of {source} time", gemm, "trace"))
    return Finding(
        "memory",
        "bandwidth",
        "Memory bandwidth: unfused elementwise operations",
        share,
        0.8 if fraction >= 0.5 else 0.6,
        evidence,
        weight=PRODUCTIVE_WEIGHT,
    )


def memory_capacity(ev: Evidence) -> Finding | None:
    error = str((ev.run or {}).get("error") or "")
    evidence: list[dict[str, Any]] = []
    oom = "out of memory" in error.lower() or "OutOfMemoryError" in error
    if oom:
        evidence.append(_ev(f"the job failed: {error[:160]}", None, "run"))
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
                        _ev(
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
                _ev(f"GPU memory used up to {_pct(nvml_share)} of the device", nvml_share, "NVML")
            )
    elif peak_share is not None:
        evidence.append(
            _ev(f"peak allocated {_pct(peak_share)} of device memory", peak_share, "trace")
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


def collectives(ev: Evidence) -> Finding | None:
    comm = ev.trace.communication if ev.trace is not None else None
    if not comm or not comm.get("share"):
        return None
    share = float(comm["share"])
    if share < COMM_MIN:
        return None
    evidence = [_ev(f"communication {_pct(share)} of step time", share, "trace")]
    overlap = comm.get("overlap")
    if overlap is not None:
        evidence.append(
            _ev(f"overlap with compute {_pct(float(overlap))}", float(overlap), "trace")
        )
    skew = comm.get("skew")
    if skew is not None and hasattr(skew, "empty") and not skew.empty and "skew_ns" in skew:
        worst = float(skew["skew_ns"].max())
        evidence.append(_ev(f"rank skew up to {worst / 1e6:.1f} ms per step", worst / 1e6, "trace"))
    return Finding(
        "communication",
        "collectives",
        "Communication: collectives not hidden behind compute",
        share,
        0.85 if share >= COMM_HIGH else 0.55,
        evidence,
    )


def host_device(ev: Evidence) -> Finding | None:
    if not _has_gpu_trace(ev):
        return _syncs_from_stacks(ev)
    b = ev.trace.breakdown
    copies = float(b.get("Memcpy", 0) + b.get("Memset", 0))
    syncs = ev.trace.syncs
    sync_share = 0.0
    evidence = []
    if syncs is not None and not syncs.empty:
        sync_share = ev.sync_time_share()
        named = syncs[syncs["op"] != ""].head(3)
        for r in named.itertuples():
            evidence.append(
                _ev(
                    f"{r.op} synchronised ({r.call}) {r.count}×, {r.total_ns / 1e6:.2f} ms",
                    r.total_ns / 1e6,
                    "trace",
                )
            )
        util = _gpu_util_trace(ev) or 0.0
        if util >= GPU_UTIL_BUSY:
            # The host waits, but the GPU has queued work meanwhile: no step time lost.
            evidence.append(
                _ev(
                    f"syncs {_pct(sync_share)} of host time, not counted: GPU busy {_pct(util)}",
                    sync_share,
                    "trace",
                )
            )
            sync_share = 0.0
    share = copies + sync_share
    if share < HOST_DEVICE_MIN:
        return None
    evidence.insert(
        0,
        _ev(
            f"copies and syncs {_pct(share)} of step time (memcpy {_pct(copies)}, syncs {_pct(sync_share)})",
            share,
            "trace",
        ),
    )
    return Finding(
        "communication",
        "host_device",
        "Host-device transfers and synchronisations",
        share,
        0.7,
        evidence,
    )


def _syncs_from_stacks(ev: Evidence) -> Finding | None:
    """An attached job: the main thread sampled on lines that read tensors back."""
    if ev.stacks is None:
        return None
    share = float(ev.stacks["shares"]["sync"])
    if share < HOST_DEVICE_MIN:
        return None
    evidence = [
        _ev(f"main thread waiting on syncs {_pct(share)} of the time", share, "stack samples")
    ]
    for s in ev.stacks["sites"]:
        if s["category"] == "sync":
            evidence.append(_ev(f"{s['site']}: {_pct(s['share'])}", s["share"], "stack samples"))
    return Finding(
        "communication",
        "host_device",
        "Host-device synchronisations in the loop (.item(), .cpu(), synchronize)",
        share,
        0.6,
        evidence,
    )


def waiting_process(ev: Evidence) -> Finding | None:
    """Samples only, no GPU: a process that barely uses the CPU is waiting on input."""
    if ev.level != "samples" or _gpu_util_samples(ev) is not None:
        return None
    cpu = ev.system.get("proc.cpu_percent.mean")
    if cpu is None or cpu >= WAITING_CPU_PERCENT:
        return None
    evidence = [
        _ev(
            f"process tree CPU {cpu:.0f} % on average (less than a core) with no GPU", cpu, "psutil"
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


RULES: tuple[Callable[[Evidence], Finding | None], ...] = (
    input_pipeline,
    storage,
    host_overhead,
    device_compute,
    memory_bandwidth,
    memory_capacity,
    collectives,
    host_device,
    waiting_process,
)


def diagnose(ev: Evidence) -> Diagnosis:
    """All findings of the evidence, with their fixes, most costly first."""
    if ev.no_steps:
        return _nothing_to_diagnose(ev)
    findings, warnings = [], []
    for rule in RULES:
        try:
            finding = rule(ev)
        except Exception as exc:  # one rule failing on odd evidence costs only itself
            warnings.append(f"diagnosis rule {rule.__name__} failed ({type(exc).__name__}: {exc})")
            continue
        if finding is not None:
            finding.confidence = round(finding.confidence * LEVEL_CONFIDENCE.get(ev.level, 0.5), 2)
            findings.append(finding)
    timed = (ev.steps or {}).get("timed_steps") if ev.level == "steps" else None
    if timed is not None and timed < FEW_STEPS:
        warnings.append(
            f"only {timed} timed step{'s' if timed != 1 else ''}: shares from so few steps are "
            f"weak evidence (confidence halved); record at least {FEW_STEPS} steps"
        )
        for finding in findings:
            finding.confidence = round(finding.confidence * FEW_STEPS_FACTOR, 2)
    findings.sort(key=lambda f: (f.cost, f.confidence), reverse=True)
    for finding in findings:
        recommend(finding, ev)
    return Diagnosis(ev.level, findings, warnings)


def _nothing_to_diagnose(ev: Evidence) -> Diagnosis:
    """A run whose job recorded no step: no step time, so no share of it to find.

    Without steps the samples are the interpreter starting, imports and set-up, not the
    job's loop: a "compute 100 %" read from them, with fixes, would be invented. The one
    finding kept is an out-of-memory error the job died of (its own error message says
    so, whatever the steps), with its fixes.
    """
    reason = str(ev.no_steps)
    findings = []
    oom = memory_capacity(ev)
    if oom is not None and oom.extra_cost:  # the job's own error: no level to discount
        recommend(oom, ev)
        findings.append(oom)
    return Diagnosis(ev.level, findings, [reason], reason=reason)


def diagnose_report(report: TraceReport) -> Diagnosis:
    """A trace file with no run behind it."""
    return diagnose(from_trace(report))


def diagnose_run(
    store: Any, run_id: int, report: TraceReport | None = None, save: bool = True
) -> Diagnosis:
    """Diagnose a run of the store with everything it has; saves the findings."""
    warnings: list[str] = []
    if report is None:
        report, warnings = _run_report(store, run_id)
    diagnosis = diagnose(gather(store, run_id, report))
    diagnosis.warnings = warnings + diagnosis.warnings
    if save:
        store.save_findings(run_id, diagnosis.findings)
    return diagnosis


def _run_report(store: Any, run_id: int) -> tuple[TraceReport | None, list[str]]:
    from stepscope.analyzers.trace_load import TraceError
    from stepscope.analyzers.trace_report import analyze_trace

    arts = store.artifacts(run_id)
    traces = arts[arts["kind"] == "trace"]["path"].tolist() if len(arts) else []
    if not traces:
        return None, []
    try:
        return analyze_trace(traces), []
    except TraceError as exc:
        return None, [f"trace not used: {exc}"]
