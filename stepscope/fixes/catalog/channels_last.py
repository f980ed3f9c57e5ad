"""NHWC (``channels_last``) memory format for a convolutional model and its inputs."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.fitting import CUDA, TRAINING, fit_by_job
from stepscope.fixes.points import Change, ModelCall, to_channels_last
from stepscope.types import JobContext

# Measured training torchvision models with AMP on NVIDIA GPUs: cited to CUDA training
# jobs only (a CPU's oneDNN convolutions and inference are not what it measured).
TUTORIAL_TYPICAL = Typical(
    1.08,
    1.35,
    "PyTorch tutorial 'Channels Last Memory Format': 8-35 % on torchvision models "
    "with AMP on Volta/Ampere",
)
SNIPPET = (
    "model = model.to(memory_format=torch.channels_last)\n"
    "x = x.to(memory_format=torch.channels_last)"
)


def _channels_last(ctx: JobContext) -> bool | None:
    return ctx.model.get("channels_last") if ctx.model else None


def _on_model(call: ModelCall, params: dict[str, Any]) -> None:
    torch = call.torch
    if not any(isinstance(m, torch.nn.Conv2d) for m in call.inner.modules()):
        call.record(Change("not applied: the model has no Conv2d", applied=False))
        return
    call.module.to(memory_format=torch.channels_last)
    call.new_args = tuple(to_channels_last(a, torch) for a in call.args)
    call.channels_last = True  # the installer converts the inputs of every later call
    weights = [p for p in call.inner.parameters() if p.dim() == 4]
    call.record(
        Change(
            f"{type(call.inner).__name__} and 4-D inputs in NHWC",
            verified=all(w.is_contiguous(memory_format=torch.channels_last) for w in weights),
        )
    )


FIX = Fix(
    id="channels_last",
    title="channels_last memory format for convolutions",
    addresses=("compute/device_compute", "memory/bandwidth"),
    requires=("conv2d",),
    changes_numerics=False,
    auto=True,
    why="NHWC is the layout Tensor Core convolutions and oneDNN want; NCHW costs "
    "layout-conversion kernels around each convolution",
    snippet=SNIPPET,
    typical=TUTORIAL_TYPICAL,
    phases=("forward", "backward"),
    fit=fit_by_job({(CUDA, TRAINING): TUTORIAL_TYPICAL}, SNIPPET),
    in_effect=_channels_last,
    target="a model with Conv2d layers",
    on_model=_on_model,
)
