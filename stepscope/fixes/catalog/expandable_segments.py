"""Expandable CUDA allocator segments, set through the job's environment.

The CUDA allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` once, before the bootstrap could
change it, so the runner sets it when it starts the trial (``env``), keeping any option
the job already has.

Expandable segments answer fragmentation only. Where the allocator's snapshot of an
out-of-memory error says which it was (``ev.allocator``, an ``AllocatorSnapshot``:
``fragmented``, ``explanation()``), the advice follows it: offered with that sentence
when the request fitted in the free total but in no free block, left out when it was
larger than all the free memory (no layout of the segments would have fitted it).
Without a snapshot it is offered as before.
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Advice, Fix
from stepscope.types import Finding, JobContext


def _expandable(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    if not settings:
        return None
    return "expandable_segments:true" in str(settings.get("alloc_conf") or "").lower()


def _advise(finding: Finding, ev: Any) -> Advice | str:
    """Follow the OOM snapshot's verdict on fragmentation (``ev.allocator``; None or
    absent: no snapshot, offered as before)."""
    snapshot = getattr(ev, "allocator", None)
    fragmented = getattr(snapshot, "fragmented", None)
    if fragmented is False:
        return (
            "the allocator snapshot shows no fragmentation: the failing request was larger "
            "than all the free memory"
        )
    if fragmented and getattr(snapshot, "expandable", False):
        return "already in effect: the allocator snapshot's segments are expandable"
    if fragmented:
        return Advice(evidence=f"the allocator snapshot: {snapshot.explanation()}")
    return Advice()


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
    advise=_advise,
)
