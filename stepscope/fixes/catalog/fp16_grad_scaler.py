"""fp16 mixed precision with GradScaler: advice only (loss scaling changes the loop)."""

from __future__ import annotations

from stepscope.fixes.base import Fix
from stepscope.fixes.catalog.bf16_autocast import AMP_TYPICAL, low_precision

FIX = Fix(
    id="fp16_grad_scaler",
    title="fp16 mixed precision with GradScaler (Volta/Turing)",
    addresses=("compute/device_compute", "memory/bandwidth"),
    requires=("cuda", "training"),
    changes_numerics=True,
    auto=False,
    why="fp16 needs loss scaling against gradient underflow, which changes the "
    "training loop, so it is advice only",
    snippet="scaler = torch.amp.GradScaler('cuda')\n"
    "with torch.autocast('cuda', dtype=torch.float16):\n"
    "    loss = loss_fn(model(x), y)\n"
    "scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()",
    typical=AMP_TYPICAL,  # it needs CUDA and training: the jobs that figure measured
    phases=("forward", "backward"),  # the model's work: its gain is bounded by theirs
    in_effect=low_precision,
)
