"""Advice that fits the job: a fix's snippet and cited figure chosen for its device and kind.

A figure is evidence only for jobs like the ones it was measured on: "1.5-2x on Tensor
Core GPUs" says nothing about a CPU job, and "1.43x mean training speed-up" nothing
about an inference job, whose step has no backward and no optimizer to speed up. So a
fix lists its figures by (device, kind) and a job gets the one measured on its own
device and kind, or none, with the reason said where the bound would be. A snippet
with ``loss.backward()`` is wrong advice for a loop that never computes a loss, so
snippets are listed by kind too. (Issue 27.)

The device is known only from what the job reported (``JobContext.cuda``); a job whose
device is unknown gets no figure rather than a GPU's. The kind is inference where the
job is known to run no backward and no optimizer (``JobContext.training`` False), else
training (a bare trace that cannot tell keeps the training wording, the common case).
"""

from __future__ import annotations

from collections.abc import Mapping

from stepscope.fixes.base import FitHook, Fitting, Typical
from stepscope.types import JobContext

CUDA, CPU = "cuda", "cpu"
TRAINING, INFERENCE = "training", "inference"

_DEVICE_WORDS = {CUDA: "a CUDA", CPU: "a CPU", None: "an unknown device's"}


def device_of(ctx: JobContext) -> str | None:
    """'cuda', 'cpu', or None where the job did not say."""
    return CUDA if ctx.cuda is True else CPU if ctx.cuda is False else None


def kind_of(ctx: JobContext) -> str:
    """'inference' for a job known to run no backward and no optimizer, else 'training'."""
    return INFERENCE if ctx.training is False else TRAINING


def no_figure_reason(device: str | None, kind: str) -> str:
    """What the basis says where no cited figure was measured on a job like this one."""
    return (
        f"no cited figure fits {_DEVICE_WORDS[device]} {kind} job: measure it (stepscope optimize)"
    )


def fit_by_job(
    figures: Mapping[tuple[str, str], Typical],
    snippets: Mapping[str, str] | str,
    *,
    titles: Mapping[str, str] | None = None,
    whys: Mapping[str, str] | None = None,
    device_snippets: Mapping[tuple[str | None, str], str] | None = None,
) -> FitHook:
    """A ``Fix.fit`` hook from tables: ``figures`` by (device, kind), ``snippets`` (and
    optional ``titles``, ``whys``) by kind, each falling back to the training entry (one
    string: the same snippet for every kind); ``device_snippets`` by (device, kind) come
    first where a setting holds on one device only (CUDA graphs: never a CPU job's advice).
    Empty ``figures``: the fix cites none, and its bound is the share it removes."""

    by_kind = {TRAINING: snippets} if isinstance(snippets, str) else snippets

    def fit(ctx: JobContext) -> Fitting:
        device, kind = device_of(ctx), kind_of(ctx)
        typical = figures.get((device, kind)) if device is not None else None
        # a fix that cites no figure anywhere keeps its own bound (the share it removes)
        missing = typical is None and bool(figures)
        snippet = (device_snippets or {}).get((device, kind))
        return Fitting(
            snippet=snippet or by_kind.get(kind) or by_kind[TRAINING],
            typical=typical,
            no_figure=no_figure_reason(device, kind) if missing else None,
            title=(titles or {}).get(kind),
            why=(whys or {}).get(kind),
        )

    return fit


__all__ = [
    "CPU",
    "CUDA",
    "INFERENCE",
    "TRAINING",
    "device_of",
    "fit_by_job",
    "kind_of",
    "no_figure_reason",
]
