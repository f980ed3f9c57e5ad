"""The largest training batch that fits (issue 38, part 5): the batch flag of a command,
the peak fitted against the batch, the next batch to try, and a real sweep of the
corpus's GPT trainer under a real address-space limit.

The real sweep: examples/corpus/gpt_trainer.py, six blocks over 256 tokens (its attention
scores are most of its memory), recorded at batch 2 under a 1.6 GB limit, then
``stepscope optimize --sweep batch`` at batches 2 to 16 and the confirming runs. The
answer is checked against the job run by hand at the same limit: the batch found runs,
and the smallest batch the sweep saw run out of memory runs out again. What happened is
asserted (statuses, failure kinds, peaks against the limit), never a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import memory_cli, open_page, wait_experiment
from streamlit.testing.v1 import AppTest

from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.sweeps.batch_flag import find_batch_flag
from stepscope.optim_runner.sweeps.largest_batch import (
    VM_PEAK,
    answer,
    fit_peak,
    memory_basis,
    next_size,
    predict,
    settled,
)
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "jobs"
ENTRY = REPO / "stepscope" / "app" / "dashboard" / "main.py"
GPT = str(REPO / "examples" / "corpus" / "gpt_trainer.py")
JOB = ("--layers", "6", "--dim", "64", "--seq", "256", "--vocab", "256", "--steps", "4")
LIMIT = "1.6GB"
LIMIT_BYTES = 1_600_000_000
TIMEOUT_S = 900


# -- the batch flag ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "flag", "value", "replaced"),
    [
        (["python", "main.py", "--batch-size", "64"], "--batch-size", 64, "128"),
        (
            ["python", "train.py", "--batch_size=12", "--lr", "1"],
            "--batch_size",
            12,
            "--batch_size=24",
        ),
        (["python", "gpt.py", "--batch", "4", "--batch", "8"], "--batch", 8, "16"),
        (
            ["torchrun", "t.py", "--per_device_train_batch_size", "2"],
            "--per_device_train_batch_size",
            2,
            "4",
        ),
    ],
)
def test_the_batch_flag_is_found_and_only_its_value_changes(
    command: list[str], flag: str, value: int, replaced: str
) -> None:
    found = find_batch_flag(command)
    assert found is not None and (found.flag, found.value) == (flag, value)
    changed = found.command_with(command, value * 2)
    assert changed[found.index] == replaced
    assert [c for i, c in enumerate(changed) if i != found.index] == [
        c for i, c in enumerate(command) if i != found.index
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["python", "main.py", "--test-batch-size", "1000"],  # evaluation's, not training's
        ["python", "main.py", "--batch-size"],  # no value
        ["python", "main.py", "--batch-size", "auto"],
        ["python", "main.py", "--batch-size", "0"],
        ["python", "main.py", "--epochs", "3"],
    ],
)
def test_no_training_batch_flag(command: list[str]) -> None:
    assert find_batch_flag(command) is None


# -- the fit and the next batch ------------------------------------------------------------
def test_the_line_is_fitted_to_the_largest_batches() -> None:
    # the corpus's GPT trainer under 2.2 GB: the heap's slack at batch 8 lies above the line
    points = [(2, 1.17e9), (4, 1.49e9), (8, 1.99e9), (16, 1.61e9), (23, 1.97e9), (27, 2.19e9)]
    fit = fit_peak(points)
    assert fit is not None and fit["per_sample_bytes"] > 0
    assert 27 <= predict(fit, 2_200_000_000) < 31
    assert fit_peak([(4, 1e9), (4, 1.1e9)]) is None  # one batch size: no line
    assert predict({"fixed_bytes": 1e9, "per_sample_bytes": -1.0}, 2_000_000_000) is None
    assert predict(fit, None) is None


def test_the_next_batch_is_the_prediction_then_halfway() -> None:
    assert next_size(30, fits=16, runs_out=None) == 30  # the prediction first
    assert next_size(30, fits=16, runs_out=24) == 20  # outside the bracket: halfway
    assert next_size(1877, fits=16, runs_out=None) == 32  # too far: double, as finders do
    assert next_size(12, fits=16, runs_out=None) == 32  # below a batch that ran: double
    assert next_size(None, fits=27, runs_out=31) == 29
    assert settled(27, 28) and settled(100, 105) and not settled(100, 106)
    assert next_size(40, fits=27, runs_out=28) is None


def test_the_answer_is_a_batch_that_ran() -> None:
    basis = {"key": VM_PEAK, "limit_bytes": LIMIT_BYTES, "limit_source": "test"}
    rows = [
        {"batch_size": 2, "status": "completed", "peak_bytes": 1.0e9, "samples_per_s": 5.0},
        {"batch_size": 8, "status": "completed", "peak_bytes": 1.5e9, "samples_per_s": 6.0},
        {"batch_size": 16, "status": "failed", "failure": "oom"},
        {"batch_size": 9, "status": "failed", "failure": "oom"},
    ]
    out = answer(rows, basis, fit_peak([(2, 1.0e9), (8, 1.5e9)]))
    assert (out["batch_size"], out["smallest_out_of_memory"]) == (8, 9)
    assert out["settled"] is True and "batch 9 ran out of memory" in out["why"]
    none = answer(rows, {"key": "rss_bytes", "limit_bytes": None, "limit_source": None}, None)
    assert none["predicted"] is None and "--memory-limit" in none["why"]


def test_which_peak_is_held_against_which_limit() -> None:
    cpu = memory_basis({"config": {"memory_limit": LIMIT_BYTES}}, None)
    assert (cpu["key"], cpu["limit_bytes"]) == (VM_PEAK, LIMIT_BYTES)
    assert memory_basis({"config": {}}, 10**9)["limit_source"] == "--memory-limit of the sweep"
    gpu = memory_basis({"device": {"device_memory_bytes": 80 * 10**9, "device_name": "A100"}}, None)
    assert gpu["key"] == "cuda_reserved_bytes" and "A100" in gpu["limit_source"]
    assert memory_basis({"config": {}}, None)["limit_bytes"] is None


def page(**params: str) -> AppTest:
    at = open_page("optimize", **params)
    assert not at.exception, [e.value for e in at.exception]
    return at


# -- a real sweep ----------------------------------------------------------------------------
def stepscope(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # glibc's mapping threshold fixed (not raised as blocks are freed): every tensor above
    # 1 MiB is mapped and unmapped on its own, so the peak address space follows the live
    # tensors and the same batch runs out, or not, on every run (with the moving default a
    # run of this job once peaked higher at batch 8 than at 16: largest_batch.py)
    return memory_cli(home, *args, timeout=TIMEOUT_S, env={"MALLOC_MMAP_THRESHOLD_": str(1 << 20)})


def by_hand(home: Path, batch: int) -> dict[str, Any]:
    """The job run at ``batch`` under the limit, as a user searching by hand would."""
    proc = stepscope(
        home, "run", "--no-profile", "--memory-limit", LIMIT, "--",
        sys.executable, GPT, *JOB, "--batch", str(batch),
    )  # fmt: skip
    with RunStore(home) as store:
        run = store.run(store.resolve_run("last"))
    assert run["command"][-1] == str(batch), proc.stderr[-2000:]
    return run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    home = tmp_path_factory.mktemp("largest_batch")
    run = by_hand(home, 2)
    assert run["status"] == "completed", run.get("error")
    proc = stepscope(
        home, "optimize", str(run["id"]), "--sweep", "batch", "--batch-factors", "1,2,4,8",
        "--steps", "4", "--trials", "1", "--fixes", "activation_checkpointing", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = stepscope(home, "optimize", str(run["id"]), "--sweep", "batch", "--memory-limit", "x")
    return home, json.loads(proc.stdout), text.stderr


@pytest.mark.slow
def test_the_sweep_finds_a_batch_that_runs_and_one_that_runs_out(sweep) -> None:
    home, result, _ = sweep
    largest = result["largest_batch"]
    assert largest["limit_bytes"] == LIMIT_BYTES and largest["peak_key"] == VM_PEAK
    assert "the run's --memory-limit" in largest["limit_source"]
    rows = {r["batch_size"]: r for r in result["rows"]}
    assert rows[2]["status"] == "completed" and rows[2]["factor"] == 1
    assert "note" not in largest  # the peak grew with the batch: no miss below a fit
    for r in result["rows"]:  # every batch that ran stayed under the limit it ran under
        assert r["status"] == "completed" or r["failure"] == "oom", r
        if r["status"] == "completed":
            assert r["peak_bytes"] <= LIMIT_BYTES and r["samples_per_s"] > 0
    size, out = largest["batch_size"], largest["smallest_out_of_memory"]
    assert out is not None and size < out, largest
    assert rows[size]["status"] == "completed" and rows[out]["failure"] == "oom"
    assert any(r.get("confirm") for r in result["rows"])  # a prediction was run
    assert largest["fit"]["per_sample_bytes"] > 0 and largest["predicted"] is not None
    # a search by hand at the same limit agrees: the answer runs, the miss runs out
    assert by_hand(home, size)["status"] == "completed"
    missed = by_hand(home, out)
    assert missed["status"] == "failed" and (missed.get("config") or {}).get("oom"), missed["error"]


@pytest.mark.slow
def test_a_memory_fix_gets_its_own_curve_and_its_larger_batch(sweep, monkeypatch) -> None:
    """``--fixes activation_checkpointing``: every batch size again with the blocks
    checkpointed, in the same rounds; its peaks lie below the plain ones at each batch,
    and its own search finds a larger batch that runs under the same limit."""
    home, result, _ = sweep
    (curve,) = result["curves"]
    assert curve["fixes"] == ["activation_checkpointing"]
    plain = {r["batch_size"]: r for r in result["rows"] if r["status"] == "completed"}
    fixed = {r["batch_size"]: r for r in curve["rows"] if r["status"] == "completed"}
    assert {2, 4, 8} <= set(fixed)  # the sweep's own batches all ran with the fix
    for size in set(plain) & set(fixed):
        assert fixed[size]["peak_bytes"] < plain[size]["peak_bytes"], size
    with RunStore(home) as store:  # each of its trials had the blocks wrapped
        for r in curve["rows"]:
            for run_id in r["runs"]:
                applied = store.run(run_id)["config"]["applied"]
                assert any(
                    e["fix"] == "activation_checkpointing" and e["applied"] for e in applied
                ), applied
    largest, base = curve["largest_batch"], result["largest_batch"]
    assert largest["limit_bytes"] == LIMIT_BYTES
    assert largest["batch_size"] > base["batch_size"], (largest, base)
    assert fixed[largest["batch_size"]]["peak_bytes"] <= LIMIT_BYTES
    from stepscope.app.largest_batch_text import curves_line

    line = curves_line(result)
    assert line.startswith(f"Largest batch: {base['batch_size']} (")  # its samples/s
    assert " as it is; " in line
    assert f"{largest['batch_size']} (" in line and line.endswith("with activation_checkpointing")
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = page(experiment=str(result["experiment_id"]))
    assert any(i.value.startswith("With activation_checkpointing: Largest") for i in at.info)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    peaks = next(s for s in specs if s["data"][0].get("name") == "peak memory (GB)")
    assert "with activation_checkpointing (GB)" in [t["name"] for t in peaks["data"]]


@pytest.mark.slow
def test_the_sweep_reads_the_same_in_the_terminal_and_refuses_a_bad_limit(sweep) -> None:
    home, result, refused = sweep
    assert "--memory-limit" in refused and "not a size" in refused
    from rich.console import Console

    from stepscope.app.cli.sweep import render_sweep

    console = Console(width=200, record=True)
    render_sweep(result, console)
    text = console.export_text()
    size = result["largest_batch"]["batch_size"]
    assert f"Largest batch that fits under 1.6 GB (the run's --memory-limit): {size}" in text
    assert "ran out of memory" in text and "peak memory" in text
    assert "With activation_checkpointing: Largest batch that fits under 1.6 GB" in text
    assert f"Largest batch: {size} (" in text and " as it is; " in text


@pytest.mark.slow
def test_the_optimize_page_shows_the_largest_batch_and_the_peaks(sweep, monkeypatch) -> None:
    home, result, _ = sweep
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = page(experiment=str(result["experiment_id"]))
    size = result["largest_batch"]["batch_size"]
    assert any("Largest batch that fits under 1.6 GB" in s.value for s in at.success)
    assert any(f": {size}," in s.value for s in at.success)
    table = next(df.value for df in at.dataframe if "peak memory" in df.value)
    assert "fit" in list(table["factor"]) and "x1" in list(table["factor"])
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    peaks = next(s for s in specs if s["data"][0].get("name") == "peak memory (GB)")
    names = [t["name"] for t in peaks["data"]]
    assert "ran out of memory" in names and "fitted: fixed + bytes per sample" in names
    outcomes = next(df.value for df in at.dataframe if "outcome" in df.value)
    assert f"largest batch that fits {size}" in " ".join(outcomes["outcome"])


# -- a training job's DataLoader, and the page's form ------------------------------------------
@pytest.mark.slow
def test_a_loader_batch_is_swept_and_the_form_starts_a_search_under_a_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    job = [sys.executable, str(JOBS / "train.py"), "--steps", "30"]  # batch 8, no flag given
    run_id, code = launch_run(job, home=home, max_steps=6, quiet=True)
    assert code == 0
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = page(run=str(run_id), new="1")
    assert not at.button(key="fit_sweep").disabled
    at.text_input(key="fit_factors").set_value("2")
    at.text_input(key="fit_limit").set_value("3GB")
    at.number_input(key="fit_steps").set_value(4)
    at.button(key="fit_sweep").click().run()
    row = wait_experiment(home, int(at.query_params["experiment"]), timeout=300)
    assert row["status"] == "completed", row["error"]
    assert row["config"]["memory_limit"] == 3_000_000_000 and row["config"]["training"]
    result = row["result"]
    rows = {r["factor"]: r for r in result["rows"]}
    assert (rows[1]["batch_size"], rows[2]["batch_size"]) == (8, 16)
    assert rows[2]["applied"] == 16  # the DataLoader was rebuilt with it
    assert all(r["peak_bytes"] for r in result["rows"] if r["status"] == "completed")
    largest = result["largest_batch"]
    assert largest["limit_source"] == "--memory-limit of the sweep" and largest["batch_size"] >= 16
    with RunStore(home) as store:  # every trial ran under the sweep's limit
        trials = [store.run(r) for x in result["rows"] for r in x["runs"]]
    assert all(t["config"]["memory_limit"] == 3_000_000_000 for t in trials)


def test_a_miss_below_a_batch_that_ran_bounds_nothing_and_is_said() -> None:
    basis = {"key": VM_PEAK, "limit_bytes": LIMIT_BYTES, "limit_source": "test"}
    rows = [
        {"batch_size": 2, "status": "completed", "peak_bytes": 1.0e9},
        {"batch_size": 8, "status": "failed", "failure": "oom"},
        {"batch_size": 16, "status": "completed", "peak_bytes": 1.3e9},
    ]
    out = answer(rows, basis, None)
    assert out["batch_size"] == 16 and out["smallest_out_of_memory"] is None
    assert "batch 8 ran out of memory although batch 16 ran" in out["note"]


def test_only_fixes_that_free_memory_draw_a_curve() -> None:
    from stepscope.optim_runner.sweeps.memory_curves import memory_curve_fixes, with_fixes
    from stepscope.optim_runner.trials.trials import Arm

    assert memory_curve_fixes(None) == []
    assert memory_curve_fixes(["activation_checkpointing"] * 2) == ["activation_checkpointing"]
    with pytest.raises(
        ValueError, match="fused_optimizer frees no memory: .*activation_checkpointing"
    ):
        memory_curve_fixes(["fused_optimizer"])
    with pytest.raises(ValueError, match="unknown fix 'nope'"):
        memory_curve_fixes(["nope"])
    plain = Arm("x1", "baseline", [])
    curve = with_fixes(plain, ["activation_checkpointing"])
    assert (curve.name, curve.kind, curve.fix_ids) == (
        "x1 + activation_checkpointing",
        "alone",
        ["activation_checkpointing"],
    )
    assert with_fixes(plain, []) is plain
