"""What activation checkpointing will free, measured in the job before it is applied.

Two probes, both forwards whose saved tensors are counted and then dropped (a
saved-tensors hook keeps none of them for a backward), with torch's RNG state restored
after them so the job's numbers do not move:

* the whole model at its first top-level call, on that call's positional inputs
  (``saved_by_blocks``): each block's saved bytes, and its inputs;
* one block at its own first call (``probe_at_first_block``), for a model called with
  keyword inputs only, as the Hugging Face ``Trainer`` calls it (``model(**batch)``):
  torch's global forward hooks, where the installer finds the model, see positional
  inputs only, but a block's own hook sees its keywords too. The blocks are repeats of
  one class, so one block's saved bytes stand for each of them.

Checkpointing frees the blocks' saved bytes, less one block's (recomputed in the
backward) and less each block's input (kept by the wrapper). A probe that cannot run
gives the block-count fraction ``(n - 1) / n`` instead, and says so. It is a
prediction: the experiment measures the peak (``peak_ratio``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from stepscope.fixes.points import Change

#: a block's keyword arguments that carry a generation cache: the probe passes None, as
#: a checkpointed Hugging Face layer does (it never writes a cache twice)
CACHE_KWARGS = ("past_key_values", "past_key_value", "layer_past", "cache")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def saved_by_blocks(
    model: Any, blocks: list[tuple[str, Any]], args: tuple, torch: Any
) -> tuple[list[int], list[int]]:
    """(bytes autograd saves inside each block, bytes of each block's inputs), from one
    probe forward of ``model`` on ``args`` (see the module docstring); raises what the
    forward raises."""
    n = len(blocks)
    owner = {id(m): i for i, (_, m) in enumerate(blocks)}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    per_block = [0] * n
    inputs = [0] * n
    held: dict[int, Any] = {}  # this block's saved tensors: a storage freed can be reused
    # the block before's: a ResNet block's output is saved by its last ReLU and again by
    # the next block's first conv, one storage that checkpointing keeps as an input
    previous: dict[int, Any] = {}
    active: list[int] = []

    def pre(module: Any, inp: tuple) -> None:
        i = owner[id(module)]
        active.append(i)
        inputs[i] += sum(t.nbytes for t in inp if isinstance(t, torch.Tensor))

    def post(module: Any, inp: tuple, out: Any) -> None:
        active.pop()
        previous.clear()  # at most two blocks' activations held by the probe at a time
        previous.update(held)
        held.clear()

    def pack(t: Any) -> None:
        with contextlib.suppress(Exception):  # a tensor without plain storage: not counted
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if active and ptr not in params and ptr not in held and ptr not in previous:
                held[ptr] = t
                per_block[active[-1]] += storage.nbytes()

    handles = [m.register_forward_pre_hook(pre) for _, m in blocks]
    handles += [m.register_forward_hook(post) for _, m in blocks]
    devices = [
        d for d in {getattr(a, "device", None) for a in args} if getattr(d, "type", None) == "cuda"
    ]
    try:
        with (
            torch.random.fork_rng(devices=devices),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None),
        ):
            type(model).forward(model, *args)  # the class's: a compiled forward stays as it is
    finally:
        for handle in handles:
            handle.remove()
    return per_block, inputs


def predict_saving(model: Any, blocks: list[tuple[str, Any]], args: tuple, torch: Any) -> str:
    """The bytes checkpointing should free, as the text of the change: the blocks' saved
    bytes less the largest block's (recomputed in the backward) and their inputs (kept);
    the block-count fraction where the probe forward cannot run."""
    n = len(blocks)
    try:
        per_block, inputs = saved_by_blocks(model, blocks, args, torch)
    except Exception as exc:
        return (
            f"predicted from the block count: about {n - 1}/{n} of their activations freed "
            f"(the probe forward failed: {type(exc).__name__})"
        )
    saved = sum(per_block)
    freed = max(0, saved - max(per_block) - sum(inputs))
    return (
        f"predicted saving {_mib(freed)} (measured in the job: the blocks save "
        f"{_mib(saved)} for backward, {_mib(max(per_block))} the largest; less one block "
        "and their inputs)"
    )


def _tensors(values: Any, torch: Any) -> list[Any]:
    return [v for v in values if isinstance(v, torch.Tensor)]


def saved_by_one_block(
    block: Any, args: tuple, kwargs: dict[str, Any], torch: Any
) -> tuple[int, int]:
    """(bytes autograd saves inside ``block``, bytes of its inputs that the wrapper
    keeps), from one probe forward of the block alone on the arguments of its call.

    Inputs that need no gradient (an attention mask, rotary tables) are the same
    tensors for every block and stay whatever checkpointing does: they are neither
    counted as the block's input nor as its saved bytes. A Hugging Face layer's own
    checkpointing is off for the probe, so the probe sees what an unwrapped block saves.
    """
    kwargs = {k: (None if k in CACHE_KWARGS else v) for k, v in kwargs.items()}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    given = _tensors([*args, *kwargs.values()], torch)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    skip |= {t.untyped_storage().data_ptr() for t in given if not t.requires_grad}
    inputs = sum(t.nbytes for t in given if t.requires_grad)
    held: dict[int, Any] = {}
    saved = 0

    def pack(t: Any) -> None:
        nonlocal saved
        with contextlib.suppress(Exception):  # a tensor without plain storage: not counted
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in skip and ptr not in held:
                held[ptr] = t
                saved += storage.nbytes()

    devices = [t.device for t in given if t.device.type == "cuda"][:1]
    own = getattr(block, "gradient_checkpointing", None)
    try:
        if own:
            block.gradient_checkpointing = False
        with (
            torch.random.fork_rng(devices=devices),
            torch.enable_grad(),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None),
        ):
            type(block).forward(block, *args, **kwargs)
    finally:
        if own:
            block.gradient_checkpointing = own
    return saved, inputs


def probe_at_first_block(
    blocks: list[tuple[str, Any]], torch: Any, report: Callable[[Change], None]
) -> None:
    """Predict the saving at the first block's first call, and ``report`` it (see the
    module docstring). The hook removes itself before it probes, and never raises into
    the job's forward: a probe that fails reports the block-count fraction."""
    name, first = blocks[0]
    n = len(blocks)
    handle: Any = None

    def hook(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        handle.remove()
        try:
            saved, inputs = saved_by_one_block(module, args, kwargs, torch)
        except Exception as exc:
            text = (
                f"predicted from the block count: about {n - 1}/{n} of their activations "
                f"freed (the probe of {name} failed: {type(exc).__name__})"
            )
        else:
            freed = max(0, (n - 1) * saved - n * inputs)
            text = (
                f"predicted saving {_mib(freed)} (measured in the job at the first block's "
                f"call: {name} saves {_mib(saved)} for backward, one of {n}; less one block "
                "and their inputs)"
            )
        with contextlib.suppress(Exception):
            report(Change(text))

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
