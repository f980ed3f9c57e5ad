"""Fixes for device memory capacity: checkpointing and the allocator."""

from __future__ import annotations

from stepscope.fixes.base import Fix, JobContext


def _expandable(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    if not settings:
        return None
    return "expandable_segments:true" in str(settings.get("alloc_conf") or "").lower()


FIXES = (
    Fix(
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
    ),
    Fix(
        id="gradient_checkpointing",
        title="Activation (gradient) checkpointing of repeated blocks",
        addresses=("memory/capacity",),
        requires=("training",),
        changes_numerics=False,
        auto=False,
        why="recomputes block activations in backward instead of keeping them: about a "
        "third more compute for much less memory, which makes room for a larger batch",
        snippet="from torch.utils.checkpoint import checkpoint\n"
        "x = checkpoint(block, x, use_reentrant=False)",
        removes=0.0,
    ),
)
