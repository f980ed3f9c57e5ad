"""The processes one could attach to: Python processes, and those holding a GPU.

What the Attach page and ``stepscope attach --list`` show. stepscope's own processes
(the dashboard, a launcher, a sampler, another attach) are left out, and so are the
processes the dashboard starts (its TensorBoard) and the helpers multiprocessing starts
beside any job (resource tracker, forkserver), which hold no one's work; a job started by
``stepscope run`` in the same store is marked with its run id, so the dashboard can
offer that run's full view instead of a second, poorer recording.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import psutil

from stepscope.collectors.attach.attach import stepscope_run_of
from stepscope.collectors.attach.secret_args import masked
from stepscope.collectors.samplers.gpu_sampler import gpus_and_processes

CPU_WINDOW_S = 0.3


def _is_python(proc: psutil.Process, cmdline: list[str]) -> bool:
    names = [proc.info.get("name") or ""] + [Path(cmdline[0]).name if cmdline else ""]
    return any(n.startswith(("python", "pypy")) for n in names)


def _is_stepscope(cmdline: list[str]) -> bool:
    """stepscope's own processes: `stepscope ...`, `-m stepscope...`, its Streamlit app."""
    if not cmdline:
        return False
    if Path(cmdline[0]).name == "stepscope" or (
        len(cmdline) > 1 and Path(cmdline[1]).name == "stepscope"
    ):
        return True
    joined = " ".join(cmdline)
    return " -m stepscope" in joined or "stepscope/app/dashboard/" in joined


#: multiprocessing's helper processes: started beside a job, never the job itself
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _is_helper(proc: psutil.Process, cmdline: list[str]) -> bool:
    """A multiprocessing helper, or a process the dashboard started (TensorBoard)."""
    joined = " ".join(cmdline)
    if any(h in joined for h in MP_HELPERS):
        return True
    with contextlib.suppress(psutil.Error):
        for parent in proc.parents():
            parent_cmd = parent.cmdline()
            if _is_stepscope(parent_cmd):
                # a `stepscope run` job is the user's; the dashboard's children are not
                return _is_dashboard(parent_cmd)
    return False


def _is_dashboard(cmdline: list[str]) -> bool:
    joined = " ".join(cmdline)
    return "stepscope/app/dashboard/" in joined or " dashboard" in joined or " demo" in joined


def gpu_memory_by_pid() -> dict[int, float]:
    """Bytes of GPU memory per process, summed over GPUs (NVML); empty without a driver."""
    out: dict[int, float] = {}
    for gpu in gpus_and_processes():
        for pid, used in gpu["processes"].items():
            out[pid] = out.get(pid, 0.0) + used
    return out


def candidates(home: Path, cpu_window_s: float = CPU_WINDOW_S) -> list[dict[str, Any]]:
    """One dict per process: pid, cmdline (secret-looking arguments masked,
    ``secret_args``), user, cpu_percent, rss_bytes, gpu_mem_bytes, started_at, python,
    run_id (a `stepscope run` job of this store), newest first."""
    gpu = gpu_memory_by_pid()
    own = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    picked: list[psutil.Process] = []
    for proc in psutil.process_iter(["name", "cmdline", "username", "create_time"]):
        if proc.pid in own:
            continue
        cmdline = proc.info.get("cmdline") or []
        if _is_stepscope(cmdline) or _is_helper(proc, cmdline):
            continue
        if _is_python(proc, cmdline) or proc.pid in gpu:
            picked.append(proc)
    for proc in picked:  # the first cpu_percent() call only starts the clock
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)
    time.sleep(cpu_window_s)
    rows = []
    for proc in picked:
        try:
            cpu = proc.cpu_percent(None)
            rss = float(proc.memory_info().rss)
        except psutil.NoSuchProcess:
            continue  # ended meanwhile
        except psutil.AccessDenied:
            cpu, rss = None, None
        cmdline = proc.info.get("cmdline") or [proc.info.get("name") or str(proc.pid)]
        shown = masked(cmdline)  # the list is for people to read: no tokens in it
        rows.append(
            {
                "pid": proc.pid,
                "cmdline": shown,
                "command": " ".join(shown),
                "user": proc.info.get("username"),
                "cpu_percent": cpu,
                "rss_bytes": rss,
                "gpu_mem_bytes": gpu.get(proc.pid),
                "started_at": proc.info.get("create_time"),
                "python": _is_python(proc, cmdline),
                "run_id": stepscope_run_of(proc, home),
            }
        )
    rows.sort(key=lambda r: r["started_at"] or 0.0, reverse=True)
    return rows
