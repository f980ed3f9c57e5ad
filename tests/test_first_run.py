"""A plain `stepscope run -- python train.py` answers: a trace by default, the verdict at
exit, the diagnosis kept with the run (issue 24, parts 1 and 2).

The jobs are ``tests/jobs/train.py`` (an SGD loop over a DataLoader) run through the CLI
as a user runs it. What is asserted is what happened: which steps the default capture
took and why, what was printed where, what the store kept; never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.app.cli.show_figures import compute_figures
from stepscope.app.cli.show_kept import DETAILS_VERSION, run_state
from stepscope.collectors.capture.capture_auto import FIRST_STEP, LAST_STEP
from stepscope.collectors.launch.launcher import launch_run
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"


def run(
    home: Path, *args: str, job: tuple[str, ...] = ("--steps", "30")
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", *args, "--"]
        + [sys.executable, str(JOBS / "train.py"), *job],
        capture_output=True,
        text=True,
        timeout=240,
    )


def stepscope_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """stepscope's lines after the job's output (the first says where it records)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("stepscope:")]
    return lines[1:] if lines and lines[0].startswith("stepscope: recording run") else lines


@pytest.fixture(scope="module")
def default_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess]:
    home = tmp_path_factory.mktemp("first-run") / "home"
    return home, run(home, job=("--steps", "30", "--sleep", "0.002"))


def test_the_default_capture_takes_settled_steps(default_run) -> None:
    home, proc = default_run
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    with RunStore(home) as store:
        traces = store.artifacts(1)
        steps = store.steps(1)
        config = store.run(1)["config"]
    traces = traces[traces["kind"] == "trace"]
    assert len(traces) == 1
    meta = traces["meta"].iloc[0]
    assert meta["reason"].startswith("automatic:") and meta["steps"] == 3
    assert FIRST_STEP <= meta["first_step"] <= LAST_STEP
    # the window's steps are profiled, kept out of the timing figures as a scheduled one's
    profiled = steps.loc[steps["profiled"] == 1, "step"].tolist()
    assert profiled[:3] == list(range(meta["first_step"], meta["first_step"] + 3))
    assert config["profile_at"] == "auto"


def test_the_verdict_comes_after_the_jobs_output(default_run) -> None:
    home, proc = default_run
    lines = stepscope_lines(proc)
    assert lines[0].startswith("stepscope: run 1 completed, 30 steps")
    verdict = lines[1]
    assert verdict.startswith("stepscope: verdict: ") and "confidence" in verdict
    assert verdict.endswith("(from a profiler trace and the steps)")
    assert any(line.startswith("stepscope:   fix: ") and "up to" in line for line in lines)
    assert lines[-1].startswith("stepscope:   next: stepscope optimize 1")
    # kept with the run: show has it without being asked, in both forms
    with RunStore(home) as store:
        found = store.findings(1)
        marker = store.run(1)["config"]["diagnosed"]
    assert found and found[0].title in verdict and marker["level"] == "trace"
    show = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "show", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    diagnosis = json.loads(show.stdout)["diagnosis"]
    assert diagnosis["level"] == "trace" and diagnosis["findings"][0]["title"] == found[0].title
    assert diagnosis["verdict"][0] == verdict.removeprefix("stepscope: ")


# `show` run in a fresh interpreter: what it printed, and whether pandas got loaded.
SHOW_PROBE = """
import contextlib, io, json, sys
from stepscope.app.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "out": out.getvalue(), "pandas": "pandas" in sys.modules}))
"""


def test_show_reads_the_figures_kept_as_the_run_ended(default_run) -> None:
    """`stepscope run` kept `show`'s figures once its verdict was printed: `show` reads
    them back without pandas and prints what computing them now gives (the capture's
    memory breakdown included)."""
    home, _ = default_run
    with RunStore(home) as store:
        state, version, figures = store.kept_details(1)
        assert (state, version) == (run_state(store, store.run(1)), DETAILS_VERSION)
        assert figures == compute_figures(store, 1)
    assert figures["memory"]["peak_bytes"] > 0 and figures["steps"]["steps"] == 30
    probe = [sys.executable, "-c", SHOW_PROBE, "--home", str(home), "show", "1", "--json"]
    shown = json.loads(subprocess.run(probe, capture_output=True, timeout=60).stdout)
    assert shown["code"] == 0 and not shown["pandas"]
    data = json.loads(shown["out"])
    assert data["step_time_median_s"] == figures["steps"]["step_time_median_s"]
    assert data["memory"]["lines"][0].startswith("peak ")


def test_quiet_and_no_profile(tmp_path: Path) -> None:
    proc = run(tmp_path, "--quiet", "--no-profile", job=("--steps", "8"))
    assert proc.returncode == 0 and proc.stdout == "done\n"
    lines = stepscope_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("stepscope: run 1 completed, 8 steps")
    with RunStore(tmp_path) as store:
        assert (store.artifacts(1)["kind"] != "trace").all()
        assert store.findings(1) == []  # --quiet: no verdict, so not diagnosed yet
    contradiction = run(tmp_path, "--no-profile", "--profile-at", "3")
    assert contradiction.returncode == 2 and "contradict" in contradiction.stderr


def test_a_job_too_short_for_the_capture_says_so(tmp_path: Path) -> None:
    proc = run(tmp_path, job=("--steps", str(FIRST_STEP - 1)))
    assert proc.returncode == 0
    with RunStore(tmp_path) as store:
        assert (store.artifacts(1)["kind"] != "trace").all()
        messages = " ".join(store.events(1)["message"])
    assert f"no profiler capture: the job ended after {FIRST_STEP - 1} steps" in messages
    verdict = stepscope_lines(proc)[1]
    assert verdict.startswith("stepscope: verdict: ") or verdict.startswith("stepscope: no verdict")
    assert "profiler trace" not in verdict


def test_a_failing_job_keeps_its_exit_code_and_gets_a_verdict(tmp_path: Path) -> None:
    job = tmp_path / "crash.py"
    job.write_text(
        "import runpy, sys\n"
        f"sys.argv = ['train.py', '--steps', '12']\n"
        f"runpy.run_path({str(JOBS / 'train.py')!r}, run_name='__main__')\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path), "run", "--"]
        + [sys.executable, str(job)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 3
    lines = stepscope_lines(proc)
    assert "failed (exit code 3)" in lines[0]
    assert lines[1].startswith("stepscope: verdict: ")


def test_show_diagnoses_a_run_that_ended_without_its_verdict(tmp_path: Path) -> None:
    """A launcher killed before its verdict, or a run of the API: `show` diagnoses it."""
    command = [sys.executable, str(JOBS / "train.py"), "--steps", "10"]
    run_id, code = launch_run(command, home=tmp_path, quiet=True, profile_at=3)
    assert code == 0
    with RunStore(tmp_path) as store:
        assert store.findings(run_id) == [] and "diagnosed" not in store.run(run_id)["config"]
    show = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path), "show", str(run_id)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert show.returncode == 0
    assert any(line.startswith("verdict: ") for line in show.stdout.splitlines()), show.stdout
    with RunStore(tmp_path) as store:
        assert store.run(run_id)["config"]["diagnosed"]["level"] == "trace"


def test_a_generation_jobs_default_capture_is_one_request(tmp_path: Path) -> None:
    """A request is thousands of forwards: the default capture takes one, not three."""
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path), "run", "--"]
        + [sys.executable, str(JOBS / "gen_requests.py"), "--mode", "generate", "--requests", "10"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=JOBS,
    )
    assert proc.returncode == 0, proc.stderr
    with RunStore(tmp_path) as store:
        arts = store.artifacts(1)
        requests = store.requests(1)
    meta = arts.loc[arts["kind"] == "trace", "meta"].iloc[0]
    assert meta["steps"] == 1 and meta["reason"].startswith("automatic:")
    assert requests.loc[requests["profiled"] == 1, "request"].iloc[0] == meta["first_step"]
