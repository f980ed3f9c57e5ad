"""Recording real example runs for the dashboard tests (no mocked data: the pages are
checked against what `stepscope run` really wrote)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
ENTRY = REPO / "stepscope" / "app" / "dashboard.py"
JOB_TIMEOUT_S = 240


def cli_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["STEPSCOPE_HOME"] = str(home)
    return env


def stepscope(
    home: Path, *args: str, check: bool = True, timeout: float = JOB_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run the `stepscope` CLI on ``home``; with ``check``, fails the test if it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        cwd=REPO,
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"stepscope {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    return proc


def record(home: Path, name: str, script: str, *job_args: str, opts: tuple[str, ...] = ()) -> int:
    """`stepscope run --name NAME [opts] -- python examples/SCRIPT ARGS`; returns the run id."""
    stepscope(
        home, "run", "--name", name, *opts, "--", sys.executable, f"examples/{script}", *job_args
    )
    with RunStore(home) as store:
        return store.resolve_run(name)


def start_live_job(home: Path, name: str = "live", steps: int = 2000) -> subprocess.Popen:
    """A long input-bound job under `stepscope run`, left running for the test to use.

    Its output goes to ``live.log`` beside the store (read it when a test fails).
    """
    home.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{name}.log", "wb") as log:  # the child keeps its own copy
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepscope.app.cli",
                "--home",
                str(home),
                "run",
                "--name",
                name,
                "--",
                sys.executable,
                "examples/input_bound.py",
                "--steps",
                str(steps),
            ],
            cwd=REPO,
            env=cli_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_running(home: Path, name: str, min_steps: int = 1, timeout: float = 120) -> int:
    """Wait until the named run is running with at least ``min_steps`` steps; its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (home / "stepscope.db").exists():
            with RunStore(home) as store:
                runs = store.runs()
            row = runs[runs["name"] == name]
            if (
                len(row)
                and row["status"].iloc[0] == "running"
                and row["steps"].iloc[0] >= min_steps
            ):
                return int(row["id"].iloc[0])
        time.sleep(0.5)
    raise AssertionError(f"run {name!r} did not reach {min_steps} step(s) in {timeout} s")


def stop_job(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher: it passes it to the job and finalises the run as
    interrupted (SIGINT to the launcher alone would not stop the job: a terminal's
    Ctrl-C reaches the whole process group, so the launcher does not forward it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_plain_job(folder: Path, steps: int = 2000) -> subprocess.Popen:
    """The input-bound example as a plain Python process (no stepscope in it): what the
    Attach page attaches to. Its output goes to ``plain.log`` in ``folder``, with a
    Python traceback there should it crash (``-X faulthandler``) while being sampled."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "plain.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "examples/input_bound.py",
                "--steps",
                str(steps),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def job_pid(launcher: subprocess.Popen, script: str, timeout: float = 60) -> int:
    """The pid of the job a `stepscope run` launcher started (its child running ``script``)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if any(a.endswith(script) for a in child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no child of the launcher {launcher.pid} runs {script}")


def wait_gone(pid: int, timeout: float = 60) -> None:
    """Wait until ``pid`` has exited (a zombie counts: it has, and the store says so)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs after {timeout} s")


def end_process(proc: subprocess.Popen) -> None:
    """Kill a process a test started, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
