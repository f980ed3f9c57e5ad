"""The shape of a catalog entry and the job context its checks read.

``JobContext`` is what is known about the job, from the most direct source available:
the settings the job itself reported (``runs.facts``, written by
``collectors/job_facts.py``), its device facts, or, for a bare trace file, what the
trace shows. Each field may be ``None``: unknown. A requirement that is unknown does
not rule a fix out (a trace file cannot say whether the job used a DataLoader), but it
lowers the recommendation's confidence; one that is known to be unmet always does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepscope.types import JobContext


@dataclass(frozen=True)
class Typical:
    """A speed-up range reported for this fix elsewhere, with where it comes from."""

    lo: float
    hi: float
    source: str


def _all_loaders(ctx: JobContext, test: Callable[[dict[str, Any]], bool]) -> bool | None:
    """True when every recorded loader passes; None when no loader was recorded."""
    loaders = ctx.loaders
    if not loaders:
        return None
    return all(test(loader) for loader in loaders)


def _tensor_cores_bf16(ctx: JobContext) -> bool | None:
    if ctx.cuda is False:
        return False
    if ctx.vendor == "amd":
        name = (ctx.device_name or "").upper()
        return True if ("MI2" in name or "MI3" in name) else None
    if ctx.capability is None:
        return None
    return ctx.capability >= 8.0


def _fast_bf16(ctx: JobContext) -> bool | None:
    """Tensor Cores on a GPU; on a CPU job, native bf16 in oneDNN (AVX512-BF16 or AMX),
    as the job itself reported it. A CPU nobody asked (a bare trace) counts as without:
    emulated bf16 is several times slower than float32."""
    if ctx.cuda is False:
        return bool(ctx.settings.get("cpu_bf16"))
    return _tensor_cores_bf16(ctx)


def _tf32(ctx: JobContext) -> bool | None:
    if ctx.cuda is False or ctx.vendor == "amd":
        return False
    return None if ctx.capability is None else ctx.capability >= 8.0


def _cuda(ctx: JobContext) -> bool | None:
    return ctx.cuda


def _supports_fused(ctx: JobContext) -> bool | None:
    opt = ctx.optimizer
    if not opt:
        if ctx.facts:  # the job reported itself and stepped no torch.optim optimizer
            return False
        return ctx.training  # a bare trace: unknown
    return bool(opt.get("supports_fused")) or opt.get("foreach") is not None


# Requirement name -> check. The names are what a Fix lists in ``requires``.
REQUIREMENTS: dict[str, Callable[[JobContext], bool | None]] = {
    "cuda": _cuda,
    "bf16_tensor_cores": _tensor_cores_bf16,  # Ampere+ (sm80) or AMD CDNA2+ (MI200/MI300)
    "fast_bf16": _fast_bf16,  # those GPUs, or a CPU with AVX512-BF16 / AMX
    "tf32": _tf32,  # NVIDIA Ampere+ only
    "training": lambda c: c.training,
    "dataloader": lambda c: c.dataloader,
    "workers": lambda c: (
        _all_loaders(c, lambda ld: ld.get("num_workers", 0) > 0)
        if c.dataloader is not False
        else False
    ),
    "conv2d": lambda c: c.conv2d,
    "ddp": lambda c: c.ddp,
    "dataparallel": lambda c: c.dataparallel,
    "fusable_optimizer": _supports_fused,
    "multi_core": lambda c: None if c.cpu_count is None else c.cpu_count > 1,
    "cpu_only": lambda c: None if c.cuda is None else not c.cuda,
}


# A specific set-up must have been seen to advise on it: "replace DataParallel" to a
# job nobody saw use DataParallel is noise. Generic ones (CUDA, a DataLoader) may be
# unknown: the advice then says which requirement it could not check.
MUST_BE_SEEN = frozenset({"ddp", "dataparallel"})


def _never(ctx: JobContext) -> bool | None:
    return None


@dataclass(frozen=True)
class Fix:
    """One optimisation. ``auto``: stepscope can apply it without a code change;
    otherwise it is advice with a snippet, never claimed as applied."""

    id: str
    title: str
    addresses: tuple[str, ...]  # 'class/subtype' keys of the taxonomy
    requires: tuple[str, ...]
    changes_numerics: bool
    auto: bool
    snippet: str
    why: str  # one sentence: how it removes the cost
    typical: Typical | None = None
    in_effect: Callable[[JobContext], bool | None] = _never
    removes: float = 1.0  # largest fraction of the finding's share it can remove
    # Compiles at its first steps (torch.compile): a trial's time limit allows for it.
    slow_start: bool = False

    @property
    def needs_consent(self) -> bool:
        """Applied only when the user allows numerics to change (``--allow-numerics``, the
        Optimize page's toggle): every automatic fix that changes what the model computes
        (bf16, TF32, a larger batch). The quality guard checks the loss after the fact;
        consent is asked before, because a changed result is the user's call."""
        return self.auto and self.changes_numerics

    def requirement_status(self, ctx: JobContext) -> tuple[list[str], list[str]]:
        """(unmet, unknown) requirement names for this job."""
        unmet, unknown = [], []
        for name in self.requires:
            ok = REQUIREMENTS[name](ctx)
            if ok is False or (ok is None and name in MUST_BE_SEEN):
                unmet.append(name)
            elif ok is None:
                unknown.append(name)
        return unmet, unknown
