"""Bottleneck classification: evidence in, findings out, most costly first.

The rules, one module per bottleneck class (``rules.io``, ``rules.compute``,
``rules.memory``, ``rules.communication``; ``rules.inference`` for how an inference job
runs its model), each a plain function ``Evidence ->
Finding | None`` for one subtype of the taxonomy (docs/architecture.md); they use the strongest
evidence the run has (trace > steps > stacks > samples) and say which numbers they used,
against the thresholds in ``thresholds``. This module runs them all, discounts their
confidence by the evidence's level (and by too few timed steps), ranks the findings and
has the fixes recommended for each.

Ordering: a finding's *cost* is the share of step time it could give back. Waiting
(data, communication, syncs, host overhead) can be removed entirely, so its cost is
its share; GEMM/conv and memory-bound kernel time is the useful work itself, which the
known fixes speed up by at most ~2x (mixed precision's upper end), so its cost is half
its share. This is why a ResNet whose step is 36 % GEMM and 33 % data wait is
input-bound first: the data wait is what can go.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stepscope.analyzers.report.trace_report import TraceReport, analyze_trace
from stepscope.analyzers.rules.capture_cover import NO_COMPLETE_STEP, missed_every_step
from stepscope.analyzers.rules.communication import collectives, host_device
from stepscope.analyzers.rules.compute import device_compute, host_overhead, optimizer_step
from stepscope.analyzers.rules.diagnosed import DIAGNOSED, Diagnosis

# re-exported: where the dashboard, the API and the tests have always imported them
from stepscope.analyzers.rules.diagnosed import LEVEL_TEXT as LEVEL_TEXT
from stepscope.analyzers.rules.diagnosed import saved_diagnosis as saved_diagnosis
from stepscope.analyzers.rules.evidence import Evidence, from_trace, gather
from stepscope.analyzers.rules.generation import decode_batch_one, long_prefill, no_kv_cache
from stepscope.analyzers.rules.inference import inference_grad, inference_train_mode, small_batch
from stepscope.analyzers.rules.io import input_pipeline, storage, waiting_process
from stepscope.analyzers.rules.memory import (
    memory_bandwidth,
    memory_capacity,
    oom_before_first_step,
)
from stepscope.analyzers.rules.recommend import recommend
from stepscope.analyzers.trace.load import TraceError
from stepscope.store.artifacts import ArtifactError, kind_files
from stepscope.types import FAILED_IN_STEP, Finding

LEVEL_CONFIDENCE = {"trace": 1.0, "steps": 0.85, "stacks": 0.75, "samples": 0.6, "none": 0.3}
# Shares read from fewer timed steps than this are one step's accident (a torchrun job
# that stepped once was "highly input-bound" from a single 12 ms step): the findings
# stand, at half the confidence, and the diagnosis says why.
FEW_STEPS = 5
FEW_STEPS_FACTOR = 0.5


RULES: tuple[Callable[[Evidence], Finding | None], ...] = (
    input_pipeline,
    storage,
    host_overhead,
    optimizer_step,
    device_compute,
    memory_bandwidth,
    memory_capacity,
    collectives,
    host_device,
    waiting_process,
    inference_grad,
    inference_train_mode,
    small_batch,
    no_kv_cache,
    decode_batch_one,
    long_prefill,
)


def diagnose(ev: Evidence) -> Diagnosis:
    """All findings of the evidence, with their fixes, most costly first."""
    if ev.no_steps:
        return _nothing_to_diagnose(ev)
    if oom_before_first_step(ev.run or {}):
        return _out_of_memory_in_first_step(ev)
    run = ev.run or {}
    if run.get("status") == "failed" and (run.get("config") or {}).get(FAILED_IN_STEP) == 0:
        return _failed_in_first_step(ev)
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
    _rank_before_the_work_it_slows(findings)
    findings.sort(key=lambda f: (f.cost, f.confidence), reverse=True)
    present = frozenset(f.key for f in findings)
    for finding in findings:
        recommend(finding, ev, present)
    return Diagnosis(ev.level, findings, warnings)


# Findings whose fix comes before any fix of the compute they sit in: autograd recording a
# graph nobody uses slows every forward, a decode without a KV cache recomputes the whole
# context at every token, and compile, bf16 or int8 measured on such a forward are
# measured against the wrong baseline (``thresholds``).
FIRST_AMONG_COMPUTE = ("compute/inference_grad", "compute/no_kv_cache")


def _rank_before_the_work_it_slows(findings: list[Finding]) -> None:
    """Lift such a finding's cost just above the costliest compute finding's. By shares
    alone the order would depend on the run's split between forward and "the rest of
    the step", which moves with the machine's load."""
    compute = [
        f.cost for f in findings if f.klass == "compute" and f.key not in FIRST_AMONG_COMPUTE
    ]
    if not compute:
        return
    for finding in findings:
        if finding.key in FIRST_AMONG_COMPUTE and finding.cost <= max(compute):
            finding.extra_cost += max(compute) - finding.cost + 1e-6


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


def _out_of_memory_in_first_step(ev: Evidence) -> Diagnosis:
    """A job that ran out of memory before it completed a step: its one recorded step is
    the one it died in (the step timer closes it at exit), and a share of step time read
    from it would be invented (a training step cut short in its forward reads as an
    inference step). The out-of-memory finding is the diagnosis, with its fixes."""
    model = (ev.context.facts or {}).get("model") or {}
    if model.get("training") and model.get("grad_enabled"):
        # its forward never reached the backward: a model in training mode under grad
        # mode is a training job, whatever its one cut-short step looks like
        ev.context.training = True
    oom = memory_capacity(ev)
    findings = []
    if oom is not None:
        recommend(oom, ev)
        findings.append(oom)
    note = "the job ran out of memory before it completed a step: no step time to read"
    return Diagnosis(ev.level, findings, [note])


def _failed_in_first_step(ev: Evidence) -> Diagnosis:
    """A job that died of an exception before it completed a step: its one recorded step
    is the one cut short (an HF Trainer whose first forward raised IndexError read as
    "inference records gradients, 88 % of step time"). Its error is the answer."""
    error = str((ev.run or {}).get("error") or "an exception")
    reason = f"the job failed in its first step, before completing one ({error[:200]})"
    return Diagnosis(ev.level, [], [reason], reason=reason)


def diagnose_report(report: TraceReport) -> Diagnosis:
    """A trace file with no run behind it."""
    return diagnose(from_trace(report))


def diagnose_run(
    store: Any,
    run_id: int,
    report: TraceReport | None = None,
    save: bool = True,
    read_trace: bool = True,
) -> Diagnosis:
    """Diagnose a run of the store with everything it has; saves the findings.
    ``read_trace``: False leaves its trace out (a dashboard holding a big one back)."""
    warnings: list[str] = []
    if report is None and read_trace:
        report, warnings = _run_report(store, run_id)
    if report is not None and missed_every_step(report.per_step, store.steps(run_id)):
        report = None  # its shares would be of the job's tail, not of its steps
        warnings.append(NO_COMPLETE_STEP)
    diagnosis = diagnose(gather(store, run_id, report))
    diagnosis.warnings = warnings + diagnosis.warnings
    if NO_COMPLETE_STEP in warnings:
        diagnosis.capture_note = NO_COMPLETE_STEP
    if save:
        store.save_findings(run_id, diagnosis.findings)
        marker = {"at": time.time(), "level": diagnosis.level, "reason": diagnosis.reason}
        if diagnosis.capture_note:
            marker["capture"] = diagnosis.capture_note
        store.merge_run_json(run_id, "config", {DIAGNOSED: marker})
    return diagnosis


def _run_report(store: Any, run_id: int) -> tuple[TraceReport | None, list[str]]:
    try:  # an uploaded trace is read from the artifact cache (store/artifacts.py)
        traces = kind_files(store.artifacts(run_id), store.home, "trace")
    except ArtifactError as exc:
        return None, [f"trace not used: {exc}"]
    if not traces:
        return None, []
    try:
        return analyze_trace(traces, calibration_home=store.home), []
    except TraceError as exc:
        return None, [f"trace not used: {exc}"]
