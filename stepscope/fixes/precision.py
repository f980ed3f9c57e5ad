"""Lower-precision arithmetic: bf16 autocast, fp16 with GradScaler, TF32."""

from __future__ import annotations

from stepscope.fixes.base import Fix, JobContext, Typical

AMP_TYPICAL = Typical(
    1.4,
    2.0,
    "NVIDIA 'Train With Mixed Precision' guide and the PyTorch AMP recipe: "
    "1.5-2x on Tensor Core GPUs (V100/A100) for GEMM/conv-heavy networks",
)


def _low_precision(ctx: JobContext) -> bool | None:
    model = ctx.model
    if not model:
        return None
    return bool(model.get("autocast")) or model.get("param_dtype") in ("bfloat16", "float16")


def _tf32_on(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    if not settings:
        return None
    return bool(settings.get("tf32_matmul")) or settings.get("float32_matmul_precision") in (
        "high",
        "medium",
    )


FIXES = (
    Fix(
        id="bf16_autocast",
        title="bf16 mixed precision (torch.autocast)",
        addresses=("compute/device_compute", "memory/bandwidth", "memory/capacity"),
        requires=("fast_bf16",),
        changes_numerics=True,
        auto=True,
        why="GEMMs and convolutions run on Tensor Cores (or a CPU's native bf16 units) and "
        "activations take half the bytes; bf16 keeps float32's range, so no loss scaling "
        "is needed",
        snippet="with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):\n"
        "    loss = loss_fn(model(x), y)\nloss.backward()  # outside autocast",
        typical=AMP_TYPICAL,
        in_effect=_low_precision,
    ),
    Fix(
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
        typical=AMP_TYPICAL,
        in_effect=_low_precision,
    ),
    Fix(
        id="tf32",
        title="TF32 for float32 matmuls and convolutions (Ampere+)",
        addresses=("compute/device_compute",),
        requires=("cuda", "tf32"),
        changes_numerics=True,
        auto=True,
        why="float32 GEMMs run on Tensor Cores with a 10-bit mantissa; no code change "
        "beyond one setting",
        snippet="torch.backends.cuda.matmul.allow_tf32 = True\n"
        "torch.backends.cudnn.allow_tf32 = True",
        typical=Typical(
            1.1,
            2.0,
            "PyTorch docs, CUDA semantics § TensorFloat-32 (matmuls several x faster on "
            "A100); the end-to-end gain depends on the share of float32 GEMM time",
        ),
        in_effect=_tf32_on,
    ),
)
