"""Activation checkpointing of repeated blocks, applied without a code change.

A transformer (or any stack of identical blocks) keeps every block's activations from
the forward until the backward needs them: the activation part of the peak grows with
the number of blocks. Checkpointing a block keeps only its input and recomputes the rest
in the backward, so at any moment about one block's activations are held instead of all
of them, for about one more forward of compute (a third more step time where the
forward is a third of the step).

Blocks are found by class, not by name: the children of an ``nn.ModuleList`` or
``nn.Sequential`` of which two or more are instances of the same class (the outermost
such container; nothing inside a chosen block is wrapped again). They are wrapped with
torch's own ``apply_activation_checkpointing`` (non-reentrant ``checkpoint_wrapper``).
A Hugging Face model that supports it gets its own ``gradient_checkpointing_enable``.
Applied at the model's first top-level call, before its first forward runs (the
installer's ``on_model`` point); ``torch.compile`` compiles at the first forward too, so
it traces the wrapped blocks. Numerics do not change: the recomputed forward is the same
computation (dropout's RNG state is replayed by ``torch.utils.checkpoint``). One state
does change: a BatchNorm inside a wrapped block runs twice a step in training mode, so
its running statistics take two updates where they took one (pytorch/pytorch#96136, open);
the loss and gradients are the same, the statistics used at evaluation move faster. The
change says so where the blocks hold BatchNorm layers.

The predicted saving, in bytes, is measured in the job before the blocks are wrapped
(``predict_saving``): one forward of the model on the first call's inputs, with torch's
RNG state restored after it and a saved-tensors hook that counts, per block, the bytes
autograd would keep for the backward and keeps none of them (so the probe holds no
more than two blocks' activations). A storage is counted once even where two blocks
save it (a block's output, saved by its last ReLU and by the next block's first conv).
Checkpointing frees the blocks' saved bytes, less one block's (recomputed in the
backward) and less each block's input (kept by the wrapper).
A model the probe cannot call (keyword inputs, a forward that refuses a second call)
gets the fraction ``(n - 1) / n`` from the block count instead, and says so. It is a
prediction: the experiment measures the peak (``peak_ratio``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.points import Change, ModelCall

SNIPPET = (
    "from functools import partial\n"
    "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
    "    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)\n"
    "apply_activation_checkpointing(model, checkpoint_wrapper_fn=partial(\n"
    "    checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),\n"
    "    check_fn=lambda m: isinstance(m, Block))  # your repeated block class\n"
    "# Hugging Face: model.gradient_checkpointing_enable("
    'gradient_checkpointing_kwargs={"use_reentrant": False})'
)


def repeated_blocks(model: Any, torch: Any) -> list[tuple[str, Any]]:
    """(qualified name, module) of the repeated blocks: children of a ModuleList or
    Sequential that are two or more instances of one class, outermost containers first
    (a chosen block's insides are not searched)."""
    containers = (torch.nn.ModuleList, torch.nn.Sequential)
    found: list[tuple[str, Any]] = []

    def walk(module: Any, prefix: str) -> None:
        children = list(module.named_children())
        if isinstance(module, containers):
            by_class: dict[type, list[tuple[str, Any]]] = {}
            for name, child in children:
                by_class.setdefault(type(child), []).append((name, child))
            chosen = {
                id(child)
                for members in by_class.values()
                if len(members) >= 2 and _composite(members[0][1])
                for _, child in members
            }
            for name, child in children:
                if id(child) in chosen:
                    found.append((prefix + name, child))
            children = [(n, c) for n, c in children if id(c) not in chosen]
        for name, child in children:
            walk(child, f"{prefix}{name}.")

    walk(model, "")
    return found


def _composite(module: Any) -> bool:
    """A block holds layers of its own (a repeated Linear or ReLU is not a block)."""
    return any(True for _ in module.children()) and any(True for _ in module.parameters())


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


def _hf_enable(model: Any) -> Change | None:
    """A Hugging Face model's own switch, where it has one (None: not such a model)."""
    if not getattr(model, "supports_gradient_checkpointing", False) or not hasattr(
        model, "gradient_checkpointing_enable"
    ):
        return None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return Change(
        f"{type(model).__name__}.gradient_checkpointing_enable(use_reentrant=False)",
        verified=bool(getattr(model, "is_gradient_checkpointing", False)),
    )


def _on_model(call: ModelCall, params: dict[str, Any]) -> None:
    torch, model = call.torch, call.inner
    if not isinstance(model, torch.nn.Module):
        call.record(Change("not applied: the model is not an nn.Module tree", applied=False))
        return
    if not model.training:
        call.record(Change("not applied: the model is in eval mode (no backward)", False))
        return
    hf = _hf_enable(model)
    if hf is not None:
        call.record(hf)
        return
    blocks = repeated_blocks(model, torch)
    if not blocks:
        call.record(
            Change(
                "not applied: no repeated blocks (no ModuleList or Sequential holding two "
                "or more modules of one class)",
                applied=False,
            )
        )
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    prediction = predict_saving(model, blocks, call.args, torch)
    ids = {id(m) for _, m in blocks}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
        ),
        check_fn=lambda m: id(m) in ids,
    )
    wrapped = sum(1 for m in model.modules() if isinstance(m, CheckpointWrapper))
    norms = sum(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        for _, block in blocks
        for m in block.modules()
    )
    twice = (
        f"; their {norms} BatchNorm layers update their running statistics twice a step "
        "(the recompute: pytorch/pytorch#96136)"
        if norms
        else ""
    )
    n = len(blocks)
    classes = sorted({type(m).__name__ for _, m in blocks})
    where = sorted({name.rsplit(".", 1)[0] if "." in name else "" for name, _ in blocks})
    call.record(
        Change(
            f"checkpointed {n} {'/'.join(classes)} blocks of {', '.join(w or 'the model' for w in where)}"
            f" (non-reentrant); {prediction}; about one more forward per step{twice}",
            verified=wrapped == n,
        )
    )


FIX = Fix(
    id="activation_checkpointing",
    title="Activation checkpointing of repeated blocks",
    addresses=("memory/capacity",),
    requires=("training",),
    changes_numerics=False,
    auto=True,
    why="recomputes each block's activations in backward instead of keeping them all: "
    "about one block's activations held instead of every block's, for about one more "
    "forward of compute, which makes room for a larger batch",
    snippet=SNIPPET,
    removes=0.0,  # it frees memory; it never makes the step faster
    target="a model called at top level",
    on_model=_on_model,
)
