"""A larger batch per step (numerics change: the learning rate may need scaling)."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.fitting import INFERENCE, TRAINING, fit_by_job
from stepscope.fixes.points import LoaderCall

# Twice the samples per step: enough to halve per-step fixed costs, small enough that
# the same learning rate usually still trains (the report carries the lr note).
LARGER_BATCH_FACTOR = 2


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    return {"factor": LARGER_BATCH_FACTOR}, "twice the samples per step"


def _on_loader(call: LoaderCall, params: dict[str, Any]) -> None:
    if call.params.get("batch_sampler") is not None:
        return  # the sampler makes the batches: no batch_size to scale
    size = call.params.get("batch_size", 1)
    if not size:
        return
    # the fix itself: consent was given, so an explicit value is replaced too; a batch
    # sweep's confirming run asks for one size exactly (``sweeps/largest_batch.py``)
    factor = int(params.get("factor") or LARGER_BATCH_FACTOR)
    new = int(params.get("batch_size") or size * factor)
    call.set("batch_size", new, f"batch_size {size} -> {new}")


# An inference loop has no optimizer step and no learning rate to keep equal.
SNIPPETS = {
    TRAINING: "loader = DataLoader(dataset, batch_size=4 * old_batch_size)\n"
    "# keep the number of samples per optimizer step: scale lr or accumulate",
    INFERENCE: "loader = DataLoader(dataset, batch_size=4 * old_batch_size)\n"
    "with torch.inference_mode():\n    for x in loader:\n        out = model(x)",
}


FIX = Fix(
    id="larger_batch",
    title="Larger batch with gradient accumulation kept equal in samples",
    addresses=(
        "compute/host_overhead",
        "compute/optimizer_step",
        "communication/collectives",
        "compute/small_batch",
    ),
    requires=("dataloader",),
    changes_numerics=True,
    auto=True,
    why="per-step fixed costs (launches, Python, all-reduce, the optimizer step) are paid "
    "once for more samples; the learning rate may need scaling with the batch",
    snippet=SNIPPETS[TRAINING],
    fit=fit_by_job(
        {},
        SNIPPETS,
        titles={INFERENCE: "Larger batch: more samples per forward call"},
        whys={
            INFERENCE: "per-call fixed costs (Python, dispatch, reading the weights) are "
            "paid once for more samples; each request waits for its batch"
        },
    ),
    removes=0.7,
    target="a DataLoader with a batch size",
    choose_params=_choose_params,
    on_loader=_on_loader,
)
