"""`stepscope run`: start the user's command unmodified, record it, finalise the run.

The launcher stays outside the job: it creates the run, starts the command with an
environment that lets the bootstrap in (``job_env.build_job_env``), starts the system
sampler beside it, waits, and records how the job ended. The job's stdin, stdout and
stderr are inherited, never piped, so the user sees exactly what the job prints, in
its own buffering, with its own colours and progress bars.

Signals, and why they are handled this way:

* Ctrl-C: the terminal sends SIGINT to the whole foreground process group, so the job
  gets it directly. The launcher only notes it (a Python handler, installed before
  the child starts; exec resets Python handlers to the default in the child, whereas
  SIG_IGN would be inherited and make the job immune to Ctrl-C) and goes on waiting
  so it can finalise the run. It does not forward SIGINT: the job would get it twice.
* SIGTERM and SIGHUP to the launcher (a scheduler stopping it, a closed terminal) are
  forwarded to the job, which would otherwise be orphaned and keep running.
* The sampler runs in its own session, so Ctrl-C does not kill it before it flushes;
  it stops on its own when the job's process is gone, or on the SIGTERM sent here.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Environment variables that change how a PyTorch job performs or distributes itself;
# recorded so that two runs can be compared. Nothing else from the environment is
# stored: it may hold secrets.
RELEVANT_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NCCL_DEBUG",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCHINDUCTOR_CACHE_DIR",
    "VIRTUAL_ENV",
    "CONDA_DEFAULT_ENV",
)
SAMPLER_STOP_TIMEOUT_S = 5.0
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


def launch(
    command: Sequence[str],
    *,
    name: str | None = None,
    max_steps: int | None = None,
    profile_at: int | None = None,
    profile_steps: int | None = None,
    sample_interval: float = 0.5,
) -> int:
    """Run ``command`` under stepscope; returns its exit code as a shell would report it."""
    from stepscope.store import RunStore

    command = list(command)
    store = RunStore()
    config = {
        "max_steps": max_steps,
        "profile_at": profile_at,
        "profile_steps": profile_steps if profile_at is not None else None,
        "sample_interval": sample_interval,
    }
    run_id = store.create_run(
        command,
        name=name,
        cwd=os.getcwd(),
        pid=os.getpid(),
        pid_started_at=_own_create_time(),
        max_steps=max_steps,
        env=env_summary(),
        config=config,
    )
    run_dir = store.run_dir(run_id)
    _say(f"recording run {run_id} ({store.run(run_id)['name']}) in {store.home}")

    signals = _SignalState()
    signals.install()
    try:
        return _run(store, run_id, run_dir, command, config, signals)
    except BaseException as exc:
        # a launcher bug must still leave a final status, not a run 'running' forever
        store.finish_run(run_id, "failed", error=f"stepscope launcher error: {_one_line(exc)}")
        raise
    finally:
        signals.restore()
        store.close()


def _run(
    store: Any,
    run_id: int,
    run_dir: Path,
    command: list[str],
    config: dict[str, Any],
    signals: _SignalState,
) -> int:
    env = _job_env(store, run_id, run_dir, config)
    if signals.received is not None:  # stopped before the job even started
        store.finish_run(run_id, "interrupted", 128 + signals.received, error="interrupted")
        return 128 + signals.received
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        return _not_started(store, run_id, command, EXIT_NOT_FOUND, "command not found")
    except PermissionError:
        return _not_started(store, run_id, command, EXIT_NOT_EXECUTABLE, "permission denied")
    except OSError as exc:
        return _not_started(store, run_id, command, EXIT_NOT_EXECUTABLE, exc.strerror or str(exc))
    signals.child = child
    if signals.forward_pending is not None:  # SIGTERM arrived while starting
        _forward(child, signals.forward_pending)

    sampler = _start_sampler(store, run_id, child.pid, float(config["sample_interval"]))
    returncode = child.wait()
    _stop_sampler(sampler)
    _remove_if_empty(run_dir / "sampler.log")
    return _finalise(store, run_id, returncode, signals)


def _finalise(store: Any, run_id: int, returncode: int, signals: _SignalState) -> int:
    """Turn how the job ended into a run status; the job's own error line is kept."""
    run = store.run(run_id)
    exit_code = 128 - returncode if returncode < 0 else returncode
    error: str | None = None
    user_stop = signals.received is not None
    if returncode == 0:
        if run.get("stop_reason") == "max_steps":
            status = "stopped"
        elif user_stop:
            status = "interrupted"
        else:
            status = "completed"
    elif returncode < 0:
        sig = -returncode
        sig_name = _signal_name(sig)
        if sig == signal.SIGINT or (user_stop and sig == signals.received):
            status, error = "interrupted", f"interrupted ({sig_name})"
        else:
            status, error = "killed", f"killed by {sig_name}"
    elif returncode == 130 or user_stop:
        status = "interrupted"
        error = None if run.get("error") else f"interrupted (exit code {returncode})"
    else:
        status = "failed"
        error = None if run.get("error") else f"exit code {returncode}"
    store.finish_run(run_id, status, exit_code, error=error)
    if status in ("completed", "stopped") and run.get("error"):
        # A child process of the job (a helper script, a worker) raised, yet the job
        # itself succeeded: keep the message in the run's log, not as the run's error.
        store.update_run(run_id, error=None)
        store.log_event(run_id, "warning", "launcher", f"a child process raised: {run['error']}")

    steps = store.steps(run_id)
    ranks = steps["rank"].nunique() if len(steps) else 0
    counted = f"{len(steps)} steps" if ranks <= 1 else f"{len(steps)} steps over {ranks} ranks"
    how = status if status in ("completed", "stopped") else f"{status} (exit code {exit_code})"
    _say(f"run {run_id} {how}, {counted} — stepscope show {run_id}")
    return exit_code


def _not_started(store: Any, run_id: int, command: list[str], code: int, why: str) -> int:
    error = f"{why}: {command[0]}"
    store.finish_run(run_id, "failed", code, error=error)
    _say(error)
    return code


def _job_env(store: Any, run_id: int, run_dir: Path, config: dict[str, Any]) -> dict[str, str]:
    """The job's environment with the bootstrap in; the plain environment if that fails.

    The job must never be broken by stepscope: if the environment cannot be prepared,
    the job still runs, unrecorded, and the run's log says why.
    """
    try:
        from stepscope.collectors.job_env import build_job_env

        return build_job_env(
            run_id,
            str(store.home),
            str(run_dir),
            max_steps=config["max_steps"],
            profile_at=config["profile_at"],
            profile_steps=config["profile_steps"],
        )
    except Exception as exc:
        message = f"cannot inject the step collectors ({_one_line(exc)}); steps are not recorded"
        store.log_event(run_id, "error", "launcher", message)
        _say(message)
        return dict(os.environ)


def _start_sampler(store: Any, run_id: int, pid: int, interval: float) -> subprocess.Popen | None:
    """Start the system sampler beside the job; the job goes on without it if it fails."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_RUN")}
    env["STEPSCOPE_HOME"] = str(store.home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "stepscope.collectors.system_sampler",
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


def _stop_sampler(sampler: subprocess.Popen | None) -> None:
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


def _remove_if_empty(path: Path) -> None:
    """The sampler's stderr log is kept only when it has something to say."""
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()


class _SignalState:
    """What the launcher was told while the job ran, and the handlers that record it."""

    FORWARDED = ("SIGTERM", "SIGHUP")

    def __init__(self) -> None:
        self.received: int | None = None
        self.child: subprocess.Popen | None = None
        self.forward_pending: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        sigs = [signal.SIGINT] + [getattr(signal, n) for n in self.FORWARDED if hasattr(signal, n)]
        for sig in sigs:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None or signum != signal.SIGINT:
            self.received = signum
        if signum == signal.SIGINT:
            return  # the terminal delivered it to the job as well
        if self.child is None:
            self.forward_pending = signum
        else:
            _forward(self.child, signum)


def _forward(child: subprocess.Popen, signum: int) -> None:
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signum)


def env_summary() -> dict[str, Any]:
    """What about this machine and environment can change a job's speed."""
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "vars": {k: os.environ[k] for k in RELEVANT_ENV if k in os.environ},
    }


def _own_create_time() -> float | None:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:
        return None


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _say(message: str) -> None:
    print(f"stepscope: {message}", file=sys.stderr, flush=True)


__all__ = ["env_summary", "launch"]
