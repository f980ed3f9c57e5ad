"""`stepscope attach` with the in-job collectors injected (collectors/attach/inject.py,
collectors/injob/live.py): real training jobs started as plain `python` processes,
injected through gdb while they run, detached, and left to finish.

What is checked: the steps recorded are the job's own steps over the same seconds (its
clock file, one line per `optimizer.step()`); a capture asked of the attached run lands;
after detach the job runs on to the same final loss as a run never attached, with none of
stepscope's hooks or patches left in it; and where injection cannot be done (no gdb) the
attach says why in one line and records from outside, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.collectors.attach.inject import gdb_error, injected_line
from stepscope.store import RunStore

JOB = Path(__file__).parent / "jobs" / "train_clock.py"
SERVER = Path(__file__).resolve().parents[1] / "examples" / "corpus" / "generation_server.py"
STEPS = "600"  # 20 ms apart: about 15 s of training, longer than any attach here


@pytest.fixture
def gdb() -> None:
    """The injection needs gdb: skipped without it, but failed under CI=true (.ci/run
    installs it), so a broken install cannot pass unnoticed."""
    if shutil.which("gdb") is not None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true but gdb is not installed: the injection cannot be tested")
    pytest.skip("gdb is not installed (apt-get install gdb)")


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def job(tmp_path: Path) -> Iterator:
    """Starts train_clock.py (plain python, no stepscope) and waits for its loop."""
    started: list[subprocess.Popen] = []

    def start(name: str) -> tuple[subprocess.Popen, Path, Path]:
        log, clock = tmp_path / f"{name}.log", tmp_path / f"{name}.clock"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, str(JOB), STEPS, str(clock)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")},
                start_new_session=True,
            )
        started.append(proc)
        deadline = time.monotonic() + 60
        while "ready" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the job did not start in 60 s"
            time.sleep(0.1)
        return proc, log, clock

    yield start
    for proc in started:
        end_group(proc)


def end_group(proc: subprocess.Popen) -> None:
    """The job and all it started: each runs in a session of its own."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def finished(proc: subprocess.Popen, log: Path) -> re.Match:
    assert proc.wait(timeout=120) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text and "stepscope" not in text, text
    done = re.search(r"done (\d+) steps, loss ([\d.]+), left (\d+)", text)
    assert done is not None, text
    return done


@pytest.mark.slow
def test_the_injected_job_records_its_own_steps_and_runs_on_unchanged(tmp_path: Path, job) -> None:
    home = tmp_path / "home"
    proc, log, clock = job("attached")
    attacher = cli(home, "attach", str(proc.pid), "--duration", "5", "--json")
    time.sleep(3)  # the collectors are in (or the attach said why not): ask for a trace
    capture = cli(home, "capture", "last", "--steps", "2")
    assert capture.wait(timeout=60) == 0, capture.stderr.read()
    out, err = attacher.communicate(timeout=120)
    assert attacher.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "completed", result
    assert not [m for m in result["messages"] if m.startswith("stacks only")], result
    with RunStore(home) as store:
        run = store.run(result["run_id"])
        steps = store.steps(result["run_id"])
        kinds = set(store.artifacts(result["run_id"])["kind"])
        events = " ".join(store.events(result["run_id"])["message"])
    assert run["config"]["inject"] == {"mode": "injected", "how": "gdb"}
    assert "collectors injected into process" in events
    assert len(steps) >= 50 and set(steps["kind"]) == {"optimizer"}
    # the job's own clock over the same seconds: one line per optimizer.step()
    ends = [float(t) for t in clock.read_text().split()]
    first, last = steps["start_s"].min(), steps["end_s"].max()
    # the job writes its line right after each step: the last recorded step's line is the
    # first at or after its end, however late a loaded machine let the job write it
    last_line = min(t for t in ends if t >= last)
    own = [t for t in ends if first <= t <= last_line]
    assert len(own) == len(steps), (len(own), len(steps))
    assert "trace" in kinds and int(steps["profiled"].sum()) >= 2  # the capture landed
    # detached: the job goes on to the end, as a run never attached does
    done = finished(proc, log)
    assert int(done.group(1)) == int(STEPS) and done.group(3) == "0"  # no hook or patch left
    assert len(ends) < int(STEPS) or ends[-1] > last + 1  # it trained on after the detach
    plain, plain_log, _ = job("plain")
    assert finished(plain, plain_log).group(2) == done.group(2)  # the same final loss


@pytest.mark.slow
def test_the_injected_server_records_the_clients_requests_and_tokens(
    tmp_path: Path, gdb: None
) -> None:
    """examples/corpus/generation_server.py, started plainly, attached to while it waits
    in serve_forever; a client then sends requests: each is one request of the run, with
    the client's new tokens, and a latency within 10 % of the client's own clock."""
    import urllib.request

    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, str(SERVER)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "listening on" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        port = int(log.read_text().split()[-1])
        home = tmp_path / "home"
        attacher = cli(home, "attach", str(server.pid), "--duration", "120", "--json")
        assert wait_inject_mode(home, attacher) == "injected"
        sent = []
        for seed in range(5):
            body = json.dumps({"prompt_len": 16, "max_new_tokens": 12, "seed": seed}).encode()
            start = time.perf_counter()
            answer = urllib.request.urlopen(f"http://127.0.0.1:{port}/", data=body, timeout=60)
            tokens = json.loads(answer.read())["new_tokens"]
            sent.append((tokens, time.perf_counter() - start))
        attacher.send_signal(signal.SIGINT)  # detach
        out, err = attacher.communicate(timeout=120)
        assert attacher.returncode == 0, err
        result = json.loads(out)
        assert server.poll() is None, "detaching must leave the server running"
        after = json.dumps({"prompt_len": 8, "max_new_tokens": 4, "seed": 9}).encode()
        reply = urllib.request.urlopen(f"http://127.0.0.1:{port}/", data=after, timeout=60)
        assert json.loads(reply.read())["new_tokens"] == 4  # it serves on, detached
    finally:
        end_group(server)
    with RunStore(home) as store:
        requests = store.requests(result["run_id"])
        steps = store.steps(result["run_id"])
    assert list(requests["new_tokens"]) == [t for t, _ in sent]
    assert list(requests["prompt_tokens"]) == [16] * len(sent)
    assert set(steps["kind"]) == {"generate"} and len(steps) == len(sent)
    for (_, client_s), got in zip(sent, requests["end_s"] - requests["start_s"], strict=True):
        assert got <= client_s and got >= 0.9 * client_s, (got, client_s)


def wait_inject_mode(home: Path, attacher: subprocess.Popen) -> str:
    """The attach's mode once it is settled: the collectors in, or refused."""
    deadline = time.monotonic() + 90
    while (mode := _inject_mode(home)) is None:
        assert attacher.poll() is None and time.monotonic() < deadline, attacher.stderr.read()
        time.sleep(0.2)
    return mode


def _inject_mode(home: Path) -> str | None:
    if not (home / "stepscope.db").exists():  # the attach has not made its store yet
        return None
    with RunStore(home) as store:
        runs = store.runs()
        if runs.empty:
            return None
        return (store.run(int(runs["id"].max()))["config"].get("inject") or {}).get("mode")


@pytest.mark.slow
def test_a_process_without_torch_yet_is_instrumented_when_it_imports_it(
    tmp_path: Path, gdb: None
) -> None:
    """Attached while it sleeps before `import torch`: the collectors wait for the import
    (the bootstrap's import hook, as at a job's start) and then record its steps."""
    clock = tmp_path / "late.clock"
    code = (
        "import runpy, sys, time\n"
        "print('waiting', flush=True)\n"
        "time.sleep(3)\n"
        f"sys.argv = ['train_clock.py', '300', {str(clock)!r}]\n"
        f"runpy.run_path({str(JOB)!r}, run_name='__main__')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")},
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
        home = tmp_path / "home"
        out = subprocess.run(
            [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "attach",
             str(proc.pid), "--duration", "6", "--json"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert not [m for m in result["messages"] if m.startswith("stacks only")], result
        rest = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0 and "done 300 steps" in rest, rest
    finally:
        end_group(proc)
    with RunStore(home) as store:
        steps = store.steps(result["run_id"])
    assert len(steps) >= 20 and set(steps["kind"]) == {"optimizer"}


@pytest.mark.slow
def test_a_second_attach_is_refused_with_the_first_ones_run(tmp_path: Path, job, gdb: None) -> None:
    home = tmp_path / "home"
    proc, log, _ = job("attached")
    first = cli(home, "attach", str(proc.pid), "--duration", "8", "--json")
    assert wait_inject_mode(home, first) == "injected"
    second = cli(home, "attach", str(proc.pid), "--duration", "1", "--json")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    lines = [m for m in json.loads(out)["messages"] if m.startswith("stacks only")]
    first_run = json.loads(first.communicate(timeout=120)[0])["run_id"]
    assert lines == [f"stacks only: collectors not injected: already attached by run {first_run}"]
    assert finished(proc, log).group(3) == "0"  # the first one's collectors left too


@pytest.mark.slow
def test_without_gdb_the_attach_says_why_and_records_from_outside(tmp_path: Path, job) -> None:
    home = tmp_path / "home"
    proc, _, _ = job("attached")
    attacher = cli(
        home, "attach", str(proc.pid), "--duration", "3", "--json",
        env={"STEPSCOPE_GDB": str(tmp_path / "no-such-gdb")},
    )  # fmt: skip
    out, err = attacher.communicate(timeout=120)
    assert attacher.returncode == 0, err
    result = json.loads(out)
    lines = [m for m in result["messages"] if m.startswith("stacks only")]
    assert lines == [
        "stacks only: gdb is not installed (apt-get install gdb, or set STEPSCOPE_GDB)"
    ]
    assert result["stack_samples"] > 0
    with RunStore(home) as store:
        run = store.run(result["run_id"])
        assert run["config"]["inject"]["mode"] == "stacks"
        assert store.steps(result["run_id"]).empty
    assert proc.poll() is None


# -- gdb's answers, read -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("output", "line"),
    [
        ("$1 = 140000000\n$2 = 0\n", None),
        ("ptrace: Operation not permitted.\n", "ptrace is not permitted"),
        ("ptrace: No such process.\n", "the process ended before gdb could attach"),
        (
            '$1 = 1400\nNo symbol "Py_AddPendingCall" in current context.\n',
            "gdb finds no Py_AddPendingCall in the process (a Python without its symbols?)",
        ),
        ("$1 = -1\n$2 = 0\n", "gdb could not map a page in the process"),
        ("$1 = 1400\n$2 = -1\n", "the interpreter's queue of pending calls is full; try again"),
    ],
)
def test_gdb_output_is_one_line(output: str, line: str | None) -> None:
    got = gdb_error(output)
    assert got == line or (line is not None and got is not None and got.startswith(line))


def test_the_injected_line_never_raises_and_leaves_main_alone(tmp_path: Path) -> None:
    """The line runs in the job's main thread: a missing settings file (an attach that
    gave up) must do nothing, in a namespace of its own."""
    line = injected_line(tmp_path / "gone.json")
    namespace: dict = {"__name__": "__main__"}
    exec(line, namespace)  # noqa: S102  # what PyRun_SimpleString does in the job
    assert set(namespace) == {"__name__", "__builtins__"}
