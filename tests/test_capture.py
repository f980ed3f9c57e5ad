"""Profiler capture windows: scheduled by env, or requested through the control file."""

from __future__ import annotations

import gzip
import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepscope.collectors.capture.control import (
    CapturePoller,
    capture_request_path,
    request_capture,
)
from stepscope.collectors.steps.step_accounting import AFTER_CAPTURE_STEPS
from stepscope.store import RunStore

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)


def _profiler_steps(path: str) -> list[str]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    return sorted(
        e["name"]
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("ph") == "X"
        and e.get("cat") == "user_annotation"  # on CUDA, GPU-side copies also exist
    )


def test_capture_window_yields_trace_with_exactly_k_steps(tmp_path):
    run_id, proc = jobs.run_job(tmp_path, "train.py", "--steps", "8", profile_at=2, profile_steps=3)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    arts = jobs.artifacts(tmp_path, run_id)
    # CPU: no memory snapshot; torch's categorised memory timeline beside the trace
    assert list(arts["kind"]) == ["trace", "memory_timeline"]
    assert arts["meta"][1]["device"] == "cpu"
    path = arts["path"][0]
    assert path.endswith(".pt.trace.json.gz") and Path(path).parent.name == str(run_id)
    assert _profiler_steps(path) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    held = arts["meta"][0].pop("held_s")
    assert arts["meta"][0] == {
        "first_step": 2,
        "steps": 3,
        "rank": 0,
        "reason": "scheduled",
        "request_id": None,
    }
    # what closing the window held the job's thread: torch's stop, then writing the trace
    assert set(held) == {"stop", "write"} and held["stop"] > 0 and held["write"] > 0, held
    assert "held_s" not in arts["meta"][1]  # the memory timeline's row: the window's meta
    df = jobs.steps(tmp_path, run_id)
    assert len(df) == 8
    # the window, then the steps the step timer flags after it (AFTER_CAPTURE_STEPS)
    assert df.loc[df["profiled"] == 1, "step"].tolist() == list(range(2, 5 + AFTER_CAPTURE_STEPS))
    messages = " ".join(jobs.events(tmp_path, run_id)["message"])
    assert "memory events" in messages
    said = f"torch's stop {held['stop']:.2f} s, writing the trace {held['write']:.2f} s"
    assert said in messages, messages
    # compressed off the job's thread, and waited for at its end: nothing half-written
    assert not list(Path(path).parent.glob("*.part")), list(Path(path).parent.iterdir())


def test_capture_at_step_zero(tmp_path):
    run_id, proc = jobs.run_job(tmp_path, "infer.py", "--calls", "4", profile_at=0, profile_steps=2)
    assert proc.returncode == 0, proc.stderr
    arts = jobs.artifacts(tmp_path, run_id)
    assert _profiler_steps(arts["path"][0]) == ["ProfilerStep#0", "ProfilerStep#1"]


def test_on_demand_capture_through_control_file(tmp_path):
    args = ("--steps", "100000", "--print", "--sleep", "0.002", "--batch", "2")
    run_id, env = jobs.start_run(tmp_path, "train.py", *args)
    with RunStore(tmp_path) as store:
        run_dir = store.run_dir(run_id)
    proc = subprocess.Popen(
        [sys.executable, str(jobs.JOBS / "train.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in proc.stdout:
            if line.startswith("step 5 "):
                break
        request_id = request_capture(run_dir, 2)
        deadline = time.time() + 60
        arts = jobs.artifacts(tmp_path, run_id)
        while arts.empty and time.time() < deadline:
            time.sleep(0.2)
            arts = jobs.artifacts(tmp_path, run_id)
        proc.send_signal(signal.SIGINT)  # stop the job; its atexit flush still runs
        proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    arts = jobs.artifacts(tmp_path, run_id)
    assert list(arts["kind"]) == ["trace", "memory_timeline"], "one request, one capture"
    meta = arts["meta"][0]
    assert meta["reason"] == "request" and meta["request_id"] == request_id
    names = _profiler_steps(arts["path"][0])
    first = meta["first_step"]
    assert names == [f"ProfilerStep#{first}", f"ProfilerStep#{first + 1}"]
    df = jobs.steps(tmp_path, run_id)
    after = AFTER_CAPTURE_STEPS
    assert df.loc[df["profiled"] == 1, "step"].tolist() == list(range(first, first + 2 + after))


def test_request_file_is_written_atomically_and_served_once(tmp_path):
    poller = CapturePoller(tmp_path, interval_s=0.0)
    assert poller.poll() is None
    rid = request_capture(tmp_path, 4)
    assert json.loads(capture_request_path(tmp_path).read_text())["steps"] == 4
    assert list(capture_request_path(tmp_path).parent.iterdir()) == [capture_request_path(tmp_path)]
    req = poller.poll()
    assert req == {"id": rid, "steps": 4}
    poller.served(rid)
    assert poller.poll() is None
    rid2 = request_capture(tmp_path, 1)
    assert poller.poll() == {"id": rid2, "steps": 1}
    # a second rank has its own memory of what it served: it captures once too
    assert CapturePoller(tmp_path, interval_s=0.0).poll() == {"id": rid2, "steps": 1}
    with pytest.raises(ValueError):
        request_capture(tmp_path, 0)


def test_poll_is_throttled(tmp_path):
    poller = CapturePoller(tmp_path, interval_s=10.0)
    assert poller.poll(now=100.0) is None  # checked: nothing there yet
    rid = request_capture(tmp_path, 2)
    assert poller.poll(now=105.0) is None  # inside the interval: not even looked at
    assert poller.poll(now=110.5) == {"id": rid, "steps": 2}


# Lines torch's profiler writes to stderr on its own during a capture (torch 2.13): Kineto's
# 'USDT' markers and stage lines, and c10's warning about blocks allocated before memory
# profiling started (profile_memory=True) and freed inside the window.
PROFILER_LINES = (
    "profiler_start",
    "profiler_stop",
    "SyncActivityProfilerHandler",
    "Completed Stage",
    "Memory block of unknown size",
    "CPUAllocator.cpp",
)

TALKING_JOB = """
import sys, warnings
import torch
from torch import nn

torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[1])):
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"job line {step}", file=sys.stderr, flush=True)
warnings.warn("the job's own warning")
print("done")
"""


def test_capture_keeps_the_profilers_own_lines_out_of_the_jobs_stderr(tmp_path):
    """`stepscope run` promises the job's output untouched: a capture must not add lines."""
    import os

    script = tmp_path / "talking_job.py"
    script.write_text(TALKING_JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "STEPSCOPE_HOME")}
    cli = [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path / "home"), "run"]
    proc = subprocess.run(
        [*cli, "--profile-at", "3", "--profile-steps", "3", "--", sys.executable, str(script), "9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    job_lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("stepscope: ")]
    assert [ln for ln in job_lines if ln.startswith("job line")] == [
        f"job line {i}" for i in range(9)
    ]
    assert any("UserWarning: the job's own warning" in ln for ln in job_lines)
    leaked = [ln for ln in job_lines if any(p in ln for p in PROFILER_LINES)]
    assert leaked == []
    # the capture itself is intact, memory events included
    with RunStore(tmp_path / "home") as store:
        run_id = store.resolve_run("last")
        arts = store.artifacts(run_id)
    assert list(arts["kind"]) == ["trace", "memory_timeline"]
    assert _profiler_steps(arts["path"][0]) == [
        "ProfilerStep#3",
        "ProfilerStep#4",
        "ProfilerStep#5",
    ]
    with gzip.open(arts["path"][0], "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "[memory]" for e in events)


def test_c10_log_level_is_raised_only_around_stepscopes_own_free(monkeypatch):
    import os

    from stepscope.collectors.capture import profiler_capture as pc

    level = pc._c10_log_level()
    assert level is not None  # torch 2.13's libc10 exports it
    before = level.value
    with pc._quiet_c10_warnings():
        assert level.value == pc.C10_ERROR
    assert level.value == before
    monkeypatch.delenv(pc.KINETO_LOG_LEVEL_ENV, raising=False)
    with pc._quiet_kineto():
        assert os.environ[pc.KINETO_LOG_LEVEL_ENV] == pc.KINETO_QUIET_LEVEL
    assert pc.KINETO_LOG_LEVEL_ENV not in os.environ  # the job's environment as it was
    monkeypatch.setenv(pc.KINETO_LOG_LEVEL_ENV, "1")  # the user's own choice wins
    with pc._quiet_kineto():
        assert os.environ[pc.KINETO_LOG_LEVEL_ENV] == "1"
