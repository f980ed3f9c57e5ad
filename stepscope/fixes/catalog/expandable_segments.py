"""Expandable CUDA allocator segments, set through the job's environment.

The CUDA allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` once, before the bootstrap could
change it, so the runner sets it when it starts the trial (``env``), keeping any option
the job already has.
"""

from __future__ import annotations

from stepscope.fixes.base import Fix
from stepscope.types import JobContext


def _expandable(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    if not settings:
        return None
    return "expandable_segments:true" in str(settings.get("alloc_conf") or "").lower()


FIX = Fix(
    id="expandable_segments",
    title="Expandable allocator segments (PYTORCH_CUDA_ALLOC_CONF)",
    addresses=("memory/capacity",),
    requires=("cuda",),
    changes_numerics=False,
    auto=True,
    why="segments that grow in place stop fragmentation (reserved far above "
    "allocated) and the OOMs and allocator retries it causes",
    snippet="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py",
    in_effect=_expandable,
    removes=0.0,
    env=("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
)
