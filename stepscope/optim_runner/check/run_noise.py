"""Measure this host's run-to-run spread: ``stepscope calibrate --noise``.

What ``stepscope check`` needs when a side has one run and its name no history
(``host_spread.py``): how much one figure of one unchanged job differs between whole
runs on this host. Only whole runs show it: a new process lands on other cores, gets
other clocks, other neighbours and another memory layout, none of which an interval
over one run's steps can see (two runs of one job measured medians 16.7 % apart here,
each ±1 % over its own steps).

Method: a fixed small job (``noise_job.py``) recorded ``runs`` times under ``stepscope
run`` with its default capture, one process after the other, after one warm-up run that
is dropped (a cold first run is slower by being first); each run gives the statistics a
check compares (its median, mean and p99 step over the timed steps, as
``timed_step_times`` leaves out warm-up and profiled steps), and the spread of each is
the sample standard deviation of its logs (``ddof=1``; about the coefficient of
variation). The runs go to a temporary store, whatever ``$STEPSCOPE_STORE`` says, so a
team's store never sees them; only the result is cached (``store/calibration.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from importlib import metadata
from pathlib import Path

import numpy as np

from stepscope.collectors.facts.calibrate import cpu_model
from stepscope.optim_runner.speedup.stats import timed_step_times
from stepscope.store import RunStore
from stepscope.store.artifacts import ARTIFACTS_ENV
from stepscope.store.calibration import NoiseCalibration, host_name
from stepscope.store.url import DB_FILE
from stepscope.store.url import ENV_VAR as STORE_ENV

JOB = Path(__file__).with_name("noise_job.py")
DEFAULT_RUNS = 5
DEFAULT_STEPS = 300
RUN_TIMEOUT_S = 600.0

Progress = Callable[[str], None]


def _record(home: Path, name: str, steps: int, threads: int) -> None:
    """One whole run of the job under ``stepscope run`` in ``home``'s own store."""
    env = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, ARTIFACTS_ENV)}
    job = [sys.executable, str(JOB), "--steps", str(steps), "--threads", str(threads)]
    cmd = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", "--quiet"]
    done = subprocess.run(
        [*cmd, "--name", name, "--", *job],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"a run of the fixed job failed: {last}")


def _statistics(steps: np.ndarray) -> dict[str, float]:
    return {
        "median": float(np.median(steps)),
        "mean": float(np.mean(steps)),
        "p99": float(np.percentile(steps, 99)),
    }


def spread_of(values: list[dict[str, float]]) -> dict[str, float]:
    """Each statistic's standard deviation of the log over the runs (``ddof=1``)."""
    return {key: float(np.std(np.log([v[key] for v in values]), ddof=1)) for key in values[0]}


def noise_refusal(runs: int, steps: int, threads: int) -> str | None:
    """Why these arguments cannot measure a spread, in one line; None: they can."""
    if runs < 2:
        return f"--runs {runs}: a spread needs at least 2 runs"
    if steps < 20:
        return f"--steps {steps}: at least 20 steps a run"
    if threads < 1:
        return f"--threads {threads}: at least 1"
    return None


def measure_noise(
    runs: int = DEFAULT_RUNS,
    steps: int = DEFAULT_STEPS,
    threads: int = 1,
    progress: Progress | None = None,
) -> NoiseCalibration:
    """Record the fixed job ``runs`` times (after a dropped warm-up run) and measure the
    spread of its statistics between the runs. ValueError for bad arguments,
    RuntimeError for a run that failed."""
    refusal = noise_refusal(runs, steps, threads)
    if refusal is not None:
        raise ValueError(refusal)
    say = progress or (lambda _msg: None)
    began, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="stepscope-noise-") as tmp:
        home = Path(tmp)
        say("warm-up run (not counted)")
        _record(home, "warm-up", steps, threads)
        for i in range(runs):
            say(f"run {i + 1} of {runs}")
            _record(home, "noise", steps, threads)
        with RunStore(home, url=home / DB_FILE) as store:
            listed = store.runs()
            ids = sorted(int(i) for i in listed.loc[listed["name"] == "noise", "id"])
            values = [_statistics(timed_step_times(store.steps(i))) for i in ids]
    return NoiseCalibration(
        cv={k: round(v, 5) for k, v in spread_of(values).items()},
        runs=len(values),
        steps=steps,
        step_s=round(float(np.median([v["median"] for v in values])), 6),
        threads=threads,
        host=host_name(),
        cpu_model=cpu_model(),
        torch_version=metadata.version("torch"),
        date=datetime.now().astimezone().isoformat(timespec="seconds"),
        load=(round(load_before, 2), round(os.getloadavg()[0], 2)),
        seconds=round(time.perf_counter() - began, 1),
    )


__all__ = ["DEFAULT_RUNS", "DEFAULT_STEPS", "measure_noise", "noise_refusal", "spread_of"]
