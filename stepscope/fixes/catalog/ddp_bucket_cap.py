"""DDP's gradient bucket size (``bucket_cap_mb``)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.types import JobContext

# Doubling DDP's 25 MB default halves the number of all-reduce calls; latency-bound links
# (gloo, Ethernet) gain most, and the buckets stay small enough to overlap with backward.
DDP_BUCKET_CAP_MB = 50


def ddp_setting(ctx: JobContext, key: str) -> bool | None:
    """A DDP setting the job reported (None: no DDP model seen)."""
    ddp = ctx.model.get("ddp") if ctx.model else None
    return bool(ddp.get(key)) if ddp else None


def _bucket_tuned(ctx: JobContext) -> bool | None:
    ddp = ctx.model.get("ddp") if ctx.model else None
    if not ddp:
        return None
    return abs(float(ddp.get("bucket_cap_mb") or 25.0) - 25.0) > 0.5  # 25 MB: torch's default


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    return {"bucket_cap_mb": DDP_BUCKET_CAP_MB}, "twice DDP's 25 MB: half the all-reduces"


FIX = Fix(
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
    target="a DistributedDataParallel model",
    choose_params=_choose_params,
    ddp_kwargs=lambda params: {"bucket_cap_mb": int(params.get("bucket_cap_mb") or 50)},
)
