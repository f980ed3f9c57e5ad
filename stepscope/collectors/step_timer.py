"""Finds the steps of an unmodified job and times them: the step timer of one process.

Where a step ends, in order of precedence:

* ``stepscope.mark_step()`` (explicit mode): once called, it alone defines steps.
* ``optimizer.step()`` (optimizer mode), through torch's global optimizer post hook;
  with several optimizers, at the last one of an iteration (``optimizer_steps.py``).
* the end of an outermost ``nn.Module`` call (forward mode, for inference and for
  jobs that update their parameters by hand), through torch's global forward hooks
  (``forward_steps.py``); in a text-generation job, the end of a request (a
  ``generate()`` call, a decode loop's run over one prompt: ``generation_steps.py``).

``StepTimer`` is one object per process, made of those parts and of
``step_accounting.py`` (rows written, captures and the limit between steps, the end
of the job); this module installs it into torch, measures what a step waits for its
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
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from stepscope.collectors.batch_count import BatchCounter
from stepscope.collectors.cuda_timing import CudaTiming
from stepscope.collectors.forward_steps import ForwardSteps
from stepscope.collectors.generation_steps import GenerationSteps
from stepscope.collectors.job_facts import JobFacts
from stepscope.collectors.optimizer_steps import OptimizerSteps
from stepscope.collectors.step_accounting import (
    BACKWARD,
    DATA,
    OPTIMIZER,
    StepAccounting,
    StepLimitReached,
)

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


class StepTimer(OptimizerSteps, ForwardSteps, GenerationSteps, StepAccounting):
    """Step detection and per-step accounting for one process (one rank)."""

    def __init__(
        self,
        writer: Callable[[], Any],
        *,
        rank: int | None = None,
        max_steps: int | None = None,
        capture: Any = None,
        on_first_step: Callable[[], None] | None = None,
    ) -> None:
        self._writer = writer
        # RANK from the environment (torchrun); None: ask torch.distributed at the
        # first step (mp.spawn-style jobs), else 0.
        self.rank = rank or 0
        self._rank_known = rank is not None
        self.worker: int | None = None  # known at the first step (workers.py)
        self.max_steps = max_steps if max_steps and max_steps > 0 else None
        self.capture = capture
        self._on_first_step = on_first_step
        self.mode = "auto"  # 'auto' (forward + optimizer) | 'optimizer' | 'mark'
        self.inert = False  # set in forked children and after a stop or a failure
        self.step = 0
        self.installed_at = time.time()
        self.start_s: float | None = None
        self.first_activity_s: float | None = None
        self.profiled = False
        # totals over written steps, so that a first mark_step() can take them back
        self._emitted_data_wait = 0.0
        self._emitted_phases = [0.0, 0.0, 0.0]
        self._emitted_batch = 0
        self._taken_back = 0  # hook steps already written when the job began to mark
        # per-step accumulators, reset at each step end
        self.data_wait = 0.0
        self.phase_s = [0.0, 0.0, 0.0]  # forward, backward, optimizer (step_row.PHASE_COLUMNS)
        # Samples of the step: those of the dataset it fetched last (``batch_count.py``),
        # plus ``batch``: samples merged in from held rows.
        self.batch = 0
        self.batches = 0
        self.batch_counter = BatchCounter()
        self.losses: list[Any] = []  # given to backward since the last optimizer step
        self._anchor_losses: list[Any] = []  # ... and those the first optimizer stepped on
        self.backward_seen = False
        self._last_backward_end: float | None = None
        self._at_backward_end: tuple[int, float, list[float]] | None = None
        self._after_capture = 0
        self._init_optimizer_steps()
        self._init_forward_steps()
        self._init_generation()
        self._tls = threading.local()
        self._handles: list[Any] = []
        self._fwd_handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []
        self.cuda = CudaTiming()
        self._final = False
        self._torch: Any = None
        self._is_compiling: Callable[[], bool] = _false
        self._tensor_type: type | None = None
        self._disabled: set[str] = set()
        self.facts = JobFacts()

    # -- installation -------------------------------------------------------------------
    def install(self) -> None:
        """Register torch's global hooks and patch the DataLoader and backward."""
        # local: called once torch is imported (the bootstrap's import hook); importing
        # this module must not import torch (``stepscope.mark_step`` imports it)
        import torch
        import torch.nn.modules.module as module_mod
        import torch.optim.optimizer as optim_mod
        import torch.utils.data.dataloader as dl_mod

        self._torch = torch
        self._tensor_type = torch.Tensor
        self.batch_counter.tensor_type = torch.Tensor
        self.cuda.torch = torch
        self._is_compiling = torch.compiler.is_compiling
        self._handles.append(optim_mod.register_optimizer_step_post_hook(self._optimizer_hook))
        self._handles.append(optim_mod.register_optimizer_step_pre_hook(self._optimizer_pre_hook))
        self._patch(optim_mod.Optimizer, "zero_grad", self._wrap_zero_grad)
        self._patch(module_mod.Module, "zero_grad", self._wrap_zero_grad)
        # Counting the optimizers a job creates tells a training job's evaluation
        # forwards (before its first step) from an inference job's steps.
        self._patch(optim_mod.Optimizer, "__init__", self._wrap_optimizer_init)
        self._fwd_handles = [
            module_mod.register_module_forward_pre_hook(self._forward_pre_hook),
            module_mod.register_module_forward_hook(self._forward_hook, always_call=True),
        ]
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

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        wrapped = make(original)
        wrapped.__wrapped__ = original
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(wrapped, attr, getattr(original, attr))
        setattr(owner, name, wrapped)
        self._patches.append((owner, name, original))

    def _remove_forward_hooks(self) -> None:
        for handle in self._fwd_handles:
            handle.remove()
        self._fwd_handles = []

    def _after_fork_in_child(self) -> None:
        # A forked child shares our hooks. Forked before this process began its steps, it
        # may train as a worker of its own (a hogwild job started with fork or
        # forkserver; workers.py), and a DataLoader worker still turns inert at its first
        # activity; forked mid-run it copied a step under way: it records nothing.
        if not self.fresh():
            self.inert = True

    def fresh(self) -> bool:
        """No step has begun in this process (a fork now gives the child a clean timer)."""
        return self.start_s is None and self.step == 0 and not self.inert

    # -- failure containment --------------------------------------------------------------
    def _disable(self, what: str, exc: BaseException) -> None:
        """A collector failed: switch it off, say so in the run's log, never raise."""
        if what in self._disabled:
            return
        self._disabled.add(what)
        if what == "step timer":
            self.inert = True
            with contextlib.suppress(Exception):
                self._remove_forward_hooks()
                self._remove_outer_hooks()
        with contextlib.suppress(Exception):
            self._writer().log("warning", "step_timer", f"{what} disabled: {exc!r}")

    # -- input wait and losses ----------------------------------------------------------
    def _wrap_data(self, original: Callable[..., Any], *, count_batch: bool) -> Callable[..., Any]:
        """Time inside a DataLoader entry point is time the loop waits for its input:
        ``__next__`` (the next batch, whose size is read here) and ``__iter__``
        (creating the iterator starts or resets the workers)."""
        timer = self

        def wrapper(self: Any) -> Any:
            if timer.inert or "data wait" in timer._disabled:
                return original(self)
            if not count_batch:
                timer.facts.on_loader(self)
                timer.batch_counter.on_new_iterator(getattr(self, "dataset", None))
            if timer.start_s is None:
                timer._activity()
            timer._phase_enter(DATA)
            try:
                result = original(self)
            except StopIteration:
                if count_batch and timer.batch_counter.look_ahead:
                    timer.batch_counter.count(id(getattr(self, "_dataset", None)), None)
                raise
            finally:
                timer._phase_exit(DATA)
            if count_batch:
                try:
                    timer.batch_counter.count(id(getattr(self, "_dataset", None)), result)
                except Exception as exc:
                    timer._disable("data wait", exc)
            return result

        return wrapper

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not timer.inert and "loss" not in timer._disabled:
                try:
                    timer._record_loss(tensors)
                except Exception as exc:
                    timer._disable("loss", exc)
            timed = not timer.inert and not timer._is_compiling()
            if timed:
                timer._phase_enter(BACKWARD)
            try:
                result = original(tensors, *args, **kwargs)
            finally:
                if timed:
                    timer._phase_exit(BACKWARD)
            timer._last_backward_end = time.time()
            # where the last step of a job that updates by hand ends (``finalize``)
            timer._at_backward_end = (timer.step, timer.data_wait, list(timer.phase_s))
            return result

        return backward

    def _wrap_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``optimizer.zero_grad()`` and ``model.zero_grad()`` are the optimizer's phase:
        one pass over every parameter, gone with the step when gradients are zeroed by
        ``set_to_none`` or fused away."""
        timer = self

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if timer.inert or timer._is_compiling():
                return original(obj, *args, **kwargs)
            timer._phase_enter(OPTIMIZER)
            try:
                return original(obj, *args, **kwargs)
            finally:
                timer._phase_exit(OPTIMIZER)

        return zero_grad

    def _activity(self, t: float | None = None) -> None:
        """First sign of work: step 0 starts now (and maybe a capture window with it)."""
        if self.start_s is not None:
            return
        if self._torch.utils.data.get_worker_info() is not None:
            # A spawned DataLoader worker (forked ones are caught at fork): its
            # transforms may call modules, but it is not the rank and records nothing.
            self.inert = True
            self._remove_forward_hooks()
            return
        self.start_s = self.first_activity_s = time.time() if t is None else t
        try:
            if self.capture is not None and self.capture.on_boundary(self.step):
                self.start_s = time.time()  # the capture's start-up is not the job's
            self.profiled = bool(self.capture is not None and self.capture.active)
        except Exception as exc:
            self._disable("capture", exc)
        # a zero_grad() before the loop is set-up, not the first step's optimizer phase
        self.phase_s = [0.0, 0.0, 0.0]
        self._phase_skip()
        self._record_cuda_marker()

    def _record_loss(self, tensors: Any) -> None:
        self.backward_seen = True
        if self.start_s is None:
            self._activity()
        t = tensors
        if isinstance(t, (tuple, list)):
            if len(t) != 1:
                return
            t = t[0]
        if isinstance(t, self._tensor_type) and t.numel() == 1 and (t.is_cuda or t.is_cpu):
            self.losses.append(t.detach())

    # -- explicit mode ---------------------------------------------------------------------
    def mark(self) -> None:
        if self.inert:
            return
        try:
            if self.mode != "mark":
                self._switch_to_marks()
            if self.start_s is None:
                self._activity()
            self._end_step("mark")
        except StepLimitReached:
            raise
        except Exception as exc:
            self._disable("step timer", exc)

    def _switch_to_marks(self) -> None:
        """The job marks its own steps: steps found so far by hooks are taken back.

        Their rows are overwritten (same rank and step index) by the marks that
        follow, the first mark spanning from the first activity; rows beyond the
        last mark are deleted when the job ends (``finalize``).
        """
        self.mode = "mark"
        self._remove_forward_hooks()
        self._time_outer_modules()
        self._absorb_pending()
        if self.step == 0:
            return
        taken_back = self._taken_back = self.step
        self.step = 0
        self.start_s = self.first_activity_s
        self.data_wait += self._emitted_data_wait
        self.phase_s = [a + b for a, b in zip(self.phase_s, self._emitted_phases, strict=True)]
        self.batch += self._emitted_batch
        self._writer().log(
            "info",
            "step_timer",
            f"mark_step() called: the {taken_back} steps found by hooks are replaced by marks",
        )

    def _dist_rank(self) -> int:
        try:
            dist = self._torch.distributed
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:
            pass
        return 0


def _false() -> bool:
    return False
