"""The phases of a step: on every shared trace, on hand-built traces for each rule, and on
fresh CPU captures of jobs written as people write them (a plain AdamW loop run under
stepscope's own capture; Lightning's ``optimizer.step(closure)``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hand_trace import ev, launch, make_trace
from traces import A100, ALL, CPU_ONLY, RESNET_NW0, RESNET_NW4, trace_path

from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.analyzers.steps.phases import PHASES, average_phases, phase_shares, step_phases
from stepscope.analyzers.trace.breakdown import adjusted_steps, breakdown_shares, step_breakdown
from stepscope.analyzers.trace.load import load_trace
from stepscope.store import RunStore
from stepscope.types import PHASE_LABELS

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", ROOT / "tests/jobs/util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)


def _check_adds_up(per_step: pd.DataFrame) -> None:
    assert list(per_step.columns) == ["rank", "step", "start", "end", "duration", *PHASES]
    assert (per_step[list(PHASES)] >= 0).all().all()
    parts = per_step[list(PHASES)].sum(axis=1)
    assert (abs(parts - per_step["duration"]) <= 0.001 * per_step["duration"]).all()


@pytest.mark.parametrize("name", ALL)
def test_phases_add_up_to_the_step_on_every_shared_trace(name: str) -> None:
    trace = load_trace(trace_path(name))
    steps = adjusted_steps(trace)
    per_step = step_phases(trace, steps)
    _check_adds_up(per_step)
    assert len(per_step) == len(steps)
    assert per_step["duration"].sum() > 0
    shares = phase_shares(per_step)
    assert set(shares) == set(PHASES) == set(PHASE_LABELS)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    avg = average_phases(per_step)
    assert len(avg) == len(PHASES) * len(trace.ranks)
    for _, g in avg.groupby("rank"):
        assert g["percent"].sum() == pytest.approx(100.0, abs=0.1)


def test_data_wait_is_the_dataloader_share_and_drops_with_workers() -> None:
    nw0 = load_trace(trace_path(RESNET_NW0))
    shares0 = phase_shares(step_phases(nw0))
    loader0 = breakdown_shares(step_breakdown(nw0))["DataLoader"]
    # tb-profiler puts about a third of each step in the DataLoader on this trace
    assert shares0["data_wait"] == pytest.approx(loader0, abs=0.02)
    assert shares0["data_wait"] > 0.25
    # the rest is the training itself: SGD's step is small, backward the largest
    assert shares0["backward"] > shares0["forward"] > shares0["optimizer"] > 0
    nw4 = load_trace(trace_path(RESNET_NW4))
    shares4 = phase_shares(step_phases(nw4))
    assert shares4["data_wait"] < shares0["data_wait"] / 5


def test_exposed_communication_is_part_of_the_communication() -> None:
    trace = load_trace(trace_path(A100))
    per_step = step_phases(trace)
    bd = step_breakdown(trace)
    exposed = int(per_step["communication"].sum())
    assert 0 < exposed < int(bd["comm_total"].sum())
    shares = phase_shares(per_step)
    assert shares["forward"] > 0 and shares["backward"] > 0 and shares["optimizer"] > 0


def test_cpu_only_trace_gets_its_phases() -> None:
    per_step = step_phases(load_trace(trace_path(CPU_ONLY)))
    _check_adds_up(per_step)
    # the only work recorded: gloo all_reduce ranges on the collective threads
    assert phase_shares(per_step)["communication"] > 0.5


# -- the rules, on hand-built GPU traces (times in us; host thread 1, engine thread 2) --


def _gpu_step() -> list[dict]:
    rows = [ev("user_annotation", "ProfilerStep#1", 0, 1000)]
    rows.append(ev("cpu_op", "aten::linear", 10, 30))
    rows += launch("gemm_fwd", 20, 40, 100, corr=1)  # forward: device 40-140
    rows.append(ev("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 150, 40, tid=2))
    rows += [
        dict(r, tid=2) if r["cat"] == "cuda_runtime" else r
        for r in launch("gemm_bwd", 160, 200, 100, corr=2)
    ]
    rows.append(ev("user_annotation", "Optimizer.step#SGD.step", 320, 60))
    rows += launch("sgd_update", 330, 400, 50, corr=3)  # optimizer: device 400-450
    rows.append(ev("cuda_runtime", "cudaStreamSynchronize", 460, 40))  # waits, device idle
    rows.append(ev("user_annotation", "nccl:all_reduce", 520, 5))
    rows.append(ev("kernel", "ncclKernel_AllReduce_RING", 600, 100, stream=20, corr=4))
    rows.append(ev("cuda_runtime", "cudaLaunchKernel", 521, 2, corr=4))
    rows.append(ev("kernel", "ncclKernel_AllReduce_RING", 420, 20, stream=20, corr=5))
    rows.append(ev("cuda_runtime", "cudaLaunchKernel", 330, 2, corr=5))
    return rows


def test_device_time_goes_to_the_phase_that_launched_it() -> None:
    per_step = step_phases(make_trace(_gpu_step()))
    _check_adds_up(per_step)
    row = per_step.iloc[0]
    us = 1000
    assert row["duration"] == 1000 * us
    assert row["forward"] >= 100 * us  # gemm_fwd, plus the host ops before it
    assert row["backward"] >= 100 * us  # gemm_bwd, launched on the engine's thread
    assert row["optimizer"] >= 50 * us  # sgd_update, and the range's idle device time
    assert row["sync"] == 40 * us
    # the all_reduce at 600-700 runs alone: exposed; the one at 420-440 hides under sgd_update
    assert row["communication"] == 100 * us + 5 * us  # and the host nccl range, device idle


def test_closure_forward_and_backward_are_not_optimizer_time() -> None:
    rows = [ev("user_annotation", "ProfilerStep#1", 0, 1000)]
    rows.append(ev("user_annotation", "Optimizer.step#Adam.step", 0, 1000))
    rows.append(ev("cpu_op", "aten::linear", 10, 100))  # the closure's forward
    rows.append(ev("user_annotation", "Optimizer.zero_grad#Adam.zero_grad", 120, 30))
    rows.append(ev("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 200, 300))
    rows.append(ev("cpu_op", "aten::add_", 600, 300))  # the update, after the closure
    row = step_phases(make_trace(rows)).iloc[0]
    us = 1000
    assert row["forward"] == 100 * us
    assert row["backward"] == 300 * us
    assert row["optimizer"] == 30 * us + 500 * us  # zero_grad, and all after the closure
    assert row["other"] == 70 * us  # the closure's own gaps


# -- fresh CPU captures --------------------------------------------------------------


def test_plain_adamw_loop_under_stepscope_spends_a_large_share_in_the_optimizer(
    tmp_path: Path,
) -> None:
    script = ROOT / "examples" / "corpus" / "mlp_adamw.py"
    run_id, proc = jobs.run_job(
        tmp_path, str(script), "--iters", "4", "--log-every", "4",
        profile_at=1, profile_steps=2, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    path = jobs.artifacts(tmp_path, run_id)["path"][0]
    per_step = step_phases(load_trace(path))
    _check_adds_up(per_step)
    shares = phase_shares(per_step)
    # AdamW's per-parameter loop over 8.4 M parameters after a few GEMMs on 32 rows
    assert shares["optimizer"] >= 0.20
    assert shares["forward"] > 0 and shares["backward"] > 0
    assert shares["data_wait"] == 0 and shares["communication"] == 0
    # ... and the diagnosis names that phase, with the fused step as its first fix
    with RunStore(tmp_path) as store:
        diagnosis = diagnose_run(store, run_id, save=False)
    first = diagnosis.findings[0]
    assert diagnosis.level == "trace"
    assert (first.key, first.phase) == ("compute/optimizer_step", "optimizer")
    assert first.fixes[0].id == "fused_optimizer"


def test_closure_job_counts_its_forward_and_backward(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 1)), batch_size=16
    )

    def training_step(x: torch.Tensor, y: torch.Tensor) -> None:
        def closure() -> torch.Tensor:  # Lightning's order: step, zero_grad, backward
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            return loss

        optimizer.step(closure)

    # stepscope's capture settings (collectors/capture/profiler_capture.py)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=lambda _step: ProfilerAction.RECORD,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        for x, y in data:
            training_step(x, y)
            prof.step()
    path = tmp_path / "closure.json"
    prof.export_chrome_trace(str(path))
    trace = load_trace(path)
    per_step = step_phases(trace)
    _check_adds_up(per_step)
    full = per_step[per_step["step"] < 4]  # the last ProfilerStep# is the empty tail
    assert (full["forward"] > 0).all() and (full["backward"] > 0).all()
    assert (full["data_wait"] > 0).all()
    events = trace.events
    in_step = events["name"].astype(str).str.startswith("Optimizer.step#")
    step_ns = int(events.loc[in_step, "dur"].sum())
    # the closure ran inside Optimizer.step: its forward and backward are taken out
    assert int(full["optimizer"].sum()) <= step_ns - int(full["backward"].sum())
    assert int(full["optimizer"].sum()) > 0
    assert np.isclose(full["duration"].sum(), full[list(PHASES)].sum().sum())
