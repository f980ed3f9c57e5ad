"""Fixes for compute and host overhead: compilation, layouts, optimizers, threads,
batch size, and synchronising calls."""

from __future__ import annotations

from stepscope.optim_runner.catalog.base import Fix, JobContext, Typical


def _compiled(ctx: JobContext) -> bool | None:
    return ctx.model.get("compiled") if ctx.model else None


def _channels_last(ctx: JobContext) -> bool | None:
    return ctx.model.get("channels_last") if ctx.model else None


def _fused(ctx: JobContext) -> bool | None:
    opt = ctx.optimizer
    if not opt:
        return None
    if opt.get("fused"):
        return True
    # On CUDA, foreach is already torch's default (foreach=None); only fused is new.
    # On the CPU foreach is off unless asked for.
    return bool(opt.get("foreach")) and ctx.cuda is False


def _cudnn_benchmark(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    return bool(settings.get("cudnn_benchmark")) if settings else None


FIXES = (
    Fix(
        id="torch_compile",
        title="Compile the model (torch.compile)",
        addresses=("compute/host_overhead", "memory/bandwidth", "compute/device_compute"),
        requires=(),
        changes_numerics=False,
        auto=True,
        why="fuses chains of pointwise ops into one kernel (fewer memory round trips) "
        "and removes per-op Python and dispatch overhead; the first steps pay for the "
        "compilation",
        snippet="model = torch.compile(model)",
        typical=Typical(
            1.1,
            1.4,
            "PyTorch 2.0 announcement: 1.43x mean training speed-up over 163 models on "
            "A100 with AMP, less in float32; on a small CPU it can be slower (measure)",
        ),
        in_effect=_compiled,
    ),
    Fix(
        id="cudnn_benchmark",
        title="Let cuDNN pick the fastest convolution algorithms (cudnn.benchmark)",
        addresses=("compute/device_compute",),
        requires=("cuda", "conv2d"),
        changes_numerics=False,
        auto=True,
        why="autotunes each convolution shape once; pays off when input shapes are fixed",
        snippet="torch.backends.cudnn.benchmark = True",
        typical=Typical(1.05, 1.1, "PyTorch Performance Tuning Guide (cudnn.benchmark)"),
        in_effect=_cudnn_benchmark,
    ),
    Fix(
        id="channels_last",
        title="channels_last memory format for convolutions",
        addresses=("compute/device_compute", "memory/bandwidth"),
        requires=("conv2d",),
        changes_numerics=False,
        auto=True,
        why="NHWC is the layout Tensor Core convolutions and oneDNN want; NCHW costs "
        "layout-conversion kernels around each convolution",
        snippet="model = model.to(memory_format=torch.channels_last)\n"
        "x = x.to(memory_format=torch.channels_last)",
        typical=Typical(
            1.08,
            1.35,
            "PyTorch tutorial 'Channels Last Memory Format': 8-35 % on torchvision models "
            "with AMP on Volta/Ampere",
        ),
        in_effect=_channels_last,
    ),
    Fix(
        id="fused_optimizer",
        title="Fused (CUDA) or foreach (CPU) optimizer step",
        addresses=("compute/host_overhead",),
        requires=("training", "fusable_optimizer"),
        changes_numerics=False,
        auto=True,
        why="updates all parameters in a few multi-tensor kernels instead of several ops "
        "per parameter",
        snippet="optimizer = torch.optim.AdamW(model.parameters(), lr=..., fused=True)"
        "  # CUDA\noptimizer = torch.optim.SGD(model.parameters(), lr=..., foreach=True)"
        "  # CPU",
        in_effect=_fused,
        removes=0.5,
    ),
    Fix(
        id="cpu_threads",
        title="Set the CPU thread count (torch.set_num_threads)",
        addresses=("compute/host_overhead", "compute/device_compute"),
        requires=("multi_core", "cpu_only"),
        changes_numerics=False,
        auto=True,
        why="tiny ops pay for waking intra-op threads, and intra-op threads compete with "
        "DataLoader workers for the same cores; the right count is measured, not guessed",
        snippet="torch.set_num_threads(1)  # tiny ops; or cores minus DataLoader workers",
        removes=0.3,
    ),
    Fix(
        id="larger_batch",
        title="Larger batch with gradient accumulation kept equal in samples",
        addresses=("compute/host_overhead", "communication/collectives"),
        requires=("dataloader",),
        changes_numerics=True,
        auto=True,
        needs_consent=True,
        why="per-step fixed costs (launches, Python, all-reduce) are paid once for more "
        "samples; the learning rate may need scaling with the batch",
        snippet="loader = DataLoader(dataset, batch_size=4 * old_batch_size)\n"
        "# keep the number of samples per optimizer step: scale lr or accumulate",
        removes=0.7,
    ),
    Fix(
        id="avoid_syncs",
        title="Remove host-device synchronisations from the loop",
        addresses=("communication/host_device", "compute/host_overhead"),
        requires=("cuda",),
        changes_numerics=False,
        auto=False,
        why=".item(), .cpu(), printing tensors and data-dependent shapes make the host "
        "wait for the GPU, so it cannot queue the next kernels",
        snippet="# accumulate on the device, read once per log interval\n"
        "running = running + loss.detach()\n"
        "if step % 100 == 0:\n    print(running.item() / 100)",
        removes=0.8,
    ),
)
