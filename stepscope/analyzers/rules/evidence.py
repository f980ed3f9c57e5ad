"""Everything the diagnosis may use about one run, gathered from the store once.

Four levels, each more direct than the one before, because a run has whatever its
collectors could record: ``samples`` (system sampler only), ``stacks`` (plus Python
stack samples of an attached process: where its main thread spends its time),
``steps`` (the step timer of `stepscope run`: data wait, step times) and ``trace``
(plus a profiler capture: the full breakdown, kernels, memory, communication). The diagnosis
states which level it had, and its confidence follows from it.

A generation run (its steps are requests: ``analyzers/steps/generation.py``) also carries its
requests, their summary and decoded tokens, and, on the CPU, the host's calibration
(``stepscope calibrate``): the generation rules (``rules.generation``) read the decode
against it. The settings its ``generate()`` calls were seen with go into the context's
facts (``facts["generation"]``), where the fixes' requirements read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from stepscope.analyzers.report.run_snapshot import run_snapshot
from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.analyzers.steps.generation import (
    generation_summary,
    is_generation,
    timed_requests,
    token_latencies,
)
from stepscope.analyzers.steps.stacks import stack_summary
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.analyzers.trace.allocator_snapshot import AllocatorSnapshot
from stepscope.errors import is_out_of_memory
from stepscope.store.calibration import Calibration, cached_calibration
from stepscope.types import JobContext

LEVELS = ("samples", "stacks", "steps", "trace")


@dataclass
class Evidence:
    level: str  # 'samples' | 'stacks' | 'steps' | 'trace' | 'none'
    context: JobContext
    steps: dict[str, Any] | None = None  # summarize_steps
    stacks: dict[str, Any] | None = None  # analyzers.steps.stacks.stack_summary
    system: dict[str, float] = field(default_factory=dict)  # 'scope.metric.stat' -> value
    trace: TraceReport | None = None
    run: dict[str, Any] | None = None  # the run's row (status, error)
    # Set when the step timer was in the job but recorded no step: there is nothing to
    # diagnose, and this says why (the diagnosis then has no findings).
    no_steps: str | None = None
    # A generation run: its requests (``store.requests``), their summary
    # (``generation.generation_summary``) and the decoded tokens of the timed requests
    # (``generation.token_latencies``); None for any other run.
    requests: pd.DataFrame | None = None
    generation: dict[str, Any] | None = None
    timed: pd.DataFrame | None = None  # ``generation.timed_requests``: the timed ones
    tokens: pd.DataFrame | None = None
    # The host's measured bandwidth for a CPU generation run (None: not calibrated).
    calibration: Calibration | None = None
    # A run that ran out of CUDA memory: the allocator's snapshot dumped at the error
    # (``report/run_snapshot.py``; None without one), or the one line saying why the
    # run's snapshot was not read.
    allocator: AllocatorSnapshot | None = None
    allocator_problem: str | None = None

    def per_step(self, total: float) -> float:
        """A total over the whole trace (kernel time, kernel count) per step and rank."""
        assert self.trace is not None
        numbers = self.trace.summary.get("step_numbers") or []
        steps = max(1, len(set(numbers)) or int(self.trace.summary["steps"]))
        ranks = max(1, len(self.trace.summary.get("ranks") or [0]))
        return total / steps / ranks

    def mean_step(self) -> float:
        """The trace's mean step time in ns (1 when it has none: a divisor)."""
        assert self.trace is not None
        return float(self.trace.summary["mean_step_ns"]) or 1.0

    def sync_time_share(self) -> float:
        """Host time in synchronising runtime calls per step / step time."""
        syncs = self.trace.syncs if self.trace is not None else None
        if syncs is None or syncs.empty:
            return 0.0
        return min(1.0, self.per_step(float(syncs["total_ns"].sum())) / self.mean_step())


def system_summary(samples: pd.DataFrame) -> dict[str, float]:
    """Long-form samples -> ``{'proc.cpu_percent.mean': 97.1, ...}`` (mean, p95, max).

    Samples of several GPUs are pooled under ``gpu.*`` (their mean is the job's mean
    utilisation; ``max`` the worst device) and kept per device as well.
    """
    if samples is None or samples.empty:
        return {}
    df = samples.dropna(subset=["value"])
    gpu = df[df["scope"].str.startswith("gpu")].assign(scope="gpu")
    df = pd.concat([df, gpu], ignore_index=True)
    stats = df.groupby(["scope", "metric"])["value"].agg(
        mean="mean", p95=lambda v: v.quantile(0.95), max="max", n="count"
    )
    out: dict[str, float] = {}
    for (scope, metric), row in stats.iterrows():
        for stat in ("mean", "p95", "max", "n"):
            out[f"{scope}.{metric}.{stat}"] = float(row[stat])
    span = samples["t"].max() - samples["t"].min()
    out["duration_s"] = float(span)
    return out


def context_from_run(run: dict[str, Any]) -> JobContext:
    """What the job reported about itself (facts, device)."""
    facts = run.get("facts") or {}
    device = run.get("device") or {}
    model = facts.get("model") or {}
    model_device = str(model.get("device") or "")
    if model_device:
        cuda: bool | None = model_device.startswith("cuda")
    elif device:
        cuda = bool(device.get("device_name"))  # set only when the job initialised CUDA
    else:
        cuda = None
    capability = device.get("capability")
    name = device.get("device_name")
    vendor = None
    if name:
        vendor = "amd" if "AMD" in name.upper() or "INSTINCT" in name.upper() else "nvidia"
    training = None
    if facts:
        training = bool(facts.get("optimizer")) or bool(model.get("grad_enabled"))
        forward = facts.get("forward")
        if forward and not facts.get("optimizer"):
            # grad mode alone is not training: an inference job may forget inference_mode
            training = bool(forward.get("backward"))
    return JobContext(
        cuda=cuda,
        vendor=vendor,
        capability=float(capability) if capability else None,
        device_name=name,
        training=training,
        dataloader=bool(facts.get("dataloaders")) if facts else None,
        conv2d=model.get("conv2d") if model else None,
        ddp=(model.get("wrapper") == "DistributedDataParallel") if model else None,
        dataparallel=(model.get("wrapper") == "DataParallel") if model else None,
        cpu_count=device.get("cpu_count"),
        facts=facts,
    )


#: busy main-thread samples below which stacks without a backward say nothing of the
#: kind (a training job spends at least as long in its backward as in its forward)
STACKS_FOR_KIND = 20


def training_from_stacks(stacks: dict[str, Any]) -> bool | None:
    """An attach from outside has no facts: its main thread's samples say the kind. A
    backward or an optimizer step seen: training. Neither in enough busy samples (a model
    served behind `http.server`): inference, and the advice fits inference. Too few
    samples to tell: unknown (advice as for training, as before)."""
    shares = stacks["shares"]
    if shares.get("backward", 0.0) > 0 or shares.get("optimizer", 0.0) > 0:
        return True
    busy = stacks["samples"] * (1.0 - stacks["idle_share"])
    if busy >= STACKS_FOR_KIND and shares.get("forward", 0.0) > 0:
        return False
    return None


def context_from_trace(report: TraceReport) -> JobContext:
    """A bare trace file: what the events show (None where they cannot say)."""
    props = [
        p
        for r in report.summary.get("devices", {}).values()
        for p in (r or [])
        if isinstance(p, str)
    ]
    name = props[0] if props else None
    vendor = None
    capability = None
    if name:
        amd = any(k in name.upper() for k in ("AMD", "INSTINCT", "MI2", "MI3"))
        vendor = "amd" if amd else "nvidia"
    for meta in report.summary.get("device_properties", []):
        major, minor = meta.get("computeMajor"), meta.get("computeMinor")
        if major is not None and vendor != "amd":
            capability = float(f"{major}.{minor or 0}")
            break
    ops = set(report.ops_top["name"].astype(str)) if not report.ops_top.empty else set()
    dataloader = any(n.startswith("enumerate(DataLoader)") for n in ops) or (
        report.breakdown.get("DataLoader", 0.0) > 0
    )
    training = any(n.startswith("Optimizer.step") or "Backward" in n for n in ops)
    conv = any("conv" in n for n in ops)
    comm = report.communication or {}
    ddp = bool(comm.get("share")) or any(n.startswith("c10d::") for n in ops)
    return JobContext(
        cuda=bool(report.summary.get("has_device")),
        vendor=vendor,
        capability=capability,
        device_name=name,
        training=training or None,
        dataloader=dataloader or None,
        conv2d=conv or None,
        ddp=ddp or None,
        dataparallel=None,
    )


def gather(store: Any, run_id: int, report: TraceReport | None = None) -> Evidence:
    """The run's evidence; ``report`` is its trace analysis when it has traces."""
    run = store.run(run_id)
    context = context_from_run(run)
    if report is not None:
        from_trace = context_from_trace(report)
        for name in ("cuda", "vendor", "capability", "device_name", "training", "conv2d"):
            if getattr(context, name) is None:
                setattr(context, name, getattr(from_trace, name))
    steps = store.steps(run_id)
    system = system_summary(store.samples(run_id))
    if context.cpu_count is None and "system.cpu_count.max" in system:
        context.cpu_count = int(system["system.cpu_count.max"])
    if context.cuda is None and system.get("gpu.job_mem_used_bytes.max", 0.0) > 0:
        context.cuda = True  # NVML saw the job's own processes hold GPU memory
    workers = max((int(ld.get("num_workers") or 0) for ld in context.loaders), default=0)
    summary = summarize_steps(steps, workers=workers or None) if len(steps) else None
    allocator = oom_snapshot(store, run_id, run)
    if summary is None and report is None and step_timer_ran(run):
        return Evidence(
            level="none",
            context=context,
            system=system,
            run=run,
            no_steps=no_steps_reason(run, store.events(run_id)),
            **allocator,
        )
    stacks = stack_summary(store.stack_samples(run_id))
    if stacks is not None and stacks["ddp"] and context.ddp is None:
        context.ddp = True  # seen on the stacks of an attached job
    if stacks is not None and context.training is None:
        context.training = training_from_stacks(stacks)
    generation: dict[str, Any] = {}
    if is_generation(steps):
        generation = _generation(store, run_id, steps, run, context)
    if generation or (summary or {}).get("latency") is not None:
        # requests or forward steps, no backward, no optimizer: whatever grad mode the
        # model was built under, the job is inference (its advice and phases follow)
        context.training = False
    if report is not None:
        level = "trace"
    elif summary is not None:
        level = "steps"
    elif stacks is not None:
        level = "stacks"
    elif system:
        level = "samples"
    else:
        level = "none"
    return Evidence(
        level=level,
        context=context,
        steps=summary,
        stacks=stacks,
        system=system,
        trace=report,
        run=run,
        **generation,
        **allocator,
    )


def oom_snapshot(store: Any, run_id: int, run: dict[str, Any]) -> dict[str, Any]:
    """For a run that ran out of memory: its allocator snapshot taken at the error (one
    whose trace has the ``oom`` entry; a capture's earlier one explains nothing about
    it), or why it was not read. Other runs: nothing read."""
    if not ((run.get("config") or {}).get("oom") or is_out_of_memory(run.get("error"))):
        return {}
    snapshot, problems = run_snapshot(store, run_id)
    if problems:
        return {"allocator_problem": problems[0]}
    return {"allocator": snapshot} if snapshot is not None and snapshot.oom else {}


def _generation(
    store: Any, run_id: int, steps: pd.DataFrame, run: dict[str, Any], context: JobContext
) -> dict[str, Any]:
    """A generation run's requests, summary, timed tokens and (CPU) calibration; the
    settings of its generate() calls go into the context's facts."""
    requests = store.requests(run_id)
    if "generation" not in context.facts:
        context.facts = {**context.facts, "generation": generation_facts(requests)}
    calibration = None
    if context.cuda is not True:
        calibration = host_calibration(store.home, run, context)
    timed = timed_requests(requests, steps)
    return {
        "requests": requests,
        "generation": generation_summary(requests, steps),
        "timed": timed,
        "tokens": token_latencies(timed),
        "calibration": calibration,
    }


def generation_facts(requests: pd.DataFrame) -> dict[str, Any]:
    """What the requests say about how the job generates, for the fixes' requirements:
    ``sources`` ('generate', 'loop'), ``rows`` (the most rows of one request),
    ``greedy`` (every generate() call without sampling or beams; None where none was
    seen), ``use_cache`` (False if a call turned it off), ``cache_implementation``,
    ``prompt_lookup`` and ``assistant`` (a call already used them)."""
    rows = requests[["source", "meta"]].itertuples(index=False) if len(requests) else ()
    generate = [r.meta for r in rows if r.source == "generate" and isinstance(r.meta, dict)]
    greedy = None
    if generate:
        greedy = all(not m.get("do_sample") and int(m.get("num_beams") or 1) == 1 for m in generate)
    caches = [m["cache_implementation"] for m in generate if m.get("cache_implementation")]
    return {
        "sources": sorted(set(requests["source"].dropna())) if len(requests) else [],
        "rows": int(requests["rows"].fillna(1).max()) if len(requests) else None,
        "greedy": greedy,
        "use_cache": (not any(m.get("use_cache") is False for m in generate)) if generate else None,
        "cache_implementation": caches[0] if caches else None,
        "prompt_lookup": any(m.get("prompt_lookup_num_tokens") for m in generate),
        "assistant": any(m.get("assistant") for m in generate),
    }


def host_calibration(home: Any, run: dict[str, Any], context: JobContext) -> Calibration | None:
    """The calibration of the run's host (``stepscope calibrate``) at the job's thread
    count, else its entry with the most threads. Bandwidth does not depend on the matmul
    dtype an entry was measured for: the job's dtype is tried first, then any."""
    host = run.get("host") or None
    threads = context.settings.get("threads")
    dtypes = [context.model.get("param_dtype"), "float32", "bfloat16", "float16"]
    for dtype in dict.fromkeys(d for d in dtypes if d):
        for count in dict.fromkeys((threads, None)):
            found = cached_calibration(home, dtype, count, host=host)
            if found is not None:
                return found
    return None


def step_timer_ran(run: dict[str, Any]) -> bool:
    """Was the job started by ``stepscope run`` (or an experiment's trial), so that the
    step timer was inside it? Only then does "no steps" mean the job made none: an
    attached process or a run created by hand has no step timer, and its samples and
    stacks are all the evidence there ever was."""
    config = run.get("config") or {}
    return config.get("mode") != "attach" and "profile_at" in config


NO_STEPS = "no steps recorded: the job ended before its first optimizer step / forward"
NOT_YET = "no steps recorded yet: the job has not reached its first optimizer step / forward"


def no_steps_reason(run: dict[str, Any], events: pd.DataFrame | None = None) -> str:
    """One line: why a run of ``stepscope run`` has no steps to diagnose.

    The job may still be starting, may have ended (or failed) before its first step, or
    stepscope's own step timer may have been disabled in it (its events say so).
    """
    if events is not None and len(events):
        disabled = events[events["message"].astype(str).str.startswith("step timer disabled")]
        if len(disabled):
            return f"no steps recorded: stepscope's {disabled['message'].iloc[0]}"
    if run.get("status") == "running":
        return NOT_YET
    if run.get("error"):
        return f"{NO_STEPS} (it failed: {run['error']})"
    code = run.get("exit_code")
    return f"{NO_STEPS} (exit code {code})" if code not in (None, 0) else NO_STEPS


def from_trace(report: TraceReport) -> Evidence:
    """A trace file with no run behind it."""
    return Evidence(level="trace", context=context_from_trace(report), trace=report)
