"""Keep DataLoader workers alive between epochs (``persistent_workers``)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.points import LoaderCall
from stepscope.fixes.requirements import all_loaders


def _on_loader(call: LoaderCall, params: dict[str, Any]) -> None:
    if call.workers > 0:  # without workers there is nothing to keep alive
        call.want("persistent_workers", True)


FIX = Fix(
    id="persistent_workers",
    title="Keep DataLoader workers alive between epochs (persistent_workers)",
    addresses=("io/input_pipeline",),
    requires=("dataloader", "several_epochs"),  # a one-epoch job starts its workers once
    changes_numerics=False,
    auto=True,
    why="without it every epoch (every iter(loader)) starts the workers again and "
    "the first batches of each epoch wait for the start-up",
    snippet="DataLoader(dataset, num_workers=4, persistent_workers=True)",
    in_effect=lambda c: all_loaders(c, lambda ld: bool(ld.get("persistent_workers"))),
    removes=0.3,
    phases=("data_wait",),
    target="a DataLoader with workers",
    needs="dataloader_workers",
    on_loader=_on_loader,
)
