"""bf16 mixed precision: the model's forward under ``torch.autocast`` (numerics change)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.fitting import CUDA, INFERENCE, TRAINING, fit_by_job
from stepscope.fixes.points import Change, ModelCall
from stepscope.types import JobContext

AMP_TYPICAL = Typical(
    1.4,
    2.0,
    "NVIDIA 'Train With Mixed Precision' guide and the PyTorch AMP recipe: "
    "1.5-2x on Tensor Core GPUs (V100/A100) for GEMM/conv-heavy networks",
)

# The figure above was measured training on Tensor Core GPUs: it is cited to CUDA
# training jobs only; a CPU job (its bf16 units are not Tensor Cores) and an inference
# job (no backward, no optimizer in its step) get no figure rather than that one.
SNIPPETS = {
    TRAINING: "with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):\n"
    "    loss = loss_fn(model(x), y)\nloss.backward()  # outside autocast",
    INFERENCE: "with torch.inference_mode(), torch.autocast(\n"
    "    device_type=x.device.type, dtype=torch.bfloat16\n"
    "):\n    out = model(x)",
}


def low_precision(ctx: JobContext) -> bool | None:
    """The job already runs in 16 bits (autocast, or bf16/fp16 weights)."""
    model = ctx.model
    if not model:
        return None
    return bool(model.get("autocast")) or model.get("param_dtype") in ("bfloat16", "float16")


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    """``ctx.settings``: what the job reported (``cpu_bf16``: native bf16 on its CPU)."""
    if ctx.settings.get("cpu_bf16"):
        return {"cpu": True}, "the CPU runs bf16 natively (AVX512-BF16 or AMX)"
    return {}, ""


def _on_model(call: ModelCall, params: dict[str, Any]) -> None:
    """Around the forward only: backward runs outside autocast, as the AMP recipe says."""
    torch, device = call.torch, call.device.type
    if device != "cuda" and not params.get("cpu"):
        call.record(
            Change("not applied: CPU job (bf16 only on CUDA unless the plan sets cpu=true)", False)
        )
        return
    call.autocast_dtype = torch.bfloat16
    # this first call is already under way: it runs under autocast from here
    call.autocast_ctx = torch.autocast(device, dtype=torch.bfloat16)
    call.autocast_ctx.__enter__()
    call.record(
        Change(
            f"forward of {type(call.inner).__name__} under torch.autocast({device!r}, bfloat16)",
            verified=bool(torch.is_autocast_enabled(device))
            and torch.get_autocast_dtype(device) == torch.bfloat16,
        )
    )


FIX = Fix(
    id="bf16_autocast",
    title="bf16 mixed precision (torch.autocast)",
    addresses=("compute/device_compute", "memory/bandwidth", "memory/capacity"),
    requires=("fast_bf16",),
    changes_numerics=True,
    auto=True,
    why="GEMMs and convolutions run on Tensor Cores (or a CPU's native bf16 units) and "
    "activations take half the bytes; bf16 keeps float32's range, so no loss scaling "
    "is needed",
    snippet=SNIPPETS[TRAINING],
    typical=AMP_TYPICAL,
    phases=("forward", "backward"),
    fit=fit_by_job({(CUDA, TRAINING): AMP_TYPICAL}, SNIPPETS),
    in_effect=low_precision,
    target="a model called at top level",
    choose_params=_choose_params,
    on_model=_on_model,
)
