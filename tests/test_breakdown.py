"""Step-time breakdown: agreement with torch-tb-profiler 0.4.3 and exact hand-made cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from traces import CPU_ONLY, MI250, RANK0, RANK1, RESNET_NW0, RESNET_NW4, V100_NS, trace_path

from stepscope.analyzers.trace.breakdown import (
    CATEGORIES,
    average_breakdown,
    breakdown_shares,
    step_breakdown,
)
from stepscope.analyzers.trace.load import load_trace

# Pinned by bench/reference_tb_profiler.py (RunProfileData.parse + RunGenerator), tb-profiler 0.4.3
REFERENCE = json.loads(
    (Path(__file__).parent / "reference" / "tb_profiler_breakdown.json").read_text()
)


@pytest.mark.parametrize("name", [RESNET_NW0, RESNET_NW4])
def test_agrees_with_tb_profiler_within_1pp(name: str) -> None:
    ref = REFERENCE["traces"][name]
    per_step = step_breakdown(load_trace(trace_path(name)))
    avg = average_breakdown(per_step).set_index("category")["percent"]
    for c in CATEGORIES:
        assert abs(avg[c] - ref["percent"][c]) < 1.0, (c, avg[c], ref["percent"][c])
    # same steps, same (device-extended) step lengths, in us as tb-profiler keeps them
    assert [str(s) for s in per_step["step"]] == ref["steps"]
    assert (per_step["duration"] / 1000).tolist() == pytest.approx(ref["step_duration_us"], abs=1)


def test_reference_was_made_with_tb_profiler_043() -> None:
    assert REFERENCE["tool"] == "torch-tb-profiler" and REFERENCE["version"] == "0.4.3"
    # the input-bound story the traces are known for
    nw0 = REFERENCE["traces"][RESNET_NW0]["percent"]["DataLoader"]
    nw4 = REFERENCE["traces"][RESNET_NW4]["percent"]["DataLoader"]
    assert nw0 > 30 and nw4 < 5


@pytest.mark.parametrize("name", [RESNET_NW0, V100_NS, MI250, CPU_ONLY])
def test_parts_add_up_to_step_wall_time(name: str) -> None:
    per_step = step_breakdown(load_trace(trace_path(name)))
    assert len(per_step) >= 1
    assert (per_step[CATEGORIES].sum(axis=1) == per_step["duration"]).all()
    assert (per_step[CATEGORIES] >= 0).all().all()


def test_cpu_only_trace_gets_a_breakdown() -> None:
    per_step = step_breakdown(load_trace(trace_path(CPU_ONLY)))
    shares = breakdown_shares(per_step)
    assert per_step["step"].tolist() == [551]
    for c in ("Kernel", "Memcpy", "Memset", "Runtime"):
        assert shares[c] == 0.0
    # the step is mostly gloo:all_reduce, a CPU-side collective
    assert shares["Communication"] > 0.5
    assert shares["CPU Exec"] + shares["Other"] > 0


def test_mi250_breakdown() -> None:
    per_step = step_breakdown(load_trace(trace_path(MI250)))
    # step 2 launched < 80 % of step 1's device work: dropped, as tb-profiler does
    assert per_step["step"].tolist() == [1]
    assert per_step["Kernel"].sum() > 0 and per_step["Runtime"].sum() > 0


def test_nccl_kernels_count_as_communication_on_two_ranks() -> None:
    per_step = step_breakdown(load_trace([trace_path(RANK0), trace_path(RANK1)]))
    assert sorted(set(per_step["rank"])) == [0, 1]
    assert (per_step["Communication"] > 0).all()
    assert (per_step["comm_overlap"] <= per_step["comm_total"]).all()


# -- a hand-made trace with known overlaps ---------------------------------------------


def _x(name, cat, ts, dur, pid=1, tid=1, **args) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_hand_made_priority_subtraction(tmp_path: Path) -> None:
    """One step, host 0..100 us; a kernel launched inside it runs 90..130, so the step
    is extended to 130. Expected pieces (us):
      DataLoader 0..20 (beats the CPU op under it); CPU op 20..40 -> CPU Exec 20..30,
      Runtime 30..35 and 36..39 (launch, memcpy, memset calls inside it), CPU Exec 35..36
      and 39..40;
      memcpy 50..60 beats the nccl range 55..70 -> Memcpy 10, Communication 60..70;
      nothing 40..50, 70..90 -> Other 30; kernel 90..130 -> Kernel 40 (beats a memset
      95..100 and the CPU op 95..110).
    """
    events = [
        _x("ProfilerStep#3", "user_annotation", 0, 100),
        _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 0, 20),
        _x("aten::copy_", "cpu_op", 10, 30, **{"External id": 7}),
        _x("cudaLaunchKernel", "cuda_runtime", 30, 5, correlation=11, **{"External id": 7}),
        _x("cudaMemcpyAsync", "cuda_runtime", 36, 2, correlation=99),
        _x("cudaMemsetAsync", "cuda_runtime", 38, 1, correlation=98),
        _x("nccl:all_reduce", "user_annotation", 55, 15, **{"External id": 8}),
        _x("aten::relu", "cpu_op", 95, 15),
        _x("k", "kernel", 90, 40, pid=0, tid=7, correlation=11, device=0, stream=7),
        _x("Memcpy HtoD", "gpu_memcpy", 50, 10, pid=0, tid=8, correlation=99, device=0, stream=8),
        _x("Memset", "gpu_memset", 95, 5, pid=0, tid=8, correlation=98, device=0, stream=8),
    ]
    p = tmp_path / "hand.json"
    p.write_text(json.dumps({"traceEvents": events}))
    per_step = step_breakdown(load_trace(p))
    assert len(per_step) == 1
    row = per_step.iloc[0]
    assert row["step"] == 3 and row["duration"] == 130_000
    expected_us = {
        "Kernel": 40,
        "Memcpy": 10,
        "Memset": 0,
        "Communication": 10,
        "Runtime": 8,
        "DataLoader": 20,
        "CPU Exec": 12,
        "Other": 30,
    }
    assert {c: row[c] / 1000 for c in CATEGORIES} == expected_us
    # the nccl range 55..70 overlaps no kernel: no overlap
    assert row["comm_total"] == 15_000 and row["comm_overlap"] == 0


def test_hand_made_trailing_step_with_little_device_work_is_dropped(tmp_path: Path) -> None:
    events = [_x("ProfilerStep#1", "cpu_op", 0, 100), _x("ProfilerStep#2", "cpu_op", 100, 100)]
    corr = 1
    for step_start, n in ((0, 5), (100, 2)):  # step 2 launched 2 < 0.8 * 5 kernels
        for i in range(n):
            events.append(
                _x("cudaLaunchKernel", "cuda_runtime", step_start + 10 * i, 2, correlation=corr)
            )
            events.append(
                _x(
                    "k",
                    "kernel",
                    step_start + 10 * i + 5,
                    3,
                    pid=0,
                    tid=7,
                    correlation=corr,
                    device=0,
                    stream=7,
                )
            )
            corr += 1
    p = tmp_path / "tail.json"
    p.write_text(json.dumps(events))
    per_step = step_breakdown(load_trace(p))
    assert per_step["step"].tolist() == [1]
