"""What the model's own state held when a job ran out of memory.

A job that runs out in its first step has no capture, so no categorised timeline says
what filled the memory. Its optimizers do: their parameter groups are the parameters
and their gradients, their ``state`` the optimizer state (Adam's two moments). With the
module whose calls are the steps (the step timer's anchor: the frozen parameters and the
buffers the optimizers do not hold), they give the model's state in bytes on the device
that ran out; what was in use beyond it is the step's own: activations, temporaries,
and (on the CPU) the process's other memory. ``oom_record`` calls it from the job's
excepthook, in a process that just ran out: it allocates nothing but a set of
addresses, and counts each storage once (a tied weight, a gradient that is a view of a
DDP bucket).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["model_state_bytes"]


def model_state_bytes(
    optimizers: Iterable[Any], model: Any, torch: Any, device: Any
) -> dict[str, int] | None:
    """``{"parameters", "gradients", "optimizer_state", "buffers", "optimizers"}`` in
    bytes on ``device`` (a ``torch.device``); None without an optimizer or a model."""
    seen: set[int] = set()
    out = {"parameters": 0, "gradients": 0, "optimizer_state": 0, "buffers": 0}

    def add(key: str, t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.device != device:
            return
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in seen:
            seen.add(ptr)
            out[key] += storage.nbytes()

    count = 0
    for opt in optimizers:
        count += 1
        for group in opt.param_groups:
            for p in group["params"]:
                add("parameters", p)
                add("gradients", p.grad)
        for per_param in opt.state.values():
            for value in per_param.values() if isinstance(per_param, dict) else ():
                add("optimizer_state", value)
    if model is not None:
        for p in model.parameters():  # frozen ones too (a LoRA fine-tune's base model)
            add("parameters", p)
            add("gradients", p.grad)
        for b in model.buffers():
            add("buffers", b)
    if not count and model is None:
        return None
    return {**out, "optimizers": count}
