"""What filled the memory when a job ran out, and what each remedy would free, in bytes.

The OOM record's ``model_state`` (``collectors/injob/model_state.py``: parameters,
gradients, optimizer state and buffers on the device that ran out) against what was in
use then (CUDA's allocated bytes; on the CPU the resident set) says how much was the
model's state and how much the step's own (activations and temporaries; on the CPU also
the libraries and the interpreter, so there the rest is only an upper bound). From those:

* 8-bit optimizer state (bitsandbytes' ``AdamW8bit``): three quarters of the optimizer
  state (one byte per value for four);
* the optimizer state offloaded to the CPU (DeepSpeed's ZeRO-Offload): all of it, on
  CUDA only (on the CPU it is already there);
* sharding over two ranks (FSDP, ZeRO-3): half of the parameters, gradients and
  optimizer state, per rank;
* half the micro-batch, with two accumulation steps to keep the batch: about half the
  step's own bytes (activations scale with the batch), where they are known apart from
  the process's other memory (CUDA's allocated bytes; a capture's timeline).

The same remedies are given at a capture's peak (``peak_remedies``), from the memory
timeline's categories, where the step's bytes are its tensors alone.

They are advice, computed, not measured: the fixes stepscope applies are measured by
``optimize``. The store's record is data from the job: a field that is not a
non-negative number is left out, never trusted.
"""

from __future__ import annotations

from typing import Any

from stepscope.types import EvidenceItem

__all__ = ["model_state_evidence", "peak_remedies", "remedies"]

_STATE_KEYS = ("parameters", "gradients", "optimizer_state", "buffers")


def _bytes(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def _mib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def model_state_evidence(record: dict[str, Any]) -> list[EvidenceItem]:
    """Two lines where the record has the model's state: what held the memory, and what
    each remedy would free; none where it has not."""
    state = record.get("model_state")
    if not isinstance(state, dict):
        return []
    held = {k: _bytes(state.get(k)) or 0 for k in _STATE_KEYS}
    total = sum(held.values())
    if total <= 0:
        return []
    cuda = _bytes(record.get("cuda_allocated_bytes"))
    in_use = cuda if cuda is not None else _bytes(record.get("rss_bytes"))
    parts = ", ".join(f"{k.replace('_', ' ')} {_mib(v)}" for k, v in held.items() if v > 0)
    text = f"held by the model's state: {parts} ({_mib(total)})"
    rest = None
    if in_use is not None and in_use >= total:
        rest = in_use - total
        what = (
            "activations and temporaries"
            if cuda is not None
            else ("activations, temporaries and the process's libraries")
        )
        text += f"; the rest of what was in use, {_mib(rest)}, the step's ({what})"
    items = [EvidenceItem.of(text, total, "oom")]
    step_bytes = rest if cuda is not None else None
    frees = remedies(held, step_bytes, on_cuda=cuda is not None)
    items.append(EvidenceItem.of("would free (advice): " + "; ".join(frees), None, "oom"))
    return items


def remedies(held: dict[str, int], step_bytes: int | None, *, on_cuda: bool) -> list[str]:
    """What each remedy would free, from the model's state (``held``: parameters,
    gradients, optimizer state) and the step's own bytes (None where not known apart
    from the process's other memory: the micro-batch line is left out)."""
    frees = []
    opt, sharded = held.get("optimizer_state", 0), held.get("parameters", 0)
    sharded += held.get("gradients", 0)
    if opt > 0:
        frees.append(f"8-bit optimizer state about {_mib(opt * 3 / 4)}")
        if on_cuda:
            frees.append(f"the optimizer state offloaded to the CPU {_mib(opt)}")
    frees.append(f"sharding over 2 ranks (FSDP) about {_mib((sharded + opt) / 2)} per rank")
    if step_bytes:
        frees.append(f"half the micro-batch (2 accumulation steps) about {_mib(step_bytes / 2)}")
    return frees


#: the memory timeline's categories that are the step's own, not the model's state
STEP_CATEGORIES = ("ACTIVATION", "TEMPORARY", "INPUT", "AUTOGRAD_DETAIL")


def peak_remedies(peak: list[dict[str, Any]], device: str | None) -> list[str]:
    """``remedies`` at a capture's peak (``MemoryBreakdown.peak`` records: category and
    bytes). The timeline counts tensors only, so the step's bytes there are exact on the
    CPU too. None of them for a peak without the model's state (an inference job)."""
    by = {r.get("category"): _bytes(r.get("bytes")) or 0 for r in peak if isinstance(r, dict)}
    held = {
        "parameters": by.get("PARAMETER", 0),
        "gradients": by.get("GRADIENT", 0),
        "optimizer_state": by.get("OPTIMIZER_STATE", 0),
    }
    if not held["gradients"] and not held["optimizer_state"]:
        return []  # no training state: sharding and optimizer remedies do not apply
    step = sum(by.get(c, 0) for c in STEP_CATEGORIES)
    return remedies(held, step, on_cuda=str(device or "").startswith("cuda"))
