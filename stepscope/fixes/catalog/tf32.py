"""TF32 for float32 matmuls and convolutions (NVIDIA Ampere and later; numerics change)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.points import Change
from stepscope.types import JobContext


def _tf32_on(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    if not settings:
        return None
    return bool(settings.get("tf32_matmul")) or settings.get("float32_matmul_precision") in (
        "high",
        "medium",
    )


def _set_global(torch: Any, params: dict[str, Any]) -> Change:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return Change(
        "allow_tf32 = True (matmul and cuDNN)",
        verified=bool(torch.backends.cuda.matmul.allow_tf32),
        changed=not before,
    )


FIX = Fix(
    id="tf32",
    title="TF32 for float32 matmuls and convolutions (Ampere+)",
    addresses=("compute/device_compute",),
    requires=("cuda", "tf32"),
    changes_numerics=True,
    auto=True,
    why="float32 GEMMs run on Tensor Cores with a 10-bit mantissa; no code change "
    "beyond one setting",
    snippet="torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True",
    typical=Typical(
        1.1,
        2.0,
        "PyTorch docs, CUDA semantics § TensorFloat-32 (matmuls several x faster on "
        "A100); the end-to-end gain depends on the share of float32 GEMM time",
    ),
    phases=("forward", "backward"),  # the model's work: its gain is bounded by theirs
    in_effect=_tf32_on,
    set_global=_set_global,
)
