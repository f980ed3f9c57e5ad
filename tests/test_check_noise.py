"""`stepscope check` never fails on run-to-run noise (issue 36, item 8).

The false alarm replayed: one real run of tests/jobs/pause.py (120 steps of 8 ms, no
pause: a tight interval over its steps), and the same run again as a slower minute of
the machine would have recorded it, every step 15 % longer (written into the store
directly, so that the spread is exact and no test depends on the machine's mood). The
two are one unchanged job: the check must never say "slower" of them, whatever it knows.

- one run a side, no history, no calibration: inconclusive (exit 0 with a warning line;
  3 with ``--inconclusive fail``);
- a ``calibrate --noise`` entry for this host, or earlier runs of the names: the
  interval is widened by that spread, and the verdict line says so;
- three runs a side: judged over them by default, and a real 15 % shift is found;
- more work per step (real runs of tests/jobs/train.py with 3 extra matmuls a step)
  still fails one against one, with nothing known of the spread.

Verdicts and texts are asserted, never timings.
"""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_check import calibrated

from stepscope.app.cli.main import main
from stepscope.collectors.launch.contract import PROFILE_AUTO
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.check.check_result import INCONCLUSIVE, OVER_RUNS, STEPS_ONLY, WIDENED
from stepscope.optim_runner.check.perf_check import NO_SLOWDOWN, SLOWER, check_runs
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"
PAUSE = [sys.executable, str(JOBS / "pause.py"), "--steps", "120", "--compute-ms", "8"]
PAUSE += ["--pause-ms", "0"]
TRAIN = JOBS / "train.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with one real run "base" of the 8 ms job."""
    home = tmp_path_factory.mktemp("noise") / "home"
    _, code = launch_run(PAUSE, name="base", home=home, quiet=True)
    assert code == 0
    return home


@pytest.fixture
def home(recorded: Path, tmp_path: Path) -> Path:
    """A copy of the recorded store for one test to add runs to."""
    dest = tmp_path / "home"
    shutil.copytree(recorded, dest)
    return dest


def replayed(home: Path, name: str, scale: float, source: str = "base") -> int:
    """A finished run ``name`` of the same command whose steps are ``source``'s first
    run's, each ``scale`` times as long (the machine slower or faster for that run)."""
    with RunStore(home) as store:
        first = int(store.runs().query("name == @source")["id"].min())
        steps = store.steps(first)
        run_id = store.create_run(store.run(first)["command"], name=name, status="running")
        t0 = float(steps["start_s"].min())
        rows = []
        for row in steps.to_dict("records"):
            scaled = {k: row[k] * scale for k in ("forward_s", "backward_s", "optimizer_s")}
            scaled.update(data_wait_s=row["data_wait_s"] * scale, profiled=row["profiled"])
            rows.append({
                "step": row["step"], "rank": row["rank"], "batch_size": row["batch_size"],
                "kind": row["kind"], "loss": row["loss"],
                "start_s": t0 + (row["start_s"] - t0) * scale,
                "end_s": t0 + (row["end_s"] - t0) * scale, **scaled,
            })  # fmt: skip
        store.add_steps(run_id, rows)
        store.finish_run(run_id, "completed", 0)
    return run_id


def cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--home", str(home), "check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_false_alarm_is_inconclusive_without_a_spread(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replayed(home, "base2", 1.15)
    with RunStore(home) as store:
        steps_only = check_runs(store, "base2", "base")
    assert steps_only.verdict == INCONCLUSIVE and steps_only.exit_code == 0
    (figure,) = steps_only.figures
    assert figure.basis == STEPS_ONLY and figure.verdict == INCONCLUSIVE
    assert figure.ci.hi < 1 / 1.05  # its per-step interval alone would have said "slower"
    code, out, err = cli(capsys, home, "base2", "--against", "base")
    assert code == 0, out + err
    assert "cannot be judged yet against" in out.splitlines()[0]
    assert "knows nothing of run-to-run spread" in out and "calibrate --noise" in out
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert warning.startswith("stepscope check: warning: inconclusive, passing: throughput")
    code, out, err = cli(capsys, home, "base2", "--against", "base", "--inconclusive", "fail")
    assert code == 3 and "inconclusive, failing (--inconclusive fail)" in err
    for policy, counts in (("pass", ("0", "1")), ("fail", ("1", "0"))):
        junit = home / f"{policy}.xml"
        args = ("--inconclusive", policy, "--junit", str(junit))
        cli(capsys, home, "base2", "--against", "base", *args)
        suite = ET.parse(junit).getroot().find("testsuite")
        assert suite is not None and (suite.get("failures"), suite.get("skipped")) == counts
    code, out, _ = cli(capsys, home, "base2", "--against", "base", "--format", "json")
    doc = json.loads(out)
    assert (doc["verdict"], doc["exit_code"], doc["inconclusive"]) == (INCONCLUSIVE, 0, True)
    assert "knows nothing of run-to-run spread" in doc["why"]
    assert doc["figures"][0]["interval"]["basis"] == STEPS_ONLY
    code, out, _ = cli(capsys, home, "base2", "--against", "base", "--format", "markdown")
    assert code == 0 and out.startswith("### ⚠️ stepscope check: ")


def test_a_faster_run_is_not_called_faster_without_a_spread(home: Path) -> None:
    """The interval that is too narrow to fail a run is too narrow to praise it."""
    replayed(home, "quick", 1 / 1.15)
    with RunStore(home) as store:
        result = check_runs(store, "quick", "base", operators=False)
    assert result.verdict == NO_SLOWDOWN and result.figures[0].ci.lo > 1.0
    assert result.exit_code == 0


def test_the_hosts_calibration_widens_the_interval(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replayed(home, "base2", 1.15)
    calibrated(home, sd=0.08)
    code, out, err = cli(capsys, home, "base2", "--against", "base")
    assert code == 0, out + err
    assert "is not measurably slower than" in out.splitlines()[0]
    assert "widened by this host's run-to-run spread: 8.0 % per run" in out
    assert "stepscope calibrate --noise, 2026-11-28 10:00" in out and "warning" not in err
    code, out, _ = cli(capsys, home, "base2", "--against", "base", "--format", "json")
    figure = json.loads(out)["figures"][0]
    assert figure["interval"]["basis"] == WIDENED
    assert [s["source"] for s in figure["interval"]["spread"]] == ["calibration"] * 2
    assert figure["interval"]["spread"][0]["df"] == 4
    # a real regression beyond the spread is still found one against one
    replayed(home, "base3", 2.0)
    with RunStore(home) as store:
        slower = check_runs(store, "base3", "base", operators=False)
    assert slower.verdict == SLOWER and slower.figures[0].basis == WIDENED


def test_same_name_history_widens_the_interval(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two earlier runs of "base" (as a machine that wanders by about 5 % gives them):
    the baseline's own history is the spread, and says so; no calibration needed."""
    replayed(home, "base", 0.95)
    replayed(home, "base", 1.06)
    replayed(home, "base2", 1.15)
    code, out, err = cli(capsys, home, "base2", "--against", "base")
    assert code == 0, out + err
    assert "widened by this host's run-to-run spread" in out
    assert "from 3 runs of 'base' on " in out and "warning" not in err
    with RunStore(home) as store:
        result = check_runs(store, "base2", "base", operators=False)
        # history stops at the newer run checked: an old check gives the answer it gave
        older = check_runs(store, 2, 1, runs=1, operators=False)
    assert result.verdict == NO_SLOWDOWN and result.baseline_ids == (result.baseline_id,)
    assert result.figures[0].spread[0].df == 2  # three runs of one name
    assert older.figures[0].basis == WIDENED and "2 runs of 'base'" in older.why


def test_three_runs_a_side_are_used_by_default(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """By default (no --runs), each side's newest runs of its name are judged over when
    each has 3; the named runs and the runs used are said. A 15 % shift over runs that
    spread by about 2 % is found; the same spread without the shift is not."""
    for scale in (1.02, 0.98):
        replayed(home, "base", scale)
    for name, shift in (("same", 1.0), ("shifted", 1.15)):
        for scale in (1.01, 0.99, 1.02):
            replayed(home, name, shift * scale)
    code, out, err = cli(capsys, home, "shifted", "--against", "base", "--no-operators")
    assert code == 1, out + err
    assert "Student's t over 3 baseline runs and 3 runs" in out
    with RunStore(home) as store:
        runs = store.runs()
        shifted = check_runs(store, "shifted", "base", operators=False)
        same = check_runs(store, "same", "base", operators=False)
        one = check_runs(store, "same", "base", runs=1, operators=False)
    newest = runs.query("name == 'shifted'")["id"].sort_values(ascending=False).tolist()
    assert shifted.run_ids == tuple(newest) and len(shifted.baseline_ids) == 3
    assert shifted.verdict == SLOWER and shifted.figures[0].basis == OVER_RUNS
    assert any(f"judged over 3 baseline run(s) ({', '.join(map(str, shifted.baseline_ids))})"
               in n for n in shifted.notes)  # fmt: skip
    assert same.verdict == NO_SLOWDOWN and same.figures[0].basis == OVER_RUNS
    # --runs 1 is one against one, widened by the names' history
    assert one.run_ids == (one.run_id,) and one.figures[0].basis == WIDENED


def test_bad_runs_and_inconclusive_options_are_one_line(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, words in (
        (("--runs", "0"), "at least 1 run"),
        (("--runs", "many"), "'auto'"),
    ):
        code, out, err = cli(capsys, home, "base", "--against", "base", *args)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, args
        assert words in err and "--runs" in err
    with pytest.raises(SystemExit):  # argparse's choices: exit 2 with its usage line
        main(["--home", str(home), "check", "base", "--against", "base", "--inconclusive", "x"])
    with RunStore(home) as store, pytest.raises(ValueError, match="'pass' or 'fail'"):
        check_runs(store, "base", "base", inconclusive="maybe")


@pytest.fixture(scope="module")
def extra_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real runs of tests/jobs/train.py, "more" with 3 extra matmuls a step, each with
    `stepscope run`'s default capture (the trace the added work is read from)."""
    home = tmp_path_factory.mktemp("work") / "home"
    for name, extra in (("plain", "0"), ("more", "3")):
        job = [sys.executable, str(TRAIN), "--steps", "40", "--compute", extra]
        _, code = launch_run(job, name=name, home=home, quiet=True, profile_at=PROFILE_AUTO)
        assert code == 0
    return home


def test_more_work_per_step_fails_one_against_one(
    extra_work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No history, no calibration: time cannot be judged, work can."""
    code, out, err = cli(capsys, extra_work, "more", "--against", "plain", "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == SLOWER, doc["why"]
    assert doc["why"].startswith("more work per step: aten::mm (256x256, 256x256)")
    assert doc["figures"][0]["interval"]["basis"] == STEPS_ONLY
    assert doc["figures"][0]["verdict"] in (INCONCLUSIVE, NO_SLOWDOWN)
    assert "warning" not in err
