"""Finds the steps of an unmodified job and times them.

Where a step ends, in order of precedence:

* ``stepscope.mark_step()`` (explicit mode): once called, it alone defines steps.
* ``optimizer.step()`` (optimizer mode), through torch's global optimizer post hook.
  With several optimizers (a GAN's discriminator and generator), one iteration is one
  step and it ends at the *last* optimizer of the iteration: the cycle (every
  optimizer that steps between two steps of the first one) is learned over the first
  iteration, whose row is written once the cycle is known. The step's loss is the
  one given to backward for the first optimizer (summed over its backward calls:
  a GAN's real and fake discriminator losses, or gradient-accumulation micro-batches
  whose losses the script divided by the accumulation steps, add up to the loss the
  script logs).
* the end of an outermost ``nn.Module`` call (forward mode, for inference and for
  jobs that update their parameters by hand), through torch's global forward hooks;
  nested module calls are ignored, and so are top-level calls of modules other than
  the first one called (the anchor: a loss or softmax module applied to the model's
  output is part of the step, not a step). The global hooks take every module call
  off torch's fast path, so they are removed as soon as the first optimizer step (or
  mark) shows they are not needed.

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

A step spans [end of the previous step, end of this one]; the first one starts at the
first sign of activity (DataLoader, a forward, a backward).

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
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from stepscope.collectors.job_facts import JobFacts

# Grad-enabled forward steps of a job with no optimizer wait this long for a backward
# or an optimizer before they are taken for inference steps.
CONFIRM_FORWARD_S = 1.0
# Forwards of a job that has an optimizer but never steps it (evaluation with a
# checkpoint's optimizer loaded) are taken for inference steps after this long, or
# after this many of them.
CONFIRM_UNUSED_OPTIMIZER_S = 120.0
MAX_HELD_FORWARDS = 10_000
# Steps right after a capture window run slow (the profiler's teardown, cold caches):
# flagged like the captured ones and left out of the step-time figures.
AFTER_CAPTURE_STEPS = 2
# A step row waits this long for its CUDA event before it is written without device_s.
CUDA_WAIT_S = 2.0
# Bookkeeping between two steps longer than this (first-step set-up, a capture) is
# left out of the next step rather than charged to it.
OWN_WORK_GAP_S = 0.001

_timer: StepTimer | None = None


class StepLimitReached(SystemExit):
    """Raised in the job after ``STEPSCOPE_MAX_STEPS`` steps: exits with code 0.

    A SystemExit so that ``except Exception`` in the user's loop cannot swallow it,
    and so that atexit handlers (our final flush) still run.
    """

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


def mark_step() -> None:
    """Public entry (``stepscope.mark_step``): a no-op outside ``stepscope run``."""
    timer = _timer
    if timer is not None:
        timer.mark()


def current() -> StepTimer | None:
    return _timer


class StepTimer:
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
        self._rank_from_env = rank
        self.rank = rank or 0
        self._rank_known = rank is not None
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
        self._emitted_batch = 0
        self._taken_back = 0  # hook steps already written when the job began to mark
        # per-step accumulators, reset at each step end
        self.data_wait = 0.0
        # Samples of the step. Batches are counted per dataset, and a step's batch is
        # that of the dataset it fetched last (its training data): a validation pass
        # between two steps (imagenet's validate(), Lightning's val check) fetches
        # batches that are not training samples. ``batch`` carries samples merged in
        # from held rows.
        self.batch = 0
        self.batches = 0
        self._ds_samples: dict[int, int] = {}
        self._ds_batches: dict[int, int] = {}
        self._last_ds: int | None = None
        self._last_batch = 0  # size of the last batch fetched
        self._look_ahead = False  # the training loader is read one batch ahead
        self._skip_first: set[int] = set()  # datasets whose next batch is fetched ahead
        self.losses: list[Any] = []  # given to backward since the last optimizer step
        self._anchor_losses: list[Any] = []  # ... and those the first optimizer stepped on
        self.backward_seen = False
        self._pending_fwd: list[dict[str, Any]] = []
        self._fwd_confirmed = False
        self._optimizers_made = 0
        self._anchor: weakref.ReferenceType[Any] | None = None
        # the optimizer whose step ends an iteration; None while the cycle is learned
        self._closing: weakref.ReferenceType[Any] | None = None
        self._anchor_steps = 0
        self._last_opt: weakref.ReferenceType[Any] | None = None
        self._held: dict[str, Any] | None = None  # the first iteration, while learning
        self._first_row: dict[str, Any] | None = None  # step 0, for the look-ahead check
        self._after_capture = 0
        # a job with no optimizer that runs backward updates its parameters by hand: its
        # steps end where its next forward starts (forward, backward and update in one)
        self._fwd_since_boundary = False
        self._last_backward_end: float | None = None
        self._fwd_anchor: weakref.ReferenceType[Any] | None = None
        self._tls = threading.local()
        self._handles: list[Any] = []
        self._fwd_handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []
        self._cuda_rows: deque[dict[str, Any]] = deque()
        self._last_event: Any = None
        self._side_streams: dict[int, Any] = {}
        self._final = False
        self._torch: Any = None
        self._is_compiling: Callable[[], bool] = _false
        self._tensor_type: type | None = None
        self._disabled: set[str] = set()
        self.facts = JobFacts()

    # -- installation -------------------------------------------------------------------
    def install(self) -> None:
        """Register torch's global hooks and patch the DataLoader and backward."""
        import torch
        import torch.nn.modules.module as module_mod
        import torch.optim.optimizer as optim_mod
        import torch.utils.data.dataloader as dl_mod

        self._torch = torch
        self._tensor_type = torch.Tensor
        self._is_compiling = torch.compiler.is_compiling
        self._handles.append(optim_mod.register_optimizer_step_post_hook(self._optimizer_hook))
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
        # A forked child (DataLoader worker, multiprocessing) shares our hooks but is
        # not the rank: it must record nothing.
        self.inert = True

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
        with contextlib.suppress(Exception):
            self._writer().log("warning", "step_timer", f"{what} disabled: {exc!r}")

    # -- hooks ------------------------------------------------------------------------
    def _optimizer_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._is_compiling() or self.inert or self.mode == "mark":
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
        self._held = row if self._held is None else _merge_rows(self._held, row)
        self.start_s = now
        self._last_opt = weakref.ref(optimizer)

    def _wrap_optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if not timer.inert:
                timer._optimizers_made += 1

        return __init__

    def _forward_pre_hook(self, module: Any, args: Any) -> None:
        # Under torch.compile tracing the hook must trace to nothing (no graph break);
        # the compiled module's own outer call still runs the hooks eagerly.
        if self._is_compiling() or self.inert:
            return
        tls = self._tls
        depth = getattr(tls, "depth", 0)
        tls.depth = depth + 1
        if depth == 0:
            if self.start_s is None:
                self._activity()
            if "model" not in self.facts.facts:
                self.facts.on_top_forward(module, args)
            # (the first iteration's forward is held: it ran before any backward)
            if (self._fwd_since_boundary or self._pending_fwd) and self._updates_by_hand():
                anchor = self._fwd_anchor() if self._fwd_anchor is not None else None
                if module is anchor and self._torch.is_grad_enabled():
                    try:
                        self._end_update_step(time.time())
                    except StepLimitReached:
                        tls.depth = depth  # the call does not happen
                        raise
                    except Exception as exc:
                        self._disable("step timer", exc)

    def _forward_hook(self, module: Any, args: Any, output: Any) -> None:
        if self._is_compiling() or self.inert:
            return
        tls = self._tls
        depth = getattr(tls, "depth", 1) - 1
        tls.depth = depth
        if depth == 0 and self.mode == "auto":
            try:
                # Like the optimizer anchor: the first module called at top level ends
                # steps; other top-level calls (a loss module, a post-processing
                # module applied to the outputs) are part of the step.
                anchor = self._fwd_anchor() if self._fwd_anchor is not None else None
                if anchor is None:
                    self._fwd_anchor = weakref.ref(module)
                elif anchor is not module:
                    return
                self._forward_end()
            except StepLimitReached:
                raise
            except Exception as exc:
                self._disable("step timer", exc)

    def _wrap_data(self, original: Callable[..., Any], *, count_batch: bool) -> Callable[..., Any]:
        """Time inside a DataLoader entry point is time the loop waits for its input:
        ``__next__`` (the next batch, whose size is read here) and ``__iter__``
        (creating the iterator starts or resets the workers)."""
        timer = self
        perf = time.perf_counter

        def wrapper(self: Any) -> Any:
            if timer.inert or "data wait" in timer._disabled:
                return original(self)
            if not count_batch:
                timer.facts.on_loader(self)
                if timer._look_ahead:
                    timer._skip_first.add(id(getattr(self, "dataset", None)))
            t0 = perf()
            if timer.start_s is None:
                timer._activity()
            try:
                result = original(self)
            except StopIteration:
                if count_batch and timer._look_ahead:
                    timer._count_batch(id(getattr(self, "_dataset", None)), None)
                raise
            finally:
                timer.data_wait += perf() - t0
            if count_batch:
                try:
                    timer._count_batch(id(getattr(self, "_dataset", None)), result)
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
            result = original(tensors, *args, **kwargs)
            timer._last_backward_end = time.time()
            return result

        return backward

    # -- per-step accounting ------------------------------------------------------------
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

    def _count_batch(self, ds: int, batch: Any) -> None:
        """One batch of dataset ``ds`` for this step (``batch`` None: a look-ahead loader
        ran out, and the step uses the batch it fetched before).

        A look-ahead loader (accelerate's ``DataLoaderShard`` in Hugging Face's Trainer)
        fetches the next batch before it yields the current one: each epoch's first
        fetch is a batch used one step later (not counted), and its last step fetches
        nothing (the batch fetched before is counted then).
        """
        if batch is None:
            n = self._last_batch if ds == self._last_ds else None
        else:
            n = self._batch_len(batch)
            if ds in self._skip_first:
                self._skip_first.discard(ds)
                self._last_ds, self._last_batch = ds, n or 0
                return
        if not n:
            return
        self._ds_samples[ds] = self._ds_samples.get(ds, 0) + n
        self._ds_batches[ds] = self._ds_batches.get(ds, 0) + 1
        self._last_ds, self._last_batch = ds, n

    def _batch_len(self, batch: Any, depth: int = 0) -> int | None:
        tensor_type = self._tensor_type
        if isinstance(batch, tensor_type):
            return int(batch.shape[0]) if batch.dim() > 0 else None
        if depth >= 2:
            return None
        if isinstance(batch, dict):
            items = batch.values()
        elif isinstance(batch, (list, tuple)):
            items = batch
        else:
            return None
        for item in items:
            n = self._batch_len(item, depth + 1)
            if n is not None:
                return n
        return None

    def _take_row(self, kind: str, end_s: float) -> dict[str, Any]:
        """Snapshot the accumulators into a row (no step index yet) and reset them."""
        row: dict[str, Any] = {
            "rank": self.rank,
            "start_s": self.start_s if self.start_s is not None else self.installed_at,
            "end_s": end_s,
            "data_wait_s": self.data_wait,
            "batch_size": (self.batch + self._ds_samples.get(self._last_ds, 0)) or None,
            "kind": kind,
            "profiled": self.profiled,
            "_losses": self._anchor_losses + self.losses,
            "_batches": self.batches + self._ds_batches.get(self._last_ds, 0),
            "_last_batch": self._last_batch,
        }
        self.data_wait = 0.0
        self.batch = 0
        self.batches = 0
        self._ds_samples = {}
        self._ds_batches = {}
        self.losses = []
        self._anchor_losses = []
        return row

    def _end_step(self, kind: str) -> None:
        end = time.time()
        row = self._take_row(kind, end)
        self._emit(row)
        self._after_emit(end)

    def _release(self, rows: list[dict[str, Any]]) -> None:
        """Write rows held back earlier, checking the limit and captures after each.

        The step under way keeps its start: only the job ran since these rows ended.
        """
        start, profiled = self.start_s, self.profiled
        for row in rows:
            self._emit(row)
            self._between_steps()
        self.start_s = start
        self.profiled = profiled or self.profiled

    def _emit(self, row: dict[str, Any]) -> None:
        """Give the row its index and hand it to the writer (or to the CUDA queue)."""
        if not self._rank_known:
            self._rank_known = True
            self.rank = self._dist_rank()
            if self.capture is not None:
                self.capture.rank = self.rank
        row["rank"] = self.rank
        row["step"] = self.step
        self.step += 1
        self._emitted_data_wait += row["data_wait_s"]
        self._emitted_batch += row["batch_size"] or 0
        if self._on_first_step is not None:
            callback, self._on_first_step = self._on_first_step, None
            try:
                callback()
            except Exception as exc:
                self._disable("device info", exc)
            self._write_facts()
        self._check_look_ahead(row)
        losses = row["_losses"]
        if "cuda" not in self._disabled and self._cuda_in_use():
            try:
                event = self._torch.cuda.Event(enable_timing=True)
                event.record()
                row["_ev_prev"], row["_ev"] = self._last_event, event
                self._last_event = event
                self._cuda_rows.append(row)
                return
            except Exception as exc:
                self._disable("cuda", exc)
        if losses:
            row["loss"] = _sum([t.item() for t in losses if t.is_cpu])
        self._writer().add_step(_public(row))

    def _check_look_ahead(self, row: dict[str, Any]) -> None:
        """Loaders that fetch one batch ahead (accelerate's ``DataLoaderShard``, as in
        Hugging Face's Trainer; Lightning's prefetching fetcher) put two batches in
        the first step where it used one: step 0 is corrected by step 1's count."""
        if row["step"] == 0:
            self._first_row = row
            return
        first, self._first_row = self._first_row, None
        if first is None or row["step"] != 1 or not first["_batches"] or not row["_batches"]:
            return
        if first["_batches"] == row["_batches"] + 1 and first["batch_size"]:
            self._look_ahead = True
            # the row may be written already (or, on CUDA, wait for its event): write
            # the corrected one now, which replaces it; a later CUDA write carries it too
            first["batch_size"] -= first["_last_batch"]
            self._writer().add_step(_public(first))

    def _after_emit(self, end: float) -> None:
        """Right after a step ended: the next step's start, captures, the limit."""
        slow = self._between_steps(stop=False)
        now = time.time()
        if slow or now - end > OWN_WORK_GAP_S:
            # Only stepscope ran since `end` (starting the writer, a capture): that
            # time is ours, so the next step starts after it instead of paying for it.
            self.start_s = now
            self._last_event = None
            self._record_cuda_marker()
        else:
            self.start_s = end
        if self.max_steps is not None and self.step >= self.max_steps:
            self._stop_job()

    def _between_steps(self, stop: bool = True) -> bool:
        """Capture windows and (``stop``) the step limit at the boundary before
        ``self.step``; True when slow work (a capture starting or ending) was done."""
        slow = False
        if self._after_capture:
            self._after_capture -= 1
        if self.capture is not None and "capture" not in self._disabled:
            try:
                was_active = self.capture.active
                slow = self.capture.on_boundary(self.step)
                if was_active and not self.capture.active:
                    self._after_capture = AFTER_CAPTURE_STEPS
            except Exception as exc:
                self._disable("capture", exc)
        active = bool(self.capture is not None and self.capture.active)
        self.profiled = active or self._after_capture > 0
        if stop and self.max_steps is not None and self.step >= self.max_steps:
            self._stop_job()
        return slow

    # -- forward mode --------------------------------------------------------------------
    def _forward_end(self) -> None:
        end = time.time()
        grad = self._torch.is_grad_enabled()
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
        self._emitted_batch = 0
        self._first_row = None
        self._cuda_rows.clear()
        self._last_event = None
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
        self._absorb_pending()
        if self.step == 0:
            return
        taken_back = self._taken_back = self.step
        self.step = 0
        self.start_s = self.first_activity_s
        self.data_wait += self._emitted_data_wait
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

    # -- CUDA ------------------------------------------------------------------------------
    def _cuda_in_use(self) -> bool:
        cuda = self._torch.cuda
        return cuda.is_initialized()

    def _record_cuda_marker(self) -> None:
        """An event at a step's start, for the device time of the first step of a run."""
        if "cuda" in self._disabled or not self._cuda_in_use():
            return
        try:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self._last_event = event
        except Exception as exc:
            self._disable("cuda", exc)

    def resolve_pending(self) -> None:
        """Writer ``before_flush`` callback: write CUDA rows whose events have completed.

        Runs on the writer's thread. ``event.query()`` never blocks; a row whose event
        is still pending after CUDA_WAIT_S is written without device_s rather than
        held, so the store stays within a couple of seconds of the job.
        """
        rows = self._cuda_rows
        if not rows:
            return
        writer = self._writer()
        now = time.time()
        while rows:
            row = rows[0]
            event = row["_ev"]
            done = event.query()
            if not done and not self._final and now - row["end_s"] < CUDA_WAIT_S:
                break
            rows.popleft()
            if done:
                prev = row.get("_ev_prev")
                if prev is not None and prev.query():
                    with contextlib.suppress(Exception):
                        row["device_s"] = prev.elapsed_time(event) / 1000.0
                if row["_losses"]:
                    row["loss"] = _sum(self._read_losses(row["_losses"]))
            writer.add_step(_public(row))

    def _read_losses(self, losses: list[Any]) -> list[float]:
        """Read completed loss tensors on a side stream, so the copy does not queue
        behind the job's work on its own stream."""
        torch = self._torch
        values = []
        for t in losses:
            if t.is_cpu:
                values.append(t.item())
                continue
            index = t.device.index or 0
            stream = self._side_streams.get(index)
            if stream is None:
                stream = self._side_streams[index] = torch.cuda.Stream(device=t.device)
            with torch.cuda.device(t.device), torch.cuda.stream(stream):
                values.append(t.item())
        return values

    # -- end of the job ------------------------------------------------------------------
    def finalize(self) -> None:
        """At exit or at the step limit: write everything still held back."""
        if self._final:
            return
        try:
            pending = self._fwd_since_boundary or self._pending_fwd
            if pending and self._updates_by_hand() and not self.inert:
                # the last iteration of a job that updates by hand ends with its backward
                self._fwd_since_boundary = False
                self._absorb_pending()
                self._emit(self._take_row("forward", self._last_backward_end or time.time()))
            if self._held is not None and not self.inert:
                held, self._held = self._held, None  # a job that ended in its first cycle
                self._emit(held)
            if self._pending_fwd and not self.inert:
                self._fwd_confirmed = True
                pending, self._pending_fwd = self._pending_fwd, []
                for row in pending:
                    self._emit(row)
        except Exception as exc:
            self._disable("step timer", exc)
        self._final = True
        self.inert = True
        self._write_facts()
        if self.mode == "mark" and self._taken_back > self.step:
            with contextlib.suppress(Exception):
                self._writer().delete_steps_from(self.step)
        if self.capture is not None:
            self.capture.close(self.step)
        if self._cuda_rows:
            with contextlib.suppress(Exception):
                self._torch.cuda.synchronize()  # the job is over: waiting is free now

    def _write_facts(self) -> None:
        """Rank 0 speaks for the job: ranks run the same script with the same settings."""
        if self.rank != 0 or "facts" in self._disabled:
            return
        try:
            facts = self.facts.take_if_changed()
            if facts:
                self._writer().merge_run_json("facts", facts)
        except Exception as exc:
            self._disable("facts", exc)

    def _stop_job(self) -> None:
        writer = self._writer()
        self.finalize()
        writer.update_run(stop_reason="max_steps")
        writer.log("info", "step_timer", f"stopping the job after {self.step} steps (max_steps)")
        writer.flush()
        raise StepLimitReached(self.step)


def _false() -> bool:
    return False


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def _sum(values: list[float]) -> float | None:
    return float(sum(values)) if values else None


def _merge_rows(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """One row spanning two consecutive ones (an iteration with several optimizers)."""
    merged = dict(later)
    merged["start_s"] = first["start_s"]
    merged["data_wait_s"] = first["data_wait_s"] + later["data_wait_s"]
    batch = (first["batch_size"] or 0) + (later["batch_size"] or 0)
    merged["batch_size"] = batch or None
    merged["_batches"] = first["_batches"] + later["_batches"]
    merged["_losses"] = first["_losses"] + later["_losses"]
    merged["profiled"] = first["profiled"] or later["profiled"]
    return merged


def set_current(timer: StepTimer | None) -> None:
    global _timer
    _timer = timer
