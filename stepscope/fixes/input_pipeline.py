"""Fixes for the input pipeline (I/O) and host-to-device copies."""

from __future__ import annotations

from stepscope.fixes.base import Fix, JobContext, _all_loaders

# A loading process below half a core while the loop waits for it is waiting itself (the
# same threshold as the diagnosis's "waiting process" rule).
LOADER_BUSY_PERCENT = 50.0


def _enough_workers(ctx: JobContext) -> bool | None:
    # More workers than cores still help when __getitem__ waits on storage, so only a
    # loader that already has a worker per core counts as done.
    cores = ctx.cpu_count or 2
    return _all_loaders(ctx, lambda ld: ld.get("num_workers", 0) >= max(2, cores))


FIXES = (
    Fix(
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
    ),
    Fix(
        id="persistent_workers",
        title="Keep DataLoader workers alive between epochs (persistent_workers)",
        addresses=("io/input_pipeline",),
        requires=("dataloader",),
        changes_numerics=False,
        auto=True,
        why="without it every epoch (every iter(loader)) starts the workers again and "
        "the first batches of each epoch wait for the start-up",
        snippet="DataLoader(dataset, num_workers=4, persistent_workers=True)",
        in_effect=lambda c: _all_loaders(c, lambda ld: bool(ld.get("persistent_workers"))),
        removes=0.3,
    ),
    Fix(
        id="prefetch_factor",
        title="Prefetch more batches per worker (prefetch_factor)",
        addresses=("io/input_pipeline", "io/storage"),
        requires=("dataloader",),
        changes_numerics=False,
        auto=True,
        why="a deeper queue absorbs slow or uneven batches (storage latency spikes)",
        snippet="DataLoader(dataset, num_workers=4, prefetch_factor=4)",
        in_effect=lambda c: _all_loaders(c, lambda ld: (ld.get("prefetch_factor") or 2) > 2),
        removes=0.5,
    ),
    Fix(
        id="pin_memory",
        title="Pin host memory for batches (pin_memory=True)",
        addresses=("io/input_pipeline", "communication/host_device"),
        requires=("cuda", "dataloader"),
        changes_numerics=False,
        auto=True,
        why="copies from page-locked memory run at full PCIe speed and can be asynchronous",
        snippet="DataLoader(dataset, num_workers=4, pin_memory=True)",
        in_effect=lambda c: _all_loaders(c, lambda ld: bool(ld.get("pin_memory"))),
        removes=0.5,
    ),
    Fix(
        id="non_blocking_copies",
        title="Copy batches to the GPU asynchronously (non_blocking=True)",
        addresses=("communication/host_device",),
        requires=("cuda",),
        changes_numerics=False,
        auto=False,
        why="with pinned memory, .to(device, non_blocking=True) lets the copy overlap "
        "with the kernels already queued instead of stalling the host",
        snippet="x = x.to(device, non_blocking=True)\ny = y.to(device, non_blocking=True)",
        removes=0.8,
    ),
)
