"""Where the peak goes: a real `stepscope run` of a small transformer trainer, its
capture's memory timeline, the breakdown (CLI, API, `show`, the Run page), and the
files that cannot be read."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from dashboard_helpers import REPO, no_errors, open_page, stepscope, texts

import stepscope as api
from stepscope.analyzers.report.run_memory import run_memory
from stepscope.analyzers.trace.memory import (
    TIMELINE_CATEGORIES,
    load_memory_timeline,
    memory_timeline_by_category,
)
from stepscope.app.cli.exit_codes import EXIT_UNKNOWN_RUN
from stepscope.store import RunStore

pytestmark = pytest.mark.slow
JOB = str(REPO / "tests" / "jobs" / "memory_blocks.py")
JOB_ARGS = ("--steps", "4", "--batch", "4", "--seq", "32", "--width", "32", "--blocks", "3")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One store: the trainer with a 2-step capture, the same job without one, the same
    at half the batch, and the job under a torch that has no memory timeline export."""
    home = tmp_path_factory.mktemp("memhome")
    capture = ("--profile-at", "1", "--profile-steps", "2")
    out = stepscope(home, "run", "--name", "blocks", *capture, "--", sys.executable, JOB, *JOB_ARGS)
    params = int(re.search(r"^params (\d+)$", out.stdout, re.M).group(1))
    stepscope(home, "run", "--name", "plain", "--no-profile", "--", sys.executable, JOB, *JOB_ARGS)
    # the same at half the batch, before the last run (`memory last` has no timeline)
    half = [a if a != "4" or JOB_ARGS[i - 1] != "--batch" else "2" for i, a in enumerate(JOB_ARGS)]
    stepscope(home, "run", "--name", "half", *capture, "--", sys.executable, JOB, *half)
    gone = stepscope(
        home,
        "run",
        "--name",
        "no-export",
        *capture,
        "--",
        sys.executable,
        JOB,
        *JOB_ARGS,
        "--no-timeline-export",
    )
    with RunStore(home) as store:
        ids = {n: store.resolve_run(n) for n in ("blocks", "plain", "no-export", "half")}
    return {"home": home, "ids": ids, "params": params, "gone": gone}


def test_half_the_micro_batch_frees_what_was_predicted(recorded: dict) -> None:
    """The advice's bytes at the peak (the step's own, halved) against the same job
    recorded at half the batch: within 15 % of the peaks' difference."""
    home, ids = recorded["home"], recorded["ids"]
    full = json.loads(stepscope(home, "memory", str(ids["blocks"]), "--json").stdout)
    half = json.loads(stepscope(home, "memory", str(ids["half"]), "--json").stdout)
    (line,) = [f for f in full["would_free"] if f.startswith("half the micro-batch")]
    amount, unit = re.search(r"about ([\d.]+) (MiB|GiB)", line).groups()
    predicted = float(amount) * (2**30 if unit == "GiB" else 2**20)
    measured = full["peak_bytes"] - half["peak_bytes"]
    assert measured > 0 and abs(predicted - measured) <= 0.15 * measured, (predicted, measured)
    assert any(f.startswith("sharding over 2 ranks") for f in full["would_free"])
    assert "would free (advice): " in stepscope(home, "show", str(ids["blocks"])).stdout


def test_capture_saves_the_timeline(recorded: dict) -> None:
    with RunStore(recorded["home"]) as store:
        arts = store.artifacts(recorded["ids"]["blocks"])
    kinds = list(arts["kind"])
    assert kinds.count("trace") == 1 and kinds.count("memory_timeline") == 1
    row = arts[arts["kind"] == "memory_timeline"].iloc[0]
    assert row["meta"]["device"] == "cpu" and row["meta"]["steps"] == 2
    assert row["meta"]["export_s"] >= 0
    assert len(load_memory_timeline(row["path"])) > 0


def test_breakdown_adds_up_to_the_peak(recorded: dict) -> None:
    with RunStore(recorded["home"]) as store:
        b = run_memory(store, recorded["ids"]["blocks"])
        path = store.artifacts(recorded["ids"]["blocks"]).query("kind == 'memory_timeline'")
    assert b.problems == []
    tl = memory_timeline_by_category(load_memory_timeline(path["path"].iloc[0]))
    assert b.peak_bytes == int(tl["total"].max())
    assert int(b.peak["bytes"].sum()) == b.peak_bytes  # the categories are the peak's parts
    assert set(b.peak["category"]) == set(TIMELINE_CATEGORIES)
    by = b.peak.set_index("category")
    # the model's parameters, as the job counted them (the timeline's unit is a byte)
    assert by.loc["PARAMETER", "bytes"] == recorded["params"]
    # a training step: activations held for backward; AdamW's two moments = 2x params
    assert by.loc["ACTIVATION", "bytes"] > 0
    assert by.loc["OPTIMIZER_STATE", "max_bytes"] >= 2 * recorded["params"]
    assert (b.peak["max_bytes"] >= b.peak["bytes"]).all()
    # the blocks live at the peak sit in the blocks' forwards
    mods = b.modules.set_index("module")
    for name in ("Block_0", "Block_1", "Block_2"):
        assert mods.loc[name, "bytes"] > 0
    assert mods["bytes"].max() <= b.attributed_bytes <= b.peak_bytes
    # what the whole model's forwards left live at the peak is the timeline's activations
    # (measured: 24 bytes apart), from another source: the trace's addresses and scopes
    acts = by.loc["ACTIVATION", "bytes"]
    assert abs(mods.loc["Model_0", "bytes"] - acts) <= 0.05 * acts
    assert b.lines["line"].str.startswith("memory_blocks.py(").any()


def test_memory_cli_json_text_and_show(recorded: dict) -> None:
    home, ids = recorded["home"], recorded["ids"]
    out = stepscope(home, "memory", "last", "--json", check=False)
    assert out.returncode == 1  # 'last' is the run without a timeline: one line
    assert out.stderr.count("\n") == 1 and "memory timeline" in out.stderr
    data = json.loads(stepscope(home, "memory", str(ids["blocks"]), "--json").stdout)
    assert data["run_id"] == ids["blocks"] and data["device"] == "cpu"
    assert sum(r["bytes"] for r in data["peak"]) == data["peak_bytes"]
    assert {r["label"] for r in data["peak"]} >= {"parameters", "activations", "gradients"}
    assert any(r["module"] == "Block_0" for r in data["modules"])
    text = stepscope(home, "memory", "blocks").stdout
    assert "At the peak, by what it holds" in text and "activations" in text
    plain = stepscope(home, "memory", "plain", check=False)
    assert plain.returncode == 1 and "no profiler capture" in plain.stderr
    unknown = stepscope(home, "memory", "9999", check=False)
    assert unknown.returncode == EXIT_UNKNOWN_RUN and unknown.stderr.count("\n") == 1
    show = json.loads(stepscope(home, "show", "blocks", "--json").stdout)
    assert show["memory"]["peak_bytes"] == data["peak_bytes"]
    assert "activations" in stepscope(home, "show", "blocks").stdout
    assert json.loads(stepscope(home, "show", "plain", "--json").stdout)["memory"] is None
    # `analyze` of the run has the same section, beside its trace's report
    analyzed = json.loads(stepscope(home, "analyze", str(ids["blocks"]), "--json").stdout)
    assert analyzed["memory_breakdown"]["peak_bytes"] == data["peak_bytes"]
    assert f"(stepscope memory {ids['blocks']})" in stepscope(home, "analyze", "blocks").stdout


def test_api_memory_returns_frames(recorded: dict) -> None:
    home, ids = recorded["home"], recorded["ids"]
    b = api.memory("blocks", home=home)
    assert list(b.peak.columns) == ["category", "label", "bytes", "share", "max_bytes"]
    assert {"ts", "total", *TIMELINE_CATEGORIES} <= set(b.timeline.columns)
    assert b.peak_bytes == api.memory(api.run(ids["blocks"], home)).peak_bytes
    with pytest.raises(LookupError, match="no profiler capture"):
        api.memory("plain", home=home)


def test_export_failure_keeps_the_trace(recorded: dict) -> None:
    """Under a torch without the export: the job's exit and trace stay, one warning line."""
    with RunStore(recorded["home"]) as store:
        rid = recorded["ids"]["no-export"]
        assert store.run(rid)["status"] == "completed"
        assert list(store.artifacts(rid)["kind"]) == ["trace"]
        log = store.events(rid)
    lines = [m for m in log["message"] if m.startswith("memory timeline not saved")]
    assert len(lines) == 1 and "export_memory_timeline" in lines[0]
    assert "params" in recorded["gone"].stdout  # the job's own output passed through


@pytest.mark.parametrize(
    "content", [b"\x1f\x8b not gzip at all", b'{"a": 1}', b"[[1, 2, 3, 99]]"], ids=str
)
def test_unreadable_timeline_is_one_line(recorded: dict, tmp_path: Path, content: bytes) -> None:
    """A corrupt or foreign timeline: one line naming it; the trace's tables still shown."""
    with RunStore(recorded["home"]) as store:
        arts = store.artifacts(recorded["ids"]["blocks"])
    trace = arts.query("kind == 'trace'")["path"].iloc[0]
    stem = Path(trace).name.removesuffix(".pt.trace.json.gz")
    home = tmp_path / "home"
    with RunStore(home) as store:
        rid = store.create_run(["python", "job.py"], name="bad")
        folder = home / "runs" / str(rid)  # artifacts are read from the run's folder only
        folder.mkdir(parents=True, exist_ok=True)
        copy = folder / f"{stem}.pt.trace.json.gz"
        shutil.copy(trace, copy)
        bad = folder / f"{stem}.memory_timeline.raw.json.gz"
        bad.write_bytes(content)
        store.add_artifact(rid, "trace", str(copy))
        store.add_artifact(rid, "memory_timeline", str(bad), meta={"device": "cpu"})
        b = run_memory(store, rid)
    assert len(b.problems) == 1 and str(bad) in b.problems[0]
    assert "\n" not in b.problems[0]
    assert b.peak.empty and b.peak_bytes > 0  # the trace's own peak
    assert (b.modules["module"] == "Block_0").any()
    out = stepscope(home, "memory", "bad")
    assert str(bad) in out.stdout


def test_run_page_memory_section(recorded: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    home, ids = recorded["home"], recorded["ids"]
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(ids["blocks"]))
    no_errors(at)
    assert any(h.value == "Where the peak goes" for h in at.subheader)
    b = api.memory("blocks", home=home)
    assert "Peak " in texts(at)
    frames = [d.value for d in at.dataframe]
    peak = next(f for f in frames if "at the peak" in f.columns)
    assert list(peak["category"]) == list(b.peak["label"])
    assert "Would free (advice, from the peak's parts): " in texts(at)
    assert any("module" in f.columns and (f["module"] == "Block_0").any() for f in frames)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    stacked = next(s for s in specs if any(t.get("stackgroup") for t in s["data"]))
    assert {t["name"] for t in stacked["data"]} >= {"activations", "parameters"}
    plain = open_page("run", run=str(ids["plain"]))
    no_errors(plain)
    assert "no profiler capture" in texts(plain) or "has none" in texts(plain)


@pytest.mark.parametrize(
    ("frame", "the_jobs"),
    [
        ("/home/me/project/train.py(42): main", True),
        ("transformers/activations.py(65): forward", True),  # a library the job chose
        (f"{REPO}/stepscope/collectors/steps/step_timer.py(256): backward", False),
        ("/opt/other/stepscope/collectors/steps/step_timer.py(256): backward", False),
        ("torch/nn/modules/module.py(1778): _wrapped_call_impl", False),
        ("threading.py(1045): _bootstrap_inner", False),
    ],
)
def test_the_lines_table_skips_stepscopes_own_frames(frame: str, the_jobs: bool) -> None:
    """An editable install's frames are absolute paths: the step timer's wrapper of
    ``backward()`` was shown as the job's line holding 72 MiB of an HF Trainer's peak."""
    from stepscope.analyzers.trace.job_frames import is_job_frame

    assert is_job_frame(frame) is the_jobs
