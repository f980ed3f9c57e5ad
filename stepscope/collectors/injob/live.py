"""The in-job collectors, put into a process that is already running (`stepscope attach`).

The attach (``collectors/attach/inject.py``) has gdb queue one line in the process's
interpreter (``Py_AddPendingCall``): the main thread runs it between two bytecodes, the
one moment where running Python code cannot catch the interpreter half way through
something. That line calls ``begin`` with the path of the attach's settings.

``begin`` imports what the collectors need there, on the main thread: a one-off pause
of the job, where imports on a thread of ours could leave a child the job forks
meanwhile (a DataLoader worker) holding their module locks for ever. Then the hooks go
in, as ``stepscope run``'s bootstrap puts them in (``bootstrap.install``, with the
attach's settings instead of the job's environment), but only where no module's forward,
optimizer step, backward or generate() call is under way on the main thread: torch
decides when a call begins whether its hooks run, so a call begun before them would end
without its half, and the step timer would count the wrong nesting for the rest of the
run. When one is under way, a profile function (``sys.setprofile``, the main thread
only, for as long as that call lasts) installs at the first moment none is. A process
that never imported torch gets the bootstrap's import hook, as a job at start does.

A thread of ours then waits for the detach: a ``stop`` file in the attach's folder, or
the attaching process gone. It asks the main thread, by another pending call, to take
everything out again (``bootstrap.uninstall``); the process runs on as before.

Every state goes to ``status.json`` in the attach's folder, for the attach to read:
'installed', 'refused' (one line why), 'detached'. Nothing here may raise into the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from stepscope.errors import one_line_error

STATUS_FILE = "status.json"
STOP_FILE = "stop"
SAFE_WAIT_S = 30.0  # how long the install waits for the main thread to leave a step
STOP_POLL_S = 0.2
# frames that mean "a call whose hooks were decided at its start is under way"
BUSY_FRAMES = (
    ("torch/nn/modules/module.py", "_call_impl"),
    ("torch/optim/optimizer.py", "wrapper"),
    ("torch/autograd/__init__.py", "backward"),
    ("torch/_tensor.py", "backward"),
    ("transformers/generation/utils.py", "generate"),
)

CALL_READS_HOOKS_LATER = ("_call_impl", "wrapper")

_session: _Live | None = None
_PENDING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def begin(settings_path: str) -> None:
    """The injected line's call, on the main thread."""
    global _session
    try:
        path = Path(settings_path)
        settings = json.loads(path.read_text())
        path.unlink()  # read once: it may hold the store's URL
        folder = Path(settings["folder"])
    except Exception:
        return  # no folder to say it in: the attach reads the silence as a refusal
    if _session is not None and not _session.ended:
        _write_status(folder, "refused", f"already attached by run {_session.run_id}")
        return
    _session = _Live(settings, folder)
    _session.start()


class _Live:
    def __init__(self, settings: dict[str, Any], folder: Path) -> None:
        self.settings = settings
        self.folder = folder
        self.run_id = int(settings["run_id"])
        self.ended = False
        self._deadline = 0.0
        self._callbacks: list[Any] = []  # ctypes callbacks queued: kept alive

    def start(self) -> None:
        try:
            if sys.getprofile() is not None:
                self._refuse("the process runs a profiler of its own (sys.setprofile)")
                return
            self._import()
            frame = sys._getframe(1)
            if "torch" not in sys.modules or not _busy(frame):
                self._install()
                return
            self._deadline = time.monotonic() + float(self.settings.get("wait_s", SAFE_WAIT_S))
            sys.setprofile(self._at_boundary)
        except Exception as exc:
            self._refuse(_one_line(exc))

    def _import(self) -> None:
        # local: this module runs inside someone else's process; what the collectors
        # need is imported here, on the job's own thread (module docstring)
        from stepscope.collectors.injob import bootstrap  # noqa: F401

        if "torch" in sys.modules:  # local, all four: as above
            from stepscope.collectors.capture import profiler_capture  # noqa: F401
            from stepscope.collectors.steps import step_timer  # noqa: F401
            from stepscope.store import writer  # noqa: F401
            from stepscope.store.db import preload  # local: as above

            preload()

    def _at_boundary(self, frame: Any, event: str, arg: Any) -> None:
        """The profile function: a busy call begins or ends; install once none is on."""
        if event not in ("call", "return") or not _is_busy_frame(frame):
            if time.monotonic() > self._deadline:
                sys.setprofile(None)
                self._refuse(
                    f"the process was inside a step for {self.settings.get('wait_s', SAFE_WAIT_S)}"
                    " s: collectors not installed"
                )
            return
        # a module call or optimizer step that begins with none under way above it reads
        # the hooks after this (a generate() or backward begun now is the original
        # function already: it waits for its end); one that ends leaves none under way
        # only if none is below it
        if event == "call" and frame.f_code.co_name not in CALL_READS_HOOKS_LATER:
            return
        if _busy(frame.f_back):
            return
        sys.setprofile(None)
        try:
            self._install()
        except Exception as exc:
            self._refuse(_one_line(exc))

    def _install(self) -> None:
        # local: imported in _import above
        from stepscope.collectors.injob import bootstrap

        bootstrap.install(self.settings["env"])
        state = bootstrap._state
        if state is None:
            self._refuse("the collectors did not start (the attach's settings)")
            return
        if state.timer is not None:
            state.timer.state.optimizers_made += _live_optimizers()
        _write_status(self.folder, "installed", f"collectors injected into process {os.getpid()}")
        threading.Thread(target=self._wait_for_detach, name="stepscope-attach", daemon=True).start()

    def _wait_for_detach(self) -> None:
        attacher = self.settings.get("attacher_pid")
        stop = self.folder / STOP_FILE
        while not stop.exists() and _alive(attacher):
            time.sleep(STOP_POLL_S)
        callback = _PENDING(self._detach)
        self._callbacks.append(callback)
        if ctypes.pythonapi.Py_AddPendingCall(callback, None) != 0:
            self._detach(None)  # the queue is full: from here, with the hooks made inert

    def _detach(self, _arg: Any) -> int:
        if self.ended:
            return 0
        self.ended = True
        try:
            # local: imported in _import above
            from stepscope.collectors.injob import bootstrap

            bootstrap.uninstall()
            _write_status(self.folder, "detached", "collectors removed; the process goes on")
        except BaseException as exc:  # never into the job
            _write_status(self.folder, "detached", f"detached with an error: {_one_line(exc)}")
        return 0

    def _refuse(self, why: str) -> None:
        self.ended = True
        _write_status(self.folder, "refused", why)


def _busy(frame: Any) -> bool:
    while frame is not None:
        if _is_busy_frame(frame):
            return True
        frame = frame.f_back
    return False


def _is_busy_frame(frame: Any) -> bool:
    code = frame.f_code
    name = code.co_name
    if name not in ("_call_impl", "wrapper", "backward", "generate"):
        return False
    path = code.co_filename.replace(os.sep, "/")
    return any(path.endswith(tail) and name == fn for tail, fn in BUSY_FRAMES)


def _live_optimizers() -> int:
    """The optimizers the job made before the attach: the timer counts the ones made
    while it is there, and their count tells a training job from an inference one."""
    import gc  # local: once, at install

    optim = sys.modules.get("torch.optim.optimizer")
    kind = getattr(optim, "Optimizer", None)
    if kind is None:
        return 0
    # by type, not isinstance: that reads __class__, which wakes lazy modules' warnings
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), kind))


def _alive(pid: Any) -> bool:
    if not pid:
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def _write_status(folder: Path, state: str, message: str) -> None:
    with contextlib.suppress(Exception):
        tmp = folder / f".{STATUS_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"state": state, "message": message, "pid": os.getpid()}))
        os.replace(tmp, folder / STATUS_FILE)


def _one_line(exc: BaseException) -> str:
    return one_line_error(type(exc), exc)
