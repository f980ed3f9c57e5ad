"""bf16 gradient compression for DDP's all-reduce (a comm hook; numerics change)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.catalog.ddp_bucket_cap import ddp_setting
from stepscope.fixes.points import Change


def _after_ddp(ddp: Any, params: dict[str, Any]) -> Change:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return Change("bf16_compress_hook registered", verified=True)


FIX = Fix(
    id="ddp_bf16_compression",
    title="Compress gradients to bf16 for the all-reduce (DDP comm hook)",
    addresses=("communication/collectives",),
    requires=("ddp", "nccl"),  # bf16_compress_hook: NCCL's, no bf16 all-reduce on gloo
    changes_numerics=True,
    auto=True,
    why="halves the bytes every all-reduce moves",
    snippet="from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
    "model.register_comm_hook(None, default_hooks.bf16_compress_hook)",
    in_effect=lambda c: ddp_setting(c, "comm_hook"),
    removes=0.5,
    target="a DistributedDataParallel model",
    after_ddp=_after_ddp,
)
