"""Helpers for tests that run small jobs under the bootstrap without the launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from stepscope.collectors.launch.job_env import build_job_env
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent


def start_run(home: Path, script: str, *args: str, **env_kw: Any) -> tuple[int, dict[str, str]]:
    """Create a run in the store at ``home`` and the environment to run ``script`` in it."""
    cmd = [sys.executable, str(JOBS / script), *args]
    with RunStore(home) as store:
        run_id = store.create_run(cmd)
        run_dir = store.run_dir(run_id)
    extra = env_kw.pop("extra_env", None) or {}
    env = build_job_env(run_id, home, run_dir, **env_kw)
    env.update(extra)
    return run_id, env


def run_job(
    home: Path, script: str, *args: str, timeout: float = 60, **env_kw: Any
) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run ``tests/jobs/<script>`` under the bootstrap; returns (run_id, completed process)."""
    run_id, env = start_run(home, script, *args, **env_kw)
    proc = subprocess.run(
        [sys.executable, str(JOBS / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(home),
    )
    return run_id, proc


def steps(home: Path, run_id: int) -> Any:
    with RunStore(home) as store:
        return store.steps(run_id)


def run_row(home: Path, run_id: int) -> dict[str, Any]:
    with RunStore(home) as store:
        return store.run(run_id)


def events(home: Path, run_id: int) -> Any:
    with RunStore(home) as store:
        return store.events(run_id)


def artifacts(home: Path, run_id: int) -> Any:
    with RunStore(home) as store:
        return store.artifacts(run_id)


def torch_threads_env() -> dict[str, str]:
    """Keep jobs to one thread: the test machine's cores are shared."""
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


__all__ = ["JOBS", "artifacts", "events", "os", "run_job", "run_row", "start_run", "steps"]
