"""`stepscope attach`: real example jobs started as plain `python` processes (not under
stepscope), recorded from outside with psutil and py-spy, then diagnosed. Where a test
reads what the stacks alone say, it attaches with --no-inject; the injected collectors
have tests/test_attach_inject.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from other_user import stepscope_as_nobody

from stepscope.analyzers.rules.thresholds import INPUT_HIGH
from stepscope.analyzers.steps.stacks import stack_summary
from stepscope.store import RunStore

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
pytestmark = pytest.mark.slow


def stepscope(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_job(log: Path, *args: str) -> subprocess.Popen:
    """A plain python process in a session of its own, left running until its first
    progress line is out (imports done, the loop under way)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")},
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not log.read_text().strip():
        assert proc.poll() is None, f"the job ended before its first step: {log.read_text()}"
        assert time.monotonic() < deadline, "the job printed nothing in 60 s"
        time.sleep(0.1)
    return proc


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts jobs (``job(*args)``) and kills each one's whole session afterwards."""
    started: list[subprocess.Popen] = []

    def start(*args: str, wait_for_output: bool = True) -> subprocess.Popen:
        log = tmp_path / f"job{len(started)}.log"
        if wait_for_output:
            proc = start_job(log, *args)
        else:
            proc = subprocess.Popen(
                [sys.executable, *args],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def attach_json(home: Path, pid: int, duration: float, *extra: str) -> dict:
    out = stepscope(home, "attach", str(pid), "--duration", str(duration), "--json", *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    ("script", "args", "verdict", "phase"),
    [
        (
            # 20 ms of read latency per sample: the loading (sleeps) outweighs the model
            # (CPU work, which a loaded machine stretches) whatever else runs beside it
            "input_bound.py",
            ("--steps", "2000", "--log-every", "1", "--io-latency-ms", "20"),
            ("io", "input_pipeline"),
            "data_loading",
        ),
        (
            "dense_compute.py",
            ("--steps", "2000", "--log-every", "1"),
            ("compute", "device_compute"),
            None,
        ),
    ],
)
def test_attached_example_gets_its_verdict_from_stacks(
    tmp_path: Path, job: Callable, script: str, args: tuple, verdict: tuple, phase: str | None
) -> None:
    proc = job(str(EXAMPLES / script), *args)
    result = attach_json(tmp_path, proc.pid, 8, "--no-inject")  # the stacks' own verdict
    assert result["status"] == "completed" and result["stop_reason"] == "duration"
    assert proc.poll() is None, "attaching must not stop the job"
    assert result["diagnosis_level"] == "stacks"
    first = result["findings"][0]
    assert (first["class"], first["subtype"]) == verdict
    phases = {p["category"]: p["share"] for p in result["phases"]}
    assert result["stack_samples"] >= 100  # 8 s at 20 Hz, minus py-spy's start-up
    assert sum(phases.values()) == pytest.approx(1.0)
    if phase == "data_loading":
        assert phases["data_loading"] > INPUT_HIGH  # "highly input-bound"
        assert any("__getitem__" in s["site"] for s in result["sites"][:2])
    else:
        assert phases["forward"] + phases["backward"] + phases["optimizer"] > 0.6
        assert phases["data_loading"] < 0.05
    with RunStore(tmp_path) as store:
        run = store.run(result["run_id"])
        assert run["config"]["attached_pid"] == proc.pid
        assert run["device"]["seen_from"] == "attach" and "device_name" not in run["device"]
        assert len(store.samples(result["run_id"])) > 0  # psutil beside the stacks
        assert store.findings(result["run_id"])[0].subtype == verdict[1]
        assert store.stack_samples(result["run_id"])["samples"].sum() == result["stack_samples"]


def test_process_that_exits_mid_attach_keeps_what_was_recorded(
    tmp_path: Path, job: Callable
) -> None:
    proc = job(str(EXAMPLES / "input_bound.py"), "--steps", "25", "--log-every", "1")
    started = time.monotonic()
    out = stepscope(tmp_path, "attach", str(proc.pid), "--duration", "60", "--json")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 40, "the attach must end with the process"
    result = json.loads(out.stdout)
    assert result["stop_reason"] == "process_ended" and result["status"] == "completed"
    assert any(m.startswith(f"process {proc.pid} ended after") for m in result["messages"])
    assert result["stack_samples"] > 30
    with RunStore(tmp_path) as store:
        events = store.events(result["run_id"])
        assert events["message"].str.contains("ended after").any()
        assert store.stack_samples(result["run_id"])["samples"].sum() == result["stack_samples"]


def test_ctrl_c_detaches_and_keeps_the_recording(tmp_path: Path, job: Callable) -> None:
    proc = job(str(EXAMPLES / "input_bound.py"), "--steps", "2000", "--log-every", "1")
    cmd = [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path)]
    attacher = subprocess.Popen(
        [*cmd, "attach", str(proc.pid), "--duration", "120", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(8)
    sent = time.time()
    attacher.send_signal(signal.SIGINT)
    stdout, stderr = attacher.communicate(timeout=60)
    assert attacher.returncode == 0, stderr
    result = json.loads(stdout)
    assert result["status"] == "stopped" and result["stop_reason"] == "detached"
    assert result["stack_samples"] > 0
    # the window under way was written on SIGINT: the last one ends at the detach, not at
    # the 5-second boundary before it (a count would depend on how fast py-spy started)
    with RunStore(tmp_path) as store:
        windows = store.stack_samples(int(result["run_id"]))
    last = windows[windows["t_end"] == windows["t_end"].max()]
    assert float(last["t_end"].iloc[0]) >= sent - 0.5 and int(last["samples"].sum()) > 0
    assert proc.poll() is None, "detaching must leave the job running"


def test_a_pid_that_does_not_exist_is_one_line_and_records_nothing(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    out = stepscope(tmp_path, "attach", str(gone.pid), "--duration", "2")
    assert out.returncode == 1
    assert out.stderr.strip() == f"stepscope: no process with PID {gone.pid}"
    with RunStore(tmp_path) as store:
        assert store.runs().empty


def test_another_users_process_says_why_and_keeps_the_system_samples(
    request: pytest.FixtureRequest, job: Callable
) -> None:
    """stepscope run as user nobody (tests/other_user.py: from a world-readable mirror of
    this clone where the clone's folder is private) attaches to root's job."""
    proc = job(str(EXAMPLES / "input_bound.py"), "--steps", "2000", "--log-every", "1")
    # pytest's tmp_path lives under a folder only root may enter
    home = Path(tempfile.mkdtemp(prefix="stepscope-other-user-home-"))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    with stepscope_as_nobody(home) as (cli, env):
        out = subprocess.run(
            [*cli, "--home", str(home), "attach", str(proc.pid), "--duration", "4", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["stack_samples"] == 0
    stacks_off = [m for m in result["messages"] if m.startswith("no stack samples")]
    assert stacks_off and "the OS forbids reading" in stacks_off[0]
    with RunStore(home) as store:
        assert store.run(result["run_id"])["status"] == "completed"
        assert len(store.samples(result["run_id"])) > 0
        events = store.events(result["run_id"])
        assert events["message"].str.contains("belongs to user root").any()
    assert result["diagnosis_level"] == "samples"


def test_list_shows_python_processes_and_recognises_stepscope_runs(
    tmp_path: Path, job: Callable
) -> None:
    plain = job(str(EXAMPLES / "input_bound.py"), "--steps", "2000", "--log-every", "1")
    recorded = job(
        *("-m", "stepscope.app.cli", "--home", str(tmp_path), "run", "--"),
        *(sys.executable, str(EXAMPLES / "input_bound.py"), "--steps", "2000"),
        wait_for_output=False,
    )
    deadline = time.monotonic() + 30
    rows: dict[int, dict] = {}
    while time.monotonic() < deadline:
        out = stepscope(tmp_path, "attach", "--list", "--json")
        assert out.returncode == 0, out.stderr
        rows = {r["pid"]: r for r in json.loads(out.stdout)}
        if any(r["run_id"] is not None for r in rows.values()):
            break
        time.sleep(1)
    assert rows[plain.pid]["python"] and rows[plain.pid]["run_id"] is None
    assert "input_bound.py" in rows[plain.pid]["command"]
    runs = [r for r in rows.values() if r["run_id"] is not None]
    assert len(runs) == 1 and runs[0]["run_id"] == 1
    assert recorded.pid not in rows  # the launcher itself is stepscope's, not a job


def test_stack_phases_agree_with_the_step_timer_on_the_same_job(
    tmp_path: Path, job: Callable
) -> None:
    """Attach to a job recorded by `stepscope run`: the share of stack samples in data
    loading must match the share of step time its step timer measured waiting for data,
    over the same seconds."""
    launcher = job(
        *("-m", "stepscope.app.cli", "--home", str(tmp_path), "run", "--"),
        *(sys.executable, str(EXAMPLES / "input_bound.py"), "--steps", "2000"),
        wait_for_output=False,
    )
    deadline = time.monotonic() + 60
    with RunStore(tmp_path) as store:
        while store.runs().empty or len(store.steps(1)) < 3:
            assert time.monotonic() < deadline, "the recorded job made no steps in 60 s"
            time.sleep(0.5)
    children = psutil.Process(launcher.pid).children()
    (the_job,) = [c for c in children if "input_bound.py" in " ".join(c.cmdline())]
    result = attach_json(tmp_path, the_job.pid, 8)
    with RunStore(tmp_path) as store:
        stacks = store.stack_samples(result["run_id"])
        steps = store.steps(1)
    t0, t1 = stacks["t_start"].min(), stacks["t_end"].max()
    inside = steps[(steps["start_s"] >= t0) & (steps["end_s"] <= t1)]
    assert len(inside) >= 10
    timer_share = inside["data_wait_s"].sum() / (inside["end_s"] - inside["start_s"]).sum()
    phases = {p["category"]: p["share"] for p in result["phases"]}
    assert phases["data_loading"] == pytest.approx(timer_share, abs=0.12)


def test_list_leaves_out_the_dashboards_children_and_multiprocessing_helpers(
    tmp_path: Path,
) -> None:
    """What the dashboard starts (its TensorBoard) and multiprocessing's helpers are not
    jobs: the list leaves them out, as its caption says; a plain job beside them stays."""
    from stepscope.collectors.attach.process_list import candidates

    sleep = "import time; time.sleep(60)"
    fake_dashboard = tmp_path / "stepscope" / "app" / "dashboard" / "main.py"
    fake_dashboard.parent.mkdir(parents=True)
    child = tmp_path / "child.pid"
    fake_dashboard.write_text(  # starts a child as the dashboard starts TensorBoard
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {sleep!r}])\n"
        f"open({str(child)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    procs = [
        subprocess.Popen([sys.executable, str(fake_dashboard)]),
        subprocess.Popen(
            [sys.executable, "-c", f"import multiprocessing.resource_tracker; {sleep}"]
        ),
        subprocess.Popen([sys.executable, "-c", sleep]),
    ]
    try:
        deadline = time.monotonic() + 20
        while not child.exists() or not child.read_text():
            assert time.monotonic() < deadline, "the fake dashboard did not start its child"
            time.sleep(0.1)
        pids = {r["pid"] for r in candidates(tmp_path, cpu_window_s=0.05)}
        assert procs[2].pid in pids  # a plain Python process is a candidate
        assert procs[0].pid not in pids and int(child.read_text()) not in pids
        assert procs[1].pid not in pids
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.kill(int(child.read_text()), signal.SIGKILL)


def test_a_server_waiting_for_requests_is_idle_not_elsewhere(tmp_path: Path, job: Callable) -> None:
    """A model behind http.server (tests/jobs/idle_server.py), attached to while a client
    sends requests now and then: its waits in serve_forever are idle, and the busy
    samples' shares, which the diagnosis reads, are the requests' work (the forward)."""
    import threading
    import urllib.request

    proc = job(str(Path(__file__).parent / "jobs" / "idle_server.py"))
    port = int((tmp_path / "job0.log").read_text().split()[-1])
    stop = threading.Event()

    def client() -> None:
        while not stop.wait(0.5):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", data=b"{}", timeout=30).read()

    sender = threading.Thread(target=client, daemon=True)
    sender.start()
    try:
        result = attach_json(tmp_path, proc.pid, 6, "--no-inject")  # what stacks alone say
    finally:
        stop.set()
        sender.join(timeout=30)
    assert proc.poll() is None, "attaching must not stop the server"
    phases = {p["category"]: p["share"] for p in result["phases"]}
    assert phases["idle"] > 0.3 and phases["elsewhere"] < phases["idle"]
    assert sum(phases.values()) == pytest.approx(1.0)
    with RunStore(tmp_path) as store:
        summary = stack_summary(store.stack_samples(result["run_id"]))
    assert summary is not None and summary["idle_share"] == pytest.approx(phases["idle"], abs=0.02)
    busy = summary["shares"]
    assert busy["idle"] == 0.0 and sum(busy.values()) == pytest.approx(1.0)
    assert busy["forward"] > 0.5  # the requests' model calls, once the waits are left out
    # no backward and no optimizer step on its main thread: an inference job's advice
    bases = [str(x["basis"]) for f in result["findings"] for x in f["fixes"]]
    assert bases and not [b for b in bases if "training job" in b], bases
