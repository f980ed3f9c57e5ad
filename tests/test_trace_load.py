"""Loading real and broken traces: columns, units, ranks, and one-line errors."""

from __future__ import annotations

import gc
import gzip
import json
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from traces import ALL, CPU_ONLY, MI250, RANK0, RANK1, RESNET_NW0, V100_NS, trace_path

from stepscope.analyzers.trace import pieces
from stepscope.analyzers.trace.columns import CATEGORIES
from stepscope.analyzers.trace.flop_ops import keeps_op_args
from stepscope.analyzers.trace.load import TraceError, load_trace

EXPECTED_DTYPES = {
    "rank": "int16",
    "pid": "int64",
    "tid": "int64",
    "cat": "category",
    "name": "category",
    "ts": "int64",
    "dur": "int64",
    "end": "int64",
    "on_device": "bool",
    "correlation": "int64",
    "external_id": "int64",
    "stream": "int64",
    "device": "int64",
    "blocks_per_sm": "float32",
    "occupancy": "float32",
}


@pytest.mark.parametrize("name", ALL)
def test_every_shared_trace_loads(name: str) -> None:
    tr = load_trace(trace_path(name))
    ev = tr.events
    assert {c: str(t) for c, t in ev.dtypes.items() if c in EXPECTED_DTYPES} == EXPECTED_DTYPES
    assert set(ev["cat"].cat.categories) == set(CATEGORIES)
    assert len(ev) > 0
    assert (ev["end"] == ev["ts"] + ev["dur"]).all()
    assert (ev["dur"] >= 0).all()
    # sorted by (rank, ts)
    assert (np.diff(ev["ts"].to_numpy()) >= 0).all()
    assert len(tr.steps) >= 1 and (tr.steps["end"] >= tr.steps["start"]).all()
    assert tr.has_device == (name != CPU_ONLY)
    kernels = ev[(ev["cat"] == "kernel").to_numpy()]
    assert (kernels["stream"] >= 0).all() and (kernels["device"] >= 0).all()
    assert (ev.loc[~ev["on_device"], "stream"] == -1).all()


def test_old_trace_categories_and_string_tids_are_normalised() -> None:
    tr = load_trace(trace_path(RESNET_NW0))
    cats = tr.events["cat"].value_counts()
    # 'Operator' -> cpu_op, 'Runtime' -> cuda_runtime, 'Kernel' -> kernel, ...
    assert cats["cpu_op"] == 23646 and cats["cuda_runtime"] == 11923
    assert cats["kernel"] == 8772 and cats["gpu_memcpy"] == 12 and cats["gpu_memset"] == 312
    # string tids "25738" keep their number; 'stream 7' gets a stable id
    assert 25738 in set(tr.events["tid"])
    # old kernels carry 'external id' in lower case
    k = tr.events[tr.events["cat"] == "kernel"]
    assert (k["external_id"] > 0).mean() > 0.99
    assert tr.steps["step"].tolist() == [5, 6, 7, 8, 9, 10]
    assert len(tr.memory) == 12838 and tr.memory["total_allocated"].eq(-1).all()


def test_ns_resolution_keeps_sub_microsecond_digits() -> None:
    tr = load_trace(trace_path(V100_NS))
    ts = tr.events["ts"].to_numpy()
    # the file has ts like 1712195495519695.8 us; ns must not be rounded to whole us
    assert (ts % 1000 != 0).mean() > 0.5
    first = tr.events.iloc[0]
    assert first["ts"] == 1712195495406752750  # 1712195495406752.75 us, exact


def test_several_ranks_from_distributed_info(tmp_path: Path) -> None:
    tr = load_trace([trace_path(RANK1), trace_path(RANK0)])
    assert tr.ranks == [0, 1]
    assert tr.events["rank"].tolist()[0] == 0
    assert str(tr.events["name"].dtype) == "category"
    assert sorted(tr.steps.groupby("rank").size().tolist()) == [2, 2]
    assert tr.meta[1]["path"].endswith(RANK1)


def test_folder_loads_every_json(tmp_path: Path) -> None:
    for name in (RANK0, RANK1):
        (tmp_path / name).symlink_to(trace_path(name))
    (tmp_path / "notes.txt").write_text("not a trace")
    assert load_trace(tmp_path).ranks == [0, 1]


def _kineto(events: list, **meta) -> dict:
    return {"schemaVersion": 1, "traceEvents": events, **meta}


def _x(name, cat, ts, dur, **args) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_bare_list_form_and_no_steps_warning(tmp_path: Path) -> None:
    p = tmp_path / "bare.json"
    p.write_text(json.dumps([_x("aten::mm", "cpu_op", 10, 5), _x("aten::add", "cpu_op", 20, 2.5)]))
    tr = load_trace(p)
    assert tr.events["ts"].tolist() == [10_000, 20_000]
    assert tr.events["dur"].tolist() == [5_000, 2_500]
    assert tr.steps.to_dict("records") == [{"rank": 0, "step": -1, "start": 10_000, "end": 22_500}]
    assert any("no ProfilerStep#" in w and str(p) in w for w in tr.warnings)
    assert not tr.has_device


def test_mi250_device_naming() -> None:
    tr = load_trace(trace_path(MI250))
    k = tr.events[tr.events["cat"] == "kernel"]
    assert set(k["device"]) == {2}
    assert tr.steps["step"].tolist() == [1, 2]  # the GPU-side ProfilerStep#1 copy is not a step


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


GOOD = json.dumps(_kineto([_x("ProfilerStep#1", "user_annotation", 0, 10)])).encode()


@pytest.mark.parametrize(
    ("name", "data", "problem"),
    [
        ("trunc.json.gz", gzip.compress(GOOD * 50)[:-40], "truncated or corrupt gzip"),
        ("trunc.json", GOOD[:-7], "truncated JSON"),
        ("empty.json", b"", "empty file"),
        ("blank.json", b"  \n", "empty file"),
        ("text.json", b"hello, world", "not valid JSON"),
        ("obj.json", b'{"a": 1}', "not a Kineto trace"),
        ("numbers.json", b"[1, 2, 3]", "not a Kineto trace"),
        ("scalar.json", b"42", "not a Kineto trace"),
        ("noevents.json", json.dumps(_kineto([])).encode(), "no events"),
        ("onlymeta.json", json.dumps(_kineto([{"ph": "M", "name": "x"}])).encode(), "no complete"),
    ],
)
def test_bad_input_is_one_line_error_naming_the_file(
    tmp_path: Path, name: str, data: bytes, problem: str
) -> None:
    p = _write(tmp_path, name, data)
    with pytest.raises(TraceError) as info:
        load_trace(p)
    msg = str(info.value)
    assert msg.startswith(f"{p}: ") and problem in msg and "\n" not in msg


def test_missing_path_is_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.json")


def test_irregular_events_take_the_fallback_paths(tmp_path: Path) -> None:
    """Missing fields, null args, non-dict args and a lower-case 'external id' give the
    same columns as regular events would (the loader's fast paths fall back per field)."""
    events = [
        _x("aten::mm", "cpu_op", 10, 5, **{"External id": 7}),
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 20},
        {**_x("cudaLaunchKernel", "cuda_runtime", 21, 1), "args": None},
        {**_x("python_fn", "python_function", 22, 1), "args": [1, 2]},
        _x("k", "kernel", 30, 4, correlation=9, **{"external id": 7, "stream": 7, "device": 0}),
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 11, "args": {"Bytes": 64}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12},
        {"ph": "i", "name": "other instant", "pid": 1, "tid": 1, "ts": 13},
        {"name": "no ph at all"},
    ]
    tr = load_trace(_write(tmp_path, "irregular.json", json.dumps(_kineto(events)).encode()))
    ev = tr.events.set_index(tr.events["name"].astype(str))
    assert ev.loc["aten::add", "dur"] == 0 and ev.loc["aten::add", "external_id"] == -1
    assert ev.loc["aten::mm", "external_id"] == 7
    assert ev.loc["cudaLaunchKernel", "correlation"] == -1
    assert ev.loc["python_fn", "external_id"] == -1
    assert ev.loc["k", ["correlation", "external_id", "stream", "device"]].tolist() == [9, 7, 7, 0]
    assert list(tr.events["name"].cat.categories) == sorted(ev.index)
    assert tr.memory["bytes"].tolist() == [64, 0]
    assert tr.memory["total_allocated"].tolist() == [-1, -1]


def test_non_string_names_stay_categorical(tmp_path: Path) -> None:
    events = [_x("b", "cpu_op", 1, 1), _x(5, "cpu_op", 2, 1), _x("a", "cpu_op", 3, 1)]
    tr = load_trace(_write(tmp_path, "names.json", json.dumps(_kineto(events)).encode()))
    assert str(tr.events["name"].dtype) == "category"
    assert tr.events["name"].tolist() == ["b", 5, "a"]


def test_loading_restores_the_garbage_collector(tmp_path: Path) -> None:
    """The loader pauses the cyclic GC (see _gc_paused); it must leave it as it found it."""
    p = _write(tmp_path, "gc.json", GOOD)
    assert gc.isenabled()
    load_trace(p)
    assert gc.isenabled()
    gc.disable()
    try:
        load_trace(p)
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(TraceError):
        load_trace(_write(tmp_path, "bad.json", b"[1]"))
    assert gc.isenabled()


@pytest.mark.parametrize(
    "names", [(RESNET_NW0,), (RANK0, RANK1), (RANK1, RANK0, RANK1)], ids="+".join
)
def test_op_args_are_rows_of_the_events_through_sorting_and_renumbered_ranks(
    names: tuple[str, ...],
) -> None:
    """Each op_args row points at its event (after the (ts, -dur) sort, the concatenation
    of ranks, and renumbering by position where two files claim one rank), in (rank,
    file order), for every cpu_op the loader keeps args of and no other event."""
    tr = load_trace([trace_path(n) for n in names])
    ev, args = tr.events, tr.op_args
    assert list(args.columns) == ["row", "name", "args", "seq"]
    rows = args["row"].to_numpy()
    assert (ev["name"].astype(str).to_numpy()[rows] == args["name"].to_numpy()).all()
    assert (ev["cat"].to_numpy()[rows] == "cpu_op").all()
    kept = (ev["cat"] == "cpu_op").to_numpy() & ev["name"].map(keeps_op_args).to_numpy(bool)
    assert sorted(rows) == np.flatnonzero(kept).tolist()
    ranks = ev["rank"].to_numpy()
    assert (np.diff(ranks[rows]) >= 0).all()
    for rank in tr.ranks:  # each file's own args, shifted to where its events went
        alone = load_trace(tr.meta[rank]["path"]).op_args
        mine = args[ranks[rows] == rank]
        first_row = np.flatnonzero(ranks == rank)[0]
        assert (mine["row"].to_numpy() - first_row).tolist() == alone["row"].tolist()
        assert mine["name"].tolist() == alone["name"].tolist()
        assert mine["args"].tolist() == alone["args"].tolist()


def test_op_args_of_the_old_resnet_trace() -> None:
    """A tb-profiler era trace: 'Operator' events, shapes but no 'Concrete Inputs'; the
    conv's autograd node carries the output's gradient shape and the sequence number."""
    tr = load_trace(trace_path(RESNET_NW0))
    args = tr.op_args.set_index("name")
    dims, types, concrete = orjson.loads(args.loc["aten::convolution", "args"].iloc[0])
    assert dims[:2] == [[32, 3, 224, 224], [64, 3, 7, 7]]
    assert types[0] == "float" and concrete is None
    node = args.loc["CudnnConvolutionBackward"]
    assert len(node) == 318 and node["seq"].ge(0).all()
    assert orjson.loads(node["args"].iloc[0])[0][0] == [32, 2048, 7, 7]  # the last conv's


def test_op_args_of_irregular_events(tmp_path: Path) -> None:
    """Null or missing args give None; an op later in the file that starts first gets the
    first row; names without a formula and other categories are not kept."""
    events = [
        _x("aten::add", "cpu_op", 30, 1, **{"Input Dims": [[2], [2]], "Sequence number": 4}),
        {**_x("aten::mul", "cpu_op", 40, 1), "args": None},
        _x("aten::mm", "cpu_op", 10, 5, **{"Input Dims": [[1, 2], [2, 3]], "Input type": []}),
        _x("aten::empty", "cpu_op", 11, 1, **{"Input Dims": [[1]]}),
        _x("aten::mm", "user_annotation", 12, 1),
        _x(5, "cpu_op", 13, 1),
        _x("autograd::engine::evaluate_function: ConvolutionBackward0", "cpu_op", 50, 2),
        _x("ConvolutionBackward0", "cpu_op", 51, 1, **{"Sequence number": 9}),
    ]
    tr = load_trace(_write(tmp_path, "args.json", json.dumps(_kineto(events)).encode()))
    args = tr.op_args
    assert args["name"].tolist() == ["aten::add", "aten::mul", "aten::mm", "ConvolutionBackward0"]
    assert args["row"].tolist() == [4, 5, 0, 7]
    assert list(map(orjson.loads, args["args"])) == [
        [[[2], [2]], None, None],
        [None, None, None],
        [[[1, 2], [2, 3]], [], None],
        [None, None, None],
    ]
    assert args["seq"].tolist() == [4, -1, -1, 9]  # -1: no sequence number


# -- big files, parsed a piece at a time (trace/pieces.py) -----------------------------------
@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every file is 'big', cut into ~64 kB pieces; the list counts the pieces parsed."""
    seen: list[int] = []
    cut = pieces._pieces

    def counted(*args, **kwargs):
        for events in cut(*args, **kwargs):
            seen.append(len(events))
            yield events

    monkeypatch.setattr(pieces, "MIN_BYTES", 0)
    monkeypatch.setattr(pieces, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(pieces, "_pieces", counted)
    return seen


def _whole(path: Path, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as m:
        m.setattr(pieces, "MIN_BYTES", 1 << 62)
        return load_trace(path)


def _assert_same(a, b) -> None:
    for field in ("events", "memory", "steps", "op_args"):
        pd.testing.assert_frame_equal(getattr(a, field), getattr(b, field), obj=field)
    assert a.meta == b.meta and a.ranks == b.ranks


@pytest.mark.parametrize(
    "name", ["resnet50_v100_num_workers_0.pt.trace.json.gz", "a100_nccl_3steps.json.gz"]
)
def test_a_big_trace_in_pieces_loads_as_one(name, small_pieces, monkeypatch) -> None:
    """Kineto's layout (an event per block at two spaces): the same columns, in order."""
    path = trace_path(name)
    whole = _whole(path, monkeypatch)
    _assert_same(load_trace(path), whole)
    assert len(small_pieces) > 5 and sum(small_pieces) > len(whole.events)


def test_one_event_per_line_is_cut_and_compact_json_is_parsed_whole(
    tmp_path: Path, small_pieces, monkeypatch
) -> None:
    doc = orjson.loads(gzip.decompress(trace_path("a100_nccl_3steps.json.gz").read_bytes()))
    events = doc.pop("traceEvents")
    head = orjson.dumps(doc)[:-1] + b', "traceEvents": [\n'
    lines = tmp_path / "lines.json"  # the layout of bench/synthetic_trace.py
    lines.write_bytes(head + b",\n".join(map(orjson.dumps, events)) + b"\n]}")
    compact = tmp_path / "compact.json"
    compact.write_bytes(orjson.dumps({**doc, "traceEvents": events}))
    whole = _whole(lines, monkeypatch)
    _assert_same(load_trace(lines), whole)
    assert len(small_pieces) > 5
    small_pieces.clear()
    _assert_same(load_trace(compact), _whole(compact, monkeypatch))
    assert small_pieces == []  # no line to cut at: one parse, the usual way


def test_a_truncated_big_file_is_still_one_line(tmp_path: Path, small_pieces) -> None:
    text = gzip.decompress(trace_path("a100_nccl_3steps.json.gz").read_bytes())
    bad = tmp_path / "cut.json"
    bad.write_bytes(text[: len(text) // 2])
    with pytest.raises(TraceError) as err:
        load_trace(bad)
    assert "truncated JSON" in str(err.value) and "\n" not in str(err.value)


# -- typed records (trace/typed_events.py) against the dict reading -----------------------------
def _dict_reading(path: Path, monkeypatch: pytest.MonkeyPatch):
    """The trace read the dict way (orjson), as a trace the typed records do not fit is."""
    from stepscope.analyzers.trace import load as load_module

    with monkeypatch.context() as m:
        m.setattr(load_module, "decode_document", lambda data: None)
        m.setattr(pieces, "decode_events", lambda data: None)
        return load_trace(path)


@pytest.mark.parametrize("name", ALL)
def test_typed_records_read_every_shared_trace_as_the_dicts_do(name, monkeypatch) -> None:
    from stepscope.analyzers.trace.load import read_text
    from stepscope.analyzers.trace.typed_events import decode_document

    path = trace_path(name)
    assert decode_document(read_text(path)) is not None  # the fast reading is the one used
    _assert_same(load_trace(path), _dict_reading(path, monkeypatch))


def test_typed_records_read_irregular_events_as_the_dicts_do(tmp_path: Path, monkeypatch) -> None:
    """Null and missing args, missing fields, numbers as strings, a lower-case 'external
    id', a non-string name, a memory instant without args: the same columns both ways."""
    events = [
        _x("aten::mm", "cpu_op", 10, 5, **{"External id": 7, "Input Dims": [[1, 2], [2, 3]]}),
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": "7", "ts": 20},
        {**_x("cudaLaunchKernel", "cuda_runtime", 21, 1), "args": None},
        {**_x("aten::addmm", "cpu_op", "22.5", 1), "args": {"Sequence number": 3}},
        _x("k", "kernel", 30, 4, correlation=9, **{"external id": 7, "stream": 7, "device": 0}),
        _x(5, "cpu_op", 31, 1),
        {
            "ph": "X",
            "cat": "Operator",
            "name": "old",
            "pid": "worker",
            "tid": 2,
            "ts": 32,
            "dur": 1,
        },
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 11, "args": {"Bytes": 64}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12},
        {"ph": "i", "name": "other instant", "pid": 1, "tid": 1, "ts": 13},
        {"name": "no ph at all"},
    ]
    path = _write(tmp_path, "irregular.json", json.dumps(_kineto(events)).encode())
    from stepscope.analyzers.trace.load import read_text
    from stepscope.analyzers.trace.typed_events import decode_document

    assert decode_document(read_text(path)) is not None
    typed, dicts = load_trace(path), _dict_reading(path, monkeypatch)
    _assert_same(typed, dicts)
    ev = typed.events.set_index(typed.events["name"].astype(str))
    assert ev.loc["k", ["correlation", "external_id", "stream", "device"]].tolist() == [9, 7, 7, 0]
    assert typed.memory["bytes"].tolist() == [64, 0]


def test_a_big_trace_in_typed_pieces_reads_as_the_dicts_do(small_pieces, monkeypatch) -> None:
    path = trace_path("a100_nccl_3steps.json.gz")
    _assert_same(load_trace(path), _dict_reading(path, monkeypatch))
    assert len(small_pieces) > 5
