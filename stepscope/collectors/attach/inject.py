"""Put stepscope's in-job collectors into a running Python process, from outside.

``stepscope run`` puts its collectors in at start (the bootstrap); a process already
running gets them here, as ``memray attach`` gets its tracker in: through the
interpreter itself. Python 3.14's ``sys.remote_exec`` (PEP 768) runs a file at the
target's next safe point where both sides have it. Elsewhere gdb attaches for about a
second and queues one line with ``Py_AddPendingCall``, which the target's main thread runs
between two bytecodes; the line's text is written into a page gdb maps in the target
(``mmap``), so nothing is allocated with the target's own allocator while it is stopped.
That line calls ``injob/live.py: begin``, which does the rest inside and writes its state
to ``status.json`` in the attach's folder (``<run_dir>/inject``).

When it cannot be done (gdb missing, ptrace not permitted, another user's process, a
Python whose symbols gdb cannot find, a main thread that never runs Python, stepscope
not importable there) the attach goes on with stack samples alone and says why in one
line: ``inject`` returns that line instead of an ``Injection``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

import stepscope
from stepscope.collectors.injob.live import SAFE_WAIT_S, STATUS_FILE, STOP_FILE
from stepscope.collectors.launch.contract import ENV_HOME, ENV_RUN_DIR, ENV_RUN_ID, ENV_STORE

GDB_ENV = "STEPSCOPE_GDB"  # the gdb to use (default: gdb on PATH)
GDB_TIMEOUT_S = 60.0
START_WAIT_S = 20.0  # for the main thread to run the line (and import), before the step wait
DETACH_WAIT_S = 15.0
SETTINGS_FILE = "settings.json"
FOLDER = "inject"


@dataclass
class Injection:
    """Collectors running inside ``pid``; ``detach`` takes them out again."""

    pid: int
    folder: Path
    how: str  # 'gdb' | 'sys.remote_exec'

    def detach(self, timeout: float = DETACH_WAIT_S) -> str | None:
        """Ask the process to take the collectors out; None once it has, else why not."""
        (self.folder / STOP_FILE).touch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = read_status(self.folder)
            if state and state["state"] == "detached":
                return None
            if not psutil.pid_exists(self.pid):
                return None  # it ended: nothing of ours is left in it
            time.sleep(0.1)
        return (
            f"process {self.pid} did not take the collectors out within {timeout:.0f} s "
            "(its main thread runs no Python): they go when it next does"
        )


def inject(
    pid: int,
    *,
    run_id: int,
    home: str,
    run_dir: Path,
    wait_s: float = SAFE_WAIT_S,
    stop: threading.Event | None = None,
) -> Injection | str:
    """The collectors into ``pid``, recording into run ``run_id``; or one line why not
    (``stop`` set meanwhile: the attach was stopped, and nothing is left in the process)."""
    refused = refusal(pid)
    if refused is not None:
        return refused
    folder = run_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    settings = folder / SETTINGS_FILE
    env = {ENV_RUN_ID: str(run_id), ENV_HOME: str(home), ENV_RUN_DIR: str(run_dir)}
    if os.environ.get(ENV_STORE):  # read, then removed, by the process (live.begin)
        env[ENV_STORE] = os.environ[ENV_STORE]
    payload = {
        "folder": str(folder),
        "run_id": run_id,
        "attacher_pid": os.getpid(),
        "wait_s": wait_s,
        "env": env,
    }
    fd = os.open(settings, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f)
    line = injected_line(settings)
    how = "sys.remote_exec" if _remote_exec_possible(pid) else "gdb"
    error = _remote_exec(pid, folder, line) if how == "sys.remote_exec" else run_gdb(pid, line)
    if error is not None:
        settings.unlink(missing_ok=True)
        return error
    deadline = time.monotonic() + START_WAIT_S + wait_s
    while time.monotonic() < deadline:
        state = read_status(folder)
        if state is not None and state["state"] == "installed":
            return Injection(pid, folder, how)
        if state is not None:
            return f"collectors not injected: {state['message']}"
        if not psutil.pid_exists(pid):
            return f"process {pid} ended while the collectors were being injected"
        if stop is not None and stop.wait(0.1):
            break
    # the queued line may still run later: with its settings gone it does nothing, and
    # collectors it installed meanwhile see the stop file and leave
    settings.unlink(missing_ok=True)
    (folder / STOP_FILE).touch()
    if stop is not None and stop.is_set():
        return "the attach was stopped while the collectors were being injected"
    return (
        f"collectors not injected: process {pid} ran no Python on its main thread for "
        f"{START_WAIT_S + wait_s:.0f} s (blocked in a call), or stepscope cannot be "
        "imported by its Python"
    )


def refusal(pid: int) -> str | None:
    """Why the collectors cannot go into ``pid`` at all (before gdb is tried), or None."""
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
        exe = proc.exe()
    except psutil.NoSuchProcess:
        return f"process {pid} has ended"
    except psutil.AccessDenied:
        return f"process {pid} cannot be read (another user's)"
    if uid != os.getuid():
        return (
            f"process {pid} is another user's: its collectors could not write to this "
            "store (attach as that user)"
        )
    if not Path(exe).name.startswith("python"):
        return f"process {pid} is not a CPython interpreter ({Path(exe).name})"
    if _remote_exec_possible(pid):
        return None
    if gdb_path() is None:
        return "gdb is not installed (apt-get install gdb, or set STEPSCOPE_GDB)"
    return None


def gdb_path() -> str | None:
    return shutil.which(os.environ.get(GDB_ENV) or "gdb")


def injected_line(settings: Path) -> str:
    """The text the target runs: in a namespace of its own (not the job's __main__),
    never raising (a pending call that fails raises in the job's main thread)."""
    root = str(Path(stepscope.__file__).resolve().parent.parent)
    code = (
        "import sys\n"
        "try:\n"
        "    import stepscope\n"
        "except ImportError:\n"
        f"    sys.path.append({root!r})\n"
        "from stepscope.collectors.injob.live import begin\n"
        f"begin({str(settings)!r})\n"
    )
    return f"try:\n    exec({code!r}, {{}})\nexcept BaseException:\n    pass\n"


def run_gdb(pid: int, line: str) -> str | None:
    """Queue ``line`` in ``pid``'s interpreter with gdb; None when queued, else why not."""
    gdb = gdb_path()
    if gdb is None:
        return "gdb is not installed (apt-get install gdb, or set STEPSCOPE_GDB)"
    data = line.encode() + b"\0"
    size = (len(data) + 4095) // 4096 * 4096
    commands = [
        "sharedlibrary libc",
        "sharedlibrary libpython",
        f"set $stepscope_buf = (char *) mmap(0, {size}, 3, 0x22, -1, 0)",  # RW, private|anon
        "print (long) $stepscope_buf",
        f"set {{char[{len(data)}]}} $stepscope_buf = {_c_string(data[:-1])}",
        "print (int) Py_AddPendingCall((int (*)(void *)) PyRun_SimpleString, $stepscope_buf)",
        "detach",
    ]
    args = [gdb, "-p", str(pid), "-batch", "-nx", "-q"]
    for setting in ("auto-solib-add off", "auto-load off", "debuginfod enabled off"):
        args += ["-iex", f"set {setting}"]
    for command in commands:
        args += ["-ex", command]
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=GDB_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return f"gdb did not finish within {GDB_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return f"gdb could not be started ({exc.strerror or exc})"
    return gdb_error(proc.stdout + proc.stderr)


def gdb_error(output: str) -> str | None:
    """What went wrong in gdb's output, one line; None when the call was queued."""
    if "ptrace: Operation not permitted" in output:
        scope = _ptrace_scope()
        return "ptrace is not permitted" + (
            f" (kernel.yama.ptrace_scope={scope}: attach as root, or set it to 0)"
            if scope not in (None, "0")
            else ""
        )
    if "ptrace: No such process" in output:
        return "the process ended before gdb could attach"
    missing = re.search(r'No symbol "?(\w+)"? in current context', output)
    if missing:
        return f"gdb finds no {missing.group(1)} in the process (a Python without its symbols?)"
    values = re.findall(r"^\$\d+ = (-?\d+)$", output, re.MULTILINE)
    if len(values) < 2:
        return "gdb could not call into the process: " + (_last_line(output) or "no output")
    if int(values[0]) in (-1, 0):
        return "gdb could not map a page in the process"
    if int(values[1]) != 0:
        return "the interpreter's queue of pending calls is full; try again"
    return None


def read_status(folder: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        state = json.loads((folder / STATUS_FILE).read_text())
        if isinstance(state, dict) and isinstance(state.get("state"), str):
            return {"state": state["state"], "message": str(state.get("message") or "")}
    return None


def _remote_exec_possible(pid: int) -> bool:
    """PEP 768 needs it on our side and a 3.14+ interpreter on the other."""
    if not hasattr(sys, "remote_exec"):
        return False
    with contextlib.suppress(psutil.Error, ValueError):
        found = re.search(r"python(3)\.(\d+)", Path(psutil.Process(pid).exe()).name)
        return found is not None and int(found.group(2)) >= 14
    return False


def _remote_exec(pid: int, folder: Path, line: str) -> str | None:
    script = folder / "inject.py"
    script.write_text(line)
    try:
        sys.remote_exec(pid, str(script))  # type: ignore[attr-defined]  # Python 3.14+
    except Exception as exc:
        return f"sys.remote_exec failed: {' '.join(str(exc).split())}"
    return None


def _c_string(data: bytes) -> str:
    """A C string literal for gdb: printable ASCII as it is, the rest octal escapes."""
    out = []
    for byte in data:
        char = chr(byte)
        out.append(char if 32 <= byte < 127 and char not in '"\\' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _ptrace_scope() -> str | None:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    return None


def _last_line(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1] if lines else ""
