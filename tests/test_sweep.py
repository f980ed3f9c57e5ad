"""The batch-size sweep of an inference job: one row per factor, with the batch size the
job's DataLoader really got, stored as an experiment and shown on the Optimize page.

One real sweep (tests/jobs/infer_loader.py, batch 8, factors 1, 2, 4, a few steps) is
shared by the tests; the page is checked on it under Streamlit's AppTest, and its
control starts a second, smaller sweep in the background.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import wait_experiment
from rich.console import Console
from streamlit.testing.v1 import AppTest

from stepscope.app.cli.sweep import render_sweep
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.sweeps.sweep import parse_factors
from stepscope.optim_runner.sweeps.sweep_figures import knee
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"
REPO = JOBS.parents[1]
ENTRY = REPO / "stepscope" / "app" / "dashboard" / "main.py"
BATCH = 8


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


# -- figures on hand-made rows ---------------------------------------------------------------
def test_factors_and_the_knee() -> None:
    assert parse_factors(None) == [1, 2, 4, 8]
    assert parse_factors("4, 2") == [1, 2, 4]  # the job as it is is always measured
    for bad in ("x", "0,2", "2,4096"):
        with pytest.raises(ValueError, match="--batch-factors"):
            parse_factors(bad)
    rows = [
        {"factor": 1, "batch_size": 8, "samples_per_s": 100.0},
        {"factor": 2, "batch_size": 16, "samples_per_s": 170.0},
        {"factor": 4, "batch_size": 32, "samples_per_s": 195.0},
        {"factor": 8, "batch_size": 64, "samples_per_s": 200.0},
        {"factor": 16, "status": "failed"},
    ]
    found = knee(rows)
    assert found is not None
    assert found["factor"] == 4 and found["batch_size"] == 32 and found["best_factor"] == 8
    rows[2]["samples_per_s"] = 150.0  # now only x8 is within 10 % of the best
    assert knee(rows)["factor"] == 8  # type: ignore[index]
    assert knee([{"factor": 1, "status": "failed"}]) is None


# -- a real sweep ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("sweep") / "home"
    job = [sys.executable, str(JOBS / "infer_loader.py"), "--calls", "40"]
    job += ["--batch-size", str(BATCH)]
    run_id, code = launch_run(job, home=home, max_steps=8, name="infer", quiet=True)
    assert code == 0
    out = _cli(
        home,
        *("optimize", str(run_id), "--sweep", "batch", "--batch-factors", "2,4"),
        *("--steps", "6", "--trials", "1", "--json"),
    )
    assert out.returncode == 0, out.stderr
    return {"home": home, "run_id": run_id, "result": json.loads(out.stdout)}


def test_one_row_per_factor_with_the_batch_size_applied(swept) -> None:
    result = swept["result"]
    assert result["kind"] == "sweep" and result["factors"] == [1, 2, 4]
    rows = {r["factor"]: r for r in result["rows"]}
    assert sorted(rows) == [1, 2, 4]
    with RunStore(swept["home"]) as store:
        for factor, row in rows.items():
            assert row["status"] == "completed", row
            assert row["batch_size"] == BATCH * factor  # what the steps recorded
            (run_id,) = row["runs"]
            run = store.run(run_id)
            assert run["parent_run_id"] == swept["run_id"]
            applied = [e for e in run["config"].get("applied", []) if e["fix"] == "larger_batch"]
            if factor == 1:
                assert applied == [] and row["applied"] is None  # the job as it is
            else:  # read back from the job's DataLoader
                assert applied and applied[0]["verified"] is True
                assert applied[0]["change"] == f"batch_size {BATCH} -> {BATCH * factor}"
                assert row["applied"] == BATCH * factor
            assert row["samples_per_s"] > 0 and row["p50_s"] <= row["p99_s"]
            lo, hi = row["p99_ci"]
            assert lo <= row["p99_s"] <= hi
    assert result["knee"]["factor"] in rows


def test_the_sweep_is_stored_as_an_experiment(swept) -> None:
    result = swept["result"]
    with RunStore(swept["home"]) as store:
        row = store.experiment(result["experiment_id"])
    assert row["status"] == "completed" and row["config"]["kind"] == "sweep"
    assert row["result"]["rows"] == result["rows"]
    console = Console(record=True, width=160)
    render_sweep(result, console)
    text = console.export_text()
    assert "Per batch size" in text and "<- knee" in text
    assert f"Knee: batch {result['knee']['batch_size']}" in text


def test_a_training_run_without_a_batch_size_is_refused_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = [sys.executable, str(JOBS / "gan.py")]  # no DataLoader, no batch flag
    run_id, code = launch_run(job, home=home, max_steps=4, quiet=True)
    assert code == 0
    out = _cli(home, "optimize", str(run_id), "--sweep", "batch")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"stepscope: run {run_id} has no batch size to change: no batch-size flag in its "
        "command (--batch-size N, --batch_size N, --batch N, ...) and no DataLoader with a "
        "batch size"
    ]
    limited = _cli(home, "optimize", str(run_id), "--memory-limit", "2GB")
    assert limited.returncode == 2 and "--memory-limit is for --sweep batch" in limited.stderr


# -- the Optimize page -----------------------------------------------------------------------
def _page(**params: str) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=120)
    at.run()
    at.query_params.update(params)
    at.switch_page("views/optimize/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_optimize_page_shows_the_sweep_table_and_curve(swept, monkeypatch) -> None:
    monkeypatch.setenv("STEPSCOPE_HOME", str(swept["home"]))
    result = swept["result"]
    at = _page(experiment=str(result["experiment_id"]))
    table = next(df.value for df in at.dataframe if "loader batch (read back)" in df.value)
    assert list(table["factor"]) == ["x1", "x2", "x4"]
    assert list(table["batch size"]) == [BATCH, 2 * BATCH, 4 * BATCH]
    assert list(table["knee"]).count("◀ knee") == 1
    assert any(f"batch {result['knee']['batch_size']}" in s.value for s in at.success)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    curve = next(s for s in specs if any(t.get("name") == "samples/s" for t in s["data"]))
    assert curve["data"][0]["x"] == [BATCH, 2 * BATCH, 4 * BATCH]
    assert [t["name"] for t in curve["data"]] == ["samples/s", "p99 latency per batch (ms)"]
    outcomes = next(df.value for df in at.dataframe if "outcome" in df.value)
    assert f"knee at batch {result['knee']['batch_size']}" in " ".join(outcomes["outcome"])


def test_the_sweep_control_starts_a_sweep_in_the_background(swept, monkeypatch) -> None:
    home = swept["home"]
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = _page(run=str(swept["run_id"]), new="1")  # the set-up form, not the last sweep
    at.text_input(key="sweep_factors").set_value("2")
    at.number_input(key="sweep_trials").set_value(1)
    at.number_input(key="sweep_steps").set_value(4)
    at.button(key="sweep").click().run()
    row = wait_experiment(home, int(at.query_params["experiment"]), timeout=120)
    assert row["status"] == "completed", row["error"]
    assert row["config"]["factors"] == [1, 2] and row["config"]["steps"] == 4
    assert [r["batch_size"] for r in row["result"]["rows"]] == [BATCH, 2 * BATCH]
