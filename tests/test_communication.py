"""Communication: share of step time, overlap with compute (HTA parity), rank skew."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hand_trace import US, ev, launch, make_trace
from traces import trace_path

from stepscope.analyzers.trace.communication import communication_summary
from stepscope.analyzers.trace.load import load_trace

REFERENCE = Path(__file__).parent / "reference" / "hta_reference.json"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _step(rank, n, start, dur):
    return ev("user_annotation", f"ProfilerStep#{n}", start, dur, rank=rank)


def test_overlap_is_share_of_comm_time_with_compute_running():
    rows = [_step(0, 1, 0, 1000)]
    rows += launch(NCCL, 1, 100, 100, corr=1, stream=20)
    rows += launch("volta_sgemm_128x64_nn", 2, 150, 30, corr=2)
    # a memcpy during communication is not compute
    rows += launch("Memcpy DtoD", 3, 185, 10, corr=3, cat="gpu_memcpy")
    out = communication_summary(make_trace(rows))
    assert out["overlap"] == pytest.approx(0.3)
    assert out["share"] == pytest.approx(0.1)
    assert out["basis"] == {0: "device"}
    assert out["skew"] is None  # one rank


def test_no_communication_gives_none_overlap_and_zero_share():
    rows = [_step(0, 1, 0, 100)] + launch("gemm", 1, 10, 10, corr=1)
    out = communication_summary(make_trace(rows))
    assert out["share"] == 0 and out["overlap"] is None


def test_comm_outside_steps_does_not_count_in_share():
    rows = [_step(0, 1, 0, 100)]
    rows += launch(NCCL, 1, 80, 40, corr=1, stream=20)  # 20 us inside, 20 us after the step
    out = communication_summary(make_trace(rows))
    assert out["comm_ns"] == 20 * US and out["share"] == pytest.approx(0.2)


def test_two_ranks_straggler_is_the_rank_that_waits_least():
    rows = []
    for rank, comm_us in ((0, 300), (1, 100)):
        rows += [_step(rank, 7, 0, 1000)]
        rows += launch(NCCL, 10, 500, comm_us, corr=10 + rank, stream=20, rank=rank)
        rows += [_step(rank, 8, 1000, 1000)]
        # in step 8 the roles swap: rank 0 arrives last
        rows += launch(NCCL, 1010, 1500, 400 - comm_us, corr=20 + rank, stream=20, rank=rank)
    out = communication_summary(make_trace(rows))
    skew = out["skew"].set_index("step")
    assert skew.loc[7, "straggler_rank"] == 1 and skew.loc[7, "most_waiting_rank"] == 0
    assert skew.loc[7, "skew_ns"] == 200 * US
    assert skew.loc[8, "straggler_rank"] == 0 and skew.loc[8, "skew_ns"] == 200 * US
    pr = out["per_rank"].set_index(["step", "rank"])
    assert pr.loc[(7, 0), "wait_ns"] == 200 * US and pr.loc[(7, 1), "wait_ns"] == 0
    assert bool(pr.loc[(7, 1), "is_straggler"]) and not bool(pr.loc[(7, 0), "is_straggler"])


def test_cpu_only_uses_host_collectives():
    rows = [
        _step(0, 1, 0, 1000),
        ev("cpu_op", "aten::mm", 0, 100),
        ev("user_annotation", "gloo:all_reduce", 50, 400, tid=2),
        ev("cpu_op", "aten::add", 600, 50),
    ]
    out = communication_summary(make_trace(rows))
    assert out["basis"] == {0: "cpu"}
    assert out["share"] == pytest.approx(0.4)
    assert out["overlap"] == pytest.approx(50 / 400)


def test_real_cpu_only_trace():
    out = communication_summary(load_trace(trace_path("cpu_only_rank34.pt.trace.json.gz")))
    assert out["basis"] == {34: "cpu"}
    assert 0.5 < out["share"] <= 1.0


@pytest.mark.parametrize("job", ["a100_nccl", "sampled_2ranks"])
def test_overlap_agrees_with_hta_within_1pp(job):
    ref = json.loads(REFERENCE.read_text())["jobs"][job]
    out = communication_summary(load_trace([trace_path(f) for f in ref["files"]]))
    for row in ref["comm_comp_overlap"]:
        got = 100 * out["overlap_by_rank"][row["rank"]]
        assert got == pytest.approx(row["comp_comm_overlap_pctg"], abs=1.0)


def test_two_rank_pair_skew():
    files = [trace_path(f"sampled_2ranks_rank-{r}.json.gz") for r in (0, 1)]
    out = communication_summary(load_trace(files))
    skew = out["skew"]
    assert list(skew["step"]) == [551, 552]
    assert set(skew["straggler_rank"]) <= {0, 1}
    assert (skew["skew_ns"] > 0).all()
    assert set(out["per_rank"]["rank"]) == {0, 1}
    assert 0 < out["share"] < 1
