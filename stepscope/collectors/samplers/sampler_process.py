"""The system sampler's process beside the job: started, stopped, its log tidied.

The sampler (``system_sampler.py``) runs in its own session, so Ctrl-C does not kill it
before it flushes; it stops on its own when the job's process is gone, or on the
SIGTERM sent here. The job goes on without it if it cannot start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

SAMPLER_STOP_TIMEOUT_S = 5.0


def start_sampler(store: Any, run_id: int, pid: int, interval: float) -> subprocess.Popen | None:
    """Start the system sampler beside the job; the job goes on without it if it fails."""
    package_root = str(Path(__file__).resolve().parents[3])
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_RUN")}
    env["STEPSCOPE_HOME"] = str(store.home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "stepscope.collectors.samplers.system_sampler",
        "--home",
        str(store.home),
        "--run-id",
        str(run_id),
        "--pid",
        str(pid),
        "--interval",
        str(interval),
    ]
    try:
        log = open(store.run_dir(run_id) / "sampler.log", "ab")  # noqa: SIM115 (child owns it)
    except OSError:
        log = subprocess.DEVNULL  # type: ignore[assignment]
    try:
        return subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # out of the foreground group: Ctrl-C is not for it
        )
    except OSError as exc:
        store.log_event(run_id, "warning", "launcher", f"system sampler not started: {exc}")
        return None
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


def stop_sampler(sampler: subprocess.Popen | None) -> None:
    """Ask the sampler to flush and stop; it would notice the job is gone by itself anyway."""
    if sampler is None:
        return
    try:
        sampler.send_signal(signal.SIGTERM)
        sampler.wait(timeout=SAMPLER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sampler.kill()
        sampler.wait()
    except OSError:
        pass


def remove_if_empty(path: Path) -> None:
    """The sampler's stderr log is kept only when it has something to say."""
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()
