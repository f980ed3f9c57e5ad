"""A capture that covered no complete step of the job, as the Run page says it (issue 39)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dashboard_helpers import no_errors, open_page, texts

from stepscope.analyzers.rules.diagnosis import NO_COMPLETE_STEP, saved_diagnosis
from stepscope.collectors.launch.launcher import launch_run
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"


def test_the_run_page_says_the_capture_covered_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the capture opens at step 4 of a 4-step job: it holds only the job's tail (LBFGS's
    # 58 s steps: "host overhead, 100 % of step time" from 5.6 ms after the last step)
    home = tmp_path / "h"
    run_id, code = launch_run(
        [sys.executable, str(JOBS / "train.py"), "--steps", "4", "--sleep", "0.3"],
        home=home,
        quiet=True,
        profile_at=4,
        profile_steps=3,
    )
    assert code == 0
    with RunStore(home) as store:
        saved = saved_diagnosis(store, run_id)
    assert saved is not None and saved.capture_note == NO_COMPLETE_STEP
    assert saved.level != "trace"
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(run_id))
    no_errors(at)
    assert "The capture covered no complete step" in texts(at)
    assert "Host overhead: many tiny operators" not in texts(at)


def _default_capture(home: Path, *args: str) -> tuple[dict, list[str]]:
    """train.py under the default capture: its one trace's meta, and its log lines."""
    run_id, code = launch_run(
        [sys.executable, str(JOBS / "train.py"), *args], home=home, quiet=True, profile_at="auto"
    )
    assert code == 0
    with RunStore(home) as store:
        arts = store.artifacts(run_id)
        messages = store.events(run_id)["message"].tolist()
    traces = arts[arts["kind"] == "trace"]
    assert len(traces) == 1, arts
    return traces["meta"].iloc[0], messages


def test_long_steps_are_captured_one_whole_step_at_a_time(tmp_path: Path) -> None:
    # steps of 1.2 s (8 samples of 0.15 s): the default capture covers one whole step,
    # not three (an LBFGS job's three steps made a 38 MB trace that held it for 100 s)
    meta, _ = _default_capture(tmp_path / "h", "--steps", "7", "--sleep", "0.15")
    assert meta["steps"] == 1, meta
    assert "one step captured (steps of 1." in meta["reason"], meta


def test_the_default_window_ends_at_its_time_bound_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bound of 0.3 s: the default window of 3 steps of 0.4 s ends after its first
    monkeypatch.setenv("STEPSCOPE_CAPTURE_BOUND_S", "0.3")
    meta, messages = _default_capture(tmp_path / "h", "--steps", "8", "--sleep", "0.05")
    assert meta["steps"] == 1, meta
    assert any(m.startswith("capture ended after 1 of 3 steps") for m in messages), messages
