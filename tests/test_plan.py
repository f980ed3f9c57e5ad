"""Choosing the fixes and their parameters from a recorded run (real jobs, real samples)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope import fixes as catalog
from stepscope.collectors.launch.launcher import launch_run
from stepscope.fixes.catalog.cpu_threads import choose_threads
from stepscope.fixes.catalog.dataloader_workers import choose_num_workers
from stepscope.optim_runner.trials import plan
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
    assert cpu.kind == "cpu" and cpu.cpu_percent > 2 * io.cpu_percent


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
        # one pass over the loader: persistent workers would keep nothing (issue 39)
        assert "persistent_workers" not in planned
        assert planned["dataloader_workers"].predicted_speedup > 1.0
        assert planned["dataloader_workers"].finding == "io/input_pipeline"


def test_threads_leave_cores_to_cpu_busy_workers_only(runs) -> None:
    with RunStore(runs["home"]) as store:
        cores = plan.job_cores(store.run(runs["io"]))
        threads = store.run(runs["io"])["device"]["threads"]
    assert threads == 1  # tests/jobs/loader.py sets one thread
    if cores < 2:
        pytest.skip("needs 2 cores")
    ids = ["dataloader_workers", "cpu_threads"]
    io = _planned(runs, "io", fix_ids=ids)
    # sleeping workers leave the cores alone: one thread per core, never the job's own 1
    assert io["cpu_threads"].params == {"threads": cores}
    assert "CPU-busy" not in io["cpu_threads"].why_params
    # CPU-busy workers take every core: 1 thread is what they leave, and what the job
    # runs already; an explicit choice with nothing to try is refused, not run
    with pytest.raises(ValueError, match="nothing to try: the job already runs 1 intra-op"):
        _planned(runs, "cpu", fix_ids=ids)
    # and neither run is offered the thread fix by default: no evidence for it
    for kind in ("io", "cpu"):
        assert "cpu_threads" not in _planned(runs, kind)


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
        recommended = {r.id: r for r in plan.recommended(store, runs["io"])}
    consent = [i for i, r in recommended.items() if r.needs_consent]
    default = _planned(runs, "io")
    assert not any(i in default for i in consent)
    assert all(recommended[i].auto for i in default)


def test_plan_file_and_environment() -> None:
    fixes = [
        plan.PlannedFix("dataloader_workers", {"num_workers": 4}),
        plan.PlannedFix("expandable_segments"),
    ]
    doc = plan.plan_document(fixes, seed=3)
    # the allocator reads its setting before the bootstrap runs: the runner's job
    assert doc == {
        "fixes": {"dataloader_workers": {"num_workers": 4}},
        "override_explicit": True,  # trying a fix replaces what the script set
        "seed": 3,
    }
    assert plan.plan_env(fixes) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    kept = plan.plan_env(fixes, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    assert kept == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert plan.plan_env(fixes[:1]) == {}


def test_worker_and_thread_counts() -> None:
    assert choose_num_workers(2, "io") == 4
    assert choose_num_workers(16, "io") == 8  # capped
    assert choose_num_workers(2, "cpu") == 2
    assert choose_num_workers(6, "unknown") == 6
    assert choose_threads(8, "compute/host_overhead", 0)[0] == 1
    assert choose_threads(8, "compute/device_compute", 3)[0] == 5


@pytest.mark.parametrize(
    ("cores", "finding", "busy", "current", "advised", "expected", "why"),
    [
        (2, "compute/device_compute", 0, 4, None, 2, "oversubscribed"),  # one per core
        (8, "compute/device_compute", 3, 8, None, 5, "minus 3 CPU-busy"),  # what they leave
        (8, "compute/device_compute", 3, 16, None, 5, "minus 3 CPU-busy"),
        (4, "compute/host_overhead", 0, 4, 1, 1, "tiny ops"),
        (4, "compute/device_compute", 0, 4, 2, 2, "from the diagnosis"),  # its evidence
        (4, "compute/device_compute", 0, 1, None, 4, "one per core"),  # explicit, under-used
    ],
)
def test_threads_follow_the_evidence_never_the_jobs_own_count(
    cores: int,
    finding: str,
    busy: int,
    current: int,
    advised: int | None,
    expected: int,
    why: str,
) -> None:
    threads, reason = choose_threads(
        cores, finding, busy, current=current, advised=advised, advised_why="from the diagnosis"
    )
    assert (threads, why in reason) == (expected, True)
    assert threads != current


@pytest.mark.parametrize(
    ("cores", "finding", "busy", "current"),
    [
        (2, "compute/device_compute", 0, 2),  # threads == cores, nothing points elsewhere
        (2, "compute/device_compute", 2, 1),  # busy workers leave 1, the job runs 1
        (4, "compute/host_overhead", 0, 1),  # tiny ops, already 1 thread
    ],
)
def test_nothing_to_try_is_refused(cores: int, finding: str, busy: int, current: int) -> None:
    with pytest.raises(ValueError, match="nothing to try"):
        choose_threads(cores, finding, busy, current=current)


def test_every_fix_that_changes_numerics_needs_consent(runs) -> None:
    """bf16 autocast ran in every default experiment although the catalog marked it
    "numerics: changes" and --help said such fixes need --allow-numerics."""
    for fix in catalog.FIXES.values():
        assert fix.needs_consent == (fix.auto and fix.changes_numerics), fix.id
    assert catalog.get("bf16_autocast").needs_consent and catalog.get("tf32").needs_consent
    with RunStore(runs["home"]) as store, pytest.raises(ValueError, match="--allow-numerics"):
        plan.choose_fixes(store, runs["io"], ["bf16_autocast"])
