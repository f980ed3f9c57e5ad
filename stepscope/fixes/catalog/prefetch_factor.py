"""Prefetch more batches per DataLoader worker (``prefetch_factor``)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.points import LoaderCall
from stepscope.fixes.requirements import all_loaders

# Twice torch's default of 2 per worker: enough to absorb latency spikes without holding
# many batches in memory.
PREFETCH_FACTOR = 4


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    return {"prefetch_factor": PREFETCH_FACTOR}, "twice torch's default of 2 per worker"


def _on_loader(call: LoaderCall, params: dict[str, Any]) -> None:
    if call.workers > 0:  # torch refuses prefetch_factor without workers
        call.want("prefetch_factor", int(params.get("prefetch_factor") or PREFETCH_FACTOR))


FIX = Fix(
    id="prefetch_factor",
    title="Prefetch more batches per worker (prefetch_factor)",
    addresses=("io/input_pipeline", "io/storage"),
    requires=("dataloader",),
    changes_numerics=False,
    auto=True,
    why="a deeper queue absorbs slow or uneven batches (storage latency spikes)",
    snippet="DataLoader(dataset, num_workers=4, prefetch_factor=4)",
    in_effect=lambda c: all_loaders(c, lambda ld: (ld.get("prefetch_factor") or 2) > 2),
    removes=0.5,
    phases=("data_wait",),
    target="a DataLoader with workers",
    needs="dataloader_workers",
    choose_params=_choose_params,
    on_loader=_on_loader,
)
