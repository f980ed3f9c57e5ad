"""From a finding to the fixes that address it, each with a predicted gain.

A fix is recommended only when the job can take it (no requirement known to be
unmet) and does not have it already; every fix left out is listed with the reason,
so the user sees that it was considered.

The prediction is an upper bound, never a promise (Amdahl's law over the finding's
share ``s`` of the step):

* a fix that removes waiting removes at most ``removes`` of it:
  ``1 / (1 - s * removes)``; removing a 30 % data wait bounds the step at 0.7x, ≤ 1.43x;
* a fix that speeds up work (mixed precision, compilation) speeds its part up by at
  most the top of its literature range ``k``: ``1 / ((1 - s) + s / k)``; the range and
  its source are shown beside it.

Two kinds of fix need more than "not known to be unmet":

* **CUDA-only fixes** (TF32, cudnn.benchmark, pinned memory, ...) need the job to have
  reported CUDA (or NVML to have seen it on a GPU). A run that says nothing about its
  device (no step reached, an attached process) gets none: advising TF32 to a CPU job
  is worse than saying nothing.
* **The thread count** (``cpu_threads``) is offered only with evidence that it is wrong,
  and with the count that evidence points to (``thread_advice``): more intra-op threads
  than the cores the job may use; DataLoader workers busy on the CPU beside the
  intra-op threads, together more than the cores; or tiny operators (host overhead)
  with several threads. Without such evidence, trying 1 thread or half the cores only
  ever measured slower (0.62-0.87x in every experiment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope import fixes as catalog
from stepscope.analyzers.evidence import Evidence
from stepscope.fixes.base import Fix
from stepscope.fixes.input_pipeline import LOADER_BUSY_PERCENT
from stepscope.types import Finding, FixAdvice, SkippedFix

MAX_BOUND = 20.0  # a bound above this says nothing more than "large"
# Requirements only a GPU meets (ROCm's torch.cuda included): such a fix is recommended
# only to a job known to use CUDA, never to one whose device is unknown.
CUDA_ONLY = frozenset({"cuda", "tf32", "bf16_tensor_cores"})


@dataclass(frozen=True)
class ThreadAdvice:
    """The intra-op thread count the evidence points to, and the evidence."""

    threads: int  # the count to try
    current: int  # intra-op threads the job runs (torch.get_num_threads)
    cores: int  # cores the job may use (its CPU affinity)
    rule: str  # 'oversubscribed' | 'busy_workers' | 'tiny_ops'
    why: str


def predict(fix: Fix, share: float | None) -> tuple[float | None, str]:
    """(upper bound of the speed-up, how it was derived)."""
    if share is None or share <= 0:
        return None, "no share of step time to bound it (capacity: it makes room, not speed)"
    s = min(share, 0.999)
    if fix.typical is not None:
        k = fix.typical.hi
        bound = 1.0 / ((1.0 - s) + s / k)
        basis = f"Amdahl: {100 * s:.0f} % of the step sped up by at most {k:g}x"
    elif fix.removes > 0:
        removed = s * fix.removes
        bound = 1.0 / (1.0 - removed)
        what = "all" if fix.removes >= 1 else f"up to {100 * fix.removes:.0f} % of"
        basis = f"Amdahl: removes {what} the {100 * s:.0f} % share"
    else:
        return None, "does not speed the step up by itself"
    return round(min(bound, MAX_BOUND), 2), basis


def recommend(finding: Finding, ev: Evidence) -> None:
    """Fill ``finding.fixes`` (best first) and ``finding.skipped``."""
    ctx = ev.context
    chosen: list[dict[str, Any]] = []
    for fix in catalog.for_problem(finding.klass, finding.subtype):
        unmet, unknown = fix.requirement_status(ctx)
        if unmet:
            finding.skipped.append(SkippedFix(fix.id, "needs " + ", ".join(unmet)))
            continue
        if ctx.cuda is not True and CUDA_ONLY & set(fix.requires):
            why = "needs cuda (the job did not report using CUDA)"
            finding.skipped.append(SkippedFix(fix.id, why))
            continue
        if fix.in_effect(ctx) is True:
            finding.skipped.append(SkippedFix(fix.id, "already in effect"))
            continue
        advice: ThreadAdvice | None = None
        if fix.id == "cpu_threads":
            advice, reason = thread_advice(finding, ev)
            if advice is None:
                finding.skipped.append(SkippedFix(fix.id, reason))
                continue
        share = finding.share
        if fix.id == "avoid_syncs" and finding.subtype != "host_device":
            share = ev.sync_time_share()  # only the syncs' own time can be won back
            if share < 0.01:
                finding.skipped.append(SkippedFix(fix.id, "no synchronising calls found"))
                continue
        predicted, basis = predict(fix, share)
        entry = FixAdvice(
            id=fix.id,
            title=fix.title,
            why=fix.why,
            predicted_speedup=predicted,
            basis=basis,
            typical=None if fix.typical is None else (fix.typical.lo, fix.typical.hi),
            typical_source=None if fix.typical is None else fix.typical.source,
            auto=fix.auto,
            changes_numerics=fix.changes_numerics,
            needs_consent=fix.needs_consent,
            unverified_requirements=unknown,
            snippet=_snippet(fix, finding),
        )
        if advice is not None:  # the value to try, for the plan (optim_runner.plan)
            entry.params = {"threads": advice.threads}
            entry.evidence = advice.why
            entry.snippet = f"torch.set_num_threads({advice.threads})  # {advice.why}"
        chosen.append(entry)
    chosen.sort(key=lambda f: f.predicted_speedup or 0.0, reverse=True)
    finding.fixes = chosen


def thread_advice(finding: Finding, ev: Evidence) -> tuple[ThreadAdvice | None, str]:
    """(the thread count the evidence points to, or None; why not when None).

    Evidence, in order: tiny operators (host overhead) while the job runs more than one
    intra-op thread: 1; more intra-op threads than the cores the job may use: one per
    core; DataLoader workers busy on the CPU beside the intra-op threads, together more
    than the cores: the cores the workers leave. The count is always below the job's own
    (trying the count it already runs measures nothing).
    """
    current, cores = _job_threads(ev), _job_cores(ev)
    if current is None or cores is None:
        return None, "the job's thread count or cores were not recorded"
    busy, beside = _busy_workers(ev)
    if finding.subtype == "host_overhead" and current > 1:
        why = (
            f"tiny operators (host overhead) while the job runs {current} intra-op "
            "threads: waking them costs more than they give; 1 thread"
        )
        return ThreadAdvice(1, current, cores, "tiny_ops", why), ""
    free = max(1, cores - busy)
    if current > cores and free < current:
        why = f"{current} intra-op threads on {_n(cores, 'core')} the job may use (oversubscribed)"
        if busy:
            why += f", beside {busy} CPU-busy DataLoader workers"
        return ThreadAdvice(free, current, cores, "oversubscribed", why + f": {free}"), ""
    if busy and current + busy > cores and free < current:
        why = (
            f"{busy} CPU-busy DataLoader workers ({beside:.0f} % CPU beside the busiest "
            f"process) and {current} intra-op threads exceed the {_n(cores, 'core')}: "
            f"{free} leave the workers theirs"
        )
        return ThreadAdvice(free, current, cores, "busy_workers", why), ""
    return None, (
        f"no evidence the thread count is wrong: {_n(current, 'intra-op thread')} "
        f"on {_n(cores, 'core')}"
    )


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _job_threads(ev: Evidence) -> int | None:
    """Intra-op threads of the job's (rank 0) process: its own last reading, else the
    one taken at its first step."""
    value = ev.context.settings.get("threads") or ((ev.run or {}).get("device") or {}).get(
        "threads"
    )
    return int(value) if value else None


def _job_cores(ev: Evidence) -> int | None:
    """Cores the job may use: the CPU affinity it was started with, else the machine's
    count (as ``plan.job_cores``, but never this machine's: the run may be another's)."""
    run = ev.run or {}
    env, device = run.get("env") or {}, run.get("device") or {}
    for value in (
        env.get("cpu_affinity"),
        device.get("cpu_count"),
        env.get("cpu_count"),
        ev.context.cpu_count,
    ):
        if value:
            return int(value)
    return None


def _busy_workers(ev: Evidence) -> tuple[int, float]:
    """(DataLoader workers busy on the CPU, the CPU % they were seen to use).

    The sampler records the process tree's CPU and its busiest process's. What runs
    beside the busiest process (the main one, when it runs the model) is the workers:
    at least half a core of it (the plan's LOADER_BUSY_PERCENT) means they compute
    rather than wait, and each full core of it counts one busy worker.
    """
    workers = max((int(ld.get("num_workers") or 0) for ld in ev.context.loaders), default=0)
    total = ev.system.get("proc.cpu_percent.mean")
    top = ev.system.get("proc.cpu_max_process_percent.mean")
    if not workers or total is None or top is None:
        return 0, 0.0
    beside = max(0.0, total - top)
    if beside < LOADER_BUSY_PERCENT:
        return 0, beside
    return min(workers, max(1, round(beside / 100))), beside


def _snippet(fix: Fix, finding: Finding) -> str:
    """The catalog snippet, plus the operators that synced for the sync advice."""
    if fix.id != "avoid_syncs":
        return fix.snippet
    ops = [e.text for e in finding.evidence if "synchronised" in e.text]
    if not ops:
        return fix.snippet
    return "# synchronised in this run:\n" + "".join(f"#   {t}\n" for t in ops) + fix.snippet
