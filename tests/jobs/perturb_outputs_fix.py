"""A test fix from outside the catalog (``STEPSCOPE_FIX_MODULES=perturb_outputs_fix``):
it adds noise to the model's outputs, as a broken int8 or bf16 conversion would move
them, so that the output guard has a candidate to fail.

Applied at the model's first call by wrapping its forward (the first call itself runs
unchanged: it is already under way); ``scale`` is the noise's size relative to the
output's standard deviation.
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.points import Change, ModelCall

NOISE_SCALE = 3.0


def _on_model(call: ModelCall, params: dict[str, Any]) -> None:
    torch = call.torch
    scale = float(params.get("scale", NOISE_SCALE))
    forward = call.module.forward

    def noisy(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        return out + scale * out.detach().std() * torch.randn_like(out)

    call.module.forward = noisy
    call.record(Change(f"outputs perturbed (noise {scale} x their std)", verified=True))


FIX = Fix(
    id="perturb_outputs",
    title="Perturb the model's outputs (a test fix)",
    addresses=("compute/device_compute",),
    requires=(),
    changes_numerics=True,
    auto=True,
    snippet="# a test fix: nothing to write",
    why="stands for a numerics change gone wrong, for the output guard's tests",
    target="the model's outputs",
    on_model=_on_model,
)
