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
A Hugging Face model that supports it gets its own switch (``activation_checkpointing_enable``;
``gradient_checkpointing_enable`` before transformers 5).
Applied at the model's first top-level call, before its first forward runs (the
installer's ``on_model`` point); ``torch.compile`` compiles at the first forward too, so
it traces the wrapped blocks. Numerics do not change: the recomputed forward is the same
computation (dropout's RNG state is replayed by ``torch.utils.checkpoint``). One state
does change: a BatchNorm inside a wrapped block runs twice a step in training mode, so
its running statistics take two updates where they took one (pytorch/pytorch#96136, open);
the loss and gradients are the same, the statistics used at evaluation move faster. The
change says so where the blocks hold BatchNorm layers.

The saving is predicted in the job before the blocks are wrapped, by a probe forward
that counts the bytes autograd would keep (``fixes/checkpoint_probe.py``): of the whole
model on its first call's inputs, or, for a model called with keyword inputs (the
Hugging Face ``Trainer``) or checkpointed by its own switch, of one block at its first
call. It is a prediction: the experiment measures the peak (``peak_ratio``).
"""

from __future__ import annotations

import functools
from typing import Any

from stepscope.fixes.base import Fix
from stepscope.fixes.checkpoint_probe import predict_saving, probe_at_first_block
from stepscope.fixes.points import Change, ModelCall

SNIPPET = (
    "from functools import partial\n"
    "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
    "    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)\n"
    "apply_activation_checkpointing(model, checkpoint_wrapper_fn=partial(\n"
    "    checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),\n"
    "    check_fn=lambda m: isinstance(m, Block))  # your repeated block class\n"
    "# Hugging Face: model.activation_checkpointing_enable("
    'activation_checkpointing_kwargs={"use_reentrant": False})\n'
    "# (transformers before 5: gradient_checkpointing_enable(gradient_checkpointing_kwargs=...))"
)
REENTRANT_OFF = {"use_reentrant": False}


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


def _hf_enable(model: Any) -> Change | None:
    """A Hugging Face model's own switch, where it has one (None: not such a model):
    ``activation_checkpointing_enable`` from transformers 5, the older name before it
    (which 5 keeps, with a deprecation warning in the job's output)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return None
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=REENTRANT_OFF)
        name, on = "activation_checkpointing_enable", "is_activation_checkpointing"
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=REENTRANT_OFF)
        name, on = "gradient_checkpointing_enable", "is_gradient_checkpointing"
    else:
        return None
    return Change(
        f"{type(model).__name__}.{name}(use_reentrant=False)",
        verified=bool(getattr(model, on, False)),
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
        blocks = repeated_blocks(model, torch)
        if blocks:  # the Trainer calls with keywords: the model's first block is probed
            probe_at_first_block(blocks, torch, call.record_later())
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

    if call.args:
        prediction = predict_saving(model, blocks, call.args, torch)
    else:  # keyword inputs only: the first block's call has them
        probe_at_first_block(blocks, torch, call.record_later())
        prediction = "saving predicted at the first block's call"
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
