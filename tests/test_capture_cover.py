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
