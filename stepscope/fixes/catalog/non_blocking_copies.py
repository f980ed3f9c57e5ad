"""Asynchronous host-to-device copies (``non_blocking=True``): advice, a code change."""

from __future__ import annotations

from stepscope.fixes.base import Fix

FIX = Fix(
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
)
