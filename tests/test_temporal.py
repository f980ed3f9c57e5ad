"""Temporal breakdown: idle / compute / non-compute as HTA 0.5.0 defines them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hand_trace import US, ev, launch, make_trace
from traces import trace_path

from stepscope.analyzers.trace.load import load_trace
from stepscope.analyzers.trace.temporal import temporal_breakdown

REFERENCE = Path(__file__).parent / "reference" / "hta_reference.json"


def test_compute_non_compute_idle_on_two_streams():
    rows = launch("volta_sgemm_128x64_nn", 0, 0, 100, corr=1)
    rows += launch("ncclKernel_AllReduce_RING_LL_Sum_float", 1, 50, 100, corr=2, stream=20)
    rows += launch("Memcpy DtoH (Device -> Pinned)", 2, 200, 20, corr=3, cat="gpu_memcpy")
    row = temporal_breakdown(make_trace(rows)).iloc[0]
    # span 0..220; busy = [0,150] + [200,220] = 170; compute = the gemm only
    assert row["span_ns"] == 220 * US
    assert row["idle_ns"] == 50 * US
    assert row["compute_ns"] == 100 * US
    assert row["non_compute_ns"] == 70 * US  # nccl alone 50 + memcpy 20
    assert row["idle_pct"] + row["compute_pct"] + row["non_compute_pct"] == pytest.approx(100)
    assert row["basis"] == "device"


def test_names_hta_does_not_count_as_compute():
    # HTA: anything containing Memcpy, starting with Memset, or containing Sync is not compute
    rows = launch("my_Memcpy_like_kernel", 0, 0, 10, corr=1)
    rows += launch("cudaStreamSync_kernel", 1, 20, 10, corr=2)
    rows += launch("elementwise_kernel", 2, 40, 10, corr=3)
    row = temporal_breakdown(make_trace(rows)).iloc[0]
    assert row["compute_ns"] == 10 * US and row["non_compute_ns"] == 20 * US


def test_overlapping_compute_counted_once():
    rows = launch("gemm", 0, 0, 100, corr=1) + launch("gemm", 1, 10, 50, corr=2, stream=8)
    row = temporal_breakdown(make_trace(rows)).iloc[0]
    assert row["compute_ns"] == 100 * US and row["idle_ns"] == 0


def test_cpu_only_rank_gets_a_cpu_basis_answer():
    rows = [
        ev("user_annotation", "ProfilerStep#1", 0, 1000),
        ev("cpu_op", "aten::mm", 10, 100),
        ev("user_annotation", "gloo:all_reduce", 50, 200, tid=2),
        ev("cpu_op", "aten::add", 400, 100),
    ]
    row = temporal_breakdown(make_trace(rows)).iloc[0]
    assert row["basis"] == "cpu"
    # span 10..500; busy [10,250] + [400,500]; compute [10,110] + [400,500]
    assert row["span_ns"] == 490 * US
    assert row["idle_ns"] == 150 * US
    assert row["compute_ns"] == 200 * US
    assert row["non_compute_ns"] == 140 * US


def test_real_cpu_only_trace_where_hta_fails():
    ref = json.loads(REFERENCE.read_text())["jobs"]["cpu_only"]
    assert "error" in ref["temporal_breakdown"]  # HTA cannot analyse it
    trace = load_trace(trace_path("cpu_only_rank34.pt.trace.json.gz"))
    row = temporal_breakdown(trace).iloc[0]
    assert row["rank"] == 34 and row["basis"] == "cpu"
    # the job spends most of its time in gloo all-reduces on the gloo threads
    assert row["non_compute_pct"] > 50
    assert row["idle_pct"] + row["compute_pct"] + row["non_compute_pct"] == pytest.approx(100)


def _jobs_with(key: str) -> list[str]:
    jobs = json.loads(REFERENCE.read_text())["jobs"]
    return [j for j, r in jobs.items() if isinstance(r.get(key), list)]


@pytest.mark.parametrize("job", _jobs_with("temporal_breakdown"))
def test_agrees_with_hta_within_1pp(job):
    ref = json.loads(REFERENCE.read_text())["jobs"][job]
    trace = load_trace([trace_path(f) for f in ref["files"]])
    ours = temporal_breakdown(trace).set_index("rank")
    for row in ref["temporal_breakdown"]:
        mine = ours.loc[row["rank"]]
        for part in ("idle", "compute", "non_compute"):
            assert mine[f"{part}_pct"] == pytest.approx(row[f"{part}_time_pctg"], abs=1.0), (
                job,
                row["rank"],
                part,
            )
        assert mine["span_ns"] / US == pytest.approx(row["kernel_time(us)"], rel=0.001)
