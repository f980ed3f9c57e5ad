"""Steps that end with ``optimizer.step()``: training jobs, with one optimizer or several.

Torch's global optimizer post hook ends a step at each optimizer step; the pre hook and
the post hook bound the step's optimizer phase. With several
optimizers (a GAN's discriminator and generator), one iteration is one step and it
ends at the *last* optimizer of the iteration: the cycle (every optimizer that steps
between two steps of the first one) is learned over the first iteration, whose row is
written once the cycle is known. The step's loss is the one given to backward for the
first optimizer (summed over its backward calls: a GAN's real and fake discriminator
losses, or gradient-accumulation micro-batches whose losses the script divided by the
accumulation steps, add up to the loss the script logs).

Optimizers can also take turns by phase instead of by iteration: forward-forward
training (pytorch/examples ``mnist_forward_forward``) trains layer 1 with its own
optimizer for all its epochs, then layer 2 with another; a two-stage fine-tune makes a
new optimizer for stage 2. An optimizer outside the learned cycle that steps twice with
no step of the closing one in between starts a *phase*: it closes the steps from then
on. Its first step's row is held until that is known: if the closing optimizer steps
first (an optimizer that steps now and then inside an iteration), the row goes back into
the step under way. Before this, the forward-forward job recorded 30 steps of its 60.

A step detector of ``StepTimer`` (``step_timer.py``): it works on the timer's shared
``StepState`` and its ``StepAccounting``; what only it uses is its own.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepscope.collectors.steps.forward_steps import ForwardSteps
from stepscope.collectors.steps.step_accounting import (
    OPTIMIZER,
    OTHER,
    StepAccounting,
    StepLimitReached,
)
from stepscope.collectors.steps.step_row import merge_rows
from stepscope.collectors.steps.step_state import StepState


class OptimizerSteps:
    """The optimizer hook, the switch to training, and the multi-optimizer cycle."""

    def __init__(self, state: StepState, accounting: StepAccounting, forward: ForwardSteps) -> None:
        self.state = state
        self.acc = accounting
        self.forward = forward  # its global hooks go, its held forwards come in, at training
        self._anchor: weakref.ReferenceType[Any] | None = None  # the first optimizer stepped
        # the optimizer whose step ends an iteration; None while the cycle is learned
        self._closing: weakref.ReferenceType[Any] | None = None
        self._anchor_steps = 0
        self._last_opt: weakref.ReferenceType[Any] | None = None
        self.held: dict[str, Any] | None = None  # the first iteration, while learning
        self._cycle: list[weakref.ReferenceType[Any]] = []  # the optimizers of an iteration
        self._foreign: _Foreign | None = None  # an optimizer outside it stepped once
        self.phases = 1  # phases of training seen (a new optimizer took over the steps)

    def pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """The optimizer phase begins (a closure run inside it is forward and backward)."""
        state, acc = self.state, self.acc
        if state.is_compiling() or state.inert:
            return None
        if state.start_s is None:
            acc.activity()  # optimizer.step(closure) may be the first thing a step does
        # A step that raised never reached its post hook: close it here, or its phase
        # would stay open under everything that follows.
        acc.phase_exit(OPTIMIZER)
        acc.phase_enter(OPTIMIZER)
        if "closure" in state.disabled:
            return None
        try:
            return self._with_timed_closure(args, kwargs)
        except Exception as exc:
            acc.disable("closure", exc)
            return None

    def _with_timed_closure(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """The step's closure, if any, wrapped so that its time is not the optimizer's.

        What a closure runs (Lightning: ``training_step``, logging, zero_grad, backward)
        is the loop's work, not the update: inside it, forward and backward are timed as
        such and the rest is "other", as in a loop that calls them itself.
        """
        if "closure" in kwargs:
            closure = kwargs["closure"]
            if callable(closure):
                return args, {**kwargs, "closure": self._timed_closure(closure)}
        elif len(args) > 1 and callable(args[1]):
            return (args[0], self._timed_closure(args[1]), *args[2:]), kwargs
        return None

    def _timed_closure(self, closure: Callable[..., Any]) -> Callable[..., Any]:
        state, acc = self.state, self.acc

        def timed_closure(*a: Any, **kw: Any) -> Any:
            if state.inert or state.is_compiling():
                return closure(*a, **kw)
            acc.phase_enter(OTHER)
            try:
                return closure(*a, **kw)
            finally:
                acc.phase_exit(OTHER)

        return timed_closure

    def post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        state, acc = self.state, self.acc
        if state.is_compiling() or state.inert:
            return
        acc.phase_exit(OPTIMIZER)  # before the step ends: the update is part of it
        if state.mode == "mark":
            return
        try:
            now = time.time()
            anchor = self._anchor() if self._anchor is not None else None
            if anchor is None:
                self._start_training(optimizer)
                anchor = optimizer
            # losses given to backward since the previous optimizer step were this one's
            mine, state.losses = state.losses, []
            closing = self._closing() if self._closing is not None else None
            if closing is not None and optimizer is not closing and not self._in_cycle(optimizer):
                self._foreign_step(optimizer, mine, now)
                return
            if self._foreign is not None:  # it stepped inside an iteration after all
                mine = self._merge_foreign() + mine
            if optimizer is anchor:
                state.anchor_losses.extend(mine)
                self._anchor_steps += 1
            if closing is None:
                self._learn_cycle(optimizer, anchor, now)
            elif optimizer is closing:
                acc.end_step("optimizer")
        except StepLimitReached:
            raise
        except Exception as exc:
            acc.disable("step timer", exc)

    def _start_training(self, optimizer: Any) -> None:
        """The job's first optimizer step: from now on optimizer steps are the steps."""
        state = self.state
        state.facts.on_optimizer(optimizer)
        self._anchor = weakref.ref(optimizer)
        self._cycle = [self._anchor]
        if state.optimizers_made <= 1:
            self._closing = self._anchor  # one optimizer: nothing to learn
        if state.mode == "auto":
            state.mode = "optimizer"
            forward = self.forward
            forward.remove_global_hooks()
            forward.time_outer_modules()
            forward.take_back_forward_steps()
            forward.absorb_pending()

    def _learn_cycle(self, optimizer: Any, anchor: Any, now: float) -> None:
        """Several optimizers: find the one that steps last in an iteration.

        Until the first optimizer steps again, every optimizer step may be the end of
        the first iteration: the row is kept up to the latest one. At the first
        optimizer's second step, the optimizer that stepped just before it closes
        every iteration, and the kept row is the first step.
        """
        acc = self.acc
        if optimizer is anchor and self._anchor_steps > 1:
            last = self._last_opt() if self._last_opt is not None else None
            self._closing = weakref.ref(last if last is not None else anchor)
            held, self.held = self.held, None
            if held is not None:
                acc.release([held])
            if self._closing() is anchor:
                acc.end_step("optimizer")
            return
        row = acc.take_row("optimizer", now)
        self.held = row if self.held is None else merge_rows(self.held, row)
        self.state.start_s = now
        self._last_opt = weakref.ref(optimizer)
        if not self._in_cycle(optimizer):
            self._cycle.append(weakref.ref(optimizer))

    # -- optimizers that take turns by phase ------------------------------------------------
    def _in_cycle(self, optimizer: Any) -> bool:
        return any(ref() is optimizer for ref in self._cycle)

    def _foreign_step(self, optimizer: Any, mine: list[Any], now: float) -> None:
        """A step of an optimizer outside the cycle: the first is held; a second one with
        no step of the closing optimizer in between starts its phase."""
        acc, pending = self.acc, self._foreign
        if pending is not None and pending.optimizer() is optimizer:
            self._foreign = None
            pending.row["_losses"] = pending.losses  # its first step's loss is the phase's
            acc.release([pending.row])
            self._anchor = self._closing = weakref.ref(optimizer)
            self._cycle = [self._anchor]
            self.phases += 1
            self.state.anchor_losses.extend(mine)
            acc.end_step("optimizer")
            return
        if pending is not None:  # another one before either came back: the first goes back
            mine = self._merge_foreign() + mine
        row = acc.take_row("optimizer", now)
        self.state.start_s = now
        self._foreign = _Foreign(weakref.ref(optimizer), row, list(mine))

    def _merge_foreign(self) -> list[Any]:
        """The held row belongs to the step under way (its optimizer stepped inside it);
        returns the losses given to backward before that step: they were this step's (a
        backward shared by both optimizers, the usual case)."""
        pending, self._foreign = self._foreign, None
        if pending is None:
            return []
        self.acc.merge_row(pending.row)
        self.state.anchor_losses = pending.row["_losses"] + self.state.anchor_losses
        return pending.losses

    def release_held(self) -> None:
        """At the job's end: a job that ended in its first cycle writes what it held, and
        one whose new optimizer stepped once before the end, that step."""
        if self.held is not None and not self.state.inert:
            held, self.held = self.held, None
            self.acc.emit(held)
        if self._foreign is not None and not self.state.inert:
            pending, self._foreign = self._foreign, None
            pending.row["_losses"] = pending.losses
            self.acc.emit(pending.row)

    def wrap_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Optimizer.__init__``: the optimizers a job creates are counted."""
        state = self.state

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if not state.inert:
                state.optimizers_made += 1
                with contextlib.suppress(TypeError):  # an optimizer that refuses weakrefs
                    state.optimizer_refs.add(optimizer)

        return __init__


@dataclass
class _Foreign:
    """An optimizer outside the cycle that stepped once: its step's row and loss, held."""

    optimizer: weakref.ReferenceType[Any]
    row: dict[str, Any]
    losses: list[Any]
