"""The bootstrap inside the job: env, sitecustomize chaining, pass-through, failures."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stepscope.collectors.launch import contract
from stepscope.collectors.launch.job_env import BOOT_DIR, build_job_env

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)


def test_job_env_prepends_boot_dir_and_keeps_user_pythonpath(tmp_path):
    base = {"PYTHONPATH": os.pathsep.join(["/user/a", "/user/b"]), "STEPSCOPE_MAX_STEPS": "9"}
    env = build_job_env(3, tmp_path, tmp_path / "runs" / "3", profile_at=4, base_env=base)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOT_DIR), "/user/a", "/user/b"]
    assert env[contract.ENV_PREV_PYTHONPATH] == os.pathsep.join(["/user/a", "/user/b"])
    assert env[contract.ENV_RUN_ID] == "3"
    assert env[contract.ENV_PROFILE_AT] == "4" and env[contract.ENV_PROFILE_STEPS] == "3"
    assert contract.ENV_MAX_STEPS not in env  # an outer run's option must not leak in
    assert (Path(env[contract.ENV_PACKAGE_PATH]) / "stepscope" / "__init__.py").is_file()
    # building from an env that already has the boot dir does not stack it twice
    again = build_job_env(4, tmp_path, tmp_path, base_env=env)
    assert again["PYTHONPATH"].split(os.pathsep).count(str(BOOT_DIR)) == 1


def test_sitecustomize_chains_to_user_sitecustomize_and_stays_lazy(tmp_path):
    user_site = str(jobs.JOBS / "user_site")
    run_id, proc = jobs.run_job(
        tmp_path, "show_env.py", base_env={**os.environ, "PYTHONPATH": user_site}
    )
    assert proc.returncode == 0, proc.stderr
    assert "user sitecustomize: yes" in proc.stdout
    assert "stepscope imported: True" in proc.stdout
    # a process that never imports torch pays no torch import and writes nothing
    assert "torch imported: False" in proc.stdout
    assert proc.stderr == ""
    assert jobs.steps(tmp_path, run_id).empty


def test_disabled_bootstrap_still_chains(tmp_path):
    user_site = str(jobs.JOBS / "user_site")
    base = {**os.environ, "PYTHONPATH": user_site}
    run_id, env = jobs.start_run(tmp_path, "show_env.py", base_env=base)
    env[contract.ENV_DISABLE] = "1"
    proc = subprocess.run(
        [sys.executable, str(jobs.JOBS / "show_env.py")], env=env, capture_output=True, text=True
    )
    assert "user sitecustomize: yes" in proc.stdout
    assert "stepscope imported: False" in proc.stdout


def test_torch_process_without_steps_records_nothing(tmp_path):
    # like the torchrun agent: imports torch, never trains
    run_id, proc = jobs.run_job(tmp_path, "show_env.py", "--torch")
    assert proc.returncode == 0, proc.stderr
    assert "step timer installed: True" in proc.stdout
    assert "writer thread: False" in proc.stdout
    assert jobs.steps(tmp_path, run_id).empty


def test_failing_job_keeps_exit_code_traceback_and_records_error(tmp_path):
    run_id, proc = jobs.run_job(tmp_path, "fail.py")
    assert proc.returncode == 1
    assert proc.stdout == "about to fail\n"
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert jobs.run_row(tmp_path, run_id)["error"] == "ZeroDivisionError: division by zero"
    assert len(jobs.steps(tmp_path, run_id)) == 3


def test_a_job_that_fails_in_its_first_step_gets_its_error_not_a_verdict(tmp_path):
    """Its one step is the forward cut short: read as a step, it was "inference records
    gradients, 88 % of step time". One that fails after three steps is diagnosed."""
    from stepscope.analyzers.rules.diagnosis import diagnose_run
    from stepscope.store import RunStore
    from stepscope.types import FAILED_IN_STEP

    first, proc = jobs.run_job(tmp_path, "fail_in_forward.py")
    assert proc.returncode == 1 and "IndexError" in proc.stderr
    later, proc = jobs.run_job(tmp_path, "fail.py")
    assert proc.returncode == 1
    with RunStore(tmp_path) as store:
        assert store.run(first)["config"][FAILED_IN_STEP] == 0
        assert store.run(later)["config"][FAILED_IN_STEP] == 3
        for run_id in (first, later):  # as the launcher ends them (the job ran alone here)
            store.finish_run(run_id, "failed", exit_code=1)
        cut_short = diagnose_run(store, first, save=False)
        diagnosed = diagnose_run(store, later, save=False)
    assert cut_short.findings == []
    assert cut_short.reason.startswith("the job failed in its first step, before completing one")
    assert "IndexError" in cut_short.reason
    assert diagnosed.reason is None and diagnosed.findings


def test_unwritable_store_does_not_break_the_job(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    run_id, env = jobs.start_run(tmp_path, "train.py", "--steps", "4")
    env[contract.ENV_HOME] = str(blocker / "home")  # cannot be created: a file is in the way
    proc = subprocess.run(
        [sys.executable, str(jobs.JOBS / "train.py"), "--steps", "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout == "done\n"
    assert "stepscope: cannot write to the run store" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_rank_from_env_and_device_info(tmp_path):
    run_id, proc = jobs.run_job(
        tmp_path, "train.py", "--steps", "3", extra_env={"RANK": "1", "WORLD_SIZE": "2"}
    )
    assert proc.returncode == 0, proc.stderr
    df = jobs.steps(tmp_path, run_id)
    assert list(df["rank"]) == [1, 1, 1]
    device = jobs.run_row(tmp_path, run_id)["device"]
    info = device["rank1"]
    assert info["torch"] and info["world_size"] == 2 and info["cpu_count"] >= 1
    assert "cuda_available" in info and info["threads"] >= 1


def test_sigkill_keeps_steps_up_to_about_a_second_before(tmp_path):
    args = ("--steps", "100000", "--print", "--sleep", "0.002", "--batch", "2")
    run_id, env = jobs.start_run(tmp_path, "train.py", *args)
    proc = subprocess.Popen(
        [sys.executable, str(jobs.JOBS / "train.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    printed: list[tuple[int, float]] = []  # (step, time the job printed it)
    try:
        deadline = time.time() + 60
        first = None
        for line in proc.stdout:
            step, t = line.split()[1:3]
            printed.append((int(step), float(t)))
            first = first or time.time()
            if time.time() - first > 3.0 or time.time() > deadline:
                break
        kill_t = time.time()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    recorded = len(jobs.steps(tmp_path, run_id))
    # every step printed more than ~1.5 s before the kill is in the store
    due = sum(1 for _, t in printed if t < kill_t - 1.5)
    assert due > 0
    assert recorded >= due, (recorded, due, len(printed))
    assert recorded <= len(printed) + 1


def test_a_process_forked_while_stepscope_starts_up_trains_and_is_recorded(tmp_path):
    # the child of a fork must not inherit a lock a thread of the parent held (the store's
    # imports once ran on a thread of their own, and such a child hung at its first write)
    run_id, proc = jobs.run_job(tmp_path, "fork_at_start.py", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "exit code 0\n"
    df = jobs.steps(tmp_path, run_id)
    assert len(df) == 3 and set(df["worker"]) == {1}
