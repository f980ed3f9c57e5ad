"""Replace ``nn.DataParallel`` with DistributedDataParallel: advice, a code change."""

from __future__ import annotations

from stepscope.fixes.base import Fix, Typical

FIX = Fix(
    id="dataparallel_to_ddp",
    title="Replace nn.DataParallel with DistributedDataParallel",
    addresses=("communication/collectives", "compute/host_overhead"),
    requires=("dataparallel",),
    changes_numerics=False,
    auto=False,
    why="DataParallel scatters inputs and gathers outputs through one Python process "
    "every step; DDP runs one process per GPU and overlaps the all-reduce with backward",
    snippet="torchrun --nproc_per_node=N train.py\n"
    "model = DDP(model.to(local_rank), device_ids=[local_rank])",
    typical=Typical(
        1.2,
        3.0,
        "PyTorch docs 'DataParallel vs DistributedDataParallel': DDP is "
        "significantly faster, even on a single machine",
    ),
)
