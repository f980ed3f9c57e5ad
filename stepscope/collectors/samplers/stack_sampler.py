"""Python stack samples of a running process, with py-spy, into the run store.

py-spy reads another process's memory (``process_vm_readv``, the ptrace permission)
to walk its Python frames: the process is neither restarted nor modified, which is what
attaching to a job that is already running needs. It runs as a subprocess in windows
of a few seconds, because py-spy writes its output only when a recording ends: each
window lands in the store as soon as it is over, so a long attach shows progress and a
process that dies keeps every window before the last (py-spy also writes the last one
when the process exits).

Options: ``--nonblocking`` (py-spy's default stops the process at each sample for a
consistent stack; on a 2-core machine running a CPU-bound job that cost the job 26 %,
against none measurable without it, see bench/README.md; a rare torn sample is
counted as a py-spy error, not misfiled), ``--idle`` (a main thread blocked on a
DataLoader queue or a read is exactly what must be seen; py-spy drops idle threads by
default), ``--threads`` (to tell the main thread apart), ``--subprocesses`` (``torchrun`` ranks; DataLoader workers come
along and are left out by the analysis), ``--full-filenames`` (the job's own source
lines are read to spot ``.item()`` syncs). The raw format is one line per distinct
stack and thread: ``process P:"cmd";thread (TID): NAME;func (file:line);... COUNT``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WINDOW_S = 5.0
# 20 a second: 600 samples in a 30 s attach put a phase's share within ~2 % (one
# standard error); 50 cost a job that keeps both cores of a 2-core machine busy with tiny
# ops 41 % (bench/overhead.py --attach, host_overhead), 20 nothing measurable.
RATE_HZ = 20
STOP_TIMEOUT_S = 10.0
START_RETRIES = 3
START_RETRY_S = 1.0

_PROCESS = re.compile(r'process (\d+):".*?";')
_THREAD = re.compile(r"^thread \((0x[0-9A-Fa-f]+|\d+)\): ?(.*)$")

StackRow = tuple[int, int, str, str, int]  # pid, tid, thread name, frames, samples


def py_spy_path() -> str | None:
    """The py-spy binary installed with stepscope (its wheel puts it beside python).
    ``os.path.isfile``, not ``Path.is_file``: a folder this user may not search (an
    interpreter run from another user's private checkout) is "not here", not an error."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = os.path.join(folder, "py-spy")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("py-spy")


def parse_raw(text: str, root_pid: int) -> list[StackRow]:
    """py-spy's raw output -> rows; lines that do not parse (a cut-off last line) are
    skipped rather than failing the window."""
    rows: list[StackRow] = []
    for line in text.splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        pid = root_pid
        pos = 0
        while m := _PROCESS.match(frames, pos):
            pid, pos = int(m.group(1)), m.end()
        head, _, rest = frames[pos:].partition(";")
        t = _THREAD.match(head)
        if t is None:
            continue
        tid = int(t.group(1), 16) if t.group(1).startswith("0x") else int(t.group(1))
        rows.append((pid, tid, t.group(2).strip(), rest, int(count)))
    return rows


def explain_failure(pid: int, stderr: str) -> str:
    """py-spy's error, as one line that says what to do about it."""
    error = next((ln for ln in stderr.splitlines() if ln.startswith("Error:")), "")
    cause = " ".join(ln.strip() for ln in stderr.splitlines() if ln.strip()[:2] in ("0:", "1:"))
    text = f"{error} {cause}".lower()
    if "permission denied" in text or "operation not permitted" in text or _denied(pid):
        return (
            f"the OS forbids reading process {pid}'s stacks (ptrace): it belongs to another "
            "user, or kernel.yama.ptrace_scope / a container without CAP_SYS_PTRACE blocks "
            "it; attach as that user or as root"
        )
    if "no such file" in text or "check that the process is running" in text:
        return f"process {pid} is gone"
    if any(k in text for k in ("python version", "python interpreter", "no python processes")):
        return f"process {pid} is not running Python (py-spy found no interpreter in it)"
    first = error or next((ln for ln in stderr.splitlines() if ln.strip()), "no message")
    return f"py-spy failed on process {pid}: {first.removeprefix('Error: ').strip()[:200]}"


def _denied(pid: int) -> bool:
    """Whether the OS hides the process's memory map from us: py-spy then says it found
    no Python at all, which is not the reason."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            maps.read(1)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


@dataclass
class StackSampler:
    """Records windows of stack samples of ``pid`` until stopped or the process ends.

    ``on_window(t_start, t_end, rows)`` stores each window; the first py-spy failure
    ends sampling and is kept in ``error`` (the caller reports it once and goes on with
    the system samples).
    """

    pid: int
    on_window: Callable[[float, float, list[StackRow]], Any]
    rate_hz: int = RATE_HZ
    window_s: float = WINDOW_S
    error: str | None = None
    samples: int = 0
    windows: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _proc: subprocess.Popen | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        binary = py_spy_path()
        if binary is None:
            self.error = "py-spy is not installed (pip install py-spy): no stack samples"
            return
        with tempfile.TemporaryDirectory(prefix="stepscope-stacks-") as tmp:
            out = Path(tmp) / "window.txt"
            retries = START_RETRIES
            while not self._stop.is_set():
                if self._window(binary, out):
                    continue
                # a process attached to right after it started may not have its
                # interpreter set up yet: py-spy then finds no Python; try again shortly
                starting = self.windows == 0 and self.error and "not running Python" in self.error
                if not (starting and retries and not self._stop.wait(START_RETRY_S)):
                    return
                retries -= 1
                self.error = None

    def _window(self, binary: str, out: Path) -> bool:
        """One py-spy recording; False when sampling is over (stopped, gone, failed)."""
        out.unlink(missing_ok=True)
        cmd = [
            binary,
            "record",
            *("--pid", str(self.pid), "--rate", str(self.rate_hz), "--format", "raw"),
            *("--duration", str(max(1, round(self.window_s))), "--output", str(out)),
            *("--idle", "--threads", "--subprocesses", "--full-filenames", "--nonblocking"),
        ]
        env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
        t_start = time.time()
        with self._lock:
            if self._stop.is_set():
                return False
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal is for stepscope, not it
            )
        _, stderr = self._proc.communicate()
        code = self._proc.returncode
        t_end = time.time()
        text = out.read_text(errors="replace") if out.exists() else ""
        rows = parse_raw(text, self.pid)
        if rows:
            self.on_window(t_start, t_end, rows)
            self.samples += sum(r[-1] for r in rows)
            self.windows += 1
        if code != 0 and not rows and not self._stop.is_set():
            self.error = explain_failure(self.pid, stderr or "")
            return False
        return "process exited" not in (stderr or "") and not self._stop.is_set()

    def stop(self) -> None:
        """End the window under way early; py-spy writes what it has on SIGINT."""
        with self._lock:
            self._stop.set()
            proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
