"""Set-up inside every Python process of a job run under ``stepscope run``.

Called from ``boot/sitecustomize.py`` before the user's script starts. It costs next
to nothing until torch is imported: the step timer is installed by an import hook when
``import torch`` finishes, and the run store writer (a thread plus a SQLite handle) is
created only when the process has something to write. Processes of the job that never
train — the ``torchrun`` agent, spawned DataLoader workers, helper subprocesses —
therefore record nothing and pay nothing.

With ``STEPSCOPE_PLAN`` set (an experiment's trial), the plan's fixes are installed
first (``stepscope/fixes/install.py``), so that seeding and patched constructors are
in place before the step timer and the user's script.

What ends up in the run's row: ``device`` (torch/CUDA/CPU facts, merged per rank),
``error`` (one line, from the job's uncaught exception; an out-of-memory one adds its
numbers to ``config["oom"]``, ``oom_record.py``) and ``stop_reason``
(``'max_steps'``, from the step timer). The launcher owns status and exit code.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import Any

from stepscope.collectors.launch import contract
from stepscope.errors import one_line_error
from stepscope.types import FAILED_IN_STEP

_state: _Bootstrap | None = None
# transformers' generate() lives here; imported lazily by transformers itself
GENERATION_MODULE = "transformers.generation.utils"


def install(env: Mapping[str, str] | None = None) -> None:
    """Entry point for the sitecustomize (the process's environment) and for an attach's
    injection (``live.py``: its own settings, so the job's environment is left as it
    was); idempotent, inert without STEPSCOPE_RUN_ID."""
    global _state
    if _state is not None:
        return
    env = os.environ if env is None else env
    if not env.get(contract.ENV_RUN_ID) or env.get(contract.ENV_DISABLE) == "1":
        return
    _state = _Bootstrap(env)
    _state.start()


def uninstall() -> None:
    """An attach detaches (``live.py``): what was recorded is written, and every hook and
    patch goes, so the process runs on as it did before."""
    global _state
    state, _state = _state, None
    if state is not None:
        state.stop()


def writer() -> Any:
    """The process's BufferedWriter (created on first use), or None when not installed."""
    return _state.writer() if _state is not None else None


class _Bootstrap:
    def __init__(self, env: Any) -> None:
        self.run_id = int(env[contract.ENV_RUN_ID])
        self.home = env.get(contract.ENV_HOME) or None
        self.run_dir = env.get(contract.ENV_RUN_DIR) or None
        self.rank = _int(env.get("RANK"))  # None: the step timer asks torch.distributed
        self.max_steps = _int(env.get(contract.ENV_MAX_STEPS))
        self.profile_at = _int(env.get(contract.ENV_PROFILE_AT))
        self.profile_auto = env.get(contract.ENV_PROFILE_AT) == contract.PROFILE_AUTO
        self.profile_steps = _int(env.get(contract.ENV_PROFILE_STEPS))
        self.flush_s = _float(env.get(contract.ENV_FLUSH_S)) or 1.0
        self.plan_path = env.get(contract.ENV_PLAN) or None
        # the store: as RunStore resolves it from the job's environment, or an attach's
        self.store_url = env.get(contract.ENV_STORE) or None
        self.pid = os.getpid()
        self._writer: Any = None
        self.timer: Any = None
        self.applier: Any = None  # the plan's installer (fixes/install.py), in a trial
        self._prev_excepthook: Any = None
        self._interrupted = False
        self._closed = False
        self._parent_writers: list[Any] = []  # a forked child's copies: never used, never closed
        self._import_hooks: list[_ImportHook] = []

    def start(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._close_writer)  # registered first, so it runs last
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        if "torch" in sys.modules:
            self.on_torch_imported()
        else:
            self._import_hooks.append(_ImportHook("torch", self.on_torch_imported))
        if GENERATION_MODULE in sys.modules:
            self.on_generation_imported()
        else:
            self._import_hooks.append(_ImportHook(GENERATION_MODULE, self.on_generation_imported))
        for hook in self._import_hooks:
            sys.meta_path.insert(0, hook)

    def stop(self) -> None:
        """Detach (``uninstall``): the rows held back written, the writer closed, then
        the import hooks, the excepthook, the generate() wrapper and the step timer's
        hooks and patches removed. The fork and exit hooks stay registered (Python
        cannot take them back); closed, they do nothing."""
        for hook in self._import_hooks:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(hook)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        self._close_writer()
        if GENERATION_MODULE in sys.modules and self.timer is not None:
            # local: loaded already when generate() was wrapped
            from stepscope.collectors.injob import generate_patch

            generate_patch.uninstall()
        if self.timer is not None:
            self.timer.uninstall()
            # local: loaded already with the timer
            from stepscope.collectors.steps import step_timer

            if step_timer.current() is self.timer:
                step_timer.set_current(None)

    def writer(self) -> Any:
        if self._writer is None:
            # local: the writer (sqlite3, a thread) is for processes with something to
            # write; the others (the torchrun agent, helper scripts) never pay for it
            from stepscope.store.writer import BufferedWriter

            self._writer = BufferedWriter(
                self.home,
                self.run_id,
                interval_s=self.flush_s,
                rank=self.current_rank(),
                url=self.store_url,
            )
            if self.timer is not None:
                self._writer.before_flush.append(self.timer.resolve_pending)
        return self._writer

    def current_rank(self) -> int:
        if self.timer is not None:
            return int(self.timer.rank)
        return self.rank or 0

    # -- torch ------------------------------------------------------------------------
    def on_torch_imported(self) -> None:
        if os.getpid() != self.pid:
            return
        if not _is_launcher_agent():
            # local: a process that imports torch steps and writes; the store's imports
            # run now, before the job's own set-up goes on, not beside its first steps
            from stepscope.store.db import preload

            preload()
        if self.plan_path and not _is_launcher_agent():
            # before the step timer: the plan may seed the RNGs the job then uses
            # local: runs inside the user's job, only when the plan asks for it
            from stepscope.fixes.install import install_plan

            self.applier = install_plan(self.plan_path, self.writer)
        try:
            # local: the step timer and the capture are for processes that import torch;
            # every other process of the job loads the bootstrap alone
            from stepscope.collectors.capture.profiler_capture import CaptureController
            from stepscope.collectors.steps import step_timer  # local: same

            capture = CaptureController(
                self.writer,
                self.run_dir,
                rank=self.rank or 0,
                profile_at=self.profile_at,
                profile_steps=self.profile_steps,
                auto=self.profile_auto,
            )
            timer = step_timer.StepTimer(
                self.writer,
                rank=self.rank,
                max_steps=self.max_steps,
                capture=capture,
                on_first_step=self._record_device_info,
            )
            timer.install()
            self.timer = timer
            if self._writer is not None:
                self._writer.before_flush.append(timer.resolve_pending)
            step_timer.set_current(timer)
            # Registered after torch's own atexit handlers, so it runs before them.
            atexit.register(self._finalize_timer)
        except Exception as exc:
            _say(f"step timer disabled ({type(exc).__name__}: {exc})")
            with contextlib.suppress(Exception):
                self.writer().log("warning", "bootstrap", f"step timer disabled: {exc!r}")
        if self.plan_path and not _is_launcher_agent():
            # after the step timer: its hooks run first, so a step ends before the copy
            # local: a trial's outputs (an inference job's, a generation job's tokens and
            # prompts), only when the plan asks for them
            from stepscope.collectors.steps.generation import TOKENS_FILE  # local: same
            from stepscope.collectors.trials.generation_sweep import plan_settings  # local: same
            from stepscope.collectors.trials.output_record import (  # local: same
                calls_wanted,
                install_from_plan,
            )

            recorder = install_from_plan(self.plan_path, self.run_dir, self.writer)
            if recorder is not None:
                atexit.register(recorder.at_exit)  # before the writer closes
            if self.timer is not None and self.run_dir:
                # a generation trial's outputs are its generated tokens (the first requests')
                gen = self.timer.gen
                gen.record = calls_wanted(self.plan_path)
                gen.tokens_path = os.path.join(self.run_dir, TOKENS_FILE)
                gen.record_prompts, gen.sweep = plan_settings(self.plan_path)
                gen.run_dir = self.run_dir

    def on_generation_imported(self) -> None:
        """transformers' generation module is loaded: its generate() calls are requests."""
        if os.getpid() != self.pid or self.timer is None:
            return
        # local: only for jobs that import transformers' generation
        from stepscope.collectors.injob import generate_patch

        generate_patch.install()
        if self.applier is not None:  # a trial: the plan's generation fixes see each call
            generate_patch.add_kwargs_hook(self.applier.on_generate)

    def _record_device_info(self) -> None:
        """Called by the step timer at its first step, once the rank is known."""
        rank = self.current_rank()
        writer = self.writer()
        writer.rank = rank  # the rank may have come from torch.distributed just now
        writer.worker = worker = int(self.timer.worker or 0) if self.timer is not None else 0
        if worker:
            self._at_worker_exit()
            writer.log("info", "step_timer", f"training process {os.getpid()}: worker {worker}")
            return  # the rank's process records the device and the rank's host
        info = device_info()
        info["rank"] = rank
        writer.merge_run_json("device", info if rank == 0 else {f"rank{rank}": info})
        with contextlib.suppress(Exception):  # which node each rank ran on (multi-node runs)
            writer.register_rank(rank, socket.gethostname(), os.getpid())

    def _at_worker_exit(self) -> None:
        """A worker started with fork or forkserver leaves by ``os._exit``: no atexit
        handler runs there, multiprocessing's own finalizers do (spawned ones run both)."""
        # local: a worker's process has imported multiprocessing already
        from multiprocessing import util

        util.Finalize(None, self._close_writer, exitpriority=0)
        # A Pool's workers are ended with SIGTERM (``Pool.terminate``, the ``with`` block's
        # exit): their last steps are written first, then the signal does what it did.
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            with contextlib.suppress(ValueError):  # not the main thread: left as it is
                signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._closed:
            # already leaving: a Pool's worker that took its sentinel is closing its
            # writer when terminate() signals it; dying now would lose its last steps
            return
        with contextlib.suppress(Exception):
            self._close_writer()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _after_fork_in_child(self) -> None:
        """A child forked before any step may train as a worker (forkserver's children
        import torch after the fork): its writer is its own (the parent's thread is not
        in this process; its buffered rows are the parent's)."""
        if self.timer is not None and not self.timer.fresh():
            return  # the child's timer is inert: nothing to write, pid checks keep it quiet
        self.pid = os.getpid()
        if self._writer is not None:
            self._parent_writers.append(self._writer)
            self._writer = None

    # -- exit paths -------------------------------------------------------------------
    def _finalize_timer(self) -> None:
        if os.getpid() != self.pid or self.timer is None:
            return
        with contextlib.suppress(Exception):
            self.timer.finalize()

    def _record_peak_memory(self) -> None:
        """The process's peak memory into the run's config (``facts/peak_memory.py``): a
        process that stepped (the training or inference process, not a worker) records it,
        rank 0 as ``peak_memory``, another rank as ``peak_memory_rank<r>``."""
        if self.timer is None or self._writer is None or getattr(self.timer, "worker", 0):
            return
        with contextlib.suppress(Exception):
            # local: read once, at exit
            from stepscope.collectors.facts.peak_memory import peak_memory

            rank = self.current_rank()
            key = "peak_memory" if rank == 0 else f"peak_memory_rank{rank}"
            self._writer.merge_run_json("config", {key: peak_memory()})

    def _close_writer(self) -> None:
        if os.getpid() != self.pid or self._closed:
            return
        self._closed = True
        self._finalize_timer()
        self._record_peak_memory()
        if self._writer is not None:
            self._writer.close()
        if self._interrupted:
            _die_by_sigint()

    def _excepthook(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """The job's own traceback first, then the error into the store: a store that is
        slow to answer (a busy PostgreSQL, a lock) must not hold back what the user sees
        (once under load, a Ctrl-C'd job printed nothing for a minute)."""
        if isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt):
            self._interrupted = True
        try:
            (self._prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            try:
                if os.getpid() == self.pid and not _is_launcher_agent():
                    w = self.writer()
                    w.update_run(error=one_line_error(exc_type, exc))
                    w.flush()  # first: the launcher's stall limit stops at the error
                    if self.timer is not None:  # the step it died in: 0, none completed
                        w.merge_run_json("config", {FAILED_IN_STEP: int(self.timer.step)})
                    self._record_oom(w, exc_type, exc, tb)
                    self._finalize_timer()
                    w.flush()
            except Exception:
                pass

    def _record_oom(self, writer: Any, exc_type: Any, exc: Any, tb: Any) -> None:
        """An out-of-memory error: its numbers into the run (``oom_record.py``)."""
        try:
            # local: only a job that died of an exception pays for it
            from stepscope.collectors.injob.oom_record import record_oom

            record_oom(exc_type, exc, tb, writer, self.timer, self.run_dir)
        except Exception as exc_oom:  # the error line is recorded already
            _say(f"out-of-memory record disabled ({type(exc_oom).__name__}: {exc_oom})")


class _ImportHook(importlib.abc.MetaPathFinder):
    """Runs a callback right after the module ``name`` has finished executing.

    It finds the module's spec through the other finders and wraps the loader's
    exec_module on that one spec, so the module itself is imported exactly as before.
    """

    def __init__(self, name: str, callback: Any) -> None:
        self.name = name
        self.callback = callback
        self.done = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self.done:
            return None
        self.done = True
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module
        callback = self.callback

        def exec_module(module: Any) -> None:
            original(module)
            try:
                callback()
            except Exception as exc:
                _say(f"{name} hook disabled ({type(exc).__name__}: {exc})")

        spec.loader.exec_module = exec_module
        return spec


def device_info() -> dict[str, Any]:
    """Facts about this process's torch and devices, without initialising CUDA.

    Device names and capabilities are read only when the job has initialised CUDA
    itself: creating a context here would cost memory on a GPU the rank may not use.
    """
    import torch  # local: called at the first step, when the job has imported torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "world_size": _int(os.environ.get("WORLD_SIZE")) or 1,
        "rank": _int(os.environ.get("RANK")) or 0,
    }
    if info["cuda_available"]:
        info["device_count"] = torch.cuda.device_count()
    if torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info.update(
            device=index,
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            device_memory_bytes=int(props.total_memory),
            cudnn=torch.backends.cudnn.version(),
        )
    return info


def _die_by_sigint() -> None:
    """End the process by SIGINT, as CPython does after an unhandled KeyboardInterrupt.

    CPython remembers the unhandled KeyboardInterrupt in a flag and kills itself with
    SIGINT at exit (so shells see 130 / -SIGINT); any import inside an excepthook (the
    store pulls in sqlite3 and friends) clears that flag and the job would exit 1.
    Runs last among the atexit handlers, so everything else has been flushed.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _is_launcher_agent() -> bool:
    """The torchrun agent: its children's failures are theirs to record, not its own."""
    argv0 = (sys.argv[0] if sys.argv else "").replace("\\", "/")
    return os.path.basename(argv0) == "torchrun" or argv0.endswith(
        ("torch/distributed/run.py", "torch/distributed/launch.py")
    )


def _say(message: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"stepscope: {message}\n")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None
