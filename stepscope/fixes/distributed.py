"""Fixes for collective communication in data-parallel training."""

from __future__ import annotations

from stepscope.fixes.base import Fix, JobContext, Typical


def _ddp(ctx: JobContext, key: str) -> bool | None:
    ddp = ctx.model.get("ddp") if ctx.model else None
    return bool(ddp.get(key)) if ddp else None


def _bucket_tuned(ctx: JobContext) -> bool | None:
    ddp = ctx.model.get("ddp") if ctx.model else None
    if not ddp:
        return None
    return abs(float(ddp.get("bucket_cap_mb") or 25.0) - 25.0) > 0.5  # 25 MB: torch's default


FIXES = (
    Fix(
        id="ddp_bucket_cap",
        title="Tune DDP's gradient bucket size (bucket_cap_mb)",
        addresses=("communication/collectives",),
        requires=("ddp",),
        changes_numerics=False,
        auto=True,
        why="bigger buckets mean fewer all-reduce calls (latency-bound links); smaller "
        "ones start communicating earlier in backward (more overlap)",
        snippet="DDP(model, bucket_cap_mb=50)",
        in_effect=_bucket_tuned,
        removes=0.3,
    ),
    Fix(
        id="ddp_gradient_as_bucket_view",
        title="Gradients as views of DDP's buckets (gradient_as_bucket_view)",
        addresses=("communication/collectives", "memory/capacity"),
        requires=("ddp",),
        changes_numerics=False,
        auto=True,
        why="saves one copy of every gradient into and out of the buckets per step",
        snippet="DDP(model, gradient_as_bucket_view=True)",
        in_effect=lambda c: _ddp(c, "gradient_as_bucket_view"),
        removes=0.2,
    ),
    Fix(
        id="ddp_static_graph",
        title="Declare the graph static (static_graph=True)",
        addresses=("communication/collectives",),
        requires=("ddp",),
        changes_numerics=False,
        auto=True,
        why="DDP stops searching for unused parameters each step and can reorder buckets "
        "to overlap better",
        snippet="DDP(model, static_graph=True)",
        in_effect=lambda c: _ddp(c, "static_graph"),
        removes=0.2,
    ),
    Fix(
        id="ddp_bf16_compression",
        title="Compress gradients to bf16 for the all-reduce (DDP comm hook)",
        addresses=("communication/collectives",),
        requires=("ddp",),
        changes_numerics=True,
        auto=True,
        why="halves the bytes every all-reduce moves",
        snippet="from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "model.register_comm_hook(None, default_hooks.bf16_compress_hook)",
        in_effect=lambda c: _ddp(c, "comm_hook"),
        removes=0.5,
    ),
    Fix(
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
    ),
)
