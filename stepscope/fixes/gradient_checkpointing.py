"""Activation (gradient) checkpointing of repeated blocks: advice, a code change."""

from __future__ import annotations

from stepscope.fixes.base import Fix

FIX = Fix(
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
)
