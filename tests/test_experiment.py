"""Experiments end to end: real trial runs of real jobs, judged from the store.

Most tests share one experiment (``stepscope optimize --json``) on a job that reacts to
its plan file as fixes can go wrong or right (tests/jobs/plan_effects.py): one fix
crashes it, one raises the allocator's out-of-memory error, one hangs it, two make it
faster, one slower, one makes the loss overflow and one moves its level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from stepscope.collectors.launcher import launch_run
from stepscope.optim_runner.experiment import (
    cancel_experiment,
    failure_kind,
    start_experiment,
)
from stepscope.optim_runner.quality import check_quality
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EFFECTS = {
    "ddp_bucket_cap": "raise",
    "ddp_static_graph": "oom",
    "ddp_gradient_as_bucket_view": "hang",
    "fused_optimizer": "fast",
    "ddp_bf16_compression": "fast",
    "channels_last": "slow",
    "tf32": "diverge",
    "cudnn_benchmark": "drift",
}
FAILING = ("ddp_bucket_cap", "ddp_static_graph", "ddp_gradient_as_bucket_view")
WORKING = ("fused_optimizer", "ddp_bf16_compression", "channels_last", "tf32", "cudnn_benchmark")
HANG_TIMEOUT_S = 15


def _effects_command(*effects: str) -> list[str]:
    args = [a for fix in effects for a in ("--effect", f"{fix}={EFFECTS[fix]}")]
    return [sys.executable, str(JOBS / "plan_effects.py"), "--steps", "40", *args]


def _record(home: Path, command: list[str], steps: int = 10) -> int:
    """The user's run: the job recorded once, as `stepscope run` would."""
    run_id, code = launch_run(command, home=home, max_steps=steps, quiet=True)
    assert code == 0
    return run_id


def _job_processes(home: Path) -> list[psutil.Process]:
    """Jobs of this store still alive (a hung trial must not be left behind)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "plan_effects.py" in " ".join(proc.info["cmdline"] or []) and proc.environ().get(
                "STEPSCOPE_HOME"
            ) == str(home):
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A store holding the user's run of the job (with every effect on offer)."""
    home = tmp_path_factory.mktemp("experiment") / "home"
    return home, _record(home, _effects_command(*EFFECTS))


@pytest.fixture(scope="module")
def experiment(recorded: tuple[Path, int]) -> dict[str, Any]:
    home, run_id = recorded
    started = time.monotonic()
    out = subprocess.run(
        [
            *(sys.executable, "-m", "stepscope.app.cli", "--home", str(home)),
            *("optimize", str(run_id), "--fixes", ",".join(EFFECTS)),
            *("--steps", "10", "--trials", "2", "--timeout", str(HANG_TIMEOUT_S), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return {
        "home": home,
        "run_id": run_id,
        "result": json.loads(out.stdout),
        "stderr": out.stderr,
        "elapsed": time.monotonic() - started,
    }


def _candidates(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in result["candidates"]}


def _trial_runs(home: Path, baseline: int, experiment_id: int) -> list[dict[str, Any]]:
    with RunStore(home) as store:
        runs = store.runs()
        rows = runs[runs["parent_run_id"] == baseline].sort_values("id")
        trials = [store.run(int(i)) for i in rows["id"]]
    return [r for r in trials if r["config"].get("experiment") == experiment_id]


def test_failing_candidates_are_recorded_and_the_others_complete(experiment) -> None:
    cands = _candidates(experiment["result"])
    expected = {
        "ddp_bucket_cap": ("crash", "this fix breaks the job"),
        "ddp_static_graph": ("oom", "out of memory"),
        "ddp_gradient_as_bucket_view": ("hang", f"timed out after {HANG_TIMEOUT_S} s (hang?)"),
        "all": ("crash", "this fix breaks the job"),  # the first failing fix it meets
    }
    with RunStore(experiment["home"]) as store:
        for name, (failure, text) in expected.items():
            c = cands[name]
            assert (c["status"], c["failure"]) == ("failed", failure), c
            assert text in c["error"]
            assert c["speedup"] is None and c["verdict"] is None
            assert len(c["runs"]) == 1  # not tried again in the second trial
            run = store.run(c["failed_run"])
            assert run["status"] == "failed" and text in run["error"]
        hung_log = (
            store.run_dir(cands["ddp_gradient_as_bucket_view"]["failed_run"])
        ) / "output.log"
        assert "hanging" in hung_log.read_text()
        for name in WORKING:
            c = cands[name]
            assert c["status"] == "completed" and c["error"] is None, c
            assert len(c["runs"]) == 2
            assert all(store.run(r)["status"] == "stopped" for r in c["runs"])
    assert not _job_processes(experiment["home"])  # the hung job's group was ended
    assert "ddp_static_graph failed" in experiment["stderr"]  # said on the terminal too


def test_quality_guard_fails_diverging_candidates_and_passes_others(experiment) -> None:
    cands = _candidates(experiment["result"])
    overflow = cands["tf32"]["quality"]
    assert cands["tf32"]["quality_ok"] is False
    assert "NaN or infinite" in overflow["reason"]
    drift = cands["cudnn_benchmark"]["quality"]
    assert cands["cudnn_benchmark"]["quality_ok"] is False
    assert "drifted" in drift["reason"] and drift["drift"] > drift["tolerance"]
    for name in ("fused_optimizer", "ddp_bf16_compression", "channels_last", "confirm"):
        assert cands[name]["quality_ok"] is True, cands[name]["quality"]
        assert cands[name]["quality"]["drift"] < 0.01  # seeded: the same losses
    assert cands["fused_optimizer"]["quality"]["tolerance"] == pytest.approx(0.05)


def test_verdicts_and_the_fixes_kept(experiment) -> None:
    result = experiment["result"]
    cands = _candidates(result)
    fast = cands["fused_optimizer"]
    assert fast["verdict"] == "faster" and fast["ci"][0] > 1.0
    assert 1.4 < fast["speedup"] < 2.6  # the per-step wait is halved
    slow = cands["channels_last"]
    assert slow["verdict"] == "slower" and slow["ci"][1] < 1.0
    assert slow["speedup"] < 0.6
    fixes = {f["id"]: f for f in result["fixes"]}
    assert [f for f in fixes if fixes[f]["kept"]] == ["fused_optimizer", "ddp_bf16_compression"]
    assert fixes["channels_last"]["verdict"] == "slower" and not fixes["channels_last"]["kept"]
    assert not fixes["tf32"]["kept"] and not fixes["cudnn_benchmark"]["kept"]  # loss changed
    assert fixes["ddp_static_graph"]["status"] == "failed" and fixes["ddp_static_graph"]["error"]
    # the kept pair was never run as a candidate of its own: it is confirmed
    best = result["best"]
    assert best["fixes"] == ["fused_optimizer", "ddp_bf16_compression"]
    assert best["confirmed"] is True and best["candidate"] == "confirm"
    assert best["speedup"] > max(fast["speedup"], cands["ddp_bf16_compression"]["speedup"])
    assert best["ci"][0] > 1.0 and best["verdict"] == "faster"
    # the verdict is on throughput; with even steps the median step ratio agrees
    assert fast["speedup_basis"] == "samples_per_s"
    assert fast["samples_per_s"]["ratio"] == pytest.approx(fast["speedup"], abs=1e-3)
    assert fast["step_time"]["ratio"] == pytest.approx(fast["speedup"], rel=0.1)


def test_trials_are_interleaved_with_the_arm_order_rotated(experiment) -> None:
    result = experiment["result"]
    names = ["baseline", "all", *EFFECTS]
    alive = ["baseline", *WORKING]
    assert result["arm_order"] == [names, alive[1:] + alive[:1]]
    runs = _trial_runs(experiment["home"], experiment["run_id"], result["experiment_id"])
    seen = [(r["config"]["phase"], r["config"]["trial"], r["config"]["arm"]) for r in runs]
    expected = [("trials", k, arm) for k, order in enumerate(result["arm_order"]) for arm in order]
    # then the confirmation, beside the baseline again, rotated per trial too
    expected += [
        ("confirm", 0, "baseline"),
        ("confirm", 0, "confirm"),
        ("confirm", 1, "confirm"),
        ("confirm", 1, "baseline"),
    ]
    assert seen == expected
    for run in runs:
        assert run["config"]["experiment"] == result["experiment_id"]
        assert run["cwd"] == str(Path.cwd())  # the baseline's
        assert run["max_steps"] == 10


def test_each_trial_gets_its_plan_file_with_the_seed(experiment) -> None:
    result = experiment["result"]
    runs = _trial_runs(experiment["home"], experiment["run_id"], result["experiment_id"])
    assert len(runs) == 20
    with RunStore(experiment["home"]) as store:
        for run in runs:
            plan = json.loads((store.run_dir(run["id"]) / "plan.json").read_text())
            assert sorted(plan["fixes"]) == sorted(run["config"]["fixes"])
            assert plan["seed"] == 0 and plan["override_explicit"] is False
    baseline_plans = [r for r in runs if r["config"]["arm"] == "baseline"]
    assert baseline_plans and all(r["config"]["fixes"] == [] for r in baseline_plans)
    # the bootstrap read the plan inside the job and says what it applied
    fused = [r for r in runs if r["config"]["arm"] == "fused_optimizer"]
    for run in fused:
        applied = {a.get("fix"): a.get("applied") for a in run["config"].get("applied") or []}
        assert applied.get("fused_optimizer") is True, run["config"]


def test_json_report_and_stored_experiment(experiment) -> None:
    result = experiment["result"]
    assert result["baseline_run"] == experiment["run_id"]
    for c in result["candidates"]:
        for key in ("fixes", "status", "speedup", "ci", "verdict", "quality_ok", "error"):
            assert key in c
    assert set(result["best"]) >= {"fixes", "speedup"}
    assert set(result["predicted"]) == set(result["measured"]) == set(EFFECTS)
    assert (
        result["measured"]["fused_optimizer"] == _candidates(result)["fused_optimizer"]["speedup"]
    )
    assert result["measured"]["ddp_static_graph"] is None
    base = result["baseline"]
    assert base["warmup"]["steps"] == 1 and base["warmup"]["time_s"] > 0  # 10 % of 10 steps
    assert len(base["runs"]) == 2 and len(base["confirm_runs"]) == 2
    with RunStore(experiment["home"]) as store:
        row = store.experiment(result["experiment_id"])
        assert row["id"] in [e["id"] for e in store.experiments(experiment["run_id"])]
    assert row["status"] == "completed" and row["ended_at"] is not None
    assert row["result"] == result
    assert row["progress"]["done"] == row["progress"]["total"] == 20
    assert row["config"]["fixes"] == list(EFFECTS)


def test_background_experiment_reports_progress_through_the_store(recorded) -> None:
    home, run_id = recorded
    experiment_id = start_experiment(
        home, run_id, fixes=["fused_optimizer"], steps=8, trials=1, timeout_s=120
    )
    events = []
    deadline = time.monotonic() + 180
    with RunStore(home) as store:
        while True:
            row = store.experiment(experiment_id)
            events.append(row["progress"].get("event"))
            if row["status"] != "running":
                break
            assert time.monotonic() < deadline, row
            time.sleep(0.2)
    assert row["status"] == "completed", row["error"]
    assert "trial_start" in events  # seen while it ran
    assert row["progress"]["done"] == row["progress"]["total"] == 2
    assert row["result"]["best"]["fixes"] == ["fused_optimizer"]
    assert row["result"]["best"]["confirmed"] is False  # the one candidate is the kept set
    assert (home / "experiments" / f"{experiment_id}.log").exists()


def test_cancelled_background_experiment_stops_its_trial(recorded) -> None:
    home, run_id = recorded
    experiment_id = start_experiment(
        home, run_id, fixes=["fused_optimizer"], steps=10_000, trials=1, timeout_s=120
    )
    deadline = time.monotonic() + 120
    with RunStore(home) as store:
        while not _job_processes(home):  # a trial job is running
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.0)
        assert cancel_experiment(store, experiment_id)
        while store.experiment(experiment_id)["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        row = store.experiment(experiment_id)
        trial = store.run(row["result"]["runs"]["baseline"][0])
    assert (row["status"], row["error"]) == ("failed", "interrupted")
    assert trial["status"] == "interrupted"
    assert not _job_processes(home)


def test_failure_kinds_and_non_finite_losses() -> None:
    assert failure_kind("timed out after 60 s (hang?)") == "hang"
    assert failure_kind("torch.OutOfMemoryError: CUDA out of memory. Tried to ...") == "oom"
    assert failure_kind("RuntimeError: boom") == "crash"
    # the store keeps a NaN loss as NULL: a missing loss where the baseline has one is NaN
    base = [np.array([2.0, 1.5, 1.2, 1.1]), np.array([2.0, 1.5, 1.2, 1.1])]
    nan_from_2 = np.array([2.0, 1.5, np.nan, np.nan])
    check = check_quality(base, [nan_from_2])
    assert check.ok is False and "step 2" in check.reason
    assert check_quality(base, [np.array([2.0, 1.5, 1.2, 1.1])]).ok is True
    # a noisy baseline widens the tolerance: 3x its own trial-to-trial drift
    noisy = [np.array([2.0, 1.5, 1.0, 1.0]), np.array([2.0, 1.5, 1.2, 1.2])]
    check = check_quality(noisy, [np.array([2.0, 1.5, 1.3, 1.3])])
    assert check.ok is True and check.tolerance == pytest.approx(3 * 0.2 / 1.1, rel=1e-6)


@pytest.mark.slow
def test_input_bound_dataloader_fix_measures_2x(tmp_path: Path) -> None:
    """The issue's acceptance check; needs the bootstrap to apply plans (apply.py)."""
    home = tmp_path / "home"
    run_id, code = launch_run(
        [sys.executable, str(EXAMPLES / "input_bound.py"), "--steps", "100"],
        home=home,
        max_steps=25,
        quiet=True,
    )
    assert code == 0
    out = subprocess.run(
        [
            *(sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "optimize"),
            *(str(run_id), "--fixes", "dataloader_workers,persistent_workers"),
            *("--steps", "25", "--trials", "2", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    fixes = {f["id"]: f for f in result["fixes"]}
    workers = fixes["dataloader_workers"]
    assert workers["predicted"] is not None and workers["predicted"] > 1.5  # the bound shown
    # the bound from the experiment's own baseline trials holds for what they measured
    assert workers["predicted_in_experiment"] >= workers["measured"] * 0.8
    assert workers["verdict"] == "faster", workers
    assert workers["measured"] >= 2.0 and workers["ci"][0] > 1.0
    assert "dataloader_workers" in result["best"]["fixes"]
    assert result["best"]["speedup"] >= 2.0
    for c in result["candidates"]:
        assert c["quality_ok"] is True, c["quality"]  # the data do not depend on the workers


def test_cli_refuses_unknown_fixes_before_running_anything(recorded) -> None:
    home, run_id = recorded
    out = subprocess.run(
        [
            *(sys.executable, "-m", "stepscope.app.cli", "--home", str(home)),
            *("optimize", str(run_id), "--fixes", "fused_optimizer,no_such_fix"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "unknown fix 'no_such_fix'" in out.stderr
    assert out.stdout == ""
    with RunStore(home) as store:
        before = len(store.experiments())
    out = subprocess.run(
        [
            *(sys.executable, "-m", "stepscope.app.cli", "--home", str(home)),
            *("optimize", str(run_id), "--fixes", "larger_batch"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "--allow-numerics" in out.stderr
    with RunStore(home) as store:
        assert len(store.experiments()) == before  # nothing was started


def test_experiment_whose_process_vanished_reads_as_failed(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    with RunStore(tmp_path / "home") as store:
        run_id = store.create_run(["python", "train.py"], status="completed")
        dead = store.create_experiment(run_id, {"fixes": []}, pid=proc.pid, pid_started_at=started)
        alive = store.create_experiment(run_id, {"fixes": []}, pid=os.getpid())
        assert store.experiment(dead)["status"] == "failed"
        assert "vanished" in store.experiment(dead)["error"]
        assert store.experiment(alive)["status"] == "running"
        assert [e["id"] for e in store.experiments(run_id)] == [alive, dead]
