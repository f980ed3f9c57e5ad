"""Page-locked host memory for batches (``pin_memory=True``)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.points import LoaderCall
from stepscope.fixes.requirements import all_loaders


def _on_loader(call: LoaderCall, params: dict[str, Any]) -> None:
    import torch  # in the job: imported already

    if torch.cuda.is_available():
        call.want("pin_memory", True)
    else:
        call.refuse("no CUDA device")


FIX = Fix(
    id="pin_memory",
    title="Pin host memory for batches (pin_memory=True)",
    addresses=("io/input_pipeline", "communication/host_device"),
    requires=("cuda", "dataloader"),
    changes_numerics=False,
    auto=True,
    why="copies from page-locked memory run at full PCIe speed and can be asynchronous",
    snippet="DataLoader(dataset, num_workers=4, pin_memory=True)",
    in_effect=lambda c: all_loaders(c, lambda ld: bool(ld.get("pin_memory"))),
    removes=0.5,
    target="a DataLoader",
    on_loader=_on_loader,
)
