"""`stepscope run` end to end: real launcher, real job, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stepscope.store import RunStore

STEPSCOPE = [sys.executable, "-m", "stepscope.app.cli"]

# Exits with 3 after writing both streams (one without a final newline) and echoing stdin.
PASSTHROUGH_JOB = """
import sys
data = sys.stdin.read()
sys.stdout.write("out: line one\\n")
sys.stdout.write("stdin was: " + data)
sys.stderr.write("err: something on stderr\\n")
sys.stdout.write("no newline at the end")
sys.exit(3)
"""

# Signals readiness through a file, then waits to be signalled.
WAITING_JOB = """
import sys, time
open(sys.argv[1], "w").write("ready")
time.sleep(60)
"""

TRAIN_JOB = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(50):
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("finished all 50 steps")
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*STEPSCOPE, "run", *args], capture_output=True, timeout=120, **kw)


def _own_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("stepscope:")]


def _last_run() -> dict:
    with RunStore() as store:
        return store.run(store.resolve_run("last"))


def _start_waiting(tmp_path: Path, **popen_kw) -> tuple[subprocess.Popen, Path]:
    job = _write(tmp_path, "wait.py", WAITING_JOB)
    ready = tmp_path / "ready"
    launcher = subprocess.Popen(
        [*STEPSCOPE, "run", "--sample-interval", "0.2", "--", sys.executable, str(job), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen_kw,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    return launcher, ready


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _assert_all_gone(procs: list[psutil.Process], timeout: float = 10.0) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        p.kill()
    assert not alive, f"left running: {[p.pid for p in alive]}"


def test_output_stdin_and_exit_code_pass_through(tmp_path: Path) -> None:
    job = _write(tmp_path, "job.py", PASSTHROUGH_JOB)
    out = _run(["--", sys.executable, str(job)], input=b"hello from stdin\n")
    assert out.returncode == 3
    assert out.stdout == (
        b"out: line one\nstdin was: hello from stdin\nno newline at the end"
    )  # byte for byte: nothing of ours on stdout
    stderr = out.stderr.decode()
    job_lines = [line for line in stderr.splitlines() if not line.startswith("stepscope:")]
    assert job_lines == ["err: something on stderr"]
    own = _own_lines(stderr)
    assert len(own) == 2, own  # one line at the start, one at the end
    run = _last_run()
    assert own[0].startswith(f"stepscope: recording run {run['id']} ")
    assert own[1].startswith(f"stepscope: run {run['id']} failed (exit code 3)")
    assert own[1].endswith(f"stepscope show {run['id']}")

    assert (run["status"], run["exit_code"]) == ("failed", 3)
    assert run["error"]
    assert run["ended_at"] is not None
    assert run["pid"] is not None and run["pid"] != os.getpid()  # the launcher's own pid
    assert run["command"] == [sys.executable, str(job)]
    assert run["cwd"] == os.getcwd()
    assert run["env"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert run["config"]["sample_interval"] == 0.5


def test_failing_job_keeps_traceback_and_records_error(tmp_path: Path, store_backend: str) -> None:
    job = _write(tmp_path, "bad.py", "def f():\n    raise ValueError('boom in the job')\nf()\n")
    out = _run(["--", sys.executable, str(job)])
    assert out.returncode == 1
    stderr = out.stderr.decode()
    assert "Traceback (most recent call last)" in stderr
    assert "ValueError: boom in the job" in stderr
    run = _last_run()
    assert (run["status"], run["exit_code"]) == ("failed", 1)
    assert "boom in the job" in run["error"]
    assert "\n" not in run["error"]


def test_command_not_found(tmp_path: Path) -> None:
    out = _run(["--", "no-such-command-xyz", "--flag"])
    assert out.returncode == 127
    own = _own_lines(out.stderr.decode())
    assert own[-1] == "stepscope: command not found: no-such-command-xyz"
    assert len(out.stderr.decode().splitlines()) == 2
    run = _last_run()
    assert (run["status"], run["exit_code"]) == ("failed", 127)
    assert "no-such-command-xyz" in run["error"]


def test_ctrl_c_to_the_process_group_interrupts_and_finalises(
    tmp_path: Path, store_backend: str
) -> None:
    # its own session, so that the signal reaches the launcher and the job as a terminal's would
    launcher, _ = _start_waiting(tmp_path, start_new_session=True)
    procs = _descendants(launcher.pid)  # the job and the sampler
    assert len(procs) >= 2
    os.killpg(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert "KeyboardInterrupt" in err  # the job got it and died of it, as without stepscope
    run = _last_run()
    assert (run["status"], run["exit_code"]) == ("interrupted", 130)
    assert run["ended_at"] is not None
    assert _own_lines(err)[-1].startswith(f"stepscope: run {run['id']} interrupted")
    _assert_all_gone(procs)  # the sampler stopped too


def test_sigterm_to_the_launcher_is_forwarded_to_the_job(tmp_path: Path) -> None:
    launcher, _ = _start_waiting(tmp_path)
    procs = _descendants(launcher.pid)
    launcher.send_signal(signal.SIGTERM)  # the launcher only, not its group
    launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM
    run = _last_run()
    assert run["status"] == "interrupted"
    assert run["error"] == "interrupted (SIGTERM)"
    _assert_all_gone(procs)


def test_job_killed_by_sigkill(tmp_path: Path, store_backend: str) -> None:
    job = _write(tmp_path, "die.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    out = _run(["--", sys.executable, str(job)])
    assert out.returncode == 128 + signal.SIGKILL
    run = _last_run()
    assert (run["status"], run["exit_code"]) == ("killed", 137)
    assert run["error"] == "killed by SIGKILL"


def test_launcher_killed_leaves_a_run_that_reads_as_lost(
    tmp_path: Path, store_backend: str
) -> None:
    launcher, _ = _start_waiting(tmp_path)
    procs = _descendants(launcher.pid)
    job = next(p for p in procs if "wait.py" in " ".join(p.cmdline()))
    with RunStore() as store:
        assert store.run(store.resolve_run("last"))["status"] == "running"
    launcher.kill()
    launcher.wait(timeout=30)  # not communicate(): the orphaned job still holds the pipes
    try:
        run = _last_run()  # the next read notices the launcher is gone
        assert run["status"] == "lost"
        assert run["ended_at"] is not None
    finally:
        job.kill()  # orphaned job: ours to clean up
        launcher.stdout.close()
        launcher.stderr.close()
    _assert_all_gone(procs)  # the sampler follows the job out by itself


def test_max_steps_stops_the_job_and_is_not_a_failure(tmp_path: Path, store_backend: str) -> None:
    job = _write(tmp_path, "train.py", TRAIN_JOB)
    out = _run(["--max-steps", "5", "--", sys.executable, str(job)])
    assert out.returncode == 0, out.stderr.decode()
    assert b"finished all 50 steps" not in out.stdout
    run = _last_run()
    assert (run["status"], run["exit_code"], run["stop_reason"]) == ("stopped", 0, "max_steps")
    with RunStore() as store:
        steps = store.steps(run["id"])
    assert len(steps) == 5
    own = _own_lines(out.stderr.decode())
    ended = next(i for i, line in enumerate(own) if line.startswith("stepscope: run "))
    assert own[ended].startswith(f"stepscope: run {run['id']} stopped, 5")
    # then the verdict: a run stopped by its step limit is diagnosed as any other
    assert own[ended + 1].startswith("stepscope: verdict: ")


@pytest.mark.parametrize("code", [0])
def test_completed_job(tmp_path: Path, code: int) -> None:
    job = _write(tmp_path, "ok.py", f"print('fine')\nraise SystemExit({code})\n")
    out = _run(["--name", "my-run", "--", sys.executable, str(job)])
    assert out.returncode == code
    assert out.stdout == b"fine\n"
    run = _last_run()
    assert (run["name"], run["status"], run["exit_code"]) == ("my-run", "completed", 0)
    assert run["error"] is None


# -- launch_run: the options experiments use ------------------------------------------

# Starts a child that would outlive it, says so, then hangs.
HANGING_JOB = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
print("hanging", flush=True)
time.sleep(600)
"""

# Prints what an experiment arm passes in: env, cwd, plan file.
ECHO_JOB = """
import json, os, sys
print("cwd", os.getcwd())
print("var", os.environ.get("SOME_SETTING"))
plan = os.environ.get("STEPSCOPE_PLAN")
print("plan", json.load(open(plan)) if plan else None)
print("to stderr", file=sys.stderr)
print("stdin", sys.stdin.read() == "")
"""


def test_launch_run_timeout_ends_the_whole_process_group(tmp_path: Path, capfd) -> None:
    from stepscope.collectors.launch.launcher import launch_run

    job = _write(tmp_path, "hang.py", HANGING_JOB)
    pid_file = tmp_path / "grandchild.pid"
    started = time.monotonic()
    run_id, code = launch_run(
        [sys.executable, str(job), str(pid_file)], timeout_s=3, output_path="output.log"
    )
    assert time.monotonic() - started < 30
    assert code == 124
    with RunStore() as store:
        run = store.run(run_id)
        log = (store.run_dir(run_id) / "output.log").read_text()
    assert (run["status"], run["exit_code"]) == ("failed", 124)
    assert run["error"] == "timed out after 3 s (hang?)"
    assert run["config"]["timeout_s"] == 3
    assert "hanging" in log  # the job's output went to the run folder
    assert "hanging" not in capfd.readouterr().out
    grandchild = int(pid_file.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"


STEPS_THEN_HANGS = """
import sys, time
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
print("hanging", flush=True)
time.sleep(3600)
"""


def test_a_job_that_stops_stepping_is_ended_long_before_its_time_limit(tmp_path: Path) -> None:
    from stepscope.collectors.launch.launcher import launch_run

    job = _write(tmp_path, "steps_then_hangs.py", STEPS_THEN_HANGS)
    started = time.monotonic()
    run_id, code = launch_run(
        [sys.executable, str(job)], timeout_s=300, stall_s=5, output_path="output.log"
    )
    assert time.monotonic() - started < 120
    assert code == 124
    with RunStore() as store:
        run = store.run(run_id)
        assert len(store.steps(run_id)) == 3  # what was recorded stays
    assert (run["status"], run["exit_code"]) == ("failed", 124)
    assert run["error"] == "no new step for 5 s after step 3 (hang?)"
    assert run["config"]["stall_s"] == 5


STEPS_THEN_FAILS_SLOWLY = """
import atexit, time
import torch
atexit.register(time.sleep, 8)  # a slow exit, as torch's teardown is on a loaded machine
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    if step == 3:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_job_that_failed_and_leaves_slowly_keeps_its_own_error(tmp_path: Path) -> None:
    # two CI runs read a trial's out-of-memory error as a hang: its exit outlasted the
    # stall limit. The error is in the store before the exit, and the stall clock stops.
    from stepscope.collectors.launch.launcher import launch_run

    job = _write(tmp_path, "steps_then_fails_slowly.py", STEPS_THEN_FAILS_SLOWLY)
    run_id, code = launch_run(
        [sys.executable, str(job)], timeout_s=300, stall_s=5, output_path="output.log"
    )
    assert code == 1
    with RunStore() as store:
        run = store.run(run_id)
        assert len(store.steps(run_id)) == 3
    assert run["status"] == "failed"
    assert run["error"].startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_launch_run_options(tmp_path: Path, capfd) -> None:
    from stepscope.collectors.launch.launcher import launch_run

    job = _write(tmp_path, "echo.py", ECHO_JOB)
    workdir = tmp_path / "work"
    workdir.mkdir()
    with RunStore() as store:
        parent = store.create_run(["python", "base.py"], status="completed")
    plan = {"fixes": {"dataloader_workers": {"num_workers": 4}}, "seed": 0}
    run_id, code = launch_run(
        [sys.executable, str(job)],
        name="trial",
        extra_env={"SOME_SETTING": "on", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        parent_run_id=parent,
        config={"experiment": 7, "arm": "all"},
        cwd=workdir,
        output_path="output.log",
        quiet=True,
        plan=plan,
    )
    assert code == 0
    captured = capfd.readouterr()
    assert "stepscope:" not in captured.err  # quiet
    assert "to stderr" not in captured.err
    with RunStore() as store:
        run = store.run(run_id)
        run_dir = store.run_dir(run_id)
    lines = (run_dir / "output.log").read_text().splitlines()
    assert f"cwd {workdir}" in lines
    assert "var on" in lines
    assert "to stderr" in lines
    assert "stdin True" in lines  # stdin closed: a background job never reads the terminal
    assert f"plan {plan}" in lines
    assert json.loads((run_dir / "plan.json").read_text()) == plan
    assert (run["name"], run["status"], run["parent_run_id"]) == ("trial", "completed", parent)
    assert run["cwd"] == str(workdir)
    assert run["config"]["experiment"] == 7 and run["config"]["arm"] == "all"
    assert run["env"]["vars"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
