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

Methods of ``StepTimer`` (``step_timer.py``); the state only they use is set up by
``_init_forward_steps``, the rest in ``StepTimer.__init__``.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from stepscope.collectors.step_accounting import DATA, FORWARD, StepLimitReached
from stepscope.collectors.step_row import add_phases

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

    def _init_forward_steps(self) -> None:
        self._pending_fwd: list[dict[str, Any]] = []
        self._fwd_confirmed = False
        # a job with no optimizer that runs backward updates its parameters by hand: its
        # steps end where its next forward starts (forward, backward and update in one)
        self._fwd_since_boundary = False
        self._fwd_anchor: weakref.ReferenceType[Any] | None = None
        # modules called at depth 0 while the global hooks were on (id -> weak reference)
        self._outer_modules: dict[int, weakref.ReferenceType[Any]] = {}
        self._outer_handles: list[Any] = []

    def _forward_pre_hook(self, module: Any, args: Any) -> None:
        # Under torch.compile tracing the hook must trace to nothing (no graph break);
        # the compiled module's own outer call still runs the hooks eagerly.
        if self._is_compiling() or self.inert:
            return
        tls = self._tls
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
            if self.start_s is None:
                self._activity()
            if "model" not in self.facts.facts:
                self.facts.on_top_forward(module, args)
            try:
                # a forward of a generation request (generation_steps.py): a token, not a step
                generation = self._generation_pre(module, args)
            except StepLimitReached:
                tls.depth = depth  # the call does not happen
                raise
            # (the first iteration's forward is held: it ran before any backward)
            if (
                not generation
                and (self._fwd_since_boundary or self._pending_fwd)
                and self._updates_by_hand()
            ):
                anchor = self._fwd_anchor() if self._fwd_anchor is not None else None
                if module is anchor and self._torch.is_grad_enabled():
                    try:
                        self._end_update_step(time.time())
                    except StepLimitReached:
                        tls.depth = depth  # the call does not happen
                        raise
                    except Exception as exc:
                        self._disable("step timer", exc)
            outer = self._outer_modules
            known = outer.get(id(module))
            if (known is None or known() is not module) and len(outer) < MAX_OUTER_MODULES:
                outer[id(module)] = weakref.ref(module)
            self._phase_enter(FORWARD)

    def _forward_hook(self, module: Any, args: Any, output: Any) -> None:
        if self._is_compiling() or self.inert:
            return
        tls = self._tls
        loading = getattr(tls, "loading", 0)
        if loading:
            tls.loading = loading - 1
            return
        depth = getattr(tls, "depth", 1) - 1
        tls.depth = depth
        if depth == 0:
            self._phase_exit(FORWARD)  # before a step ends here: the forward is part of it
        if depth == 0 and self.mode == "auto":
            try:
                # Like the optimizer anchor: the first module called at top level ends
                # steps; other top-level calls (a loss module, a post-processing
                # module applied to the outputs) are part of the step.
                anchor = self._fwd_anchor() if self._fwd_anchor is not None else None
                if anchor is None:
                    self._fwd_anchor = weakref.ref(module)
                if self._generation_post(module):
                    return  # a request's forward: its step ends with the request
                if anchor is not None and anchor is not module:
                    return
                grad = self._torch.is_grad_enabled()
                # how the step ran (grad mode, train mode): the inference findings' facts
                self.facts.on_forward_step(module, grad, self.backward_seen)
                self._forward_end(grad)
            except StepLimitReached:
                raise
            except Exception as exc:
                self._disable("step timer", exc)

    def _time_outer_modules(self) -> None:
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
                self._disable("forward phase", exc)

    def _remove_outer_hooks(self) -> None:
        for handle in self._outer_handles:
            handle.remove()
        self._outer_handles = []

    def _outer_pre_hook(self, module: Any, args: Any) -> None:
        if self._is_compiling() or self.inert:
            return
        tls = self._tls
        depth = getattr(tls, "outer_depth", 0)
        tls.outer_depth = depth + 1
        if depth == 0:  # a hooked module called inside another (a loss in the model)
            self._phase_enter(FORWARD)

    def _outer_hook(self, module: Any, args: Any, output: Any) -> None:
        if self._is_compiling() or self.inert:
            return
        tls = self._tls
        depth = max(0, getattr(tls, "outer_depth", 1) - 1)
        tls.outer_depth = depth
        if depth == 0:
            self._phase_exit(FORWARD)

    def _forward_end(self, grad: bool) -> None:
        end = time.time()
        if self._optimizers_made:
            # A training job before its first optimizer step: evaluation, or the
            # micro-batches of the first step. The optimizer step will tell.
            self._hold_forward(end, grad)
            pending = self._pending_fwd
            if (
                end - pending[0]["end_s"] >= CONFIRM_UNUSED_OPTIMIZER_S
                or len(pending) >= MAX_HELD_FORWARDS
            ):
                self._confirm_forward_steps()
            return
        if self.backward_seen:
            # a job that updates its parameters by hand: the step ends where the next
            # training forward starts (after this one's backward and update); a forward
            # without grad is evaluation, not a step
            if grad:
                self._fwd_since_boundary = True
            return
        if self._fwd_confirmed or not grad or self.backward_seen:
            if self._pending_fwd:
                self._confirm_forward_steps()
            self._end_step("forward")
            return
        self._hold_forward(end, grad)
        if end - self._pending_fwd[0]["end_s"] >= CONFIRM_FORWARD_S:
            self._confirm_forward_steps()

    def _updates_by_hand(self) -> bool:
        return self.mode == "auto" and self.backward_seen and not self._optimizers_made

    def _end_update_step(self, end: float) -> None:
        """A step of a job that updates by hand: its forward, backward and update."""
        self._fwd_since_boundary = False
        self._fwd_confirmed = True
        self.facts.on_backward()  # before the first step writes the facts: not inference
        self._absorb_pending()  # the first iteration's forward, held until its backward
        row = self._take_row("forward", end)
        self._emit(row)
        self._after_emit(end)

    def _hold_forward(self, end: float, grad: bool) -> None:
        row = self._take_row("forward", end)
        row["_grad"] = grad
        self._pending_fwd.append(row)
        self.start_s = end

    def _confirm_forward_steps(self) -> None:
        """No optimizer step came: the held forwards were inference steps after all."""
        self._fwd_confirmed = True
        pending, self._pending_fwd = self._pending_fwd, []
        self._release(pending)

    def _absorb_pending(self) -> None:
        """At the first optimizer step: held grad-enabled forwards are its micro-batches
        (merged in); held forwards without grad were evaluation (dropped)."""
        pending, self._pending_fwd = self._pending_fwd, []
        training = [r for r in pending if r.get("_grad", True)]
        if not training:
            return
        self.start_s = training[0]["start_s"]
        self.data_wait += sum(r["data_wait_s"] for r in training)
        for row in training:
            self.phase_s = add_phases(self.phase_s, row)
        self.batch += sum(r["batch_size"] or 0 for r in training)
        self.batches += sum(r["_batches"] for r in training)
        self.losses = [t for r in training for t in r["_losses"]] + self.losses
        self.profiled = self.profiled or any(r["profiled"] for r in training)

    def _take_back_forward_steps(self) -> None:
        """Forward steps written before the job's first optimizer step were evaluation
        (or set-up), not training steps: delete them and count training from 0."""
        if self.step == 0:
            return
        taken_back, self.step = self.step, 0
        self._emitted_data_wait = 0.0
        self._emitted_phases = [0.0, 0.0, 0.0]
        self._emitted_batch = 0
        self.batch_counter.forget_first_row()
        self.cuda.forget()
        self._fwd_confirmed = False
        writer = self._writer()
        writer.delete_steps_from(0)
        writer.flush()  # before step 0 is written again: deletions follow inserts
        writer.log(
            "info",
            "step_timer",
            f"{taken_back} forward steps before the first optimizer step (evaluation) "
            "are not training steps: taken back",
        )
        if self.capture is not None and "capture" not in self._disabled:
            try:
                self.capture.rearm()
                self._after_capture = 0
                self.profiled = bool(self.capture.active)
            except Exception as exc:
                self._disable("capture", exc)
