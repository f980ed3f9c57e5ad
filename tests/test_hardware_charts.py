"""The phase bars and the roofline chart, without Streamlit: from the shared V100
ResNet-50 trace's report (a datasheet peak), from a CPU capture of a plain training loop
(shapes recorded, the host's calibration as the peak), and from the step timer's rows."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from calibrations import ROUND_CALIBRATION
from traces import CPU_ONLY, RESNET_NW0, trace_path

from stepscope.analyzers.report.trace_report import TraceReport, analyze_trace
from stepscope.analyzers.steps.phases import PHASES
from stepscope.app.dashboard.charts.hardware import (
    REST_LABEL,
    STEP_PHASE_COLORS,
    mean_shares,
    phase_bars,
    phase_table,
    plottable,
    roof_lines,
    roofline_chart,
)
from stepscope.app.dashboard.views.run import hardware_sections as hw
from stepscope.store.calibration import save_calibration
from stepscope.types import PHASE_LABELS


def values(v: object) -> list:
    """A plotly array: a list, or (numpy data in to_plotly_json) a base64 typed array."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def v100() -> TraceReport:
    return analyze_trace(trace_path(RESNET_NW0))


def _cpu_capture(folder: Path) -> Path:
    """A real CPU capture: a plain loop (forward, loss.backward(), optimizer.step())
    under torch.profiler with record_shapes, 3 steps recorded."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.LayerNorm(512),
        torch.nn.Linear(512, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    path = folder / "cpu.pt.trace.json"
    sched = torch.profiler.schedule(wait=1, warmup=1, active=3)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, schedule=sched
    ) as prof:
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def cpu(tmp_path_factory: pytest.TempPathFactory) -> tuple[TraceReport, TraceReport]:
    """The same CPU capture with the home's calibration and without one."""
    folder = tmp_path_factory.mktemp("cpu")
    path = _cpu_capture(folder)
    home = folder / "home"
    save_calibration(home, ROUND_CALIBRATION)
    return analyze_trace(path, calibration_home=home), analyze_trace(path)


# -- phases ------------------------------------------------------------------------------
def test_trace_phase_bars_one_colour_per_phase(v100: TraceReport) -> None:
    table, split = phase_table(v100.phases, "trace")
    assert split and len(table) == len(v100.phases) == 6
    assert table["duration_s"].to_numpy() == pytest.approx(
        table[list(PHASES)].sum(axis=1).to_numpy()
    )  # the phases add up to the step
    fig = phase_bars(table).to_plotly_json()
    by_name = {t["name"]: t for t in fig["data"]}
    # every phase present in the trace, and only those: no communication on one V100
    shown = [PHASE_LABELS[p] for p in PHASES if v100.phases[p].any()]
    assert list(by_name) == shown and "exposed communication" not in by_name
    for p in PHASES:
        if PHASE_LABELS[p] in by_name:
            t = by_name[PHASE_LABELS[p]]
            assert t["marker"]["color"] == STEP_PHASE_COLORS[p]
            assert values(t["y"]) == pytest.approx(list(v100.phases[p] / 1e6))
    assert fig["layout"]["barmode"] == "stack"
    assert len(set(STEP_PHASE_COLORS.values())) == len(PHASES)  # distinct colours
    shares = mean_shares(table)
    assert shares["data_wait"] == pytest.approx(v100.phase_shares["data_wait"], rel=1e-9)
    assert hw.shares_line(shares).startswith("data wait 33.4 % · forward 24.6 %")


def test_timer_phase_table_with_and_without_the_split() -> None:
    steps = pd.DataFrame(
        {
            "rank": [0, 0, 0],
            "step": [1, 2, 3],
            "start_s": [0.0, 1.0, 2.0],
            "end_s": [1.0, 2.0, 3.0],
            "data_wait_s": [0.1, 0.2, None],
            "forward_s": [0.3, 0.3, 0.3],
            "backward_s": [0.4, 0.4, 0.4],
            "optimizer_s": [0.1, 0.2, 0.1],
        }
    )
    table, split = phase_table(steps, "timer")
    assert split
    assert list(table["other"]) == pytest.approx([0.1, 0.0, 0.2])  # never below 0
    assert list(table["data_wait"]) == pytest.approx([0.1, 0.2, 0.0])  # NULL: none
    names = [t.name for t in phase_bars(table, split).data]
    assert names == ["data wait", "forward", "backward", "optimizer step", "other"]

    old = steps.assign(forward_s=None, backward_s=None, optimizer_s=None)  # store < v4
    for frame in (old, steps.drop(columns=["forward_s", "backward_s", "optimizer_s"])):
        table, split = phase_table(frame, "timer")
        assert not split
        assert list(table["other"]) == pytest.approx([0.9, 0.8, 1.0])
        names = [t.name for t in phase_bars(table, split).data]
        assert names == ["data wait", REST_LABEL]


# -- roofline ---------------------------------------------------------------------------
def test_v100_roofline_chart(v100: TraceReport) -> None:
    roof = v100.roofline
    assert roof is not None and roof.peak is not None and roof.ridge is not None
    fig = roofline_chart(roof).to_plotly_json()
    layout = fig["layout"]
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "log"
    by_name = {t["name"]: t for t in fig["data"]}
    mem, comp = by_name["memory roof"], by_name["compute roof"]
    # the roofs meet at the ridge: 15.7 TFLOP/s / 900 GB/s = 17.4 FLOP/byte
    assert values(mem["x"])[-1] == values(comp["x"])[0] == pytest.approx(15.7e3 / 900)
    assert values(mem["y"])[-1] == values(comp["y"])[0] == pytest.approx(15.7)
    x0, y0 = values(mem["x"])[0], values(mem["y"])[0]
    assert y0 == pytest.approx(900 * x0 / 1e3)  # bandwidth x intensity
    assert "vector roof (elementwise, norms)" not in by_name  # V100 fp32 vector = matmul
    classes = by_name["operator classes"]
    placed = plottable(roof.classes)
    assert list(classes["text"]) == list(placed["op_class"])
    assert "copy" not in list(classes["text"])  # no FLOPs: no place on a log axis
    assert values(classes["y"]) == pytest.approx(list(placed["tflops"]))
    sizes = values(classes["marker"]["size"])
    assert sizes[0] == max(sizes)  # conv: the most time, the largest marker
    assert "74.2 % of the compute roof" in classes["hovertext"][0]  # conv's share of 15.7
    assert len(values(by_name["top operators"]["x"])) == len(plottable(roof.top_ops))
    # the axes hold the points and the ridge
    lo, hi = layout["xaxis"]["range"]
    xs = [*values(classes["x"]), roof.ridge]
    assert 10**lo < min(xs) and max(xs) < 10**hi
    only_classes = roofline_chart(roof, top_ops=False)
    assert "top operators" not in [t.name for t in only_classes.data]
    assert hw.peak_line(roof) == "V100 SXM2 float32 15.7 TFLOP/s"


def test_roof_lines_with_a_separate_vector_roof(v100: TraceReport) -> None:
    roof = replace(v100.roofline, compute_tflops=125.0, vector_tflops=15.7, ridge=125e3 / 900)
    lines = roof_lines(roof, 0.01, 1000.0)
    assert lines["compute"][0][0] == pytest.approx(125e3 / 900)
    assert lines["vector"] == ([pytest.approx(15.7e3 / 900), 1000.0], [15.7, 15.7])
    assert roof_lines(replace(roof, memory_gbs=None), 0.01, 1000.0) == {}


def test_cpu_roofline_against_the_calibration(cpu: tuple[TraceReport, TraceReport]) -> None:
    with_cal, without = cpu
    roof = with_cal.roofline
    assert roof is not None and roof.basis == "shapes" and roof.mfu is not None
    assert roof.compute_tflops == pytest.approx(0.1) and roof.memory_gbs == pytest.approx(25.0)
    fig = roofline_chart(roof)
    assert fig is not None
    by_name = {t.name: t for t in fig.data}
    # a CPU's rates read in GFLOP/s: the 0.1 TFLOP/s roof at 100
    assert fig.layout.yaxis.title.text == "achieved GFLOP/s"
    assert list(by_name["compute roof"].y) == pytest.approx([100.0, 100.0])
    assert by_name["memory roof"].x[-1] == pytest.approx(100 / 25)  # GFLOP/s / GB/s
    assert "matmul" in list(by_name["operator classes"].text)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "2025-01-02 03:04" in roof.note  # the calibration's date: MFU's help text
    # the same capture without a calibration: points but no roofs, and why no MFU
    bare = without.roofline
    assert bare is not None and bare.mfu is None and bare.peak is None
    assert "stepscope calibrate" in hw.no_mfu_reason(bare)
    names = [t.name for t in roofline_chart(bare).data]
    assert "operator classes" in names and "compute roof" not in names
    # the CPU trace's phases: a plain loop has forward, backward and optimizer
    table, _ = phase_table(with_cal.phases, "trace")
    assert (table[["forward", "backward", "optimizer"]].sum() > 0).all()


def test_no_shapes_no_chart() -> None:
    report = analyze_trace(trace_path(CPU_ONLY))  # a 2021 capture without shapes
    roof = report.roofline
    assert roof is not None and roof.basis != "shapes"
    assert roofline_chart(roof) is None
    assert hw.no_mfu_reason(roof) == roof.basis


def test_a_cpu_roofline_reads_in_human_units(cpu: tuple[TraceReport, TraceReport]) -> None:
    # a CPU job's axis read "100µ / 100n" TFLOP/s and its table "5.93e-08"
    roof = cpu[0].roofline
    assert roof is not None
    fig = roofline_chart(roof)
    assert fig is not None
    unit = fig.layout.yaxis.title.text.removeprefix("achieved ")
    assert unit in {"GFLOP/s", "MFLOP/s"}  # a laptop-class CPU: never TFLOP/s
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        assert axis.exponentformat == "none"  # plain numbers, no SI prefix beside the unit
    points = values(fig.to_plotly_json()["data"][-2]["y"])
    assert 1.0 <= max(points) < 1000.0  # the biggest rate is a plain number in that unit
    table = hw._roof_table(roof.classes, "op_class", "class")
    assert unit in table.columns and "TFLOP/s" not in table.columns
    cells = " ".join(table.astype(str).to_numpy().ravel())
    assert "e-" not in cells and "e+" not in cells
    assert hw.flops_unit([2.5]) == ("TFLOP/s", 1.0)  # a GPU's stay in TFLOP/s
    assert hw.flops_unit([6e-8]) == ("kFLOP/s", 1e9)


def _steps(step_s: float, n: int = 6) -> pd.DataFrame:
    """A run's steps as the store gives them: one process, ``n`` steps of ``step_s``."""
    start = 1_795_000_000.0 + np.arange(n) * step_s
    return pd.DataFrame(
        {"rank": 0, "worker": 0, "step": np.arange(n), "start_s": start,
         "end_s": start + step_s, "profiled": 0}
    )  # fmt: skip


def test_long_steps_read_in_seconds_or_minutes_not_80k_ms() -> None:
    from stepscope.app.dashboard.charts.steps import step_time_chart

    # LBFGS's 58 s steps read "80k" on an axis in ms
    for step_s, unit, top in ((0.05, "ms", 50.0), (58.0, "s", 58.0), (1500.0, "min", 25.0)):
        fig = step_time_chart(_steps(step_s), warmup_steps=1, median_s=step_s)
        assert fig.layout.yaxis.title.text == f"step time ({unit})"
        ys = [y for t in fig.data for y in t.y]
        assert max(ys) == pytest.approx(top)
        assert fig.layout.shapes[0].y0 == pytest.approx(top)  # the median line, same unit
