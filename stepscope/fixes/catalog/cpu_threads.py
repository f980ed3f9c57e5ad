"""The CPU's intra-op thread count (``torch.set_num_threads``), only with evidence.

Offered only with evidence that the count is wrong, and with the count that evidence
points to (``thread_advice``): more intra-op threads than the cores the job may use;
DataLoader workers busy on the CPU beside the intra-op threads, together more than the
cores; or tiny operators (host overhead) with several threads. Without such evidence,
trying 1 thread or half the cores only ever measured slower (0.62-0.87x in every
experiment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.fixes.base import Advice, Fix
from stepscope.fixes.catalog import dataloader_workers
from stepscope.fixes.catalog.dataloader_workers import LOADER_BUSY_PERCENT
from stepscope.fixes.points import Change
from stepscope.types import Finding


@dataclass(frozen=True)
class ThreadAdvice:
    """The intra-op thread count the evidence points to, and the evidence."""

    threads: int  # the count to try
    current: int  # intra-op threads the job runs (torch.get_num_threads)
    cores: int  # cores the job may use (its CPU affinity)
    rule: str  # 'oversubscribed' | 'busy_workers' | 'tiny_ops'
    why: str


# -- advice (the diagnosis) --------------------------------------------------------------
def thread_advice(finding: Finding, ev: Any) -> tuple[ThreadAdvice | None, str]:
    """(the thread count the evidence points to, or None; why not when None).

    ``ev``: the analyzers' evidence (``context``, ``run``, ``system``). Evidence, in
    order: tiny operators (host overhead) while the job runs more than one intra-op
    thread: 1; more intra-op threads than the cores the job may use: one per core;
    DataLoader workers busy on the CPU beside the intra-op threads, together more than
    the cores: the cores the workers leave. The count is always below the job's own
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


def _advise(finding: Finding, ev: Any) -> Advice | str:
    advice, reason = thread_advice(finding, ev)
    if advice is None:
        return reason
    return Advice(
        params={"threads": advice.threads},
        evidence=advice.why,
        snippet=f"torch.set_num_threads({advice.threads})  # {advice.why}",
    )


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _job_threads(ev: Any) -> int | None:
    """Intra-op threads of the job's (rank 0) process: its own last reading, else the
    one taken at its first step."""
    value = ev.context.settings.get("threads") or ((ev.run or {}).get("device") or {}).get(
        "threads"
    )
    return int(value) if value else None


def _job_cores(ev: Any) -> int | None:
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


def _busy_workers(ev: Any) -> tuple[int, float]:
    """(DataLoader workers busy on the CPU, the CPU % they were seen to use).

    The sampler records the process tree's CPU and its busiest process's. What runs
    beside the busiest process (the main one, when it runs the model) is the workers:
    at least half a core of it (LOADER_BUSY_PERCENT) means they compute rather than
    wait, and each full core of it counts one busy worker.
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


# -- the count to try (the plan) ---------------------------------------------------------
def choose_threads(
    cores: int,
    finding: str | None,
    busy_workers: int,
    current: int | None = None,
    advised: int | None = None,
    advised_why: str | None = None,
) -> tuple[int, str]:
    """Intra-op threads to try: the count the evidence points to, never the job's own.

    ``current``: the threads the job runs; ``advised``: the count the diagnosis's
    evidence gave (``thread_advice``). In order: tiny ops (host overhead) -> 1; CPU-busy
    DataLoader workers beside the threads, together more than the cores -> the cores
    they leave; more threads than cores -> one per core; the diagnosis's advice; a job
    using fewer threads than cores (an explicit choice: the diagnosis does not offer it)
    -> one per core. Trying 1 thread or half the cores without such evidence only ever
    measured slower (0.62-0.87x), so when nothing points at a count other than the job's
    own this is a ValueError: an explicit choice with nothing to try (the diagnosis
    offers cpu_threads only with evidence).
    """
    cores = max(1, cores)
    if finding == "compute/host_overhead":
        if current == 1:
            raise ValueError(
                "cpu_threads: nothing to try: tiny ops want 1 intra-op thread, and the job "
                "already runs 1"
            )
        return 1, "tiny ops: waking intra-op threads costs more than they give"
    free = max(1, cores - busy_workers)
    if busy_workers and (current is None or current + busy_workers > cores):
        if free == current:
            raise ValueError(
                f"cpu_threads: nothing to try: the job already runs {current} intra-op "
                f"threads, what {busy_workers} CPU-busy DataLoader workers leave of {cores} cores"
            )
        return free, f"{cores} cores minus {busy_workers} CPU-busy DataLoader workers"
    if current is not None and current > cores:
        return (
            cores,
            f"the job runs {current} threads on {cores} cores (oversubscribed): one per core",
        )
    if advised is not None and advised != current:
        return int(advised), advised_why or "the diagnosis's evidence"
    if current is None or current < cores:
        known = "its thread count was not recorded" if current is None else f"it runs {current}"
        return cores, f"one per core ({cores}): {known} (measured, not predicted)"
    raise ValueError(
        f"cpu_threads: nothing to try: the job already runs {current} intra-op threads on "
        f"{cores} cores, and no evidence points at another count"
    )


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    """``ctx``: the plan's context (``cores``, ``ids``, ``wait``, ``planned_workers``,
    ``settings``, ``run``, ``advice(fix_id)``)."""
    busy = 0
    if dataloader_workers.FIX.id in ctx.ids and ctx.wait.kind != "io":
        busy = ctx.planned_workers()  # the workers this plan adds will be CPU-busy
    # what the job runs: its last own reading, else the one at its first step
    current = ctx.settings.get("threads") or (ctx.run.get("device") or {}).get("threads")
    advice = ctx.advice(FIX.id)  # the count the diagnosis's evidence pointed to
    threads, why = choose_threads(
        ctx.cores,
        finding,
        busy,
        current=int(current) if current else None,
        advised=advice.params.get("threads") if advice else None,
        advised_why=advice.evidence if advice else None,
    )
    return {"threads": threads}, why


# -- in the job --------------------------------------------------------------------------
def _set_global(torch: Any, params: dict[str, Any]) -> Change:
    n = int(params.get("threads") or 1)
    before = torch.get_num_threads()
    if before == n:
        return Change(f"the job already runs {n} threads", applied=False, changed=False)
    torch.set_num_threads(n)
    return Change(
        f"torch.set_num_threads({n}) (was {before})", verified=torch.get_num_threads() == n
    )


FIX = Fix(
    id="cpu_threads",
    title="Set the CPU thread count (torch.set_num_threads)",
    addresses=("compute/host_overhead", "compute/device_compute"),
    requires=("multi_core", "cpu_only"),
    changes_numerics=False,
    auto=True,
    why="more intra-op threads than cores time-slice the same cores, intra-op threads "
    "compete with CPU-busy DataLoader workers for them, and tiny ops pay for waking "
    "threads that have nothing to do",
    snippet="torch.set_num_threads(n)  # one per core; cores minus CPU-busy DataLoader "
    "workers; 1 for tiny ops",
    removes=0.3,
    advise=_advise,
    choose_params=_choose_params,
    set_global=_set_global,
)
