"""An experiment on a run that ran out of memory makes it fit (issue 38, part 4).

Real runs under the real launcher and a real SQLite store: the corpus's GPT trainer
(examples/corpus/gpt_trainer.py) with a short sequence, a small vocabulary and 12
blocks, so that its blocks' activations (the attention scores) are most of its memory,
at batch 16 under a 1.4 GB address-space limit. Measured on a loaded 2-core machine
under ``stepscope run`` without a limit (peak address space / peak RSS): plain 1.66 GB /
1.13 GiB, with its blocks checkpointed 1.18 GB / 0.66 GiB: the limit sits ~260 MB below
the one and ~220 MB above the other.
``optimize`` runs the baseline once more under the limit, sees it run out again, runs
each candidate under the same limit and says which fit. The checks compare what
happened (statuses, failure kinds, peaks against the limit), never times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import memory_cli

from stepscope.optim_runner.trials.failures import ran_out_of_memory
from stepscope.optim_runner.trials.plan import PlannedFix, memory_fixes
from stepscope.optim_runner.verdict.fits import fit_answer, size_text
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
GPT = str(REPO / "examples" / "corpus" / "gpt_trainer.py")
LIMIT = "1.4GB"
LIMIT_BYTES = 1_400_000_000
# activations dominate: checkpointing the 12 blocks lowers the address space by ~480 MB
JOB = ("--batch", "16", "--layers", "12", "--dim", "64", "--seq", "256", "--vocab", "256")
STEPS = "4"
TIMEOUT_S = 480


def stepscope(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return memory_cli(home, *args, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def oom_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The GPT trainer run out of memory under the limit: (home, run id)."""
    home = tmp_path_factory.mktemp("oom_fit")
    proc = stepscope(
        home, "run", "--memory-limit", LIMIT, "--", sys.executable, GPT, *JOB, "--steps", STEPS
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    with RunStore(home) as store:
        run = store.run(store.resolve_run("last"))
    assert run["status"] == "failed" and ran_out_of_memory(run), run.get("error")
    return home, int(run["id"])


def optimize(home: Path, run_id: int, *extra: str) -> subprocess.CompletedProcess:
    return stepscope(home, "optimize", str(run_id), "--trials", "1", "--steps", STEPS, *extra)


@pytest.mark.slow
def test_checkpointing_makes_the_run_fit_under_the_same_limit(
    oom_run: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, run_id = oom_run
    proc = optimize(home, run_id, "--json")  # the recommended fixes
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    assert result["goal"] == "fit"
    # of the fixes recommended, those that free memory (bf16 autocast needs consent);
    # speed fixes (torch.compile, the fused optimizer) wait for a run that fits
    assert [f["id"] for f in result["fixes"]] == ["activation_checkpointing"]
    oom = result["out_of_memory"]
    assert oom["runs_out"] is True and oom["limit_bytes"] == LIMIT_BYTES
    (cand,) = result["candidates"]
    with RunStore(home) as store:
        check = store.run(oom["check_run"])
        trial = store.run(cand["runs"][0])
    # the baseline ran out again, under the same limit
    assert check["status"] == "failed" and ran_out_of_memory(check)
    assert check["config"]["memory_limit"] == LIMIT_BYTES
    assert result["baseline"]["runs"] == [oom["check_run"]]
    # the checkpointed arm completed its steps under that limit, its blocks wrapped
    assert trial["status"] in ("completed", "stopped") and not ran_out_of_memory(trial)
    assert trial["config"]["memory_limit"] == LIMIT_BYTES
    (applied,) = [e for e in trial["config"]["applied"] if e["fix"] == "activation_checkpointing"]
    assert applied["applied"] and "12 Block blocks" in applied["change"]
    assert cand["fits"] is True and cand["fit"] == "fits"
    assert 0 < cand["peak_bytes"] < LIMIT_BYTES and cand["peak_basis"] == "rss"
    assert cand["steps_per_s"] > 0 and cand["speed"].endswith("steps/s")  # no DataLoader
    assert [f["name"] for f in result["fits"]] == ["all"]
    best = result["best"]
    assert best["fits"] is True and best["fixes"] == ["activation_checkpointing"]
    assert best["answer"].startswith(
        "the baseline runs out of memory under 1.4 GB; fits with: activation_checkpointing (peak "
    )
    assert best["answer"].endswith(f"{cand['speed']})")
    # the Optimize page gives the same answer
    from dashboard_helpers import open_page  # local: Streamlit

    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("optimize", experiment=str(result["experiment_id"]))
    assert not at.exception, [e.value for e in at.exception]
    assert [s.value for s in at.success] == [best["answer"]]
    table = next(t.value for t in at.dataframe if "candidate" in t.value.columns)
    assert table.set_index("candidate").loc["all", "status"] == "fits"


@pytest.mark.slow
def test_an_arm_that_still_runs_out_is_said_and_none_fits(oom_run: tuple[Path, int]) -> None:
    home, run_id = oom_run
    # named: a fix that frees no activation runs out again
    proc = optimize(home, run_id, "--fixes", "fused_optimizer")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "still runs out" in proc.stdout
    assert (
        "the baseline runs out of memory under 1.4 GB; none of the candidates fits" in proc.stdout
    )
    assert "gradient accumulation" in proc.stdout
    with RunStore(home) as store:
        experiment = store.experiments(run_id)[0]
    result = experiment["result"]
    (cand,) = result["candidates"]
    assert cand["fits"] is False and cand["failure"] == "oom" and cand["fit"] == "still runs out"
    assert result["fits"] == [] and result["best"]["fits"] is False
    assert result["best"]["fixes"] == []


def test_the_fastest_arm_that_fits_is_kept_and_none_fitting_gives_the_advice() -> None:
    def arm(name: str, fits: bool | None, **figures: Any) -> dict[str, Any]:
        return {"name": name, "fixes": name.split("+"), "fits": fits, "peak_bytes": 7e8, **figures}

    fast = arm("a+b", True, steps_per_s=3.2, speed="3.2 steps/s")
    slow = arm("a", True, steps_per_s=2.0, speed="2 steps/s")
    top, answer = fit_answer(2.5e9, [slow, arm("b", False), fast])
    assert top is fast
    assert answer == (
        "the baseline runs out of memory under 2.5 GB; fits with: a, b (peak 700 MB, 3.2 steps/s)"
    )
    top, answer = fit_answer(None, [arm("b", False), arm("c", None)])
    assert top is None and answer.startswith("the baseline runs out of memory on its device; none")
    assert "gradient accumulation" in answer
    assert (size_text(1_400_000_000), size_text(691_081_216)) == ("1.4 GB", "691 MB")
    # on a run that ran out: the fixes that free memory (with what they need), else all
    speed, ckpt = PlannedFix("torch_compile"), PlannedFix("activation_checkpointing")
    assert memory_fixes([speed, ckpt]) == [ckpt]
    assert memory_fixes([speed]) == [speed]


@pytest.mark.slow
def test_a_baseline_that_fits_now_goes_on_as_usual(tmp_path: Path) -> None:
    job = REPO / "tests" / "jobs" / "oom_once.py"
    marker = tmp_path / "ran_once"
    command = [sys.executable, str(job), "--marker", str(marker), "--steps", STEPS]
    proc = stepscope(tmp_path, "run", "--memory-limit", LIMIT, "--", *command)
    assert proc.returncode == 1 and marker.exists(), proc.stderr[-2000:]
    with RunStore(tmp_path) as store:
        run_id = int(store.resolve_run("last"))
        assert ran_out_of_memory(store.run(run_id))
    proc = optimize(tmp_path, run_id, "--fixes", "fused_optimizer", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    oom = result["out_of_memory"]
    assert oom["runs_out"] is False and "goes on as usual" in oom["note"]
    assert result["goal"] == "time" and "fits" not in result
    assert oom["check_run"] not in result["baseline"]["runs"]  # out of the statistics
    assert len(result["baseline"]["runs"]) == 1
    (cand,) = result["candidates"]
    assert cand["status"] == "completed" and cand["speedup"] is not None
