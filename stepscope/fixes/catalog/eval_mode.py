"""Put the model in ``eval()`` mode in an inference job that left it in training mode.

A warning more than a speed fix: dropout in training mode zeroes random activations and
batch norm normalises by the batch's own statistics (and updates its running ones), so
the job's predictions are not the model's. ``eval()`` changes the outputs, so it is an
automatic fix that needs consent (``changes_numerics``, like bf16): shown as a finding,
applied only when the user allows numerics to change, never silently. Advice-only would
be the other choice; consent keeps the measurement (dropout masks and batch statistics
cost time too) and the decision with the user.
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.points import Change, ModelCall
from stepscope.types import JobContext


def _in_effect(ctx: JobContext) -> bool | None:
    forward = ctx.facts.get("forward") or {}
    if not forward.get("steps"):
        return None
    return forward.get("train_mode_steps", 0) == 0


def _on_model(call: ModelCall, params: dict[str, Any]) -> None:
    module = call.module

    def keep_eval(mod: Any, args: Any) -> None:
        if mod.training:  # the job switched it back (model.train() in its loop)
            mod.eval()

    was = "training" if module.training else "eval"
    module.eval()  # this first call too: its forward has not started yet
    module.register_forward_pre_hook(keep_eval)
    call.record(
        Change(
            f"{type(call.inner).__name__}.eval() (was in {was} mode)",
            verified=not any(m.training for m in module.modules()),
        )
    )


FIX = Fix(
    id="eval_mode",
    title="Put the model in eval() mode for inference",
    addresses=("compute/inference_train_mode",),
    requires=("inference", "dropout_or_batchnorm"),
    changes_numerics=True,
    auto=True,
    why="in training mode dropout drops random activations and batch norm uses each "
    "batch's statistics: the outputs are not the model's predictions, and the masks and "
    "statistics cost time; eval() makes them deterministic",
    snippet="model.eval()  # before the inference loop",
    removes=0.0,  # a correctness fix: any speed-up is a side effect, measured not promised
    target="a model called at top level",
    on_model=_on_model,
)
