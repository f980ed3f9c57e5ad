"""Recording real example runs for the dashboard tests (no mocked data: the pages are
checked against what `stepscope run` really wrote)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
ENTRY = REPO / "stepscope" / "app" / "dashboard" / "main.py"
JOB_TIMEOUT_S = 240
PAGE_TIMEOUT_S = 120


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
    """`stepscope run --name NAME [opts] -- python examples/SCRIPT ARGS`; returns the run id.

    A trace only where ``opts`` ask for one (``--profile-at``): the pages' tests need to
    know which steps, and a run without one; the default capture has tests of its own.
    """
    if "--profile-at" not in opts:
        opts = ("--no-profile", *opts)
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
                "--no-profile",  # the tests ask for their captures
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


# -- experiments stored by hand (the result fields the CLI and the page render) ---------
NOT_APPLIED_WHY = "the job's DataLoader is an IterableDataset [rank 0]: workers would repeat it"
FIX_NOTE = "measured 1.25x above the bound of 1.09x: the diagnosed run waited less [busy]"
CONTENTION_WARNING = (
    "other work used 61 % of the other cores during the trials (p95 90 %): "
    "the intervals are wider than on a quiet machine"
)
APPLIED_CHANGE = "num_workers 0 -> 4 (the job set 0)"


def experiment_result(
    experiment_id: int, baseline_run: int, trial_run: int, *, new_fields: bool = True
) -> dict:
    """A finished experiment's result as ``run_experiment`` returns it: ``all`` was not
    applied (never measured), ``prefetch_factor`` measured no change, nothing kept.
    Without ``new_fields`` it is a result stored before keep_explicit, contention,
    not-applied candidates and notes existed (a completed ``all`` instead)."""
    all_arm = {
        "name": "all",
        "kind": "all",
        "fixes": ["dataloader_workers", "prefetch_factor"],
        "status": "not_applied",
        "not_applied": [{"fix": "dataloader_workers", "why": NOT_APPLIED_WHY}],
        "error": f"not applied: dataloader_workers: {NOT_APPLIED_WHY}",
        "failure": None,
        "failed_run": None,
        "runs": [trial_run],
        "against": "baseline",
        "speedup": None,
        "ci": None,
        "verdict": None,
        "speedup_basis": None,
        "step_time": None,
        "samples_per_s": None,
        "quality_ok": None,
        "quality": None,
        "warmup": None,
    }
    prefetch = dict(
        all_arm,
        error=None,
        name="prefetch_factor",
        kind="alone",
        fixes=["prefetch_factor"],
        status="completed",
        runs=[],
        speedup=1.02,
        ci=[0.97, 1.08],
        verdict="no measurable change",
        speedup_basis="samples_per_s",
        step_time={"ratio": 1.01, "ci": [0.96, 1.07]},
        quality_ok=True,
        quality={"reason": "the losses agree step by step", "drift": 0.0, "tolerance": 0.05},
    )
    del prefetch["not_applied"]
    fixes = [
        {
            "id": "dataloader_workers",
            "params": {"num_workers": 4},
            "why_params": "2 cores",
            "predicted": 6.37,
            "predicted_basis": "Amdahl",
            "predicted_in_experiment": None,
            "finding": "io/input_pipeline",
            "measured": None,
            "ci": None,
            "verdict": None,
            "against": "baseline",
            "candidate": "all",
            "status": "not applied",
            "not_applied_why": NOT_APPLIED_WHY,
            "error": f"not applied: dataloader_workers: {NOT_APPLIED_WHY}",
            "quality_ok": None,
            "changes_numerics": False,
            "kept": False,
        },
        {
            "id": "prefetch_factor",
            "params": {"prefetch_factor": 4},
            "why_params": "",
            "predicted": 1.09,
            "predicted_basis": "Amdahl",
            "predicted_in_experiment": None,
            "finding": "io/input_pipeline",
            "measured": 1.02,
            "ci": [0.97, 1.08],
            "verdict": "no measurable change",
            "against": "baseline",
            "candidate": "prefetch_factor",
            "status": "completed",
            "error": None,
            "quality_ok": True,
            "changes_numerics": False,
            "kept": False,
            "note": FIX_NOTE,
        },
    ]
    result = {
        "experiment_id": experiment_id,
        "baseline_run": baseline_run,
        "command": ["python", "train.py"],
        "cwd": "/tmp",
        "steps": 12,
        "trials": 2,
        "timeout_s": 60.0,
        "tolerance": 0.05,
        "seed": 0,
        "arm_order": [["baseline", "all", "prefetch_factor"]],
        "baseline": {
            "runs": [],
            "confirm_runs": [],
            "step_time_median_s": 0.2169,
            "samples_per_s": 149.0,
            "warmup": {"steps": 1, "time_s": 0.5},
        },
        "candidates": [all_arm, prefetch],
        "fixes": fixes,
        "predicted": {f["id"]: f["predicted"] for f in fixes},
        "measured": {f["id"]: f["measured"] for f in fixes},
        "best": {"fixes": [], "speedup": None, "ci": None, "verdict": None, "candidate": None},
        "keep_explicit": False,
        "contention": {
            "other_cores_mean": 0.61,
            "other_cores_p95": 0.9,
            "cores": 2,
            "warning": CONTENTION_WARNING,
        },
    }
    if not new_fields:
        del result["keep_explicit"], result["contention"], fixes[1]["note"]
        all_arm.update(status="completed", error=None, speedup=1.5, ci=[1.2, 1.8])
        all_arm.update(verdict="faster")
        all_arm.update(quality_ok=True, quality=prefetch["quality"])
        del all_arm["not_applied"]
        fixes[0].update(status="completed", measured=1.5, ci=[1.2, 1.8], verdict="faster")
        del fixes[0]["not_applied_why"]
        fixes[0]["error"] = None
    return result


def stored_experiment(home: Path, *, new_fields: bool = True) -> dict[str, int]:
    """A baseline run, one trial run that applied a change, and a finished experiment
    holding ``experiment_result``; returns their ids (baseline, trial, experiment)."""
    with RunStore(home) as store:
        base = store.create_run(
            ["python", "train.py"], name="nanogpt", status="completed", pid=os.getpid()
        )
        store.finish_run(base, "completed", exit_code=0)
        experiment = store.create_experiment(base, {"fixes": ["dataloader_workers"]})
        trial = store.create_run(
            ["python", "train.py"],
            name="nanogpt [all #1]",
            parent_run_id=base,
            config={
                "experiment": experiment,
                "arm": "all",
                "fixes": ["dataloader_workers", "prefetch_factor"],
                "trial": 0,
                "phase": "trials",
                "applied": [
                    {
                        "fix": "dataloader_workers",
                        "change": APPLIED_CHANGE,
                        "applied": True,
                        "verified": True,
                    },
                    {
                        "fix": "prefetch_factor",
                        "change": "not applied: no worker processes [yet]",
                        "applied": False,
                        "verified": None,
                    },
                ],
            },
        )
        store.finish_run(trial, "stopped", exit_code=0)
        result = experiment_result(experiment, base, trial, new_fields=new_fields)
        store.update_experiment(experiment, status="completed", ended_at=time.time(), result=result)
    return {"baseline": base, "trial": trial, "experiment": experiment}


def memory_cli(
    home: Path, *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI on ``home`` for a job whose memory is measured or capped (in ``home``, no
    ``STEPSCOPE_HOME``): one OpenMP thread (one allocator arena per thread: a steady address
    space) and no busy repeats (the suite's two workers share two cores); ``env`` more."""
    full = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_HOME"}
    full.update(OMP_NUM_THREADS="1", STEPSCOPE_BUSY_REPEATS="0", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        cwd=home,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_experiment(home: Path, experiment_id: int, timeout: float) -> dict[str, Any]:
    """The experiment's row once it is no longer running (fails the test past ``timeout``)."""
    deadline = time.monotonic() + timeout
    with RunStore(home) as store:
        while (row := store.experiment(experiment_id))["status"] == "running":
            assert time.monotonic() < deadline, row["progress"]
            time.sleep(0.5)
    return row


def open_page(page: str, **params: str) -> AppTest:
    """The dashboard's entry script, on ``page`` with ``params`` as the URL's query."""
    at = AppTest.from_file(str(ENTRY), default_timeout=PAGE_TIMEOUT_S)
    at.run()
    if page != "runs":
        at.query_params.update(params)
        at.switch_page(f"views/{page}/page.py").run()
    return at


def no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def texts(at: AppTest) -> str:
    """Every text the page shows: markdown, captions, info, errors and warnings."""
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += (
        [i.value for i in at.info] + [e.value for e in at.error] + [w.value for w in at.warning]
    )
    return "\n".join(parts)


def ablation_page(result: dict) -> None:  # AppTest.from_function runs its source alone
    from stepscope.app.dashboard.views.optimize.experiment_view import ablation_table

    ablation_table(result)


def verdict_page(result: dict) -> None:  # AppTest.from_function runs its source alone
    from stepscope.app.dashboard.views.optimize.experiment_view import verdict

    verdict(result)


def fixes_page(result: dict) -> None:  # AppTest.from_function runs its source alone
    from stepscope.app.dashboard.views.optimize.experiment_view import per_fix
    from stepscope.app.dashboard.views.optimize.leave_one_out_view import leave_one_out

    per_fix(result)
    leave_one_out(result)


def sweep_page(row: dict, generation: bool) -> None:  # AppTest.from_function: its source alone
    from stepscope.app.dashboard.views.optimize import generation_sweep_view, inference_view

    (generation_sweep_view if generation else inference_view).result_view(row)
