"""Roofline and MFU: on the real V100 and A100 traces and on fresh CPU captures.

The CPU jobs are written as people write them (a model, an optimizer, a loop with
``prof.step()``; one uses ``optimizer.step(closure)`` as Lightning does); the assertions
are about where the ops sit relative to the ridge, never about how fast they ran.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from traces import A100, CPU_ONLY, RESNET_NW0, trace_path

from stepscope.analyzers.hardware.roofline import COLUMNS, NO_CALIBRATION, choose_peak, roofline
from stepscope.analyzers.trace.load import load_trace
from stepscope.store.calibration import Calibration

#: Figures close to what `stepscope calibrate` measured on the 2-core test VM (51.6
#: GFLOP/s, 15.6 GB/s triad): the ridge sits at ~3.3 FLOP/byte.
CAL = Calibration(
    matmul_gflops=51.6,
    copy_gbs=13.7,
    triad_gbs=15.6,
    dtype="float32",
    threads=2,
    host="test-host",
    cpu_model="test CPU",
    torch_version="2",
    date="2026-01-01T00:00:00+00:00",
    matmul_size=768,
    stream_mib=64.0,
    seconds=2.0,
)


@pytest.fixture(scope="module")
def v100():
    return roofline(load_trace(trace_path(RESNET_NW0)))


def _row(df: pd.DataFrame, cls: str) -> pd.Series:
    return df.set_index("op_class").loc[cls]


def test_v100_resnet50_peak_mfu_and_classes(v100) -> None:
    r = v100
    assert r.peak is not None and r.peak.name.startswith("V100")
    assert r.basis == "shapes" and r.dtype == "float32"
    assert r.compute_tflops == r.peak.fp32  # no TF32 on Volta
    assert r.ridge == pytest.approx(15.7e12 / 900e9)
    assert "datasheet" in r.note and "V100" in r.note
    assert 0 < r.mfu < 1
    assert len(r.steps) == 6 and ((r.steps["mfu"] > 0) & (r.steps["mfu"] < 1)).all()
    assert list(r.classes.columns) == COLUMNS
    assert r.classes.loc[r.classes["flops"].idxmax(), "op_class"] == "conv"
    conv = _row(r.classes, "conv")
    assert conv["intensity"] > r.ridge and conv["bound"] == "compute"
    assert 0 < conv["pct_compute_roof"] < 1
    for cls in ("elementwise", "normalisation"):
        row = _row(r.classes, cls)
        assert row["intensity"] < r.ridge and row["bound"] == "memory"
        assert 0 < row["pct_memory_roof"] <= 1
    # the classes' device time: the kernels of the ops, less than the steps' wall time
    assert 0 < r.classes["time_ns"].sum() < r.steps["duration_ns"].sum()
    assert r.classes["share"].sum() == pytest.approx(1.0)
    assert len(r.top_ops) == 15 and r.top_ops["time_ns"].is_monotonic_decreasing
    # the DataLoader's transforms (num_workers=0) run on CPU tensors: not device work
    assert r.host_only_ops > 0
    json.dumps(r.to_json())


def test_a100_trace_gets_its_peak_and_a_clear_reason_for_no_flops() -> None:
    r = roofline(load_trace(trace_path(A100)))
    assert r.peak is not None and r.peak.name.startswith("A100")
    # cuDNN ran TF32 kernels (sm80_xmma_*_tf32f32, s1688): the TF32 roof, said so
    assert r.compute_tflops == r.peak.tf32
    assert any("TF32" in w for w in r.warnings)
    assert r.basis.startswith("no shapes") and "record_shapes" in r.basis
    assert r.mfu is None and r.classes.empty
    assert len(r.steps) == 3 and r.steps["tflops"].isna().all()
    json.dumps(r.to_json())


def test_cpu_only_trace_without_calibration_says_why() -> None:
    trace = load_trace(trace_path(CPU_ONLY))
    peak, why = choose_peak(trace, None)
    assert peak is None and why == NO_CALIBRATION
    r = roofline(trace)
    assert r.peak is None and r.note == NO_CALIBRATION and r.mfu is None
    peak, why = choose_peak(trace, CAL)
    assert peak is not None and peak.vendor == "CPU" and "stepscope calibrate" in why


# -- fresh CPU captures ------------------------------------------------------------------


def _capture(tmp_path: Path, name: str, job: Callable[[Callable[[], None]], None]) -> Path:
    from torch.profiler import ProfilerActivity, profile, schedule

    path = tmp_path / f"{name}.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        job(prof.step)
    return path


def _gemm_job(step: Callable[[], None]) -> None:
    """An MLP trained with SGD, closure-style (as Lightning calls the optimizer)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 1024), torch.randn(256, 1024)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(4):
        opt.step(closure)
        step()


def _elementwise_job(step: Callable[[], None]) -> None:
    """A hand-written update loop over large tensors: arithmetic and activations only."""
    import torch

    a, b = torch.randn(4_000_000), torch.randn(4_000_000)
    for _ in range(4):
        c = torch.sigmoid(a) * b + a
        a = torch.relu(c - b)
        b.mul_(0.5).add_(a)
        step()


@pytest.fixture(scope="module")
def cpu_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("roofline")
    return {"gemm": _capture(tmp, "gemm", _gemm_job), "ew": _capture(tmp, "ew", _elementwise_job)}


def test_cpu_captures_against_a_calibration(cpu_traces: dict[str, Path]) -> None:
    gemm = roofline(load_trace(cpu_traces["gemm"]), calibration=CAL)
    ew = roofline(load_trace(cpu_traces["ew"]), calibration=CAL)
    assert gemm.peak is not None and gemm.peak.vendor == "CPU"
    assert gemm.compute_tflops == pytest.approx(0.0516)
    assert gemm.ridge == pytest.approx(51.6 / 15.6)
    mm = _row(gemm.classes, "matmul")
    assert mm["intensity"] > gemm.ridge and mm["bound"] == "compute"
    el = _row(ew.classes, "elementwise")
    assert el["intensity"] < ew.ridge and el["bound"] == "memory"
    for row in (mm, el):
        for col in ("tflops", "gbs", "pct_compute_roof", "pct_memory_roof", "pct_of_roof"):
            assert math.isfinite(row[col]) and row[col] > 0, col
    # the steps: three profiled steps each, every FLOP counted in one of them
    assert len(gemm.steps) == 3 and (gemm.steps["flops"] > 0).all()
    assert gemm.mfu is not None and gemm.mfu > 0
    assert gemm.classes["flops"].sum() >= gemm.steps["flops"].sum()
    # 5 matmuls a step: 2 forward, grad input and weight of the 2nd Linear, grad weight
    # of the 1st (its input needs no grad), each 2*256*1024*1024, in 3 profiled steps
    assert mm["flops"] == 3 * 5 * 2 * 256 * 1024 * 1024


def test_cpu_capture_without_calibration_still_has_achieved_rates(
    cpu_traces: dict[str, Path],
) -> None:
    r = roofline(load_trace(cpu_traces["gemm"]))
    assert r.peak is None and r.note == NO_CALIBRATION
    assert r.compute_tflops is None and r.mfu is None
    mm = _row(r.classes, "matmul")
    assert mm["tflops"] > 0 and math.isfinite(mm["tflops"])
    assert pd.isna(mm["pct_compute_roof"]) and mm["bound"] is None
    assert r.steps["tflops"].gt(0).all() and r.steps["mfu"].isna().all()
    json.dumps(r.to_json())
