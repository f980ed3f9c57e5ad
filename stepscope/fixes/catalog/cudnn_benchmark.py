"""Let cuDNN autotune its convolution algorithms (``cudnn.benchmark``)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.points import Change
from stepscope.types import JobContext


def _cudnn_benchmark(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    return bool(settings.get("cudnn_benchmark")) if settings else None


def _set_global(torch: Any, params: dict[str, Any]) -> Change:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    return Change(
        "torch.backends.cudnn.benchmark = True",
        verified=bool(torch.backends.cudnn.benchmark),
        changed=not before,
    )


FIX = Fix(
    id="cudnn_benchmark",
    title="Let cuDNN pick the fastest convolution algorithms (cudnn.benchmark)",
    addresses=("compute/device_compute",),
    requires=("cuda", "conv2d"),
    changes_numerics=False,
    auto=True,
    why="autotunes each convolution shape once; pays off when input shapes are fixed",
    snippet="torch.backends.cudnn.benchmark = True",
    typical=Typical(1.05, 1.1, "PyTorch Performance Tuning Guide (cudnn.benchmark)"),
    phases=("forward", "backward"),  # the model's work: its gain is bounded by theirs
    in_effect=_cudnn_benchmark,
    set_global=_set_global,
)
