"""`stepscope check` and `stepscope tag` on real recorded runs.

The runs differ by a known, large factor: tests/jobs/pause.py's steps busy-wait to a
wall-clock deadline (--compute-ms 10 against 30), tests/jobs/infer.py sleeps between
requests (5 ms against 80 ms: its p99 is nearly its slowest request, so the gap must
outlast a stall of the baseline beside the other worker's jobs), tests/jobs/slow_decode.py
sleeps after each token (5 ms against 15 ms). A busy machine stretches a step only by
the little work around the wait, so these verdicts hold on two busy cores. Two runs of
pause.py share its one 200 ms pause (step 20), which widens their throughput interval:
no false alarm. No test asserts a ratio: only verdicts, exit codes and which figure was
judged.

Each name has one run, so a time-based verdict needs the host's run-to-run spread: the
store's home holds a ``calibrate --noise`` entry of 5 % (written as the command writes
it; tests/test_check_noise.py covers the rules without one, and test_calibrate.py the
real measurement), and every one-run interval here is widened by it.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from dashboard_helpers import stepscope
from recordings import JOBS, pause_40
from scipy.stats import ttest_ind

import stepscope as api
from stepscope.app.cli.main import main
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.check.check_result import FASTER
from stepscope.optim_runner.check.over_runs import interval_over_runs
from stepscope.optim_runner.check.perf_check import NO_SLOWDOWN, SLOWER, check_runs, parse_slowdown
from stepscope.store import RunNotFound, RunStore
from stepscope.store.calibration import NoiseCalibration, host_name, save_calibration
from stepscope.store.schema import SCHEMA_VERSION

PAUSE = [sys.executable, str(JOBS / "pause.py"), "--steps", "40"]  # as pause_40 records it


def _record(home: Path, name: str, command: list[str]) -> None:
    _, code = launch_run(command, name=name, home=home, quiet=True)
    assert code == 0, f"{name}: exit {code}"


def calibrated(home: Path, sd: float = 0.05, runs: int = 5) -> None:
    """This host's run-to-run spread in ``home``'s cache, as `calibrate --noise` saves it."""
    noise = NoiseCalibration(
        cv={"median": sd, "mean": sd, "p99": sd}, runs=runs, steps=300, step_s=0.003,
        threads=1, host=host_name(), cpu_model="test CPU", torch_version="test",
        date="2026-11-28T10:00:00+00:00", load=(0.5, 0.5), seconds=30.0,
    )  # fmt: skip
    save_calibration(home, noise)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pause_40's run "pause" (the baseline), the same command again ("pause-again"),
    the same job with 3x the work per step ("slow"); inference and generation pairs."""
    home, _ = pause_40(tmp_path_factory, "check")
    _record(home, "pause-again", PAUSE)
    _record(home, "pause-again", PAUSE)  # two of the same name: a check over runs
    _record(home, "slow", [*PAUSE, "--compute-ms", "30"])
    infer = [sys.executable, str(JOBS / "infer.py"), "--calls", "30", "--sleep"]
    _record(home, "infer", [*infer, "0.005"])
    _record(home, "infer-slow", [*infer, "0.08"])
    decode = [sys.executable, str(JOBS / "slow_decode.py"), "--requests", "10", "--token-ms"]
    _record(home, "decode", [*decode, "5"])
    _record(home, "decode-slow", [*decode, "15"])
    calibrated(home)
    return home


def cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--home", str(home), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the verdicts --------------------------------------------------------------------------
def test_same_job_twice_is_not_slower(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, home, "check", "pause-again", "--against", "pause")
    assert code == 0, out + err
    assert "is not measurably slower than" in out and "throughput" in out


def test_slower_job_fails_naming_the_figure(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, home, "tag", "pause", "base-slow-test")
    assert code == 0
    code, out, err = cli(capsys, home, "check", "slow", "--against", "base-slow-test")
    assert code == 1, out + err
    first = out.splitlines()[0]
    assert "'slow' is slower than" in first and "(tag 'base-slow-test')" in first
    assert out.splitlines()[1].strip().startswith("throughput is at least")
    row = next(line for line in out.splitlines() if "throughput" in line and "samples/s" in line)
    assert "slower" in row
    # the busy-wait is in the loop, outside every module: its phase is what regressed
    assert "what regressed in run" in out and "phase" in out


def test_runs_judges_over_each_names_newest_runs(home: Path) -> None:
    """--runs 2: the two "pause-again" runs against the one "pause", an interval over
    runs (wide on three runs: a pass, "no measurable slowdown" or, when the three runs
    happen to sit close, "faster": 1.02x, 1.00-1.03 in one CI run); a side with fewer
    runs than asked says so."""
    with RunStore(home) as store:
        again = store.runs().query("name == 'pause-again'")["id"].sort_values(ascending=False)
        result = check_runs(store, "pause-again", "pause", runs=2)
        short = check_runs(store, "slow", "pause", runs=3)
    assert result.run_ids == tuple(int(i) for i in again) and len(result.baseline_ids) == 1
    assert result.verdict in (NO_SLOWDOWN, FASTER), result.why  # a pass either way
    (figure,) = result.figures
    assert figure.ci.method == "t over runs" and (figure.ci.n_baseline, figure.ci.n_candidate) == (
        1,
        2,
    )
    assert any("judged over 1 baseline run(s)" in n for n in result.notes)
    assert result.to_json()["run"]["runs"] == list(result.run_ids)
    # one name on both sides: the older "pause-again" is the baseline, never on both sides
    newest, older = (int(i) for i in again)
    with RunStore(home) as store:
        shared = check_runs(store, newest, older, runs=2)
    assert shared.baseline_ids == (older,) and shared.run_ids == (newest,)
    # one run of each name: judged over steps as without --runs, and told
    assert short.verdict == SLOWER and short.figures[0].ci.method != "t over runs"
    assert short.figures[0].basis == "widened" and "calibrate --noise" in short.why
    assert any("asked for 3 runs of each side: found 1" in n for n in short.notes)
    code = main(["--home", str(home), "check", "slow", "--against", "pause", "--runs", "0"])
    assert code == 2


def test_interval_over_runs_is_students_t_on_the_logs() -> None:
    base, run = [1.0, 1.02, 0.98], [1.10, 1.13, 1.08]  # times per unit: the run is slower
    ci = interval_over_runs(base, run)
    assert ci.verdict == "slower" and ci.lo < ci.ratio < ci.hi < 1.0
    assert ci.ratio == pytest.approx(np.exp(np.mean(np.log(base)) - np.mean(np.log(run))))
    p = ttest_ind(np.log(base), np.log(run)).pvalue  # the same test, as scipy runs it
    assert p < 0.05
    same = interval_over_runs([1.0, 1.05], [1.02])
    assert same.lo < 1.0 < same.hi and ttest_ind(np.log([1.0, 1.05]), np.log([1.02])).pvalue > 0.05
    assert interval_over_runs([1.0], [1.1]) is None  # two runs: no spread to judge by


def test_exit_codes_of_the_command(home: Path) -> None:
    """The process's own exit status, as a CI step sees it; errors in one line."""
    slower = stepscope(home, "check", "slow", "--against", "pause", check=False)
    assert slower.returncode == 1, slower.stderr
    unknown = stepscope(home, "check", "slow", "--against", "no-such-tag", check=False)
    assert unknown.returncode == 1  # an unknown run or tag: 1, as for every command
    assert unknown.stdout == ""
    lines = unknown.stderr.strip().splitlines()
    assert len(lines) == 1 and "'no-such-tag'" in lines[0] and "tag" in lines[0]


def test_max_slowdown_is_applied_to_the_interval(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 3x slower run passes when the allowed slowdown is far above its interval."""
    code, out, err = cli(
        capsys, home, "check", "slow", "--against", "pause", "--max-slowdown", "500 %"
    )
    assert code == 0, out + err
    assert "not measurably more than 500 % slower" in out
    code, _, err = cli(capsys, home, "check", "slow", "--against", "pause", "--max-slowdown", "5")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "5%" in err


@pytest.mark.parametrize(
    ("text", "value"),
    [("5%", 0.05), ("5 %", 0.05), ("0.05", 0.05), ("12.5%", 0.125), (" 0 % ", 0.0), (0.1, 0.1)],
)
def test_parse_slowdown(text: str | float, value: float) -> None:
    assert parse_slowdown(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "abc", "-1%", "", "5%%", "1.5"])
def test_parse_slowdown_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="max slowdown"):
        parse_slowdown(text)


def test_inference_runs_are_judged_on_p50_and_p99(home: Path) -> None:
    slower = api.check("infer-slow", against="infer", home=home, operators=False)
    assert slower.exit_code == 1
    assert [f.name for f in slower.figures] == ["p50 latency", "p99 latency"]
    assert [f.verdict for f in slower.figures] == ["slower", "slower"]
    assert all(f.unit == "s" and f.run > f.baseline for f in slower.figures)
    faster = api.check("infer", against="infer-slow", home=home, operators=False)
    assert faster.passed and faster.verdict == "faster"


def test_generation_runs_are_judged_on_tokens_per_s(home: Path) -> None:
    slower = api.check("decode-slow", against="decode", home=home, operators=False)
    assert slower.exit_code == 1, slower.why
    assert [(f.name, f.unit, f.verdict) for f in slower.figures] == [
        ("tokens/s", "tokens/s", "slower")
    ]
    mixed = api.check("infer", against="decode", home=home, operators=False)
    assert mixed.exit_code == 2 and "generation run" in mixed.why and not mixed.figures


def test_a_run_without_timed_steps_cannot_be_compared(
    home: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with RunStore(home) as store:
        empty = store.create_run(PAUSE, name="no-steps", status="failed")
    junit = tmp_path / "report.xml"
    code, out, err = cli(
        capsys, home, "check", str(empty), "--against", "pause", "--junit", str(junit)
    )
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "too few timed steps" in err
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"


# -- the outputs for CI ----------------------------------------------------------------------
def test_markdown_summary(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(
        capsys, home, "check", "slow", "--against", "pause", "--format", "markdown"
    )
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("### ❌ stepscope check: run ") and "`slow` is slower" in lines[0]
    header = lines.index("| figure | baseline | run | speed | 95 % CI | time change | verdict |")
    assert lines[header + 1].startswith("| --- |")
    assert lines[header + 2].startswith("| throughput |") and lines[header + 2].endswith("slower |")
    assert "#### What regressed (largest change first)" in lines
    assert "is slower than" in err  # the verdict for the CI log, the summary in its file
    code, out, _ = cli(
        capsys, home, "check", "pause-again", "--against", "pause", "--format", "markdown"
    )
    assert code == 0 and out.startswith("### ✅ stepscope check: ")


def test_junit_report(home: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    slow, same = tmp_path / "slow.xml", tmp_path / "ci" / "same.xml"
    code, *_ = cli(capsys, home, "check", "infer-slow", "--against", "infer", "--junit", str(slow))
    assert code == 1
    root = ET.parse(slow).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1 and suites[0].get("name") == "stepscope check"
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == ["p50 latency", "p99 latency"]
    assert all(c.find("failure") is not None for c in cases)
    assert (suites[0].get("tests"), suites[0].get("failures"), suites[0].get("errors")) == (
        "2",
        "2",
        "0",
    )
    assert "allowed slowdown 5 %" in (cases[0].find("failure").get("message") or "")
    code, *_ = cli(capsys, home, "check", "pause-again", "--against", "pause", "--junit", str(same))
    assert code == 0
    suite = ET.parse(same).getroot().find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures")) == ("1", "0")
    assert suite.find("testcase/failure") is None


def test_json_output(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, home, "check", "slow", "--against", "pause", "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and data["verdict"] == "slower"
    assert data["figures"][0]["name"] == "throughput"
    lo, hi = data["figures"][0]["ci"]
    assert lo <= data["figures"][0]["speed_ratio"] <= hi


# -- tags ----------------------------------------------------------------------------------
def test_tags_on_both_backends(
    store_backend: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Set, move, list, resolve and delete, on SQLite and on PostgreSQL."""
    home = tmp_path / "home"
    with RunStore(home) as store:
        first = store.create_run(PAUSE, name="bench", status="completed")
        second = store.create_run(PAUSE, name="bench", status="completed")
        other = store.create_run(PAUSE, name="main-baseline", status="completed")
    code, out, _ = cli(capsys, home, "tag", str(first), "main-baseline")
    assert code == 0 and out.strip() == f"tag main-baseline: run {first} 'bench'"
    code, out, _ = cli(capsys, home, "tag", "last", "main-baseline")
    assert code == 0 and f"run {first} -> run {other}" in out
    code, out, _ = cli(capsys, home, "tag", str(second), "main-baseline")
    assert code == 0 and f"run {other} -> run {second}" in out
    code, out, _ = cli(capsys, home, "tag", str(second), "main-baseline")
    assert "already there" in out
    code, out, _ = cli(capsys, home, "tag", str(first), "nightly")
    code, out, _ = cli(capsys, home, "tag", "--list", "--json")
    listed = {t["name"]: t for t in json.loads(out)}
    assert set(listed) == {"main-baseline", "nightly"}
    assert listed["main-baseline"]["run_id"] == second and listed["nightly"]["run_id"] == first
    assert listed["nightly"]["run_name"] == "bench" and listed["nightly"]["host"]
    code, out, _ = cli(capsys, home, "tag", "--list")
    assert code == 0 and "main-baseline" in out and "nightly" in out
    with RunStore(home) as store:
        # a tag means the run it was set on, over the run named like it
        assert store.resolve_run("main-baseline") == second
        assert store.resolve_run("nightly") == first
    code, out, _ = cli(capsys, home, "tag", "--delete", "main-baseline")
    assert code == 0 and f"was on run {second}" in out
    with RunStore(home) as store:
        assert store.resolve_run("main-baseline") == other  # the run's name again
        with pytest.raises(RunNotFound, match="nor a tag"):
            store.resolve_run("nightly-2")
        assert list(store.tags()["name"]) == ["nightly"]


def test_tag_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    with RunStore(home) as store:
        store.create_run(PAUSE, name="bench", status="completed")
    for args, words, exit_code in (
        (("tag", "last", "12"), "run id", 2),
        (("tag", "last", "latest"), "newest run", 2),
        (("tag", "last", "two words"), "no spaces", 2),
        (("tag", "no-such-run", "base"), "no-such-run", 1),  # an unknown run: 1 everywhere
        (("tag", "--delete", "base"), "no tag 'base'", 2),
        (("tag", "last"), "RUN NAME", 2),
        (("tag", "last", "base", "--list"), "take no RUN NAME", 2),
    ):
        code, out, err = cli(capsys, home, *args)
        assert code == exit_code and out == "", args
        assert len(err.strip().splitlines()) == 1 and words in err, (args, err)


def test_a_version_7_store_gains_the_tags_table(store_backend: str, tmp_path: Path) -> None:
    """A store made before tags (schema 7, on either backend) gets the table when opened."""
    home = tmp_path / "home"
    with RunStore(home) as store:
        run_id = store.create_run(PAUSE, name="bench", status="completed")
        store._db.execute("DROP TABLE tags")
        store._db.execute("ALTER TABLE runs DROP COLUMN signature")  # version 9's
        store._db.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    with RunStore(home) as store:
        assert store.set_tag("main-baseline", run_id) is None
        assert store.resolve_run("main-baseline") == run_id
        assert store._db.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(
            SCHEMA_VERSION
        )
