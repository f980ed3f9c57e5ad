"""Compile the model's forward (``torch.compile``): the first steps pay for compilation."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.fitting import CUDA, INFERENCE, TRAINING, fit_by_job
from stepscope.fixes.points import Change, ModelCall
from stepscope.types import JobContext

# Each figure is cited to the jobs it was measured on: both on an A100; a CPU job gets
# none (on a small CPU compiling can be slower: measure it).
TRAINING_TYPICAL = Typical(
    1.1,
    1.4,
    "PyTorch 2.0 announcement: 1.43x mean training speed-up over 163 models on "
    "A100 with AMP, less in float32",
)
INFERENCE_TYPICAL = Typical(
    1.1,
    2.27,
    "Ansel et al., 'PyTorch 2' (ASPLOS 2024): TorchInductor's 2.27x geometric-mean "
    "inference speed-up over 180+ models on an A100",
)
SNIPPETS = {
    TRAINING: "model = torch.compile(model)",
    INFERENCE: "model = torch.compile(model)\nwith torch.inference_mode():\n    out = model(x)",
}
# CUDA graphs (mode="reduce-overhead") need CUDA: only a CUDA inference job is told of them,
# as only its plan chooses them (_choose_params)
DEVICE_SNIPPETS = {
    (CUDA, INFERENCE): 'model = torch.compile(model, mode="reduce-overhead")  # CUDA graphs\n'
    "with torch.inference_mode():\n    out = model(x)",
}


def _compiled(ctx: JobContext) -> bool | None:
    return ctx.model.get("compiled") if ctx.model else None


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    """``ctx.run``: the run's row. CUDA inference (no optimizer, no backward): CUDA graphs
    (``mode="reduce-overhead"``) replay the whole forward with one launch; in training
    they would hold the graph's memory across steps and fight the optimizer."""
    facts = (ctx.run or {}).get("facts") or {}
    model, forward = facts.get("model") or {}, facts.get("forward") or {}
    inference = bool(forward.get("steps")) and not facts.get("optimizer")
    if (
        inference
        and not forward.get("backward")
        and str(model.get("device", "")).startswith("cuda")
    ):
        return {"mode": "reduce-overhead"}, "CUDA inference: CUDA graphs (reduce-overhead)"
    return {}, ""


def _on_model(call: ModelCall, params: dict[str, Any]) -> None:
    # the inner model: DDP's own forward (bucketing, hooks) stays eager
    mode = params.get("mode")
    if mode == "reduce-overhead" and call.device.type != "cuda":
        mode = None  # CUDA graphs need CUDA: the default mode elsewhere
    call.inner.forward = call.torch.compile(call.inner.forward, mode=mode)
    call.record(
        Change(
            f"torch.compile({type(call.inner).__name__}.forward"
            + (f", mode={mode!r})" if mode else ")"),
            verified=hasattr(call.inner.forward, "_torchdynamo_orig_callable"),
        )
    )


FIX = Fix(
    id="torch_compile",
    title="Compile the model (torch.compile)",
    addresses=("compute/host_overhead", "memory/bandwidth", "compute/device_compute"),
    requires=("not_generation",),
    changes_numerics=False,
    auto=True,
    why="fuses chains of pointwise ops into one kernel (fewer memory round trips) "
    "and removes per-op Python and dispatch overhead; the first steps pay for the "
    "compilation",
    snippet=SNIPPETS[TRAINING],
    typical=TRAINING_TYPICAL,
    phases=("forward", "backward"),
    fit=fit_by_job(
        {(CUDA, TRAINING): TRAINING_TYPICAL, (CUDA, INFERENCE): INFERENCE_TYPICAL},
        SNIPPETS,
        device_snippets=DEVICE_SNIPPETS,
    ),
    in_effect=_compiled,
    slow_start=True,
    target="a model called at top level",
    choose_params=_choose_params,
    on_model=_on_model,
)
