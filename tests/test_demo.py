"""`stepscope demo`: the whole loop into its own store, and a store it must not empty."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.app.cli.demo import MARKER, DemoError, fresh_home
from stepscope.store import RunStore


def test_fresh_home_empties_only_a_demo_store(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "stepscope.db").write_text("the user's runs")
    with pytest.raises(DemoError, match="not made by `stepscope demo`"):
        fresh_home(mine)
    assert (mine / "stepscope.db").exists()  # nothing lost
    demo = fresh_home(tmp_path / "demo")
    (demo / "stepscope.db").write_text("an old demo")
    again = fresh_home(demo)
    assert sorted(p.name for p in again.iterdir()) == [MARKER]


@pytest.mark.slow
def test_demo_records_diagnoses_and_compares(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepscope.app.cli",
            "--home",
            str(home),
            "demo",
            "--no-dashboard",
            "--steps",
            "10",  # enough for the capture (steps 5-7) and timed steps on either side
            "--trials",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "I/O / input_pipeline" in out.stdout
    assert "Keep:" in out.stdout or "No fix measured faster" in out.stdout
    with RunStore(home) as store:
        runs = store.runs()
        baseline = int(runs["id"].min())
        assert store.findings(baseline)[0].subtype == "input_pipeline"
        (experiment,) = store.experiments(baseline_run_id=baseline)
        assert experiment["status"] == "completed"
        # the baseline and every trial are ordinary runs linked to it
        assert (runs["parent_run_id"].dropna() == baseline).all()
        assert len(runs) > 2
