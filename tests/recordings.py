"""Real runs recorded once per test session and read by several test files.

The suite runs in several pytest-xdist workers, each with its own session fixtures, so a
recording several files read is made once under a file lock in the folder all workers
share, by whichever worker asks first; the others wait for it. Each test file then gets
its own copy of the store (``copy_of``): files that click buttons or add runs never see
each other's changes, and the recording itself stays as it was made. Artifact rows keep
the recording's absolute paths, so a copy reads the original's traces, never writes them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from dashboard_helpers import record, stepscope
from filelock import FileLock

from stepscope.collectors.launch.launcher import launch_run
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"


def session_folder(factory: pytest.TempPathFactory) -> Path:
    """The folder this test session's workers share (the base temp itself without xdist)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_home(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The store ``make(home)`` records, made once per session across workers."""
    folder = session_folder(factory) / "recordings" / name
    folder.mkdir(parents=True, exist_ok=True)
    home, done = folder / "home", folder / "done"
    with FileLock(str(folder / "lock")):
        if not done.exists():
            shutil.rmtree(home, ignore_errors=True)  # a failed attempt's leftovers
            make(home)
            done.write_text("recorded\n")
    return home


def copy_of(home: Path, factory: pytest.TempPathFactory, name: str) -> Path:
    """A store of the caller's own, holding what ``home`` holds."""
    dest = factory.mktemp(name) / "home"
    shutil.copytree(home, dest)
    return dest


# -- the recordings --------------------------------------------------------------------------
def _ib_profiled(home: Path) -> None:
    record(
        home,
        "input-bound",
        "input_bound.py",
        "--steps",
        "14",
        opts=("--max-steps", "12", "--profile-at", "3", "--profile-steps", "2"),
    )


def _ib_short(home: Path) -> None:
    record(home, "input-bound", "input_bound.py", "--steps", "14", opts=("--max-steps", "12"))


def _pause_40(home: Path) -> None:
    command = [sys.executable, str(JOBS / "pause.py"), "--steps", "40"]
    _, code = launch_run(command, name="pause", home=home, quiet=True)
    assert code == 0


def ib_profiled(factory: pytest.TempPathFactory, name: str) -> Path:
    """A copy of a store with one run, "input-bound": the example, 12 steps, profiled
    at steps 3-4 (not diagnosed yet)."""
    return copy_of(shared_home(factory, "ib_profiled", _ib_profiled), factory, name)


def ib_short(factory: pytest.TempPathFactory, name: str) -> Path:
    """A copy of a store with one run, "input-bound": the example, 12 steps, no trace."""
    return copy_of(shared_home(factory, "ib_short", _ib_short), factory, name)


def pause_40(factory: pytest.TempPathFactory, name: str) -> tuple[Path, int]:
    """A copy of a store with one run of tests/jobs/pause.py: 40 steps of 10 ms, one
    200 ms pause in its loader at step 20; and that run's id."""
    home = copy_of(shared_home(factory, "pause_40", _pause_40), factory, name)
    with RunStore(home) as store:
        return home, store.resolve_run("pause")


def failing_run(home: Path) -> int:
    """Add a run of tests/jobs/fail.py (its code raises after 3 steps) to ``home``."""
    failed = stepscope(
        home, "run", "--name", "fail", "--", sys.executable, "tests/jobs/fail.py", check=False
    )
    assert failed.returncode == 1, failed.stderr  # the job's own exit code passes through
    with RunStore(home) as store:
        return store.resolve_run("fail")
