"""Memory: peaks and curves from [memory] events; torch's categorised memory timeline."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from hand_trace import ev, make_trace
from traces import trace_path

from stepscope.analyzers.trace.load import load_trace
from stepscope.analyzers.trace.memory import (
    TIMELINE_CATEGORIES,
    load_memory_timeline,
    memory_curve,
    memory_summary,
    memory_timeline_by_category,
    memory_timeline_peaks,
)


def _mem_trace(n_cuda: int = 10, meta=None):
    rng = np.random.default_rng(0)
    deltas = rng.integers(-50, 100, n_cuda) * 1024
    alloc = np.cumsum(deltas) + 10_000_000
    rows = {
        "rank": np.zeros(n_cuda + 2, dtype=np.int16),
        "ts": np.r_[np.arange(n_cuda) * 1000, 5, 6].astype(np.int64),
        "device_type": np.r_[np.ones(n_cuda), 0, 0].astype(np.int64),
        "device_id": np.r_[np.zeros(n_cuda), -1, -1].astype(np.int64),
        "bytes": np.r_[deltas, 4096, -4096].astype(np.int64),
        "total_allocated": np.r_[alloc, 4096, 0].astype(np.int64),
        "total_reserved": np.r_[np.full(n_cuda, 64_000_000), 0, 0].astype(np.int64),
    }
    memory = pd.DataFrame(rows).sort_values("ts", ignore_index=True)
    return make_trace([ev("cpu_op", "aten::empty", 0, 1)], memory=memory, meta=meta), alloc


def test_peaks_per_device_and_capacity_share():
    meta = {0: {"deviceProperties": [{"id": 0, "totalGlobalMem": 100_000_000}]}}
    trace, alloc = _mem_trace(meta=meta)
    out = memory_summary(trace)
    assert set(out) == {"cpu", "cuda:0"}
    assert out["cuda:0"]["peak_allocated_bytes"] == alloc.max()
    assert out["cuda:0"]["peak_reserved_bytes"] == 64_000_000
    assert out["cuda:0"]["peak_share"] == pytest.approx(alloc.max() / 100_000_000)
    assert out["cpu"]["peak_allocated_bytes"] == 4096 and "capacity_bytes" not in out["cpu"]


def test_curve_downsampling_keeps_the_peak():
    trace, alloc = _mem_trace(n_cuda=10_000)
    curve = memory_curve(trace, max_points=100)
    cuda = curve[curve["device"] == "cuda:0"]
    assert len(cuda) <= 100
    assert cuda["allocated"].max() == alloc.max()
    assert cuda["ts"].is_monotonic_increasing


def test_no_memory_events():
    trace = make_trace([ev("cpu_op", "aten::mm", 0, 1)])
    assert memory_summary(trace) == {}
    assert memory_curve(trace).empty


def test_real_trace_memory_peaks():
    trace = load_trace(trace_path("resnet50_v100_num_workers_0.pt.trace.json.gz"))
    out = memory_summary(trace)
    assert set(out) == {"cpu", "cuda:0"}
    cuda = trace.memory[trace.memory["device_type"] == 1]
    # this old trace has no running totals (-1): the peak comes from the summed deltas
    assert (cuda["total_allocated"] == -1).all()
    want = int(cuda["bytes"].cumsum().max())
    assert out["cuda:0"]["peak_allocated_bytes"] == want
    assert out["cuda:0"]["capacity_bytes"] > out["cuda:0"]["peak_allocated_bytes"]


# -- export_memory_timeline raw files ---------------------------------------------------


def _torch_coalesce_peak(rows) -> dict[int, int]:
    """Plain re-statement of torch's _coalesce_timeline: the test oracle."""
    times: list[int] = []
    sizes: list[list[int]] = []
    t_min = -1
    for t, _action, nbytes, cat in rows:
        if t != -1:
            t = int(t / 1000)
        if t_min == -1 or (t < t_min and t > 0):
            t_min = t
        if not times:
            times.append(t)
            sizes.append([0] * 8)
        elif t != times[-1]:
            times.append(t)
            sizes.append(sizes[-1].copy())
        sizes[-1][cat] += nbytes
    peaks = {c: max(s[c] for s in sizes) for c in range(8)}
    peaks[-1] = max(sum(s) for s in sizes)
    return peaks


def test_small_raw_timeline_by_hand(tmp_path):
    rows = [
        [-1, 1, 1000, 0],  # parameter that existed before profiling
        [5_000, 2, 300, 4],  # activation created at 5 us
        [5_400, 4, -300, 4],  # freed in the same microsecond: no spike in torch's plot
        [9_000, 2, 500, 3],  # temporary
        [9_000, 3, -500, 3],  # version bump moves it to the gradient category
        [9_000, 3, 500, 5],
        [12_000, 4, -500, 5],
    ]
    path = tmp_path / "t.raw.json.gz"
    path.write_bytes(gzip.compress(json.dumps(rows).encode()))
    df = load_memory_timeline(path)
    assert list(df["action_name"].astype(str)) == [
        "PREEXISTING",
        "CREATE",
        "DESTROY",
        "CREATE",
        "INCREMENT_VERSION",
        "INCREMENT_VERSION",
        "DESTROY",
    ]
    by = memory_timeline_by_category(df)
    assert list(by["ts"]) == [5_000, 9_000, 12_000]  # the pre-existing row joins the first time
    assert list(by["total"]) == [1000, 1500, 1000]
    peaks = memory_timeline_peaks(by)
    assert peaks["ACTIVATION"] == 0 and peaks["GRADIENT"] == 500 and peaks["TEMPORARY"] == 0
    assert peaks["total"] == 1500


def test_shared_raw_timeline_matches_torch_coalescing():
    path = trace_path("memory_timeline.raw.gz")
    rows = json.loads(gzip.decompress(path.read_bytes()))
    want = _torch_coalesce_peak(rows)
    by = memory_timeline_by_category(load_memory_timeline(path))
    peaks = by.attrs["peak_bytes"]
    assert peaks["total"] == want[-1]
    for i, cat in enumerate(TIMELINE_CATEGORIES):
        assert peaks[cat] == want[i], cat
    # the known peak of this file: about 2.87 GiB, mostly activations
    assert peaks["total"] == 3_082_832_104
    assert peaks["ACTIVATION"] == max(peaks[c] for c in TIMELINE_CATEGORIES)


def test_not_a_timeline_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.raw.json"
    bad.write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="not a raw memory timeline"):
        load_memory_timeline(bad)
