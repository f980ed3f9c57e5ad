"""Steps that end with a forward: inference, and jobs that update parameters by hand.

A step ends at the end of an outermost ``nn.Module`` call (forward mode), through
torch's global forward hooks; nested module calls are ignored, and so are top-level
calls of modules other than the first one called (the anchor: a loss or softmax module
applied to the model's output is part of the step, not a step). The global hooks take
every module call off torch's fast path, so they are removed as soon as the first
optimizer step (or mark) shows they are not needed.

Forward steps and training jobs. A job that has created an optimizer but not yet
stepped it is a training job before its first iteration: its forwards are either
evaluation (nanoGPT's ``estimate_loss`` at iteration 0, Lightning's sanity check) or
the micro-batches of the first step (gradient accumulation), so they are held back
and never counted; at the first optimizer step the grad-enabled ones are merged into
it and the others dropped. Forward steps already written when a job starts stepping
an optimizer (an evaluation before an optimizer existed) are taken back the same way,
and a capture window opened on them is opened again on the training steps. A job
with no optimizer writes its forward steps at once once it has run a backward (hand-
written updates) or when the forward runs without grad; a grad-enabled forward with
no backward yet waits up to CONFIRM_FORWARD_S. Released rows are checked against the
step limit and the capture schedule one by one.

A module called while the DataLoader makes a batch in this process (a transform in the
dataset's ``__getitem__``, as torchvision's ``Normalize``, or in the collate function)
is input pipeline, never a model: no step, no request, no forward time; its time stays
the data wait's. (In a worker process the timer is inert.)

The forward phase. The global hooks time the outermost module calls (depth 0) and
remember which modules were called there (the model, a loss module; at most
MAX_OUTER_MODULES). Once the global hooks go (the first optimizer step, a mark), those
modules alone get hooks of their own: the forward is still timed, at the cost of one
hooked call per outermost call instead of one per submodule. A module first called at
top level after that is not timed (its time is the step's "other").

How each forward step ran (grad mode on or off, the model in training mode or not) is
counted for the job's facts at the step's end, once per step (``JobFacts.on_forward_step``):
the inference findings read it.

A step detector of ``StepTimer`` (``step_timer.py``): it works on the timer's shared
``StepState`` and its ``StepAccounting``, and hands a generation job's top-level calls
to ``GenerationSteps`` (``generation_steps.py``); what only it uses is its own.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from stepscope.collectors.steps.step_accounting import (
    DATA,
    FORWARD,
    StepAccounting,
    StepLimitReached,
)
from stepscope.collectors.steps.step_row import add_phases
from stepscope.collectors.steps.step_state import StepState

if TYPE_CHECKING:  # generation_steps.py imports this module
    from stepscope.collectors.steps.generation_steps import GenerationSteps

# Grad-enabled forward steps of a job with no optimizer wait this long for a backward
# or an optimizer before they are taken for inference steps.
CONFIRM_FORWARD_S = 1.0
# Forwards of a job that has an optimizer but never steps it (evaluation with a
# checkpoint's optimizer loaded) are taken for inference steps after this long, or
# after this many of them.
CONFIRM_UNUSED_OPTIMIZER_S = 120.0
MAX_HELD_FORWARDS = 10_000
# Outermost modules that get forward-timing hooks of their own once the global hooks
# are gone. A job calls a handful at top level (model, loss, an EMA copy); a loop that
# calls its layers one by one from Python may call dozens, each as cheap to hook.
MAX_OUTER_MODULES = 64


class ForwardSteps:
    """Forward hooks, held and taken-back forwards, and steps of updates by hand."""

    def __init__(self, state: StepState, accounting: StepAccounting) -> None:
        self.state = state
        self.acc = accounting
        # the generation detector, given by the timer once made (it needs this one)
        self.generation: GenerationSteps | None = None
        # forward rows held back until the job shows what they were (read by generation)
        self.pending: list[dict[str, Any]] = []
        self._confirmed = False  # held forwards turned out to be inference steps
        # a job with no optimizer that runs backward updates its parameters by hand: its
        # steps end where its next forward starts (forward, backward and update in one)
        self._since_boundary = False
        # the first module called at top level: its calls end steps (read by generation)
        self.anchor_ref: weakref.ReferenceType[Any] | None = None
        self._global_handles: list[Any] = []  # torch's global forward hooks
        # modules called at depth 0 while the global hooks were on (id -> weak reference)
        self._outer_modules: dict[int, weakref.ReferenceType[Any]] = {}
        self._outer_handles: list[Any] = []

    def anchor(self) -> Any:
        """The module whose top-level calls end steps, or None."""
        return self.anchor_ref() if self.anchor_ref is not None else None

    # -- torch's global forward hooks -------------------------------------------------------
    def add_global_hooks(self, module_mod: Any) -> None:
        """Register torch's global forward hooks (``torch.nn.modules.module``)."""
        self._global_handles = [
            module_mod.register_module_forward_pre_hook(self.pre_hook),
            module_mod.register_module_forward_hook(self.post_hook, always_call=True),
        ]

    def remove_global_hooks(self) -> None:
        for handle in self._global_handles:
            handle.remove()
        self._global_handles = []

    def pre_hook(self, module: Any, args: Any) -> None:
        state, acc = self.state, self.acc
        # Under torch.compile tracing the hook must trace to nothing (no graph break);
        # the compiled module's own outer call still runs the hooks eagerly.
        if state.is_compiling() or state.inert:
            return
        tls = state.tls
        loading = getattr(tls, "loading", 0)
        if loading:  # inside a transform (below)
            tls.loading = loading + 1
            return
        depth = getattr(tls, "depth", 0)
        if depth == 0 and DATA in (getattr(tls, "phases", None) or ()):
            # a module called while the DataLoader makes a batch (a transform in the
            # dataset's __getitem__ or the collate function): input pipeline, no model.
            # Checked at the top level only: a model's own submodules skip the look.
            tls.loading = 1
            return
        tls.depth = depth + 1
        if depth == 0:
            if state.start_s is None:
                acc.activity()
            if "model" not in state.facts.facts:
                state.facts.on_top_forward(module, args)
            try:
                # a forward of a generation request (generation_steps.py): a token, not a step
                generation = self.generation is not None and self.generation.pre(module, args)
            except StepLimitReached:
                tls.depth = depth  # the call does not happen
                raise
            # (the first iteration's forward is held: it ran before any backward)
            if not generation and (self._since_boundary or self.pending) and self.updates_by_hand():
                anchor = self.anchor()
                if module is anchor and state.torch.is_grad_enabled():
                    try:
                        self._end_update_step(time.time())
                    except StepLimitReached:
                        tls.depth = depth  # the call does not happen
                        raise
                    except Exception as exc:
                        acc.disable("step timer", exc)
            outer = self._outer_modules
            known = outer.get(id(module))
            if (known is None or known() is not module) and len(outer) < MAX_OUTER_MODULES:
                outer[id(module)] = weakref.ref(module)
            acc.phase_enter(FORWARD)

    def post_hook(self, module: Any, args: Any, output: Any) -> None:
        state, acc = self.state, self.acc
        if state.is_compiling() or state.inert:
            return
        tls = state.tls
        loading = getattr(tls, "loading", 0)
        if loading:
            tls.loading = loading - 1
            return
        depth = getattr(tls, "depth", 1) - 1
        tls.depth = depth
        if depth == 0:
            acc.phase_exit(FORWARD)  # before a step ends here: the forward is part of it
        if depth == 0 and state.mode == "auto":
            try:
                # Like the optimizer anchor: the first module called at top level ends
                # steps; other top-level calls (a loss module, a post-processing
                # module applied to the outputs) are part of the step.
                anchor = self.anchor()
                if anchor is None:
                    self.anchor_ref = weakref.ref(module)
                if self.generation is not None and self.generation.post(module, output):
                    return  # a request's forward: its step ends with the request
                if anchor is not None and anchor is not module:
                    return
                grad = state.torch.is_grad_enabled()
                # how the step ran (grad mode, train mode): the inference findings' facts
                state.facts.on_forward_step(module, grad, state.backward_seen)
                self._forward_end(grad)
            except StepLimitReached:
                raise
            except Exception as exc:
                acc.disable("step timer", exc)

    # -- the outermost modules' own hooks ---------------------------------------------------
    def time_outer_modules(self) -> None:
        """The global hooks are going: time the forward on the outermost modules only."""
        if self._outer_handles:  # done already (optimizer steps, then marks)
            return
        for ref in self._outer_modules.values():
            module = ref()
            if module is None:
                continue
            try:
                self._outer_handles += [
                    module.register_forward_pre_hook(self._outer_pre_hook),
                    module.register_forward_hook(self._outer_hook, always_call=True),
                ]
            except Exception as exc:  # a module that refuses hooks: its forward is "other"
                self.acc.disable("forward phase", exc)

    def remove_outer_hooks(self) -> None:
        for handle in self._outer_handles:
            handle.remove()
        self._outer_handles = []

    def _outer_pre_hook(self, module: Any, args: Any) -> None:
        state = self.state
        if state.is_compiling() or state.inert:
            return
        tls = state.tls
        depth = getattr(tls, "outer_depth", 0)
        tls.outer_depth = depth + 1
        if depth == 0:  # a hooked module called inside another (a loss in the model)
            self.acc.phase_enter(FORWARD)

    def _outer_hook(self, module: Any, args: Any, output: Any) -> None:
        state = self.state
        if state.is_compiling() or state.inert:
            return
        tls = state.tls
        depth = max(0, getattr(tls, "outer_depth", 1) - 1)
        tls.outer_depth = depth
        if depth == 0:
            self.acc.phase_exit(FORWARD)

    # -- forward steps ----------------------------------------------------------------------
    def _forward_end(self, grad: bool) -> None:
        state = self.state
        end = time.time()
        if state.optimizers_made:
            # A training job before its first optimizer step: evaluation, or the
            # micro-batches of the first step. The optimizer step will tell.
            self._hold_forward(end, grad)
            pending = self.pending
            if (
                end - pending[0]["end_s"] >= CONFIRM_UNUSED_OPTIMIZER_S
                or len(pending) >= MAX_HELD_FORWARDS
            ):
                self.confirm_forward_steps()
            return
        if state.backward_seen:
            # a job that updates its parameters by hand: the step ends where the next
            # training forward starts (after this one's backward and update); a forward
            # without grad is evaluation, not a step
            if grad:
                self._since_boundary = True
            return
        if self._confirmed or not grad or state.backward_seen:
            if self.pending:
                self.confirm_forward_steps()
            self.acc.end_step("forward")
            return
        self._hold_forward(end, grad)
        if end - self.pending[0]["end_s"] >= CONFIRM_FORWARD_S:
            self.confirm_forward_steps()

    def updates_by_hand(self) -> bool:
        state = self.state
        return state.mode == "auto" and state.backward_seen and not state.optimizers_made

    def _end_update_step(self, end: float) -> None:
        """A step of a job that updates by hand: its forward, backward and update."""
        acc = self.acc
        self._since_boundary = False
        self._confirmed = True
        self.state.facts.on_backward()  # before the first step writes the facts: not inference
        self.absorb_pending()  # the first iteration's forward, held until its backward
        row = acc.take_row("forward", end)
        acc.emit(row)
        acc.after_emit(end)

    def _hold_forward(self, end: float, grad: bool) -> None:
        row = self.acc.take_row("forward", end)
        row["_grad"] = grad
        self.pending.append(row)
        self.state.start_s = end

    def confirm_forward_steps(self) -> None:
        """No optimizer step came: the held forwards were inference steps after all."""
        self._confirmed = True
        pending, self.pending = self.pending, []
        self.acc.release(pending)

    def absorb_pending(self) -> None:
        """At the first optimizer step: held grad-enabled forwards are its micro-batches
        (merged in); held forwards without grad were evaluation (dropped)."""
        state = self.state
        pending, self.pending = self.pending, []
        training = [r for r in pending if r.get("_grad", True)]
        if not training:
            return
        state.start_s = training[0]["start_s"]
        state.data_wait += sum(r["data_wait_s"] for r in training)
        for row in training:
            state.phase_s = add_phases(state.phase_s, row)
        state.batch += sum(r["batch_size"] or 0 for r in training)
        state.batches += sum(r["_batches"] for r in training)
        state.losses = [t for r in training for t in r["_losses"]] + state.losses
        state.profiled = state.profiled or any(r["profiled"] for r in training)

    def take_back_forward_steps(self) -> None:
        """Forward steps written before the job's first optimizer step were evaluation
        (or set-up), not training steps: delete them and count training from 0."""
        state = self.state
        if state.step == 0:
            return
        taken_back, state.step = state.step, 0
        state.emitted_data_wait = 0.0
        state.emitted_phases = [0.0, 0.0, 0.0]
        state.emitted_batch = 0
        state.batch_counter.forget_first_row()
        state.cuda.forget()
        self._confirmed = False
        writer = state.writer()
        writer.delete_steps_from(0)
        writer.flush()  # before step 0 is written again: deletions follow inserts
        writer.log(
            "info",
            "step_timer",
            f"{taken_back} forward steps before the first optimizer step (evaluation) "
            "are not training steps: taken back",
        )
        if state.capture is not None and "capture" not in state.disabled:
            try:
                state.capture.rearm()
                state.after_capture = 0
                state.profiled = bool(state.capture.active)
            except Exception as exc:
                self.acc.disable("capture", exc)

    # -- the job's end ----------------------------------------------------------------------
    def finish_update_step(self) -> None:
        """At the job's end: the last iteration of a job that updates by hand ends with
        its backward."""
        state, acc = self.state, self.acc
        pending = self._since_boundary or self.pending
        if pending and self.updates_by_hand() and not state.inert:
            self._since_boundary = False
            snapshot = state.at_backward_end
            if snapshot is not None and snapshot[0] == state.step:
                # the row ends there: the evaluation after it is not in its phases
                state.data_wait, state.phase_s = snapshot[1], list(snapshot[2])
                acc.phase_skip()
            self.absorb_pending()
            acc.emit(acc.take_row("forward", state.last_backward_end or time.time()))

    def write_pending(self) -> None:
        """At the job's end: forwards still held are written as the steps they were."""
        if self.pending and not self.state.inert:
            self._confirmed = True
            pending, self.pending = self.pending, []
            for row in pending:
                self.acc.emit(row)
