"""`stepscope run`: start the user's command unmodified, record it, finalise the run.

The launcher stays outside the job: it creates the run, starts the command with an
environment that lets the bootstrap in (``job_env.build_job_env``), starts the system
sampler beside it (``samplers/sampler_process.py``), waits, and records how the job ended. The
job's stdin, stdout and stderr are inherited, never piped, so the user sees exactly
what the job prints, in its own buffering, with its own colours and progress bars.
Signals to the launcher reach the job as ``job_signals.py`` explains.

Experiments (``optim_runner.experiment.experiment``) launch many bounded trial runs through
``launch_run``, with options ``stepscope run`` does not need: the job's output goes to a
log in the run folder (a table of trials, not interleaved job output, is what the user
follows), and a timeout catches a candidate that hangs. A job with a timeout runs in its
own session, so that killing its process group also kills its DataLoader workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from stepscope.collectors.facts.env_summary import env_summary
from stepscope.collectors.launch.contract import ENV_PLAN
from stepscope.collectors.launch.job_env import build_job_env
from stepscope.collectors.launch.job_signals import SignalState, forward, signal_name
from stepscope.collectors.launch.job_wait import MIN_STALL_S, JobEnd, Progress, wait_for_job
from stepscope.collectors.launch.memory_limit import (
    MEMORY_LIMIT_KEY,
    address_space_limiter,
    killed_near_limit,
)
from stepscope.collectors.launch.run_group import Membership, RunGroup, join_or_create, run_group_of
from stepscope.collectors.samplers.sampler_process import (
    remove_if_empty,
    start_sampler,
    stop_sampler,
)
from stepscope.store import RunStore

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_TIMED_OUT = 124  # what timeout(1) returns
PLAN_FILENAME = "plan.json"


def launch(
    command: Sequence[str],
    *,
    name: str | None = None,
    max_steps: int | None = None,
    profile_at: int | str | None = None,
    profile_steps: int | None = None,
    sample_interval: float = 0.5,
    run_group: str | None = None,
    memory_limit: int | None = None,
    brief: bool = False,
) -> tuple[int, int]:
    """Run ``command`` under stepscope; returns the run's id and the exit code as a
    shell would report it. ``brief``: the one line at the end only (``run --quiet``).

    The launchers of one multi-node job join one run (``run_group.py``): ``run_group``
    names the group, else Slurm's job or torchrun's rendezvous does. ``memory_limit``:
    bytes of address space the job may map (``memory_limit.py``).
    """
    return launch_run(
        command,
        name=name,
        max_steps=max_steps,
        profile_at=profile_at,
        profile_steps=profile_steps,
        sample_interval=sample_interval,
        group=run_group_of(command, os.environ, run_group),
        memory_limit=memory_limit,
        announce=not brief,
    )


def launch_run(
    command: Sequence[str],
    *,
    name: str | None = None,
    max_steps: int | None = None,
    profile_at: int | str | None = None,
    profile_steps: int | None = None,
    sample_interval: float = 0.5,
    home: str | os.PathLike[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    parent_run_id: int | None = None,
    config: Mapping[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    output_path: str | os.PathLike[str] | None = None,
    timeout_s: float | None = None,
    stall_s: float | None = None,
    quiet: bool = False,
    plan: Mapping[str, Any] | None = None,
    group: RunGroup | None = None,
    memory_limit: int | None = None,
    announce: bool = True,
) -> tuple[int, int]:
    """Run ``command`` under stepscope; returns (run id, exit code).

    ``extra_env`` is added to the job's environment (a plan file, an allocator setting);
    ``config`` entries are added to the run's recorded config (an experiment's arm);
    ``cwd`` is where the job runs (default: here); ``output_path`` sends the job's stdout
    and stderr to that file (relative: inside the run folder) with stdin closed;
    ``timeout_s`` ends a job still running after that long, process group and all, as
    ``failed`` with exit code 124 (timeout(1)'s); ``stall_s`` ends it the same way once
    it has recorded a step and then records none for that long (``job_wait``); ``quiet``
    drops the launcher's lines; ``plan``: fixes for the bootstrap to apply (shape in
    ``contract.py``), written to ``plan.json`` in the run folder, where it stays as the
    record of what was asked; ``group``: the multi-node job this launcher is one node of
    (its run is joined, and ended by the last launcher), None for a run of its own;
    ``memory_limit``: the job's address space in bytes (RLIMIT_AS, set in the child
    before it starts: the CPU allocator then fails with "can't allocate memory"), kept in
    the run's config as ``memory_limit`` so an experiment's trials run under it too;
    ``announce``: the line that says where the run is recorded, before the job starts.
    """
    command = list(command)
    store = RunStore(home)
    run_config: dict[str, Any] = {
        "max_steps": max_steps,
        "profile_at": profile_at,
        "profile_steps": profile_steps if profile_at is not None else None,
        "sample_interval": sample_interval,
    }
    if timeout_s is not None:
        run_config["timeout_s"] = timeout_s
    if stall_s is not None:
        run_config["stall_s"] = stall_s
    if memory_limit is not None:
        run_config[MEMORY_LIMIT_KEY] = int(memory_limit)
    run_config.update(config or {})
    job = _JobOptions(
        extra_env=dict(extra_env or {}),
        cwd=str(Path(cwd).resolve()) if cwd is not None else os.getcwd(),
        output_path=output_path,
        timeout_s=timeout_s,
        quiet=quiet,
        stall_s=None if stall_s is None else max(MIN_STALL_S, stall_s),
        memory_limit=memory_limit,
    )
    job.member = join_or_create(
        store,
        command,
        group,
        name=name,
        cwd=job.cwd,
        pid=os.getpid(),
        pid_started_at=_own_create_time(),
        max_steps=max_steps,
        env=env_summary(job.extra_env),
        config=run_config,
        parent_run_id=parent_run_id,
    )
    run_id = job.member.run_id
    run_dir = store.run_dir(run_id)
    if plan is not None:
        plan_path = run_dir / PLAN_FILENAME
        plan_path.write_text(json.dumps(plan, indent=1))
        job.extra_env[ENV_PLAN] = str(plan_path)
    if not quiet and announce:
        _say(_start_line(store, job.member, group))

    signals = SignalState(own_group=job.own_group)
    signals.install()
    try:
        return run_id, _run(store, run_id, run_dir, command, run_config, signals, job)
    except BaseException as exc:
        # a launcher bug must still leave a final status, not a run 'running' forever
        job.member.finish("failed", error=f"stepscope launcher error: {_one_line(exc)}")
        raise
    finally:
        signals.restore()
        store.close()


def _start_line(store: Any, member: Membership, group: RunGroup | None) -> str:
    run_id = member.run_id
    where = f"run {run_id} ({store.run(run_id)['name']}) in {store.where}"
    if group is None:
        return f"recording {where}"
    node = "" if member.node_rank is None else f" as node {member.node_rank}"
    verb = "started" if member.created else "joined"
    return f"launcher {verb} {where}{node} (multi-node group {group.key})"


@dataclass
class _JobOptions:
    """How the job is started beyond its command (see ``launch_run``), and how this
    launcher ends its run (``member``: alone, or as one node of a group)."""

    extra_env: dict[str, str]
    cwd: str
    output_path: str | os.PathLike[str] | None
    timeout_s: float | None
    quiet: bool
    stall_s: float | None = None
    memory_limit: int | None = None
    member: Any = None  # Membership, set once the run exists

    @property
    def own_group(self) -> bool:
        # Only a job we may have to kill as a whole, or one detached from the terminal,
        # leaves the terminal's process group (where Ctrl-C reaches it directly).
        return (
            self.timeout_s is not None or self.stall_s is not None or self.output_path is not None
        )


def _run(
    store: Any,
    run_id: int,
    run_dir: Path,
    command: list[str],
    config: dict[str, Any],
    signals: SignalState,
    job: _JobOptions,
) -> int:
    env = _job_env(store, run_id, run_dir, config, job.quiet)
    env.update(job.extra_env)
    if signals.received is not None:  # stopped before the job even started
        job.member.finish("interrupted", 128 + signals.received, error="interrupted")
        return 128 + signals.received
    if not os.path.isdir(job.cwd):  # Popen would blame the command for it
        error = f"working directory not found: {job.cwd}"
        job.member.finish("failed", EXIT_NOT_FOUND, error=error)
        if not job.quiet:
            _say(error)
        return EXIT_NOT_FOUND
    with contextlib.ExitStack() as stack:
        io: dict[str, Any] = {}
        if job.output_path is not None:
            path = run_dir / job.output_path  # an absolute path stays as it is
            path.parent.mkdir(parents=True, exist_ok=True)
            io = {
                "stdin": subprocess.DEVNULL,
                "stdout": stack.enter_context(open(path, "ab")),  # noqa: SIM115
                "stderr": subprocess.STDOUT,
            }
        try:
            child = subprocess.Popen(
                command,
                env=env,
                cwd=job.cwd,
                start_new_session=job.own_group,
                preexec_fn=address_space_limiter(job.memory_limit),
                **io,
            )
        except FileNotFoundError:
            return _not_started(store, run_id, command, EXIT_NOT_FOUND, "command not found", job)
        except PermissionError:
            return _not_started(
                store, run_id, command, EXIT_NOT_EXECUTABLE, "permission denied", job
            )
        except OSError as exc:
            why = exc.strerror or str(exc)
            return _not_started(store, run_id, command, EXIT_NOT_EXECUTABLE, why, job)
    signals.child = child
    if signals.forward_pending is not None:  # SIGTERM arrived while starting
        forward(child, signals.forward_pending, signals.own_group)

    sampler = start_sampler(store, run_id, child.pid, float(config["sample_interval"]))
    end = wait_for_job(
        child, job.timeout_s, job.stall_s, lambda: Progress(*store.step_progress(run_id))
    )
    stop_sampler(sampler)
    remove_if_empty(run_dir / "sampler.log")
    if end.ended_for is not None:
        return _ended_as_hung(store, run_id, job, end)
    return _finalise(
        store, run_id, end.returncode, signals, job.member, job.quiet, job.memory_limit
    )


def _ended_as_hung(store: Any, run_id: int, job: _JobOptions, end: JobEnd) -> int:
    """A job stepscope ended: its own error, when it had reported one before it stopped
    exiting (an out-of-memory error stays one, not a hang), else the hang."""
    own = store.run(run_id).get("error")
    if own and end.ended_for == "timeout":
        error = f"{own} (it had not exited {job.timeout_s:g} s after its start: ended)"
    elif end.ended_for == "stall":
        error = f"no new step for {job.stall_s:g} s after step {end.steps} (hang?)"
    else:
        error = f"timed out after {job.timeout_s:g} s (hang?)"
    job.member.finish("failed", EXIT_TIMED_OUT, error=error)
    if not job.quiet:
        _say(f"run {run_id} {error}")
    return EXIT_TIMED_OUT


def _finalise(
    store: Any,
    run_id: int,
    returncode: int,
    signals: SignalState,
    member: Membership,
    quiet: bool = False,
    memory_limit: int | None = None,
) -> int:
    """Turn how the job ended into a run status; the job's own error line is kept. A job
    killed by SIGKILL whose last sampled RSS was near its limit (``memory_limit.py``) is
    said to have likely run out of memory."""
    run = store.run(run_id)
    exit_code = 128 - returncode if returncode < 0 else returncode
    error: str | None = None
    user_stop = signals.received is not None
    if returncode == 0:
        if run.get("stop_reason") in ("max_steps", "sweep"):  # stepscope ended it
            status = "stopped"
        elif user_stop:
            status = "interrupted"
        else:
            status = "completed"
    elif returncode < 0:
        sig = -returncode
        sig_name = signal_name(sig)
        if sig == signal.SIGINT or (user_stop and sig == signals.received):
            status, error = "interrupted", f"interrupted ({sig_name})"
        else:
            status, error = "killed", f"killed by {sig_name}"
            if sig == signal.SIGKILL:
                error = killed_near_limit(store, run_id, memory_limit) or error
    elif returncode == 130 or user_stop:
        status = "interrupted"
        error = None if run.get("error") else f"interrupted (exit code {returncode})"
    else:
        status = "failed"
        error = None if run.get("error") else f"exit code {returncode}"
    ended = member.finish(status, exit_code, error=error)
    if ended and status in ("completed", "stopped") and run.get("error"):
        # A child process of the job (a helper script, a worker) raised, yet the job
        # itself succeeded: keep the message in the run's log, not as the run's error.
        store.update_run(run_id, error=None)
        store.log_event(run_id, "warning", "launcher", f"a child process raised: {run['error']}")

    steps, ranks, workers = store.step_count(run_id)
    counted = f"{steps} steps" if ranks <= 1 else f"{steps} steps over {ranks} ranks"
    if workers:
        counted += f" ({workers} training worker process{'es' if workers > 1 else ''})"
    how = status if status in ("completed", "stopped") else f"{status} (exit code {exit_code})"
    if not quiet and not ended:  # one node of a multi-node run; the others go on
        node = "this node" if member.node_rank is None else f"node {member.node_rank}"
        _say(f"{node} of run {run_id} {how}; the run ends with its last node — so far {counted}")
    elif not quiet:
        _say(f"run {run_id} {how}, {counted} — stepscope show {run_id}")
    return exit_code


def _not_started(
    store: Any, run_id: int, command: list[str], code: int, why: str, job: _JobOptions
) -> int:
    error = f"{why}: {command[0]}"
    job.member.finish("failed", code, error=error)
    if not job.quiet:
        _say(error)
    return code


def _job_env(
    store: Any, run_id: int, run_dir: Path, config: dict[str, Any], quiet: bool = False
) -> dict[str, str]:
    """The job's environment with the bootstrap in; the plain environment if that fails.

    The job must never be broken by stepscope: if the environment cannot be prepared,
    the job still runs, unrecorded, and the run's log says why.
    """
    try:
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
        if not quiet:
            _say(message)
        return dict(os.environ)


def _own_create_time() -> float | None:
    try:
        return psutil.Process().create_time()
    except Exception:
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _say(message: str) -> None:
    print(f"stepscope: {message}", file=sys.stderr, flush=True)


__all__ = ["launch", "launch_run"]
