"""Start TensorBoard (with the torch-tb-profiler plugin) on a run's folder, on localhost.

For users who know tb-profiler's views. The plugin is no longer maintained and
misreads some newer traces (it predates the ``cuda_runtime`` category, for one), so
the dashboard says so next to the link; stepscope's own analysis does not depend on it.

No Streamlit here: a plain function that the dashboard (and anything else) can call.
The process is a child of the caller, in its process group, so Ctrl-C on
``stepscope dashboard`` ends it too.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PLUGIN_NOTE = (
    "torch-tb-profiler is no longer maintained and misreads some newer traces "
    "(for example it knows no CUDA runtime category); stepscope's own analysis above "
    "does not depend on it."
)


@dataclass
class TensorBoard:
    logdir: str
    port: int
    process: subprocess.Popen
    log_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/#pytorch_profiler"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def unavailable_reason() -> str | None:
    """Why TensorBoard cannot be offered here, or None when it can."""
    missing = [m for m in ("tensorboard", "torch_tb_profiler") if not _installed(m)]
    if missing:
        names = {"tensorboard": "tensorboard", "torch_tb_profiler": "torch-tb-profiler"}
        return (
            f"{' and '.join(names[m] for m in missing)} not installed in this environment "
            f"(pip install {' '.join(names[m] for m in missing)})"
        )
    return None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_tensorboard(logdir: str | os.PathLike[str], port: int | None = None) -> TensorBoard:
    """Start ``python -m tensorboard.main`` on ``logdir`` at 127.0.0.1; returns at once.

    Its output goes to ``tensorboard.log`` in the folder (the user's run folder is the
    one place they will look for it).
    """
    logdir = str(Path(logdir).resolve())
    port = port or free_port()
    log_path = str(Path(logdir) / "tensorboard.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                logdir,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return TensorBoard(logdir=logdir, port=port, process=proc, log_path=log_path)


def wait_listening(tb: TensorBoard, timeout_s: float = 30.0) -> bool:
    """True once TensorBoard accepts connections; False if it exited or timed out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not tb.alive():
            return False
        try:
            with socket.create_connection(("127.0.0.1", tb.port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.25)
    return False


def last_log_line(tb: TensorBoard) -> str:
    """The last line TensorBoard printed: why it exited, when it did."""
    try:
        lines = Path(tb.log_path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""
