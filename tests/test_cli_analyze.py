"""`stepscope analyze` as a user runs it: a subprocess, real traces, bad files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from traces import CPU_ONLY, RANK0, RANK1, RESNET_NW0, trace_path

from stepscope.store import RunStore


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "analyze", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_json_keys_on_a_gpu_trace() -> None:
    res = _run(str(trace_path(RESNET_NW0)), "--json", "--top", "3")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    for key in (
        "breakdown",
        "steps",
        "gpu",
        "communication",
        "memory",
        "kernels_top",
        "ops_top",
        "warnings",
    ):
        assert key in data
    assert data["steps"] == 6
    assert data["breakdown"]["DataLoader"] == pytest.approx(0.3337, abs=0.01)
    assert sum(data["breakdown"].values()) == pytest.approx(1.0)
    assert len(data["kernels_top"]) == 3 and len(data["ops_top"]) == 3
    assert data["gpu"][0]["device"] == 0
    assert "share" in data["communication"] and "overlap" in data["communication"]


def test_json_on_cpu_only_and_two_ranks() -> None:
    res = _run(str(trace_path(CPU_ONLY)), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["gpu"] == [] and data["steps"] == 1
    res = _run(str(trace_path(RANK0)), str(trace_path(RANK1)), "--json")
    data = json.loads(res.stdout)
    assert data["summary"]["ranks"] == [0, 1] and data["steps"] == 4


def test_rich_tables() -> None:
    res = _run(str(trace_path(RESNET_NW0)), "--top", "2")
    assert res.returncode == 0, res.stderr
    for title in ("Step-time breakdown", "GPU metrics", "Top 2 kernels", "Top 2 CPU operators"):
        assert title in res.stdout


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty file"),
        (b'{"a": 1}', "not a Kineto trace"),
        (b'{"traceEvents": [', "truncated JSON"),
    ],
)
def test_bad_file_is_exit_1_and_one_line(tmp_path: Path, content: bytes, problem: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    res = _run(str(p))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(p) in lines[0] and problem in lines[0]
    assert "Traceback" not in res.stderr


def test_missing_path_is_exit_1(tmp_path: Path) -> None:
    res = _run(str(tmp_path / "nope.json"))
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "nope.json" in res.stderr


def test_json_findings_and_rich_verdict() -> None:
    res = _run(str(trace_path(RESNET_NW0)), "--json")
    data = json.loads(res.stdout)
    assert data["diagnosis_level"] == "trace"
    first = data["findings"][0]
    for key in ("class", "subtype", "share", "confidence", "evidence", "fixes"):
        assert key in first
    assert (first["class"], first["subtype"]) == ("io", "input_pipeline")
    fix = first["fixes"][0]
    assert {"id", "predicted_speedup", "auto"} <= set(fix)
    assert fix["id"] == "dataloader_workers" and fix["auto"] is True
    text = _run(str(trace_path(RESNET_NW0))).stdout
    assert "1. I/O / input_pipeline" in text and "dataloader_workers" in text


def test_a_run_without_trace_gets_a_steps_level_diagnosis(tmp_path: Path) -> None:
    """No capture: the diagnosis still runs on what the run has, and is saved."""
    with RunStore(tmp_path) as store:
        run_id = store.create_run(["python", "train.py"], name="nocap", status="completed")
        store.add_steps(
            run_id,
            [
                {
                    "rank": 0,
                    "step": i,
                    "start_s": i * 1.0,
                    "end_s": i + 1.0,
                    "data_wait_s": 0.6,
                    "kind": "optimizer",
                }
                for i in range(20)
            ],
        )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepscope.app.cli",
            "--home",
            str(tmp_path),
            "analyze",
            "nocap",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["diagnosis_level"] == "steps" and data["run_id"] == run_id
    assert data["findings"][0]["subtype"] == "input_pipeline"
    assert data["findings"][0]["share"] == pytest.approx(0.6)
    with RunStore(tmp_path) as store:
        assert store.findings(run_id)[0].level == "steps"
