"""Bounded reads: a small gzip that inflates past the cap is refused in one line, by the
loader, ``stepscope analyze`` and every other reader of a stored JSON file, without ever
holding more than the cap; and the dashboard analyses no trace past its own size without
a click (issue 36, item 5).

The bomb is real: a valid Kineto trace (one step, one operator) padded with whitespace,
a couple of hundred KB of gzip that inflates to 200 MiB of JSON; the caps are set small
through the environment, as a user would.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import orjson
import pytest
from dashboard_helpers import no_errors, open_page, texts
from traces import MEMORY_TIMELINE, RESNET_NW0, trace_path

from stepscope.analyzers.trace.load import TraceError, load_trace
from stepscope.analyzers.trace.memory import load_memory_timeline
from stepscope.app.dashboard.views.run.trace_sections import HELD_BACK
from stepscope.optim_runner.guards.token_guard import TOKENS_KIND, load_tokens
from stepscope.store import RunStore
from stepscope.store.bounded_read import (
    ENV_VAR,
    PIECE_BYTES,
    ReadError,
    TooLarge,
    capped_bytes,
    json_size,
    read_capped,
)

BOMB_MIB = 200  # of JSON, from about 200 KB of gzip
ASK_ENV = "STEPSCOPE_DASHBOARD_TRACE_BYTES"
STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1}
OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50}


def write_bomb(path: Path, json_mib: int = BOMB_MIB) -> Path:
    """A trace that analyses (a step and an operator) with ``json_mib`` MiB of blanks."""
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [' + orjson.dumps({**STEP, "ts": 0, "dur": 100}) + b",")
        blank = b" " * (1 << 20)
        for _ in range(json_mib):
            fh.write(blank)
        fh.write(orjson.dumps(OP) + b"]}")
    return path


@pytest.fixture
def bomb(tmp_path: Path) -> Path:
    path = write_bomb(tmp_path / "bomb.pt.trace.json.gz")
    assert path.stat().st_size < 400_000  # a few hundred KB
    return path


def test_the_loader_refuses_a_bomb_in_one_line_holding_no_more_than_the_cap(
    bomb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "16M")
    tracemalloc.start()
    try:
        with pytest.raises(TraceError) as err:
            load_trace(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{bomb}: too large: ")
    assert "of JSON decompressed so far, over the cap of 16.0 MiB" in text and ENV_VAR in text
    # the cap and a few pieces in flight (zlib's own buffers, the piece before)
    assert peak < (16 << 20) + 4 * PIECE_BYTES
    # under a cap it fits, the same file analyses
    monkeypatch.setenv(ENV_VAR, f"{BOMB_MIB + 1}M")
    trace = load_trace(bomb)
    assert list(trace.events["name"].astype(str)) == ["ProfilerStep#1", "aten::mm"]


def test_a_plain_json_file_is_capped_by_its_size_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = gzip.decompress(trace_path(RESNET_NW0).read_bytes())
    plain = tmp_path / "plain.json"
    plain.write_bytes(real)
    monkeypatch.setenv(ENV_VAR, str(len(real) - 1))
    with pytest.raises(TraceError, match=r"plain\.json: too large: 33\.5 MiB of JSON, over"):
        load_trace(plain)
    monkeypatch.setenv(ENV_VAR, str(len(real)))  # exactly the cap: read
    assert len(load_trace(plain).events) > 0
    assert read_capped(plain) == real == read_capped(trace_path(RESNET_NW0))


def test_a_bad_cap_is_one_line(bomb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "lots")
    with pytest.raises(TraceError, match=rf"^{ENV_VAR}='lots': not a size"):
        load_trace(bomb)


def test_gzip_members_truncation_and_garbage(tmp_path: Path) -> None:
    """Streamed decompression reads what gzip.decompress reads, and fails where it fails."""
    two = gzip.compress(b'{"a": [1, ') + gzip.compress(b"2]}")
    assert capped_bytes("two", two) == gzip.decompress(two) == b'{"a": [1, 2]}'
    for bad in (two[:-4], two + b"junk", b"\x1f\x8b" + bytes(30)):
        with pytest.raises(ReadError, match=r"^bad: truncated or corrupt gzip"):
            capped_bytes("bad", bad)
    with pytest.raises(TooLarge):
        capped_bytes("two", two, cap=12)


def test_json_size_counts_without_keeping_and_stops_at_the_cap(bomb: Path) -> None:
    assert json_size(bomb, cap=1 << 30) == (BOMB_MIB << 20) + len(b'{"traceEvents": [') + (
        len(orjson.dumps({**STEP, "ts": 0, "dur": 100})) + 1 + len(orjson.dumps(OP)) + 2
    )
    with pytest.raises(TooLarge, match="decompressed so far, over the cap of 1.0 MiB"):
        json_size(bomb, cap=1 << 20)


def test_other_stored_json_readers_are_capped(
    bomb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory timeline and a trial's generated tokens: files a row names."""
    monkeypatch.setenv(ENV_VAR, "1M")
    with pytest.raises(ValueError, match="too large"):
        load_memory_timeline(bomb)
    home = tmp_path / "home"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "gen.py"], name="gen", status="completed")
        tokens = shutil.copy(bomb, store.run_dir(run_id) / "tokens.json")
        store.add_artifact(run_id, TOKENS_KIND, tokens)
        with pytest.raises(TooLarge, match=f"{tokens}: too large"):
            load_tokens(store, run_id)
    monkeypatch.setenv(ENV_VAR, "1G")
    assert len(load_memory_timeline(trace_path(MEMORY_TIMELINE))) > 0


def test_stepscope_analyze_says_one_line_and_exits_1(bomb: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "analyze", str(bomb)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, ENV_VAR: "16M"},
    )
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bomb) in lines[0] and "too large" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


# -- the dashboard ---------------------------------------------------------------------------
def _run_with_trace(home: Path, trace: Path, name: str = "big") -> tuple[int, Path]:
    """A run whose trace (a copy in its folder, where a job writes it) is ``trace``."""
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"], name=name, status="completed")
        path = Path(shutil.copy(trace, store.run_dir(run_id) / trace.name))
        store.add_artifact(run_id, "trace", path)
        store.finish_run(run_id, "completed", exit_code=0)
    return run_id, path


def _analysed(at: object) -> bool:
    """The page shows what only an analysed trace gives: its operators table."""
    return "**Top operators** (CPU self time)" in [m.value for m in at.markdown]  # type: ignore[attr-defined]


def test_run_page_asks_before_analysing_a_big_trace(
    bomb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    run_id, _ = _run_with_trace(home, bomb)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.setenv(ASK_ENV, "8M")
    monkeypatch.setenv(ENV_VAR, "1G")
    at = open_page("run", run=str(run_id))
    no_errors(at)
    assert not _analysed(at)
    line = next(i.value for i in at.info if "more than the dashboard analyses unasked" in i.value)
    assert line.startswith(f"The trace holds {BOMB_MIB}.0 MiB of JSON") and "8.0 MiB" in line
    button = next(b for b in at.button if b.label == "Analyse this trace")
    assert texts(at).count(HELD_BACK) == 4  # memory, kernels, roofline, timeline tabs
    with RunStore(home) as store:  # diagnosed without its trace, and so not saved
        assert not (store.run(run_id).get("config") or {}).get("diagnosed")
    button.click().run()
    no_errors(at)
    assert _analysed(at) and HELD_BACK not in texts(at)
    assert not [b for b in at.button if b.label == "Analyse this trace"]
    with RunStore(home) as store:  # now with its trace: saved
        assert store.run(run_id)["config"]["diagnosed"]["level"] == "trace"
    at.run()  # a redraw keeps the click
    assert _analysed(at)


def test_run_page_refuses_a_trace_past_the_cap_without_a_button(
    bomb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    run_id, copy = _run_with_trace(home, bomb)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.setenv(ASK_ENV, "8M")
    monkeypatch.setenv(ENV_VAR, "16M")
    at = open_page("run", run=str(run_id))
    assert not at.exception
    assert [e.value for e in at.error] == [
        f"The trace is not analysed: {copy}: too large: 17.0 MiB of JSON decompressed so far, "
        f"over the cap of 16.0 MiB ({ENV_VAR})"
    ]
    assert not [b for b in at.button if b.label == "Analyse this trace"]
    assert not _analysed(at)


def test_run_page_analyses_a_trace_under_the_size_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    run_id, _ = _run_with_trace(home, write_bomb(tmp_path / "small.json.gz", json_mib=4))
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.setenv(ASK_ENV, "8M")
    at = open_page("run", run=str(run_id))
    no_errors(at)
    assert _analysed(at) and not [b for b in at.button if b.label == "Analyse this trace"]


def test_compare_page_holds_both_the_breakdown_and_the_diff(
    bomb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    a, _ = _run_with_trace(home, bomb, "a")
    b, _ = _run_with_trace(home, write_bomb(tmp_path / "small.json.gz", json_mib=1), "b")
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.setenv(ASK_ENV, "8M")
    monkeypatch.setenv(ENV_VAR, "1G")
    at = open_page("compare", a=str(a), b=str(b))
    assert not at.exception and not at.error
    page = texts(at)
    assert f"Run {a}'s trace holds {BOMB_MIB}.0 MiB of JSON" in page
    assert f"No operator diff: the trace of run {a} is not analysed" in page
    assert [b.label for b in at.button if b.label == "Analyse this trace"] == ["Analyse this trace"]
