"""Attach to a process that is already running: record it into a new run.

The system sampler (psutil on its process tree, NVML for its GPUs) and the stack
sampler (py-spy) read it from outside. Where it can be done, ``stepscope run``'s in-job
collectors also go into the process for the attach's time (``inject.py``: gdb, or
``sys.remote_exec``), so its steps, requests and a capture on request are recorded as
under ``stepscope run``; they come out again at detach, and the job keeps running.
Where they cannot, one line says why and the attach records from outside alone. What it
costs the job from outside is CPU taken beside it (py-spy reading its memory 20 times a
second, without stopping it; the samplers): `bench/overhead.py --attach` measures it. The run's
``pid`` is the attaching process (the liveness check of the store): an attach that is
killed leaves a ``lost`` run with everything recorded up to then.

An attach ends when its duration is over, when the process ends (its exit status is
not ours to read: it is not our child), or when it is stopped (Ctrl-C, the dashboard's
Stop); every way keeps what was recorded and says how it ended in the run's log.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from stepscope.collectors.attach.inject import Injection, inject
from stepscope.collectors.launch.contract import ENV_HOME, ENV_RUN_ID
from stepscope.collectors.samplers.gpu_sampler import gpus_and_processes
from stepscope.collectors.samplers.stack_sampler import RATE_HZ, StackRow, StackSampler
from stepscope.collectors.samplers.system_sampler import run_sampler
from stepscope.store import RunStore
from stepscope.store.liveness import ATTACH_PROCESS, signalable_pid

DEFAULT_DURATION_S = 30.0
JOIN_TIMEOUT_S = 15.0
SOURCE = "attach"


class AttachError(RuntimeError):
    """Cannot attach at all (no such process, our own process); one line."""


@dataclass
class AttachProgress:
    elapsed_s: float
    duration_s: float
    stack_samples: int
    windows: int


@dataclass
class AttachResult:
    run_id: int
    status: str
    stop_reason: str  # 'duration' | 'process_ended' | 'detached'
    elapsed_s: float
    stack_samples: int
    messages: list[str] = field(default_factory=list)  # what the user must hear, one line each


def target(pid: int) -> psutil.Process:
    """The process to attach to, or AttachError saying why not."""
    if pid == os.getpid():
        raise AttachError(f"process {pid} is this stepscope process")
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            raise AttachError(f"process {pid} has already exited")
    except psutil.NoSuchProcess:
        raise AttachError(f"no process with PID {pid}") from None
    return proc


def describe(proc: psutil.Process) -> dict[str, Any]:
    """Command line, folder and owner, as far as we may read them."""
    info: dict[str, Any] = {"pid": proc.pid}
    for key, read in (
        ("cmdline", proc.cmdline),
        ("cwd", proc.cwd),
        ("user", proc.username),
        ("name", proc.name),
        ("started_at", proc.create_time),
    ):
        try:
            info[key] = read()
        except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
            info[key] = None
    if not info["cmdline"]:
        info["cmdline"] = [info["name"] or str(proc.pid)]
    return info


def stepscope_run_of(proc: psutil.Process, home: Path) -> int | None:
    """The run id when the process is a job started by `stepscope run` in this store."""
    try:
        env = proc.environ()
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess, OSError):
        return None
    run_id = env.get(ENV_RUN_ID)
    if not run_id or not run_id.isdigit():
        return None
    same_home = Path(env.get(ENV_HOME) or "").expanduser().resolve() == home.resolve()
    return int(run_id) if same_home else None


def _run_name(cmdline: list[str], pid: int) -> str:
    script = next((Path(a).name for a in cmdline[1:] if a.endswith(".py")), None)
    if script is None and "-m" in cmdline[:-1]:
        script = cmdline[cmdline.index("-m") + 1]
    return f"attach-{script or Path(cmdline[0]).name}-{pid}"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class _StackWriter:
    """Stores each window from the stack sampler's thread (SQLite wants one connection
    per thread), opened on the first window and closed when sampling ends."""

    def __init__(self, home: str, run_id: int) -> None:
        self.home, self.run_id, self.store = home, run_id, None

    def __call__(self, t_start: float, t_end: float, rows: list[StackRow]) -> None:
        if self.store is None:
            self.store = RunStore(self.home)
        self.store.add_stack_samples(self.run_id, t_start, t_end, rows)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def attach(
    pid: int,
    *,
    duration_s: float = DEFAULT_DURATION_S,
    name: str | None = None,
    home: str | os.PathLike[str] | None = None,
    rate_hz: int = RATE_HZ,
    sample_interval: float = 0.5,
    stop: threading.Event | None = None,
    on_progress: Callable[[AttachProgress], None] | None = None,
    inject_collectors: bool = True,
) -> AttachResult:
    """Record ``pid`` for ``duration_s`` seconds (or until it ends, or ``stop`` is set);
    with ``inject_collectors``, stepscope run's collectors go into it for that time."""
    if duration_s <= 0:
        raise AttachError(f"the duration must be positive, not {duration_s:g}")
    proc = target(pid)
    info = describe(proc)
    stop = stop or threading.Event()
    store = RunStore(home)
    home_s = str(store.home)
    messages: list[str] = []
    try:
        known_run = stepscope_run_of(proc, store.home)
        run_id = store.create_run(
            info["cmdline"],
            name=name or _run_name(info["cmdline"], pid),
            cwd=info["cwd"] or "",
            pid=os.getpid(),
            pid_started_at=psutil.Process().create_time(),
            env={"attached_to": {k: info[k] for k in ("pid", "user", "started_at")}},
            config={
                "mode": "attach",
                "attached_pid": pid,
                "duration_s": duration_s,
                "stack_rate_hz": rate_hz,
                "sample_interval": sample_interval,
                "stepscope_run": known_run,
            },
        )
        store.update_run(run_id, device=device_of(pid))  # again at the end if no GPU yet
        command = shlex.join(info["cmdline"])
        store.log_event(run_id, "info", SOURCE, f"attached to process {pid} ({command})")
        if known_run is not None:
            messages.append(
                f"process {pid} is the job of run {known_run} (stepscope run): its steps are "
                f"recorded there; `stepscope capture {known_run}` gives it a trace"
            )
        if info["user"] is None or not _same_user(proc):
            store.log_event(
                run_id, "warning", SOURCE, f"process {pid} belongs to user {info['user'] or '?'}"
            )

        writer = _StackWriter(home_s, run_id)
        stacks = StackSampler(pid, on_window=writer, rate_hz=rate_hz)
        stop_system = threading.Event()

        def _stacks() -> None:
            try:
                stacks.run()
            except Exception as exc:  # a stack-sampler bug must not end the attach
                stacks.error = f"stack sampling failed ({type(exc).__name__}: {exc})"
            finally:
                writer.close()

        system_error: list[str] = []

        def _system() -> None:
            try:
                run_sampler(home_s, run_id, pid, sample_interval, stop=stop_system)
            except Exception as exc:
                system_error.append(f"system sampling failed ({type(exc).__name__}: {exc})")

        threads = [
            threading.Thread(target=_stacks, name="stepscope-stacks", daemon=True),
            threading.Thread(target=_system, name="stepscope-system", daemon=True),
        ]
        for t in threads:
            t.start()
        injection = None
        try:
            if inject_collectors and known_run is None:  # sampled from outside meanwhile
                injection = _inject(store, run_id, pid, home_s, messages, stop)
            started = time.monotonic()  # the duration is the collectors' time in the job
            reason = _wait(proc, duration_s, stop, started, stacks, on_progress)
        except BaseException as exc:  # a bug here, or a second Ctrl-C: keep what we have
            store.finish_run(run_id, "failed", error=f"attach ended early: {exc!r}")
            raise
        finally:
            if injection is not None:  # first: the job's last rows are written as it detaches
                left = injection.detach()
                if left is not None:
                    messages.append(left)
            stacks.stop()
            stop_system.set()
            for t in threads:
                t.join(JOIN_TIMEOUT_S)
        elapsed = time.monotonic() - started
        if reason == "duration" and not _alive(proc):
            reason = "process_ended"
        return _finish(store, run_id, pid, reason, elapsed, stacks, system_error, messages)
    finally:
        store.close()


def _inject(
    store: Any, run_id: int, pid: int, home: str, messages: list[str], stop: threading.Event
) -> Injection | None:
    """The collectors into the process (``inject.py``), or the line saying why the
    attach records stacks only; the run's config says which (``inject``)."""
    result = inject(pid, run_id=run_id, home=home, run_dir=store.run_dir(run_id), stop=stop)
    if isinstance(result, str):
        messages.append(f"stacks only: {result}")
        store.merge_run_json(run_id, "config", {"inject": {"mode": "stacks", "why": result}})
        return None
    store.merge_run_json(run_id, "config", {"inject": {"mode": "injected", "how": result.how}})
    store.log_event(
        run_id,
        "info",
        SOURCE,
        f"collectors injected into process {pid} ({result.how}): its steps and requests are "
        f"recorded as under stepscope run, and `stepscope capture {run_id}` profiles it",
    )
    return result


def _wait(
    proc: psutil.Process,
    duration_s: float,
    stop: threading.Event,
    started: float,
    stacks: StackSampler,
    on_progress: Callable[[AttachProgress], None] | None,
) -> str:
    """Until the duration is over, the process ends, or ``stop``; returns which."""
    while True:
        elapsed = time.monotonic() - started
        if on_progress is not None:
            on_progress(AttachProgress(elapsed, duration_s, stacks.samples, stacks.windows))
        if elapsed >= duration_s:
            return "duration"
        if not _alive(proc):
            return "process_ended"
        if stop.wait(min(0.25, duration_s - elapsed)):
            return "detached"


def device_of(pid: int) -> dict[str, Any]:
    """The device facts the diagnosis reads (``runs.device``), seen from outside: the GPU
    whose memory the process tree holds (NVML), else none; a machine with AMD's driver
    (/dev/kfd) and no NVML leaves it unknown rather than calling the job CPU-only."""
    pids = {pid}
    with contextlib.suppress(psutil.Error):
        pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    device: dict[str, Any] = {"cpu_count": psutil.cpu_count(), "seen_from": "attach"}
    gpus = gpus_and_processes()
    for gpu in gpus:
        if pids & set(gpu["processes"]):
            return dict(device, device_name=gpu["name"], capability=gpu["capability"])
    if not gpus and Path("/dev/kfd").exists():
        return {}
    return device


def _same_user(proc: psutil.Process) -> bool:
    try:
        return os.geteuid() == 0 or proc.uids().real == os.getuid()
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return False


def _finish(
    store: Any,
    run_id: int,
    pid: int,
    reason: str,
    elapsed: float,
    stacks: StackSampler,
    system_error: list[str],
    messages: list[str],
) -> AttachResult:
    """Say how the attach ended, on the run and to the caller; keep everything recorded."""
    kept = f"kept {stacks.samples} stack samples and the system samples"
    if reason == "process_ended":
        messages.append(
            f"process {pid} ended after {elapsed:.1f} s of attach (its exit status is not "
            f"visible to stepscope: it is not our child); {kept}"
        )
    elif reason == "detached":
        messages.append(f"detached from process {pid} after {elapsed:.1f} s; {kept}")
    if stacks.error:
        messages.append(f"no stack samples: {stacks.error}")
    messages.extend(system_error)
    for message in messages:
        level = "warning" if message.startswith(("no stack", "system sampling")) else "info"
        store.log_event(run_id, level, SOURCE, message)
    status = "stopped" if reason == "detached" else "completed"
    store.update_run(run_id, stop_reason=reason)
    if reason != "process_ended" and not store.run(run_id)["device"].get("device_name"):
        store.update_run(run_id, device=device_of(pid))
    store.finish_run(run_id, status)
    return AttachResult(run_id, status, reason, elapsed, stacks.samples, messages)


def start_attach(
    pid: int,
    *,
    duration_s: float = DEFAULT_DURATION_S,
    name: str | None = None,
    home: str | os.PathLike[str] | None = None,
) -> subprocess.Popen:
    """`stepscope attach` in the background (the dashboard's Attach button): a process of
    its own, so the recording goes on when the page reloads; it writes its run like the
    command line does, and ``attach_run_of`` finds it."""
    target(pid)  # no such process: the caller hears it now, not from a log
    with RunStore(home) as store:
        home_s = str(store.home)
    log = attach_log(home_s, pid)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "stepscope.app.cli", "--home", home_s, "attach", str(pid)]
    cmd += ["--duration", str(duration_s), "--quiet", *(["--name", name] if name else [])]
    with open(log, "wb") as out:  # the latest attach to this pid: what its errors are
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # not killed with the dashboard's terminal
        )


def attach_log(home: str | os.PathLike[str], pid: int) -> Path:
    """Where a background attach to ``pid`` writes its output (one file per target,
    rewritten by the next attach to it, so they do not pile up)."""
    return Path(home) / "attach-logs" / f"{pid}.log"


def attach_run_of(store: Any, attacher_pid: int, since: float) -> int | None:
    """The run a background attach (``start_attach`` at time ``since``) is recording
    into, once it exists (an old run of a reused pid does not count)."""
    runs = store.runs()
    if runs.empty:
        return None
    mine = runs[(runs["pid"] == attacher_pid) & (runs["started_at"] >= since - 1.0)]
    for row in mine.itertuples():
        if (store.run(int(row.id))["config"] or {}).get("mode") == "attach":
            return int(row.id)
    return None


def stop_attach(store: Any, run_id: int) -> bool:
    """Detach a running attach early (SIGINT: it keeps what it recorded); False if it is
    not running any more."""
    run = store.run(run_id)
    pid = signalable_pid(run, ATTACH_PROCESS) if run["status"] == "running" else None
    if pid is None:  # ended, or not a process of this host (a shared store)
        return False
    try:
        os.kill(pid, signal.SIGINT)
    except (ProcessLookupError, PermissionError):
        return False
    return True
