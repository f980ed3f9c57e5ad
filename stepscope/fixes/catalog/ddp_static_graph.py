"""Declare DDP's graph static (``static_graph=True``)."""

from __future__ import annotations

from stepscope.fixes.base import Fix
from stepscope.fixes.catalog.ddp_bucket_cap import ddp_setting

FIX = Fix(
    id="ddp_static_graph",
    title="Declare the graph static (static_graph=True)",
    addresses=("communication/collectives",),
    requires=("ddp",),
    changes_numerics=False,
    auto=True,
    why="DDP stops searching for unused parameters each step and can reorder buckets "
    "to overlap better",
    snippet="DDP(model, static_graph=True)",
    in_effect=lambda c: ddp_setting(c, "static_graph"),
    removes=0.2,
    target="a DistributedDataParallel model",
    ddp_kwargs=lambda params: {"static_graph": True},
)
