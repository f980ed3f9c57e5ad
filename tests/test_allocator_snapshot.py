"""The CUDA allocator snapshot: read without executing it, its figures, an OOM explained.

No GPU here: the snapshots are built in torch's format by ``tests/snapshots.py`` (its
docstring says from what); ``tests/gpu/check_allocator_snapshot.py`` checks the reader
against real ones. Every file is read from a store, as `stepscope memory`, the verdict
and the Run page read it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import REPO, open_page, stepscope, texts
from snapshots import (
    GiB,
    MiB,
    block,
    capture_snapshot,
    fragmented_oom,
    full_oom,
    segment,
    snapshot,
    write_snapshot,
)

from stepscope.analyzers.report.run_memory import NoMemoryData, run_memory
from stepscope.analyzers.report.run_snapshot import run_snapshot
from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.analyzers.rules.evidence import gather
from stepscope.analyzers.trace.allocator_snapshot import (
    SnapshotError,
    read_snapshot,
    snapshot_figures,
)
from stepscope.analyzers.trace.job_frames import is_job_file
from stepscope.app.cli.memory import memory_summary
from stepscope.app.cli.verdict import verdict_lines
from stepscope.collectors.injob import oom_record
from stepscope.store import RunStore
from stepscope.store.plain_pickle import PlainPickleError, load_plain_pickle

TIMELINE = REPO / "tests" / "data" / "memory_timeline.raw.gz"  # a real CUDA timeline
STEM = "host_1.1700000000000"
OOM_ERROR = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a "
    "total capacity of 8.00 GiB of which 512.00 MiB is free."
)


class Evil:
    """Unpickled by ``pickle.load``, this runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def _run(store: RunStore, name: str, *, oom: bool = False, timeline: bool = False) -> int:
    rid = store.create_run(["python", "train.py"], name=name)
    if timeline:
        path = store.run_dir(rid) / f"{STEM}.memory_timeline.raw.json.gz"
        shutil.copy(TIMELINE, path)
        store.add_artifact(rid, "memory_timeline", str(path), meta={"device": "cuda:0"})
    if oom:
        record = {
            "error": OOM_ERROR,
            "bytes_asked": 3 * GiB // 2,
            "cuda_device": 0,
            "cuda_allocated_bytes": 4 * GiB,
            "cuda_reserved_bytes": 8 * GiB,
            "cuda_total_bytes": 8 * GiB,
            "step": 2,
            "source": "/home/me/train.py:12 in hold: x = torch.empty(n, device='cuda')",
        }
        store.update_run(
            rid,
            config={"oom": [record]},
            device={"device_name": "NVIDIA H100 80GB HBM3", "capability": 9.0},
            facts={"model": {"device": "cuda:0", "training": True, "grad_enabled": True}},
        )
        store.finish_run(rid, "failed", 1, OOM_ERROR)
    else:
        store.finish_run(rid, "completed", 0)
    return rid


def _add_snapshot(store: RunStore, rid: int, snap: Any, name: str = "oom") -> Path:
    path = store.run_dir(rid) / f"{name}.memory_snapshot.pickle"
    write_snapshot(path, snap)
    store.add_artifact(rid, "memory_snapshot", str(path), meta={"reason": "oom"})
    return path


# -- the figures ---------------------------------------------------------------------------


def test_a_captures_figures(tmp_path: Path) -> None:
    a = read_snapshot(write_snapshot(tmp_path / "c.memory_snapshot.pickle", capture_snapshot()))
    # three segments: 1 GiB of blocks, 128 MiB, 2 MiB
    assert a.segments == 3 and a.device == 0 and a.oom is None
    assert a.reserved_bytes == 1024 * MiB + 128 * MiB + 2 * MiB
    assert a.allocated_bytes == (512 + 128 + 96 + 32) * MiB + 512 * 1024
    assert a.unused_bytes == (256 + 64) * MiB + 1536 * 1024
    assert a.pending_free_bytes == 64 * MiB
    assert a.reserved_bytes == a.allocated_bytes + a.unused_bytes + a.pending_free_bytes
    assert a.largest_free_block_bytes == 256 * MiB
    # the innermost frame of the job's code: past C++, torch, stepscope's own wrapper;
    # the two blocks sharing one stack counted once each
    sites = a.sites.set_index("site")
    assert list(a.sites["site"]) == ["/home/me/train.py:12 in hold", "/home/me/train.py:30 in step"]
    assert sites.loc["/home/me/train.py:12 in hold", "bytes"] == 640 * MiB
    assert sites.loc["/home/me/train.py:12 in hold", "blocks"] == 2
    # no stack (before the history) and the standard library's thread: no job line
    assert a.no_site_bytes == 32 * MiB + 512 * 1024
    assert a.explanation() is None and a.fragmented is None
    assert a.to_dict()["largest_free_block_bytes"] == 256 * MiB


def test_the_device_that_ran_out_or_reserves_most(tmp_path: Path) -> None:
    big = segment([block(4 * GiB)], device=1)
    small = segment([block(GiB)], device=0, address=0x7F1000000000)
    a = snapshot_figures(snapshot([small, big], [[], []]), "p")
    assert (a.device, a.reserved_bytes, a.segments) == (1, 4 * GiB, 1)
    oom = fragmented_oom()
    for s in oom["segments"]:
        s["device"] = 1
    oom["segments"].append(segment([block(9 * GiB)], address=0x7F9000000000))
    oom["device_traces"] = [[], oom["device_traces"][0]]
    a = snapshot_figures(oom, "p")
    assert a.device == 1 and a.oom is not None and a.reserved_bytes == 8 * GiB
    assert snapshot_figures(oom, "p", device=0).reserved_bytes == 9 * GiB


def test_a_fragmented_oom_is_explained(tmp_path: Path) -> None:
    a = snapshot_figures(fragmented_oom(), "p")
    assert a.oom is not None
    assert (a.oom.asked_bytes, a.oom.device_free_bytes) == (3 * GiB // 2, 512 * MiB)
    assert a.free_total_bytes == 4 * GiB + 512 * MiB and a.largest_free_block_bytes == GiB
    assert a.fragmented is True
    assert a.explanation() == (
        "asked for 1.5 GiB with 4.5 GiB free in total (4.0 GiB cached unused, 512.0 MiB on "
        "the device) but the largest free block is 1.0 GiB (fragmentation: expandable "
        "segments would help)"
    )
    expandable = fragmented_oom()
    for s in expandable["segments"]:
        s["is_expandable"] = True
    assert "already on" in snapshot_figures(expandable, "p").explanation()


def test_a_full_oom_names_who_holds_the_memory() -> None:
    a = snapshot_figures(full_oom(), "p")
    assert a.fragmented is False
    text = a.explanation()
    assert text.startswith("asked for 20.0 GiB with 1.1 GiB free in total")
    assert "the memory is full, not fragmented" in text
    assert "held most by /home/me/train.py:12 in hold 6.0 GiB, /home/me/train.py:30" in text
    assert "expandable" not in text


@pytest.mark.parametrize(
    ("path", "the_jobs"),
    [
        ("/home/me/train.py", True),
        ("/venv/lib/python3.11/site-packages/transformers/activations.py", True),
        ("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", False),
        ("/usr/lib/python3/dist-packages/torch/nn/functional.py", False),
        ("/usr/lib/python3.12/threading.py", False),
        ("/opt/conda/lib/python3.11/runpy.py", False),
        ("/opt/stepscope/stepscope/collectors/steps/step_timer.py", False),
    ],
)
def test_the_job_frame_filter_by_absolute_path(path: str, the_jobs: bool) -> None:
    """The snapshot's frames are absolute paths: the one filter of memory_peak's lines
    holds for them too."""
    assert is_job_file(path) is the_jobs


# -- nothing executed, one line, the rest shown ------------------------------------------------


def test_a_pickle_with_a_global_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    pwned = tmp_path / "PWNED"
    with RunStore(tmp_path / "home") as store:
        rid = _run(store, "evil", oom=True, timeline=True)
        bad = store.run_dir(rid) / "oom.memory_snapshot.pickle"
        bad.write_bytes(pickle.dumps({"segments": [Evil(f"touch {pwned}")], "device_traces": []}))
        store.add_artifact(rid, "memory_snapshot", str(bad), meta={"reason": "oom"})
        b = run_memory(store, rid)
        diagnosis = diagnose_run(store, rid)
    assert not pwned.exists()
    assert len(b.problems) == 1 and "\n" not in b.problems[0]
    assert str(bad) in b.problems[0] and "posix.system" in b.problems[0]
    assert "refused" in b.problems[0]
    assert b.peak_bytes and len(b.peak) and b.allocator is None  # the timeline still shown
    # the verdict explains the OOM from its record and says the snapshot was not read
    lines = verdict_lines(rid, diagnosis)
    assert lines[0].startswith("verdict: out of memory")
    assert any("allocator snapshot was not read" in ln and str(bad) in ln for ln in lines)
    assert any("asked for 1.5 GiB" in ln for ln in lines)  # the record's own line
    # the CLI: the peak shown, one line about the file, nothing run
    out = stepscope(tmp_path / "home", "memory", str(rid))
    assert "At the peak, by what it holds" in out.stdout and "refused" in out.stdout
    data = json.loads(stepscope(tmp_path / "home", "memory", str(rid), "--json").stdout)
    assert data["allocator_snapshot"] is None and data["peak_bytes"] > 0
    assert not pwned.exists()


def test_the_unpickler_refuses_every_way_to_a_callable(tmp_path: Path) -> None:
    """Protocols 0-5, a persistent id, an extension code: refused, nothing run."""
    pwned = tmp_path / "PWNED"
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        path = tmp_path / f"p{proto}.pickle"
        path.write_bytes(pickle.dumps([Evil(f"touch {pwned}")], protocol=proto))
        with pytest.raises(PlainPickleError, match="refused"):
            load_plain_pickle(path)
    persistent = tmp_path / "pid.pickle"
    persistent.write_bytes(b"\x80\x02X\x01\x00\x00\x00aQ.")  # BINPERSID
    with pytest.raises(PlainPickleError, match="persistent id"):
        load_plain_pickle(persistent)
    ext = tmp_path / "ext.pickle"
    ext.write_bytes(b"\x80\x02\x82\x01.")  # EXT1 1
    with pytest.raises(PlainPickleError):
        load_plain_pickle(ext)
    assert not pwned.exists()
    plain = tmp_path / "plain.pickle"
    plain.write_bytes(pickle.dumps({"a": [1, 2.5, None, True, "x", (3, 4), b"y"]}))
    assert load_plain_pickle(plain) == {"a": [1, 2.5, None, True, "x", (3, 4), b"y"]}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("truncated", "truncated"),
        (b'{"segments": []}', "not a pickle"),  # JSON
        (b"\x1f\x8b\x08\x00 gzip", "not a pickle"),
        (pickle.dumps([1, 2, 3]), "not a CUDA allocator snapshot"),
        (pickle.dumps({"segments": [{"total_size": "big"}]}), "not a CUDA allocator snapshot"),
        (pickle.dumps({"segments": [{"total_size": 10**5000, "blocks": []}]}), "out of range"),
    ],
    ids=["truncated", "json", "gzip", "a list", "a string size", "a huge int"],
)
def test_a_truncated_or_foreign_file_is_one_line(
    tmp_path: Path, content: bytes | str, says: str
) -> None:
    if content == "truncated":
        content = pickle.dumps(fragmented_oom())[:-100]
    with RunStore(tmp_path / "home") as store:
        rid = _run(store, "bad", oom=True, timeline=True)
        bad = store.run_dir(rid) / "oom.memory_snapshot.pickle"
        bad.write_bytes(content)
        store.add_artifact(rid, "memory_snapshot", str(bad), meta={"reason": "oom"})
        b = run_memory(store, rid)
        lines = verdict_lines(rid, diagnose_run(store, rid))
    assert len(b.problems) == 1 and "\n" not in b.problems[0], b.problems
    assert b.problems[0].startswith(str(bad)) and says in b.problems[0]
    assert b.peak_bytes and len(b.peak)
    assert lines[0].startswith("verdict: out of memory")
    assert any("allocator snapshot was not read" in ln for ln in lines)


def test_a_snapshot_over_the_cap_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_snapshot(tmp_path / "s.memory_snapshot.pickle", fragmented_oom())
    monkeypatch.setenv("STEPSCOPE_MAX_SNAPSHOT_BYTES", "100")
    with pytest.raises(SnapshotError, match="too large.*STEPSCOPE_MAX_SNAPSHOT_BYTES"):
        read_snapshot(path)


def test_a_path_stepscope_did_not_record_is_not_read(tmp_path: Path) -> None:
    """Outside the run's folders, a name stepscope never writes, or a link to another
    file: refused in one line, never opened as a pickle."""
    outside = write_snapshot(tmp_path / "elsewhere" / "x.memory_snapshot.pickle", full_oom())
    with RunStore(tmp_path / "home") as store:
        cases = {}
        rid = _run(store, "outside", oom=True)
        store.add_artifact(rid, "memory_snapshot", str(outside))
        cases[rid] = "lies outside"
        rid = _run(store, "renamed", oom=True)
        named = write_snapshot(store.run_dir(rid) / "weights.pt", full_oom())
        store.add_artifact(rid, "memory_snapshot", str(named))
        cases[rid] = "not a snapshot file stepscope writes"
        rid = _run(store, "linked", oom=True)
        target = write_snapshot(store.run_dir(rid) / "other.bin", full_oom())
        link = store.run_dir(rid) / "oom.memory_snapshot.pickle"
        link.symlink_to(target)
        store.add_artifact(rid, "memory_snapshot", str(link))
        cases[rid] = "not a snapshot file stepscope writes"
        rid = _run(store, "linked-out", oom=True)
        link = store.run_dir(rid) / "oom.memory_snapshot.pickle"
        link.symlink_to(outside)
        store.add_artifact(rid, "memory_snapshot", str(link))
        cases[rid] = "lies outside"
        for rid, says in cases.items():
            snap, problems = run_snapshot(store, rid)
            assert snap is None and len(problems) == 1 and says in problems[0], problems
            b = run_memory(store, rid)
            assert b.allocator is None and says in b.problems[0]
            ev = gather(store, rid)
            assert ev.allocator is None and says in (ev.allocator_problem or "")


# -- where it is shown ---------------------------------------------------------------------


def test_memory_cli_and_show_with_an_oom_snapshot_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with RunStore(home) as store:
        rid = _run(store, "frag", oom=True)
        path = _add_snapshot(store, rid, fragmented_oom())
        b = run_memory(store, rid)
        summary = memory_summary(store, rid)
    assert b.allocator is not None and b.peak_bytes is None and b.problems == []
    assert b.reserved_unused_bytes == 4 * GiB and b.reserved_unused_at == "the out-of-memory error"
    assert b.device == "cuda:0"
    assert any("largest free block 1.0 GiB" in ln for ln in summary["lines"])
    data = json.loads(stepscope(home, "memory", str(rid), "--json").stdout)
    snap = data["allocator_snapshot"]
    assert snap["path"] == str(path) and snap["moment"] == "the out-of-memory error"
    assert snap["reserved_bytes"] == 8 * GiB and snap["allocated_bytes"] == 4 * GiB
    assert snap["reserved_unused_bytes"] == 4 * GiB == data["reserved_unused_bytes"]
    assert snap["largest_free_block_bytes"] == GiB and snap["segments"] == 4
    assert snap["oom"] == {
        "asked_bytes": 3 * GiB // 2,
        "device_free_bytes": 512 * MiB,
        "free_total_bytes": 4 * GiB + 512 * MiB,
        "fragmented": True,
    }
    assert snap["sites"] == [
        {"site": "/home/me/train.py:12 in hold", "bytes": 4 * GiB, "blocks": 4}
    ]
    text = " ".join(stepscope(home, "memory", str(rid)).stdout.split())  # rich wraps
    assert "CUDA allocator snapshot at the out-of-memory error" in text
    assert "largest free block" in text and "/home/me/train.py:12 in hold" in text
    assert "expandable segments would help" in text
    shown = stepscope(home, "show", str(rid)).stdout
    assert "allocator snapshot at the out-of-memory error" in " ".join(shown.split())


def test_a_capture_snapshot_beside_the_timeline(tmp_path: Path) -> None:
    with RunStore(tmp_path / "home") as store:
        rid = _run(store, "cap", timeline=True)
        _add_snapshot(store, rid, capture_snapshot(), name=STEM)
        b = run_memory(store, rid)
        ev = gather(store, rid)
    assert b.problems == [] and b.peak_bytes and b.allocator is not None
    assert b.allocator.moment == "the capture's end" and b.allocator.oom is None
    assert b.to_dict()["allocator_snapshot"]["segments"] == 3
    assert b.reserved_unused_bytes == b.allocator.unused_bytes  # the timeline has none
    assert ev.allocator is None  # a run that did not run out: no snapshot read to diagnose


def test_without_a_snapshot_nothing_changes(tmp_path: Path) -> None:
    with RunStore(tmp_path / "home") as store:
        rid = _run(store, "cpu", timeline=True)
        b = run_memory(store, rid)
        plain = _run(store, "plain")
        with pytest.raises(NoMemoryData, match="no profiler capture"):
            run_memory(store, plain)
        assert memory_summary(store, plain) is None
    assert b.allocator is None and b.reserved_unused_at is None
    assert b.to_dict()["allocator_snapshot"] is None


def test_the_verdict_explains_a_fragmented_oom(tmp_path: Path) -> None:
    with RunStore(tmp_path / "home") as store:
        rid = _run(store, "frag", oom=True)
        _add_snapshot(store, rid, fragmented_oom())
        d = diagnose_run(store, rid)
    lines = verdict_lines(rid, d)
    assert lines[0].startswith("verdict: out of memory")
    said = [ln for ln in lines if "allocator snapshot" in ln]
    assert len(said) == 1 and "largest free block is 1.0 GiB" in said[0]
    assert "fragmentation: expandable segments would help" in said[0]
    fixes = {f.id: f for f in d.findings[0].fixes}
    assert "expandable_segments" in fixes
    assert "largest free block" in (fixes["expandable_segments"].evidence or "")
    assert any("frees memory: expandable_segments" in ln for ln in lines)


def test_the_verdict_names_who_holds_a_full_device(tmp_path: Path) -> None:
    with RunStore(tmp_path / "home") as store:
        rid = _run(store, "full", oom=True)
        _add_snapshot(store, rid, full_oom())
        d = diagnose_run(store, rid)
    lines = verdict_lines(rid, d)
    said = [ln for ln in lines if "allocator snapshot" in ln]
    assert len(said) == 1 and "the memory is full" in said[0]
    assert "/home/me/train.py:12 in hold 6.0 GiB" in said[0]
    # expandable segments cannot fit a request larger than all the free memory
    assert "expandable_segments" not in {f.id for f in d.findings[0].fixes}
    skipped = {s.id: s.reason for s in d.findings[0].skipped}
    assert "no fragmentation" in skipped["expandable_segments"]
    # without a snapshot, the catalog offers it as before
    with RunStore(tmp_path / "home") as store:
        rid = _run(store, "none", oom=True)
        assert "expandable_segments" in {f.id for f in diagnose_run(store, rid).findings[0].fixes}


def test_run_page_shows_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    with RunStore(home) as store:
        rid = _run(store, "frag", oom=True, timeline=True)
        _add_snapshot(store, rid, fragmented_oom())
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(rid))
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [f"failed: {OOM_ERROR}"]  # the run's own error
    shown = texts(at)
    assert "CUDA allocator snapshot" in shown and "the out-of-memory error" in shown
    assert "largest free block is 1.0 GiB" in shown
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Reserved"] == "8 GiB" and metrics["Allocated"] == "4 GiB"
    assert metrics["Largest free block"] == "1 GiB" and metrics["Segments"] == "4"
    frames = [d.value for d in at.dataframe]
    sites = next(f for f in frames if "the job's line (file:line in function)" in f.columns)
    assert list(sites["the job's line (file:line in function)"]) == ["/home/me/train.py:12 in hold"]
    assert any("at the peak" in f.columns for f in frames)  # the timeline's table still there


# -- in the job ----------------------------------------------------------------------------


class _Writer:
    rank = 0

    def __init__(self) -> None:
        self.artifacts: list[tuple[str, str, dict]] = []
        self.logs: list[str] = []

    def add_artifact(self, kind: str, path: str, meta: dict) -> None:
        self.artifacts.append((kind, path, meta))

    def merge_run_json(self, *args: Any, **kw: Any) -> None:
        pass

    def log(self, level: str, source: str, text: str) -> None:
        self.logs.append(text)


class _Capture:
    _memory_history = True

    def __init__(self, writer: _Writer, folder: Path) -> None:
        self.writer, self.folder = writer, folder

    def _dump_memory_snapshot(self, extra: dict | None = None) -> str:
        path = str(self.folder / "host_1.1.memory_snapshot.pickle")
        self.writer.add_artifact("memory_snapshot", path, {"reason": "auto", **(extra or {})})
        return path


class _Cuda:
    class memory:  # noqa: N801  # torch.cuda.memory's shape
        pass

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def current_device() -> int:
        raise RuntimeError("no figures in this fake")


def test_an_oom_inside_a_capture_marks_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture's own snapshot, dumped at the error: one row, meta reason oom, and the
    record and its log line name it."""
    fake = type(sys)("torch")
    fake.cuda = _Cuda
    monkeypatch.setitem(sys.modules, "torch", fake)
    writer = _Writer()
    timer = type("Timer", (), {"step": 2, "capture": _Capture(writer, tmp_path)})()
    exc = RuntimeError("CUDA out of memory. Tried to allocate 1.50 GiB")
    record = oom_record.record_oom(RuntimeError, exc, None, writer, timer, str(tmp_path))
    assert record is not None and record["snapshot"].endswith("host_1.1.memory_snapshot.pickle")
    assert [(k, m["reason"]) for k, _, m in writer.artifacts] == [("memory_snapshot", "oom")]
    assert "allocator snapshot host_1.1.memory_snapshot.pickle" in writer.logs[0]
