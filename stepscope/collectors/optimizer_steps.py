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

Methods of ``StepTimer`` (``step_timer.py``); the state only they use is set up by
``_init_optimizer_steps``, the rest in ``StepTimer.__init__``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from stepscope.collectors.step_accounting import OPTIMIZER, OTHER, StepLimitReached
from stepscope.collectors.step_row import merge_rows


class OptimizerSteps:
    """The optimizer hook, the switch to training, and the multi-optimizer cycle."""

    def _init_optimizer_steps(self) -> None:
        self._optimizers_made = 0
        self._anchor: weakref.ReferenceType[Any] | None = None
        # the optimizer whose step ends an iteration; None while the cycle is learned
        self._closing: weakref.ReferenceType[Any] | None = None
        self._anchor_steps = 0
        self._last_opt: weakref.ReferenceType[Any] | None = None
        self._held: dict[str, Any] | None = None  # the first iteration, while learning

    def _optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """The optimizer phase begins (a closure run inside it is forward and backward)."""
        if self._is_compiling() or self.inert:
            return None
        if self.start_s is None:
            self._activity()  # optimizer.step(closure) may be the first thing a step does
        # A step that raised never reached its post hook: close it here, or its phase
        # would stay open under everything that follows.
        self._phase_exit(OPTIMIZER)
        self._phase_enter(OPTIMIZER)
        if "closure" in self._disabled:
            return None
        try:
            return self._with_timed_closure(args, kwargs)
        except Exception as exc:
            self._disable("closure", exc)
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
        timer = self

        def timed_closure(*a: Any, **kw: Any) -> Any:
            if timer.inert or timer._is_compiling():
                return closure(*a, **kw)
            timer._phase_enter(OTHER)
            try:
                return closure(*a, **kw)
            finally:
                timer._phase_exit(OTHER)

        return timed_closure

    def _optimizer_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._is_compiling() or self.inert:
            return
        self._phase_exit(OPTIMIZER)  # before the step ends: the update is part of it
        if self.mode == "mark":
            return
        try:
            now = time.time()
            anchor = self._anchor() if self._anchor is not None else None
            if anchor is None:
                self._start_training(optimizer)
                anchor = optimizer
            # losses given to backward since the previous optimizer step were this one's
            mine, self.losses = self.losses, []
            if optimizer is anchor:
                self._anchor_losses.extend(mine)
                self._anchor_steps += 1
            closing = self._closing() if self._closing is not None else None
            if closing is None:
                self._learn_cycle(optimizer, anchor, now)
            elif optimizer is closing:
                self._end_step("optimizer")
        except StepLimitReached:
            raise
        except Exception as exc:
            self._disable("step timer", exc)

    def _start_training(self, optimizer: Any) -> None:
        """The job's first optimizer step: from now on optimizer steps are the steps."""
        self.facts.on_optimizer(optimizer)
        self._anchor = weakref.ref(optimizer)
        if self._optimizers_made <= 1:
            self._closing = self._anchor  # one optimizer: nothing to learn
        if self.mode == "auto":
            self.mode = "optimizer"
            self._remove_forward_hooks()
            self._time_outer_modules()
            self._take_back_forward_steps()
            self._absorb_pending()

    def _learn_cycle(self, optimizer: Any, anchor: Any, now: float) -> None:
        """Several optimizers: find the one that steps last in an iteration.

        Until the first optimizer steps again, every optimizer step may be the end of
        the first iteration: the row is kept up to the latest one. At the first
        optimizer's second step, the optimizer that stepped just before it closes
        every iteration, and the kept row is the first step.
        """
        if optimizer is anchor and self._anchor_steps > 1:
            last = self._last_opt() if self._last_opt is not None else None
            self._closing = weakref.ref(last if last is not None else anchor)
            held, self._held = self._held, None
            if held is not None:
                self._release([held])
            if self._closing() is anchor:
                self._end_step("optimizer")
            return
        row = self._take_row("optimizer", now)
        self._held = row if self._held is None else merge_rows(self._held, row)
        self.start_s = now
        self._last_opt = weakref.ref(optimizer)

    def _wrap_optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if not timer.inert:
                timer._optimizers_made += 1

        return __init__
