"""Choosing the fixes and their parameters from a recorded run (real jobs, real samples)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.collectors.launcher import launch_run
from stepscope.optim_runner import plan
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"
# 40 steps of 4 samples; the model's work varies per step (see tests/jobs/loader.py)
LOADER = [sys.executable, str(JOBS / "loader.py"), "--steps", "40", "--compute-ms", "30"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One loader that sleeps (I/O) and one that computes, 10 ms per sample each."""
    home = tmp_path_factory.mktemp("plan") / "home"
    out: dict[str, Any] = {"home": home}
    for kind, flag in (("io", "--io-ms"), ("cpu", "--cpu-ms")):
        run_id, code = launch_run([*LOADER, flag, "10"], home=home, quiet=True, sample_interval=0.1)
        assert code == 0
        out[kind] = run_id
    return out


def _planned(runs: dict[str, Any], kind: str, **kw: Any) -> dict[str, plan.PlannedFix]:
    with RunStore(runs["home"]) as store:
        return {p.id: p for p in plan.choose_fixes(store, runs[kind], **kw)}


def test_loader_waiting_on_io_is_told_from_one_doing_cpu_work(runs) -> None:
    with RunStore(runs["home"]) as store:
        io = plan.loader_wait(store.steps(runs["io"]), store.samples(runs["io"]))
        cpu = plan.loader_wait(store.steps(runs["cpu"]), store.samples(runs["cpu"]))
    # both from the regression over sampling windows, not the fallback
    assert io.cpu_percent is not None and cpu.cpu_percent is not None
    assert io.kind == "io" and io.cpu_percent < plan.LOADER_BUSY_PERCENT
    assert cpu.kind == "cpu" and cpu.cpu_percent > 3 * io.cpu_percent


def test_workers_more_than_cores_for_io_one_per_core_for_cpu(runs) -> None:
    with RunStore(runs["home"]) as store:
        cores = plan.job_cores(store.run(runs["io"]))
    io, cpu = _planned(runs, "io"), _planned(runs, "cpu")
    assert io["dataloader_workers"].params == {"num_workers": min(8, 2 * cores)}
    assert "2 x" in io["dataloader_workers"].why_params
    assert cpu["dataloader_workers"].params == {"num_workers": cores}
    assert "CPU work" in cpu["dataloader_workers"].why_params
    for planned in (io, cpu):
        assert planned["prefetch_factor"].params == {"prefetch_factor": 4}
        # the loader has no workers: these two only mean something with the workers fix
        assert planned["prefetch_factor"].needs == "dataloader_workers"
        assert planned["persistent_workers"].needs == "dataloader_workers"
        assert planned["dataloader_workers"].predicted_speedup > 1.0
        assert planned["dataloader_workers"].finding == "io/input_pipeline"


def test_threads_leave_cores_to_cpu_busy_workers_only(runs) -> None:
    with RunStore(runs["home"]) as store:
        cores = plan.job_cores(store.run(runs["io"]))
    ids = ["dataloader_workers", "cpu_threads"]
    io, cpu = _planned(runs, "io", fix_ids=ids), _planned(runs, "cpu", fix_ids=ids)
    for planned in (io, cpu):
        assert planned["cpu_threads"].finding != "compute/host_overhead"  # not the tiny-op rule
    workers = cpu["dataloader_workers"].params["num_workers"]
    assert cpu["cpu_threads"].params == {"threads": max(1, cores - workers)}
    assert "CPU-busy DataLoader workers" in cpu["cpu_threads"].why_params
    assert io["cpu_threads"].params == {"threads": max(1, cores // 2)}  # sleeping workers
    assert "CPU-busy" not in io["cpu_threads"].why_params


def test_explicit_fixes_are_checked_against_the_catalog(runs) -> None:
    with pytest.raises(ValueError, match="unknown fix 'no_such_fix'"):
        _planned(runs, "io", fix_ids=["no_such_fix"])
    with pytest.raises(ValueError, match="advice only"):
        _planned(runs, "io", fix_ids=["non_blocking_copies"])
    with pytest.raises(ValueError, match="--allow-numerics"):
        _planned(runs, "io", fix_ids=["larger_batch"])
    allowed = _planned(runs, "io", fix_ids=["larger_batch", "cpu_threads"], allow_numerics=True)
    assert allowed["larger_batch"].params == {"factor": 2}
    assert allowed["larger_batch"].changes_numerics and allowed["larger_batch"].needs_consent
    assert list(allowed) == ["larger_batch", "cpu_threads"]


def test_consent_fixes_left_out_of_the_default_choice(runs) -> None:
    with RunStore(runs["home"]) as store:
        recommended = {r["id"]: r for r in plan.recommended(store, runs["io"])}
    consent = [i for i, r in recommended.items() if r.get("needs_consent")]
    default = _planned(runs, "io")
    assert not any(i in default for i in consent)
    assert all(recommended[i]["auto"] for i in default)


def test_plan_file_and_environment() -> None:
    fixes = [
        plan.PlannedFix("dataloader_workers", {"num_workers": 4}),
        plan.PlannedFix("expandable_segments"),
    ]
    doc = plan.plan_document(fixes, seed=3)
    # the allocator reads its setting before the bootstrap runs: the runner's job
    assert doc == {
        "fixes": {"dataloader_workers": {"num_workers": 4}},
        "override_explicit": False,
        "seed": 3,
    }
    assert plan.plan_env(fixes) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    kept = plan.plan_env(fixes, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    assert kept == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert plan.plan_env(fixes[:1]) == {}


def test_worker_and_thread_counts() -> None:
    assert plan.choose_num_workers(2, "io") == 4
    assert plan.choose_num_workers(16, "io") == 8  # capped
    assert plan.choose_num_workers(2, "cpu") == 2
    assert plan.choose_num_workers(6, "unknown") == 6
    assert plan.choose_threads(8, "compute/host_overhead", 0)[0] == 1
    assert plan.choose_threads(8, "compute/device_compute", 3)[0] == 5
