"""Fused optimizer steps (``fused=True``; ``foreach`` where torch has no fused kernels).

The optimizer step is per-parameter elementwise work: launch-bound with many small
tensors, bandwidth-bound with large ones (AdamW reads and writes four tensors per
parameter). Where the step's phases show the optimizer step itself
(``compute/optimizer_step``), the fused step removes most of that phase; elsewhere
(host overhead, elementwise bandwidth, compute) only the optimizer's part of them:
``phases`` bounds its gain there by the optimizer phase's share (``recommend``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from stepscope.errors import one_line_error
from stepscope.fixes.base import Advice, Fix
from stepscope.types import Finding, JobContext

#: Of an optimizer-step phase, the part a fused step removes. Measured on this project's
#: CPU (issue 14): AdamW over an 8.4 M-parameter MLP, per-parameter loop 32 ms of an
#: 87 ms step, fused=True 1.66x on the whole step, i.e. the phase almost gone; 0.9
#: leaves room for the fused kernel's own passes over the parameters.
REMOVES_OF_OPTIMIZER_PHASE = 0.9


def _advise(finding: Finding, ev: Any) -> Advice:
    if finding.key == "compute/optimizer_step":
        return Advice(removes=REMOVES_OF_OPTIMIZER_PHASE)
    return Advice()


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


def fused_or_foreach(
    signature: inspect.Signature, devices: set[Any], torch: Any
) -> tuple[str, str]:
    """'fused' where the optimizer class takes ``fused`` and the installed torch has fused
    kernels for every parameter device (CUDA; the CPU since torch 2.4), else 'foreach';
    with the reason, for the log."""
    if "fused" not in signature.parameters:
        return "foreach", "this optimizer has no fused implementation"
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        supported = set(_get_fused_kernels_supported_devices())
    except Exception:  # older torch: fused on CUDA only
        supported = {"cuda"}
    kinds = {getattr(d, "type", None) for d in devices}
    if kinds and kinds <= supported:
        return (
            "fused",
            f"torch {torch.__version__.split('+')[0]} has fused kernels for {sorted(kinds)[0]}",
        )
    return (
        "foreach",
        f"no fused kernels for {', '.join(sorted(str(k) for k in kinds)) or 'these parameters'}",
    )


def _patch(installer: Any, torch: Any, params: dict[str, Any]) -> None:
    """Wrap the ``__init__`` of every torch.optim class that takes ``foreach``.

    ``installer``: ``install.PlanApplier`` (``record``, ``failed``, ``override``).
    """
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer
            and "foreach" in inspect.signature(cls.__init__).parameters
        ):
            cls.__init__ = _fused_init(cls, cls.__init__, torch, installer)


def _fused_init(cls: type, original: Callable[..., None], torch: Any, installer: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(opt: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        if type(opt) is not cls:  # a subclass calling super().__init__: leave it
            return original(opt, params, *args, **kwargs)
        params = list(params)
        try:
            bound = signature.bind(opt, params, *args, **kwargs).arguments
            explicit = {"foreach", "fused"} & set(bound)
            if explicit and not installer.override:
                installer.record(
                    "fused_optimizer",
                    f"not applied: kept the job's {cls.__name__} "
                    f"{', '.join(sorted(explicit))} (set explicitly; --keep-explicit)",
                    False,
                )
                return original(opt, params, *args, **kwargs)
            was = ", ".join(f"{k}={bound[k]!r}" for k in sorted(explicit)) or "torch's default"
            tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
            devices = {getattr(t, "device", None) for t in tensors}
            use, why = fused_or_foreach(signature, devices, torch)
            extra = {use: True, ("foreach" if use == "fused" else "fused"): None}
            extra = {k: v for k, v in extra.items() if k in signature.parameters}
            try:
                original(opt, params, *args, **{**kwargs, **extra})
            except (RuntimeError, ValueError, TypeError) as exc:
                if use != "fused":
                    raise
                # fused refused these parameters (a dtype, a device): foreach then
                use, why = "foreach", f"fused refused: {one_line_error(type(exc), exc)}"
                extra = {"foreach": True, "fused": None}
                extra = {k: v for k, v in extra.items() if k in signature.parameters}
                original(opt, params, *args, **{**kwargs, **extra})
            verified = bool(opt.defaults.get(use))
            installer.record(
                "fused_optimizer", f"{cls.__name__}({use}=True; was {was}; {why})", True, verified
            )
        except Exception as exc:
            installer.failed("fused_optimizer", exc)
            original(opt, params, *args, **kwargs)

    return __init__


FIX = Fix(
    id="fused_optimizer",
    title="Fused optimizer step (fused=True; foreach where torch has no fused kernels)",
    addresses=(
        "compute/optimizer_step",
        "compute/host_overhead",
        "memory/bandwidth",
        "compute/device_compute",
    ),
    requires=("training", "fusable_optimizer"),
    changes_numerics=False,
    auto=True,
    why="updates all parameters in a few multi-tensor kernels instead of several ops per parameter",
    snippet="optimizer = torch.optim.AdamW(model.parameters(), lr=..., fused=True)"
    "  # CUDA; CPU too since torch 2.4 (Adam, AdamW, SGD, Adagrad)\n"
    "optimizer = torch.optim.RMSprop(model.parameters(), lr=..., foreach=True)"
    "  # no fused kernels",
    in_effect=_fused,
    removes=0.5,
    phases=("optimizer",),
    target="a torch.optim optimizer with foreach/fused options",
    primary="compute/optimizer_step",
    advise=_advise,
    patch=_patch,
)
