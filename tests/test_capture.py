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

from stepscope.collectors.control import CapturePoller, capture_request_path, request_capture
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
    assert list(arts["kind"]) == ["trace"]  # CPU: no memory snapshot
    path = arts["path"][0]
    assert path.endswith(".pt.trace.json.gz") and Path(path).parent.name == str(run_id)
    assert _profiler_steps(path) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert arts["meta"][0] == {
        "first_step": 2,
        "steps": 3,
        "rank": 0,
        "reason": "scheduled",
        "request_id": None,
    }
    df = jobs.steps(tmp_path, run_id)
    assert len(df) == 8
    assert df.loc[df["profiled"] == 1, "step"].tolist() == [2, 3, 4]
    messages = " ".join(jobs.events(tmp_path, run_id)["message"])
    assert "memory events" in messages


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
    assert len(arts) == 1, "one request, one capture"
    meta = arts["meta"][0]
    assert meta["reason"] == "request" and meta["request_id"] == request_id
    names = _profiler_steps(arts["path"][0])
    first = meta["first_step"]
    assert names == [f"ProfilerStep#{first}", f"ProfilerStep#{first + 1}"]
    df = jobs.steps(tmp_path, run_id)
    assert df.loc[df["profiled"] == 1, "step"].tolist() == [first, first + 1]


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
