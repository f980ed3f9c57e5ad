"""A job's ranks analysed side by side and merged: the same report as one table, in
worker processes or in this one, and a bad rank's file still named in one line."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from stepscope.analyzers.report.ranks import (
    DUPLICATE_RANKS,
    SMALL_JOB_BYTES,
    default_workers,
    map_ranks,
)
from stepscope.analyzers.report.trace_report import analyze_trace
from stepscope.analyzers.trace.breakdown import adjusted_steps, step_breakdown
from stepscope.analyzers.trace.communication import communication_summary
from stepscope.analyzers.trace.kernels import top_kernels, top_ops
from stepscope.analyzers.trace.load import TraceError, load_trace
from stepscope.analyzers.trace.memory import memory_summary
from tests.traces import trace_path

TWO_RANKS = [
    trace_path("sampled_2ranks_rank-0.json.gz"),
    trace_path("sampled_2ranks_rank-1.json.gz"),
]


def _json(report) -> dict:
    out = report.to_json()
    out.pop("timings_s")
    return out


@pytest.fixture(scope="module")
def merged():
    return analyze_trace(TWO_RANKS, workers=1)


def test_worker_processes_give_the_report_of_one_process(merged) -> None:
    ticks: list[tuple[int, int]] = []
    report = analyze_trace(TWO_RANKS, workers=2, progress=lambda *t: ticks.append(t))
    assert _json(report) == _json(merged)
    assert ticks == [(1, 2), (2, 2)]  # one tick per rank, as workers finish


def test_merged_ranks_equal_the_analyses_of_one_table(merged) -> None:
    """Per-(rank, step) tables, communication skew and memory as if loaded together."""
    trace = load_trace(TWO_RANKS)
    assert merged.summary["ranks"] == trace.ranks == [0, 1]
    pd.testing.assert_frame_equal(merged.per_step, step_breakdown(trace, adjusted_steps(trace)))
    whole = communication_summary(trace)
    for key in ("share", "overlap", "comm_ns", "step_ns", "overlap_by_rank", "basis"):
        assert merged.communication[key] == whole[key], key
    pd.testing.assert_frame_equal(merged.communication["per_rank"], whole["per_rank"])
    pd.testing.assert_frame_equal(merged.communication["skew"], whole["skew"])
    assert merged.memory == memory_summary(trace)
    assert list(merged.memory) == sorted(merged.memory)  # "rank0/..." labels, sorted

    # summed by name over ranks: the same figures per name (ties may be ordered apart)
    def by_name(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
        return df.set_index("name")[cols].sort_index()

    kernels = top_kernels(trace, n=50)
    cols = ["count", "total_ns", "max_ns", "mean_ns", "share"]
    pd.testing.assert_frame_equal(by_name(merged.kernels_top, cols), by_name(kernels, cols))
    ops = top_ops(trace, n=100_000)
    cols = ["count", "self_ns", "total_ns", "mean_self_ns", "share"]
    pd.testing.assert_frame_equal(by_name(merged.ops_top, cols), by_name(ops, cols))


def test_files_claiming_one_rank_are_numbered_by_position(tmp_path: Path) -> None:
    """Both copies say distributedInfo.rank 0: positions, with load_trace's warning."""
    for i in range(2):
        shutil.copy(TWO_RANKS[0], tmp_path / f"copy{i}.json.gz")
    files = sorted(tmp_path.iterdir())
    parts, warnings = map_ranks([str(f) for f in files], workers=1)
    assert [p.rank for p in parts] == [0, 1] and warnings == [DUPLICATE_RANKS]
    report = analyze_trace(tmp_path, workers=2)
    assert report.summary["ranks"] == load_trace(tmp_path).ranks == [0, 1]
    assert DUPLICATE_RANKS in report.warnings


def test_a_bad_rank_file_is_one_line_naming_it_from_a_worker(tmp_path: Path) -> None:
    good = tmp_path / "rank0.json.gz"
    shutil.copy(TWO_RANKS[0], good)
    bad = tmp_path / "rank1.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a"')[:-8])
    with pytest.raises(TraceError) as err:
        analyze_trace([good, bad], workers=2)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_workers_default_to_one_per_core_at_most_one_per_file(tmp_path: Path) -> None:
    small = [str(p) for p in TWO_RANKS]
    assert default_workers(small) == 1  # 0.2 MB: this process is quicker than workers
    big = []
    for i in range(64):
        big.append(tmp_path / f"rank{i}.json.gz")
        big[-1].write_bytes(b"\0" * (SMALL_JOB_BYTES // 32))
    assert default_workers([str(p) for p in big]) == min(os.cpu_count() or 1, 64)
    assert default_workers([str(big[0])]) == 1
    assert default_workers(["s3://bucket/a.json", "s3://bucket/b.json"]) == min(
        os.cpu_count() or 1, 2
    )
