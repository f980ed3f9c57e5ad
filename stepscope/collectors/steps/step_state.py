"""What the parts of the step timer share: one ``StepState`` per process.

The step timer (``step_timer.py``) is the state below, the accounting that turns it into
rows (``step_accounting.py``) and three step detectors that get both passed in:
``OptimizerSteps`` (``optimizer_steps.py``), ``ForwardSteps`` (``forward_steps.py``)
and ``GenerationSteps`` (``generation_steps.py``). What only one part uses is that
part's own private attribute; what several read or write is a field here, with who
writes it. "The timer" is ``StepTimer`` itself (its DataLoader, backward and zero_grad
wrappers, ``mark_step``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope.collectors.facts.job_facts import JobFacts
from stepscope.collectors.steps.batch_count import BatchCounter
from stepscope.collectors.steps.cuda_timing import CudaTiming


def _false() -> bool:
    return False


@dataclass(eq=False)
class StepState:
    """The step timer's shared state (the fields' comments: what it is; who writes it)."""

    # the run's writer, called for the BufferedWriter (bootstrap); set once
    writer: Callable[[], Any]
    # the rank rows are written for: RANK, or torch.distributed's at the first step
    # (accounting)
    rank: int = 0
    # the training worker of this process, known at the first step (accounting)
    worker: int | None = None
    # STEPSCOPE_MAX_STEPS, None: no limit (timer; the generation sweep clears it)
    max_steps: int | None = None
    # the profiler capture schedule, or None (bootstrap, at construction)
    capture: Any = None
    # 'auto' (forward + optimizer) | 'optimizer' | 'mark' (optimizer detector, timer)
    mode: str = "auto"
    # record nothing: a forked child, a worker, after a stop or a failure (all)
    inert: bool = False
    # the index the next step's row gets (accounting; taken back: forward, timer)
    step: int = 0
    # when the timer was made: the start of a row with no activity before it (timer)
    installed_at: float = field(default_factory=time.time)
    # the start of the step under way, None before the first activity (all)
    start_s: float | None = None
    # the first sign of work: where marks start when they take hook steps back
    # (accounting)
    first_activity_s: float | None = None
    # the step under way is inside (or just after) a capture window (accounting,
    # detectors when they merge held rows)
    profiled: bool = False
    # -- per-step accumulators, reset when a row is taken (accounting) --------------
    # seconds the step waited for its input (accounting's phases; merges of held rows)
    data_wait: float = 0.0
    # forward, backward, optimizer seconds (step_row.PHASE_COLUMNS; as data_wait)
    phase_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    # samples merged in from held rows (the counter below has the fetched ones)
    batch: int = 0
    # batches merged in from held rows
    batches: int = 0
    # samples per step of the dataset fetched last (``batch_count.py``; timer's
    # DataLoader wrapper)
    batch_counter: BatchCounter = field(default_factory=BatchCounter)
    # losses given to backward since the last optimizer step (timer; optimizer
    # detector takes them)
    losses: list[Any] = field(default_factory=list)
    # ... and those the first optimizer stepped on (optimizer detector)
    anchor_losses: list[Any] = field(default_factory=list)
    # the job has run a backward (timer)
    backward_seen: bool = False
    # optimizers the job has created (optimizer detector; read by forward, generation)
    optimizers_made: int = 0
    # ... and the optimizers themselves, weakly (an OOM record sizes their state)
    optimizer_refs: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    # when the last backward ended (timer's backward wrapper; the forward detector's
    # last step of a job that updates by hand ends there)
    last_backward_end: float | None = None
    # (step, data wait, phases) at that backward's end (as last_backward_end)
    at_backward_end: tuple[int, float, list[float]] | None = None
    # -- totals over written steps, so that a first mark_step() can take them back ---
    # (accounting adds; forward's take-back resets; the timer's switch to marks reads)
    emitted_data_wait: float = 0.0
    emitted_phases: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    emitted_batch: int = 0
    # steps still flagged as profiled after a capture window closed (accounting;
    # forward's take-back resets)
    after_capture: int = 0
    # the collectors switched off after a failure (accounting's ``disable``)
    disabled: set[str] = field(default_factory=set)
    # per thread: the open phases, the forward depths (accounting, forward detector)
    tls: threading.local = field(default_factory=threading.local)
    # the torch module, once installed (timer's ``install``)
    torch: Any = None
    # torch.compiler.is_compiling once installed: hooks trace to nothing (timer)
    is_compiling: Callable[[], bool] = _false
    # device time of the steps (``cuda_timing.py``; accounting)
    cuda: CudaTiming = field(default_factory=CudaTiming)
    # the job's facts, written by rank 0 (all parts feed it; accounting writes it)
    facts: JobFacts = field(default_factory=JobFacts)
    # the job's end was written: nothing more (``StepTimer.finalize``)
    final: bool = False
