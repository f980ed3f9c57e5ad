"""Gradients as views of DDP's buckets (``gradient_as_bucket_view=True``)."""

from __future__ import annotations

from stepscope.fixes.base import Fix
from stepscope.fixes.catalog.ddp_bucket_cap import ddp_setting

FIX = Fix(
    id="ddp_gradient_as_bucket_view",
    title="Gradients as views of DDP's buckets (gradient_as_bucket_view)",
    addresses=("communication/collectives", "memory/capacity"),
    requires=("ddp",),
    changes_numerics=False,
    auto=True,
    why="saves one copy of every gradient into and out of the buckets per step",
    snippet="DDP(model, gradient_as_bucket_view=True)",
    in_effect=lambda c: ddp_setting(c, "gradient_as_bucket_view"),
    removes=0.2,
    target="a DistributedDataParallel model",
    ddp_kwargs=lambda params: {"gradient_as_bucket_view": True},
)
