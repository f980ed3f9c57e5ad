"""Idle-time breakdown: HTA's rules on hand-built streams, and agreement with HTA 0.5.0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hand_trace import US, ev, launch, make_trace
from traces import trace_path

from stepscope.analyzers.trace.idle_time import idle_time_breakdown
from stepscope.analyzers.trace.load import load_trace

REFERENCE = Path(__file__).parent / "reference" / "hta_reference.json"


def _by_category(df, rank=0, stream=7) -> dict[str, int]:
    sub = df[(df["rank"] == rank) & (df["stream"] == stream)]
    return dict(zip(sub["idle_category"], sub["idle_ns"], strict=True))


def _four_kernels(gap_c_us: float = 10, runtime_b_us: float = 20):
    # A [0,10]; B launched at runtime_b_us, runs [50,60]; C launched at 55 (before B
    # ends), runs after a gap of gap_c_us; D launched at 75 (before C ends), runs at 200.
    c_start = 60 + gap_c_us
    return make_trace(
        launch("gemm_a", -5, 0, 10, corr=1)
        + launch("gemm_b", runtime_b_us, 50, 10, corr=2)
        + launch("gemm_c", 55, c_start, 10, corr=3)
        + launch("gemm_d", c_start + 5, 200, 10, corr=4)
    )


def test_host_wait_kernel_wait_and_other():
    got = _by_category(idle_time_breakdown(_four_kernels()))
    # B: launched at 20 > A's end 10 -> host wait 40 us
    # C: launched at 55 < B's end 60, gap 10 us < 30 -> kernel wait
    # D: launched at 75 < C's end 80, gap 120 us -> other
    assert got == {"host_wait": 40 * US, "kernel_wait": 10 * US, "other": 120 * US}


def test_shares_add_up_per_stream():
    df = idle_time_breakdown(_four_kernels())
    assert df["idle_share"].sum() == pytest.approx(1.0)
    assert df.loc[df["idle_category"] == "other", "idle_share"].item() == pytest.approx(120 / 170)


def test_threshold_is_strict_at_30_us():
    # exact nanoseconds: HTA's rounding would turn 29.999 us into 30
    below = _by_category(idle_time_breakdown(_four_kernels(gap_c_us=29.999), hta_rounding=False))
    at = _by_category(idle_time_breakdown(_four_kernels(gap_c_us=30), hta_rounding=False))
    assert below["kernel_wait"] == 29_999
    assert at["kernel_wait"] == 0 and at["other"] == 30 * US + 100 * US  # D now waits 100


def test_launch_exactly_at_previous_end_is_not_host_wait():
    # B launched exactly when A ends: not after it, so the 40 us gap is "other"
    got = _by_category(idle_time_breakdown(_four_kernels(runtime_b_us=10)))
    assert got["host_wait"] == 0
    assert got["other"] == 40 * US + 120 * US


def test_streams_are_separate_and_memcpy_counts():
    rows = launch("gemm", 0, 5, 10, corr=1) + launch("gemm", 1, 100, 10, corr=2)
    rows += launch("Memcpy HtoD", 2, 6, 4, corr=3, stream=20, cat="gpu_memcpy")
    rows += launch("Memcpy HtoD", 3, 26, 4, corr=4, stream=20, cat="gpu_memcpy")
    df = idle_time_breakdown(make_trace(rows))
    assert set(df["stream"]) == {7, 20}
    # stream 7: gap 85 us, launch at 1 < 15 -> other; stream 20: gap 16 us -> kernel wait
    assert _by_category(df, stream=7)["other"] == 85 * US
    assert _by_category(df, stream=20)["kernel_wait"] == 16 * US


def test_last_profiled_step_is_dropped_like_hta():
    rows = [
        ev("user_annotation", "ProfilerStep#1", 0, 100),
        ev("user_annotation", "ProfilerStep#2", 100, 100),
    ]
    rows += launch("gemm", 10, 20, 10, corr=1) + launch("gemm", 50, 60, 10, corr=2)
    rows += launch("gemm", 150, 300, 10, corr=3)  # launched in the last step
    df = idle_time_breakdown(make_trace(rows))
    assert df["idle_ns"].sum() == 30 * US  # only the 30 us gap inside step 1 remains


def test_single_step_keeps_everything():
    rows = [ev("user_annotation", "ProfilerStep#1", 0, 200)]
    rows += launch("gemm", 10, 20, 10, corr=1) + launch("gemm", 150, 300, 10, corr=2)
    assert idle_time_breakdown(make_trace(rows))["idle_ns"].sum() == 270 * US


def test_hta_rounding_to_whole_microseconds():
    # fractional-us kernels: HTA rounds start up and end down, widening the gap
    rows = launch("gemm", 0, 0.4, 10.2, corr=1) + launch("gemm", 1, 20.3, 5, corr=2)
    exact = idle_time_breakdown(make_trace(rows), hta_rounding=False)["idle_ns"].sum()
    hta = idle_time_breakdown(make_trace(rows))["idle_ns"].sum()
    assert exact == 9_700  # 20.3 - 10.6
    assert hta == 11 * US  # ceil(20.3)=21 - floor(10.6)=10


def test_cpu_only_trace_gives_empty_frame():
    trace = make_trace([ev("cpu_op", "aten::mm", 0, 10), ev("cpu_op", "aten::add", 20, 5)])
    df = idle_time_breakdown(trace)
    assert df.empty and list(df.columns)[:4] == ["rank", "stream", "idle_category", "idle_ns"]


# -- agreement with HTA 0.5.0 on the real traces (pinned by bench/reference_hta.py) ----


def _jobs_with(key: str) -> list[str]:
    jobs = json.loads(REFERENCE.read_text())["jobs"]
    return [j for j, r in jobs.items() if isinstance(r.get(key), list)]


@pytest.mark.parametrize("job", _jobs_with("idle_time_breakdown"))
def test_agrees_with_hta_within_1pp(job):
    ref = json.loads(REFERENCE.read_text())["jobs"][job]
    trace = load_trace([trace_path(f) for f in ref["files"]])
    ours = idle_time_breakdown(trace)
    hta = {}
    for row in ref["idle_time_breakdown"]:
        hta.setdefault((row["rank"], row["stream"]), {})[row["idle_category"]] = row["idle_time"]
    assert {(r, s) for r, s in hta} == set(zip(ours["rank"], ours["stream"], strict=True))
    for (rank, stream), cats in hta.items():
        total = sum(cats.values())
        mine = _by_category(ours, rank, stream)
        mine_total = sum(mine.values())
        for cat in ("host_wait", "kernel_wait", "other"):
            want = 100 * cats.get(cat, 0) / total if total else 0
            got = 100 * mine[cat] / mine_total if mine_total else 0
            assert got == pytest.approx(want, abs=1.0), (job, rank, stream, cat)
        # and the idle time itself (HTA: us), rounding as HTA rounds
        assert mine_total / US == pytest.approx(total, rel=0.001, abs=2)


def test_hta_fails_on_cpu_only_and_is_recorded():
    ref = json.loads(REFERENCE.read_text())["jobs"]["cpu_only"]
    assert "error" in ref["idle_time_breakdown"]
