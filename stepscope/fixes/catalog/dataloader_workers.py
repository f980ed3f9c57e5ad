"""DataLoader worker processes (``num_workers``): the headline fix of an input-bound loop.

How many: a loader whose ``__getitem__`` waits on storage or the network leaves the CPU
idle while it waits, so more workers than cores overlap the waits: 2x the cores, capped
at 8 (beyond that, start-up time and memory grow faster than the overlap). A loader that
decodes and augments on the CPU gets one worker per core: more would only time-slice the
same cores. Which of the two it is comes from the baseline's samples (the plan's
``loader_wait``: the process tree's CPU while the loop waits for data).
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.points import LoaderCall
from stepscope.fixes.requirements import all_loaders
from stepscope.types import JobContext

IO_WORKERS_PER_CORE = 2
MAX_WORKERS = 8
# A loading process below half a core while the loop waits for it is waiting itself (the
# same threshold as the diagnosis's "waiting process" rule).
LOADER_BUSY_PERCENT = 50.0


def choose_num_workers(cores: int, wait_kind: str) -> int:
    """Workers for a loader: overlap waits (2x cores, max 8), or one per core for CPU work."""
    cores = max(1, cores)
    if wait_kind == "io":
        return min(MAX_WORKERS, IO_WORKERS_PER_CORE * cores)
    return min(MAX_WORKERS, cores)


def _enough_workers(ctx: JobContext) -> bool | None:
    # More workers than cores still help when __getitem__ waits on storage, so only a
    # loader that already has a worker per core counts as done.
    cores = ctx.cpu_count or 2
    return all_loaders(ctx, lambda ld: ld.get("num_workers", 0) >= max(2, cores))


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    """``ctx``: the plan's context (``cores``, ``wait``: kind and basis, ``planned_workers``)."""
    workers = ctx.planned_workers()
    cores, wait = ctx.cores, ctx.wait
    if wait.kind == "io":
        why = f"{workers} = 2 x {cores} cores (max {MAX_WORKERS}): {wait.basis}"
    elif wait.kind == "cpu":
        why = f"{workers} = one per core: {wait.basis}"
    else:
        why = f"{workers} = one per core ({wait.basis})"
    return {"num_workers": workers}, why


def _on_loader(call: LoaderCall, params: dict[str, Any]) -> None:
    if call.iterable:
        call.refuse("an IterableDataset would yield every sample once per worker")
        return
    call.want("num_workers", int(params.get("num_workers") or 2))


FIX = Fix(
    id="dataloader_workers",
    title="Load batches in DataLoader worker processes (num_workers)",
    addresses=("io/input_pipeline", "io/storage"),
    requires=("dataloader",),
    changes_numerics=False,
    auto=True,
    why="workers prepare the next batches while the main process trains, so the "
    "loop stops waiting for __getitem__ and collate",
    snippet="loader = DataLoader(dataset, batch_size=..., num_workers=4,\n"
    "                    persistent_workers=True, prefetch_factor=4)",
    in_effect=_enough_workers,
    phases=("data_wait",),
    target="a DataLoader (the job feeds its model without one)",
    choose_params=_choose_params,
    on_loader=_on_loader,
)
