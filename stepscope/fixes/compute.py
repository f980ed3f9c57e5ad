"""Fixes for compute and host overhead: compilation, layouts, optimizers, threads,
batch size, and synchronising calls."""

from __future__ import annotations

from stepscope.fixes.base import Fix, JobContext, Typical


def _compiled(ctx: JobContext) -> bool | None:
    return ctx.model.get("compiled") if ctx.model else None


def _channels_last(ctx: JobContext) -> bool | None:
    return ctx.model.get("channels_last") if ctx.model else None


def _fused(ctx: JobContext) -> bool | None:
    """Fused counts; foreach counts only where torch has no fused kernels for the device
    (the CPU before torch 2.4, or an optimizer class without ``fused``)."""
    opt = ctx.optimizer
    if not opt:
        return None
    if opt.get("fused"):
        return True
    device = "cpu" if ctx.cuda is False else "cuda"
    kernels = opt.get("fused_kernels")
    fused_here = bool(opt.get("supports_fused")) and (
        device in kernels if kernels is not None else device == "cuda"
    )
    if fused_here:
        return False
    # without fused kernels foreach is the best there is; on CUDA it is torch's default
    return bool(opt.get("foreach")) or ctx.cuda is True


def _cudnn_benchmark(ctx: JobContext) -> bool | None:
    settings = ctx.settings
    return bool(settings.get("cudnn_benchmark")) if settings else None


FIXES = (
    Fix(
        id="torch_compile",
        slow_start=True,
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
        title="Fused optimizer step (fused=True; foreach where torch has no fused kernels)",
        # the optimizer step is per-parameter elementwise work: launch-bound with many
        # small tensors, bandwidth-bound with large ones (AdamW reads and writes four
        # tensors per parameter); a step-phase rule will say how large its share is
        addresses=("compute/host_overhead", "memory/bandwidth", "compute/device_compute"),
        requires=("training", "fusable_optimizer"),
        changes_numerics=False,
        auto=True,
        why="updates all parameters in a few multi-tensor kernels instead of several ops "
        "per parameter",
        snippet="optimizer = torch.optim.AdamW(model.parameters(), lr=..., fused=True)"
        "  # CUDA; CPU too since torch 2.4 (Adam, AdamW, SGD, Adagrad)\n"
        "optimizer = torch.optim.RMSprop(model.parameters(), lr=..., foreach=True)"
        "  # no fused kernels",
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
        # Offered only with evidence that the count is wrong, and with the count that
        # evidence points to (analyzers/recommend.thread_advice): without it, 1 thread or
        # half the cores measured 0.62-0.87x in every experiment.
        why="more intra-op threads than cores time-slice the same cores, intra-op threads "
        "compete with CPU-busy DataLoader workers for them, and tiny ops pay for waking "
        "threads that have nothing to do",
        snippet="torch.set_num_threads(n)  # one per core; cores minus CPU-busy DataLoader "
        "workers; 1 for tiny ops",
        removes=0.3,
    ),
    Fix(
        id="larger_batch",
        title="Larger batch with gradient accumulation kept equal in samples",
        addresses=("compute/host_overhead", "communication/collectives"),
        requires=("dataloader",),
        changes_numerics=True,
        auto=True,
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
