"""Finds the steps of an unmodified job and times them: the step timer of one process.

Where a step ends, in order of precedence:

* ``stepscope.mark_step()`` (explicit mode): once called, it alone defines steps.
* ``optimizer.step()`` (optimizer mode), through torch's global optimizer post hook;
  with several optimizers, at the last one of an iteration (``optimizer_steps.py``).
* the end of an outermost ``nn.Module`` call (forward mode, for inference and for
  jobs that update their parameters by hand), through torch's global forward hooks
  (``forward_steps.py``); in a text-generation job, the end of a request (a
  ``generate()`` call, a decode loop's run over one prompt: ``generation_steps.py``).

``StepTimer`` is one object per process. What its parts share is one ``StepState``
(``step_state.py``, each field says who writes it); ``StepAccounting``
(``step_accounting.py``: rows written, captures and the limit between steps, failures)
works on it, and the three step detectors above (``OptimizerSteps``, ``ForwardSteps``,
``GenerationSteps``) get both passed in. This module composes them, ends the job
(``finalize``), installs the whole into torch, measures what a step waits for its
input, times backward and ``zero_grad``, captures the losses given to backward, and
handles explicit marks. Samples per step are counted by ``batch_count.py``, device time
by ``cuda_timing.py``; the phases of a step (data wait, forward, backward, optimizer)
are accumulated as ``step_accounting.py`` describes. On CUDA the host phases are the
time the host spent launching the work (the device runs behind): a profiler capture's
trace has the device's side.

Everything here runs on the job's hot path: a hook only appends to memory; the store
is written by the BufferedWriter's thread, which also resolves CUDA events (device
time, loss values) once they have completed, so the job never synchronises for us.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from stepscope.collectors.steps.forward_steps import ForwardSteps
from stepscope.collectors.steps.generation_steps import GenerationSteps
from stepscope.collectors.steps.optimizer_steps import OptimizerSteps
from stepscope.collectors.steps.step_accounting import (
    BACKWARD,
    DATA,
    OPTIMIZER,
    StepAccounting,
    StepLimitReached,
)
from stepscope.collectors.steps.step_state import StepState
from stepscope.collectors.trials.generation_sweep import run_batches

_timer: StepTimer | None = None


def mark_step() -> None:
    """Public entry (``stepscope.mark_step``): a no-op outside ``stepscope run``."""
    timer = _timer
    if timer is not None:
        timer.mark()


def current() -> StepTimer | None:
    return _timer


def set_current(timer: StepTimer | None) -> None:
    global _timer
    _timer = timer


def _shared(name: str, doc: str) -> property:
    """A ``StepState`` field read and written through the timer (its public API)."""

    def get(timer: StepTimer) -> Any:
        return getattr(timer.state, name)

    def set_(timer: StepTimer, value: Any) -> None:
        setattr(timer.state, name, value)

    return property(get, set_, doc=doc)


class StepTimer:
    """Step detection and per-step accounting for one process (one rank)."""

    # what the bootstrap, the generation patch and sweep, and the tests read or set
    rank = _shared("rank", "the rank rows are written for")
    worker = _shared("worker", "the training worker of this process (facts/workers.py)")
    max_steps = _shared("max_steps", "the step limit, None: none")
    capture = _shared("capture", "the profiler capture schedule, or None")
    mode = _shared("mode", "'auto' (forward + optimizer) | 'optimizer' | 'mark'")
    inert = _shared("inert", "record nothing (a forked child, after a stop or a failure)")
    step = _shared("step", "the index the next step's row gets")
    start_s = _shared("start_s", "the start of the step under way")
    profiled = _shared("profiled", "the step under way is inside a capture window")
    data_wait = _shared("data_wait", "the step's input wait so far")
    phase_s = _shared("phase_s", "the step's forward, backward, optimizer seconds so far")
    batch_counter = _shared("batch_counter", "samples per step (batch_count.py)")
    facts = _shared("facts", "the job's facts (facts/job_facts.py)")
    cuda = _shared("cuda", "device time of the steps (cuda_timing.py)")
    _torch = _shared("torch", "the torch module, once installed")
    _writer = _shared("writer", "the run's writer, called for the BufferedWriter")

    def __init__(
        self,
        writer: Callable[[], Any],
        *,
        rank: int | None = None,
        max_steps: int | None = None,
        capture: Any = None,
        on_first_step: Callable[[], None] | None = None,
    ) -> None:
        # RANK from the environment (torchrun); None: ask torch.distributed at the
        # first step (mp.spawn-style jobs), else 0.
        self.state = state = StepState(
            writer,
            rank=rank or 0,
            max_steps=max_steps if max_steps and max_steps > 0 else None,
            capture=capture,
        )
        self.accounting = acc = StepAccounting(
            state, rank_known=rank is not None, on_first_step=on_first_step
        )
        self.forward = ForwardSteps(state, acc)
        self.optimizer = OptimizerSteps(state, acc, self.forward)
        self.generation = GenerationSteps(state, acc, self.forward)
        self.forward.generation = self.generation
        acc.finalize = self.finalize
        acc.remove_global_hooks = self.forward.remove_global_hooks
        acc.remove_outer_hooks = self.forward.remove_outer_hooks
        self.gen = self.generation.gen  # the requests (the bootstrap sets what to record)
        self._taken_back = 0  # hook steps already written when the job began to mark
        self._tensor_type: type | None = None
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []

    # -- installation -------------------------------------------------------------------
    def install(self) -> None:
        """Register torch's global hooks and patch the DataLoader and backward."""
        # local: called once torch is imported (the bootstrap's import hook); importing
        # this module must not import torch (``stepscope.mark_step`` imports it)
        import torch
        import torch.nn.modules.module as module_mod
        import torch.optim.optimizer as optim_mod
        import torch.utils.data.dataloader as dl_mod

        state = self.state
        state.torch = torch
        self._tensor_type = torch.Tensor
        state.batch_counter.tensor_type = torch.Tensor
        state.cuda.torch = torch
        state.is_compiling = torch.compiler.is_compiling
        optimizer = self.optimizer
        self._handles.append(optim_mod.register_optimizer_step_post_hook(optimizer.post_hook))
        self._handles.append(optim_mod.register_optimizer_step_pre_hook(optimizer.pre_hook))
        self._patch(optim_mod.Optimizer, "zero_grad", self._wrap_zero_grad)
        self._patch(module_mod.Module, "zero_grad", self._wrap_zero_grad)
        # Counting the optimizers a job creates tells a training job's evaluation
        # forwards (before its first step) from an inference job's steps.
        self._patch(optim_mod.Optimizer, "__init__", optimizer.wrap_init)
        self.forward.add_global_hooks(module_mod)
        # torch.compile warns (on the job's stderr) that global hooks fire once more for
        # the OptimizedModule wrapper; the depth counter already ignores that inner call.
        warnings.filterwarnings(
            "ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks"
        )
        self._patch(
            dl_mod._BaseDataLoaderIter,
            "__next__",
            lambda original: self._wrap_data(original, count_batch=True),
        )
        self._patch(
            dl_mod.DataLoader,
            "__iter__",
            lambda original: self._wrap_data(original, count_batch=False),
        )
        self._patch(torch.autograd, "backward", self._wrap_backward)
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def uninstall(self) -> None:
        """Every hook and patch of ``install`` taken back (an attach detaching; call
        ``finalize`` first). A patch someone else has wrapped since stays: taking ours out
        from under theirs would drop theirs too."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.forward.remove_global_hooks()
        self.forward.remove_outer_hooks()
        for owner, name, original in reversed(self._patches):
            if getattr(getattr(owner, name, None), "__wrapped__", None) is original:
                setattr(owner, name, original)
        self._patches = []
        self.state.inert = True

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        wrapped = make(original)
        wrapped.__wrapped__ = original
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(wrapped, attr, getattr(original, attr))
        setattr(owner, name, wrapped)
        self._patches.append((owner, name, original))

    def _after_fork_in_child(self) -> None:
        # A forked child shares our hooks. Forked before this process began its steps, it
        # may train as a worker of its own (a hogwild job started with fork or
        # forkserver; facts/workers.py), and a DataLoader worker still turns inert at its first
        # activity; forked mid-run it copied a step under way: it records nothing.
        if not self.fresh():
            self.state.inert = True

    def fresh(self) -> bool:
        """No step has begun in this process (a fork now gives the child a clean timer)."""
        state = self.state
        return state.start_s is None and state.step == 0 and not state.inert

    # -- input wait and losses ----------------------------------------------------------
    def _wrap_data(self, original: Callable[..., Any], *, count_batch: bool) -> Callable[..., Any]:
        """Time inside a DataLoader entry point is time the loop waits for its input:
        ``__next__`` (the next batch, whose size is read here) and ``__iter__``
        (creating the iterator starts or resets the workers)."""
        state, acc = self.state, self.accounting

        def wrapper(self: Any) -> Any:
            if state.inert or "data wait" in state.disabled:
                return original(self)
            if not count_batch:
                state.facts.on_loader(self)
                state.batch_counter.on_new_iterator(getattr(self, "dataset", None))
            if state.start_s is None:
                acc.activity()
            acc.phase_enter(DATA)
            try:
                result = original(self)
            except StopIteration:
                if count_batch and state.batch_counter.look_ahead:
                    state.batch_counter.count(id(getattr(self, "_dataset", None)), None)
                raise
            finally:
                acc.phase_exit(DATA)
            if count_batch:
                try:
                    state.batch_counter.count(id(getattr(self, "_dataset", None)), result)
                except Exception as exc:
                    acc.disable("data wait", exc)
            return result

        return wrapper

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        state, acc = self.state, self.accounting
        timer = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not state.inert and "loss" not in state.disabled:
                try:
                    timer._record_loss(tensors)
                except Exception as exc:
                    acc.disable("loss", exc)
            timed = not state.inert and not state.is_compiling()
            if timed:
                acc.phase_enter(BACKWARD)
            try:
                result = original(tensors, *args, **kwargs)
            finally:
                if timed:
                    acc.phase_exit(BACKWARD)
            state.last_backward_end = time.time()
            # where the last step of a job that updates by hand ends (``finalize``)
            state.at_backward_end = (state.step, state.data_wait, list(state.phase_s))
            return result

        return backward

    def _wrap_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``optimizer.zero_grad()`` and ``model.zero_grad()`` are the optimizer's phase:
        one pass over every parameter, gone with the step when gradients are zeroed by
        ``set_to_none`` or fused away."""
        state, acc = self.state, self.accounting

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if state.inert or state.is_compiling():
                return original(obj, *args, **kwargs)
            acc.phase_enter(OPTIMIZER)
            try:
                return original(obj, *args, **kwargs)
            finally:
                acc.phase_exit(OPTIMIZER)

        return zero_grad

    def _record_loss(self, tensors: Any) -> None:
        state = self.state
        state.backward_seen = True
        if state.start_s is None:
            self.accounting.activity()
        t = tensors
        if isinstance(t, (tuple, list)):
            if len(t) != 1:
                return
            t = t[0]
        if isinstance(t, self._tensor_type) and t.numel() == 1 and (t.is_cuda or t.is_cpu):
            state.losses.append(t.detach())

    # -- explicit mode ---------------------------------------------------------------------
    def mark(self) -> None:
        state, acc = self.state, self.accounting
        if state.inert:
            return
        try:
            if state.mode != "mark":
                self._switch_to_marks()
            if state.start_s is None:
                acc.activity()
            acc.end_step("mark")
        except StepLimitReached:
            raise
        except Exception as exc:
            acc.disable("step timer", exc)

    def _switch_to_marks(self) -> None:
        """The job marks its own steps: steps found so far by hooks are taken back.

        Their rows are overwritten (same rank and step index) by the marks that
        follow, the first mark spanning from the first activity; rows beyond the
        last mark are deleted when the job ends (``finalize``).
        """
        state = self.state
        state.mode = "mark"
        self.forward.remove_global_hooks()
        self.forward.time_outer_modules()
        self.forward.absorb_pending()
        if state.step == 0:
            return
        taken_back = self._taken_back = state.step
        state.step = 0
        state.start_s = state.first_activity_s
        state.data_wait += state.emitted_data_wait
        state.phase_s = [a + b for a, b in zip(state.phase_s, state.emitted_phases, strict=True)]
        state.batch += state.emitted_batch
        state.writer().log(
            "info",
            "step_timer",
            f"mark_step() called: the {taken_back} steps found by hooks are replaced by marks",
        )

    # -- generate() (injob/generate_patch.py) ---------------------------------------------
    def begin_generate(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A generate() call starts: its request (None when nested or not recorded)."""
        return self.generation.begin_generate(model, args, kwargs)

    def note_generate_settings(self, request: Any, model: Any, kwargs: dict[str, Any]) -> None:
        """The call's settings once the plan's fixes changed them."""
        self.generation.note_generate_settings(request, model, kwargs)

    def end_generate(self, request: Any, output: Any, error: BaseException | None) -> None:
        """The generate() call returned (or raised): its tokens, its row, its step."""
        self.generation.end_generate(request, output, error)

    def run_generation_sweep(self, original: Any, model: Any) -> None:
        """A sweep trial's first generate() call: the recorded prompts, batched, then the
        job stops (``trials/generation_sweep.py``)."""
        gen = self.gen
        gen.sweep_done = True
        run_batches(self, original, model, gen.sweep or {}, gen.run_dir or ".")
        writer = self.state.writer()
        writer.update_run(stop_reason="sweep")  # first, as at the step limit (stop_job)
        writer.flush()
        self.finalize()
        writer.log("info", "generation", f"batch sweep done: {gen.count} requests")
        writer.flush()
        raise StepLimitReached(self.state.step)

    # -- the writer's thread and the job's end ---------------------------------------------
    def resolve_pending(self) -> None:
        """Writer ``before_flush`` callback: write CUDA rows whose events have completed.

        Runs on the writer's thread. ``event.query()`` never blocks; a row whose event
        is still pending after ``cuda_timing.CUDA_WAIT_S`` is written without device_s rather than
        held, so the store stays within a couple of seconds of the job.
        """
        state = self.state
        state.cuda.resolve(state.writer, final=state.final)

    def finalize(self) -> None:
        """At exit or at the step limit: write everything still held back."""
        state, acc = self.state, self.accounting
        if state.final:
            return
        if not state.inert:
            self.generation.finalize()
        try:
            self.forward.finish_update_step()
            self.optimizer.release_held()
            self.forward.write_pending()
        except Exception as exc:
            acc.disable("step timer", exc)
        state.final = True
        state.inert = True
        acc.write_facts()
        if state.mode == "mark" and self._taken_back > state.step:
            with contextlib.suppress(Exception):
                state.writer().delete_steps_from(state.step)
        if state.capture is not None:
            state.capture.close(state.step)
        if state.cuda.rows:
            with contextlib.suppress(Exception):
                state.torch.cuda.synchronize()  # the job is over: waiting is free now
