"""The dashboard pages under Streamlit's AppTest, over a store of real example runs.

One store is recorded for the module (an input-bound run with a 2-step trace, a
dense-compute run without one, a job that fails); every figure a page shows is
checked against what the store and the analyzers say, and every button against its
effect (a capture request file, findings in the store, a TensorBoard that answers).
The Optimize page gets a store of its own, since its experiments add trial runs: a short
input-bound run and a failing job, on which the buttons start, follow and cancel real
experiments (one fix, few steps: about 40 s in all). The Attach page gets a store and
two live jobs of its own (a plain Python process and a `stepscope run` job): it lists
them, records the plain one for a few seconds, follows and stops an attach started
elsewhere, refuses a process that is gone in one line, and the Run page shows where an
attached job's main thread spends its time.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from calibrations import ROUND_CALIBRATION
from dashboard_helpers import (
    APPLIED_CHANGE,
    CONTENTION_WARNING,
    ENTRY,
    FIX_NOTE,
    NOT_APPLIED_WHY,
    end_process,
    experiment_result,
    job_pid,
    no_errors,
    open_page,
    record,
    start_live_job,
    start_plain_job,
    stepscope,
    stop_job,
    stored_experiment,
    texts,
    wait_gone,
    wait_running,
)
from recordings import failing_run, ib_profiled, ib_short
from streamlit.testing.v1 import AppTest
from traces import A100, in_run_folder, trace_path

from stepscope.analyzers.report.trace_report import analyze_trace
from stepscope.analyzers.steps.stacks import classify_samples, phase_shares, top_sites
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.app.dashboard.stack_data import inject_mode
from stepscope.app.dashboard.views.run import tensorboard
from stepscope.app.formats import fmt_num, fmt_pct, fmt_s
from stepscope.collectors.attach.attach import attach_run_of, start_attach
from stepscope.collectors.capture.control import capture_request_path
from stepscope.collectors.launch.launcher import launch_run
from stepscope.fixes import get as get_fix
from stepscope.fixes.snippets import with_params
from stepscope.optim_runner.background import start_experiment
from stepscope.optim_runner.experiment.options import ExperimentOptions
from stepscope.optim_runner.speedup.stats import speedup_ci, timed_step_times
from stepscope.optim_runner.trials.plan import choose_fixes
from stepscope.optim_runner.trials.trials import candidate_arms
from stepscope.store import RunStore
from stepscope.store.calibration import save_calibration

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Real runs: ib (profiled steps 3-4), dense (no trace), fail (its code raises)."""
    home = ib_profiled(tmp_path_factory, "dash")
    with RunStore(home) as store:
        ids = {"ib": store.resolve_run("input-bound")}
    ids["dense"] = record(
        home, "dense", "dense_compute.py", "--steps", "8", opts=("--max-steps", "6")
    )
    ids["fail"] = failing_run(home)
    return {"home": home, "ids": ids}


@pytest.fixture
def home(recorded: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    """The recorded store as the dashboard's store (after conftest's per-test one)."""
    monkeypatch.setenv("STEPSCOPE_HOME", str(recorded["home"]))
    return recorded["home"]


def table_with(at: AppTest, column: str) -> pd.DataFrame:
    """The first table on the page that has ``column``."""
    return next(df.value for df in at.dataframe if column in df.value.columns)


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def chart_specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def values(v: object) -> list:
    """A plotly JSON array: a list, or (numpy data) a base64 typed array."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)  # type: ignore[call-overload]


def trace_names(spec: dict) -> list[str]:
    return [t.get("name") for t in spec["data"]]


def per_sample(steps: pd.DataFrame) -> np.ndarray:
    """Seconds per sample of the timed steps, as the experiment runner times throughput."""
    scaled = steps.assign(
        end_s=steps["start_s"] + (steps["end_s"] - steps["start_s"]) / steps["batch_size"]
    )
    return timed_step_times(scaled)


def summary_of(home: Path, run_id: int) -> dict:
    with RunStore(home) as store:
        return summarize_steps(store.steps(run_id))


# -- runs page -------------------------------------------------------------------------
def test_runs_page_lists_every_run_with_its_figures(home: Path, recorded: dict) -> None:
    at = open_page("runs")
    no_errors(at)
    with RunStore(home) as store:
        runs = store.runs()
        top = store.top_findings()
    table = at.dataframe[0].value
    assert len(table) == len(runs) == 3
    assert list(table["id"]) == list(runs["id"])  # newest first
    for row in table.to_dict("records"):
        s = summary_of(home, row["id"])
        assert row["steps"] == s["steps"]
        median = row["median step (ms)"]
        if s["step_time_median_s"] is None:
            assert median == "—"  # unknown: a dash (its column is text then), never "None"
        elif isinstance(median, str):
            assert median == f"{s['step_time_median_s'] * 1e3:.1f}"
        else:
            assert median == pytest.approx(s["step_time_median_s"] * 1e3)
        assert row["open"] == f"run?run={row['id']}"
        finding = top.get(row["id"])
        assert (finding.title in row["top finding"]) if finding else row["top finding"] == ""
    status = dict(zip(table["id"], table["status"], strict=True))
    assert status[recorded["ids"]["fail"]] == "✗ failed"
    assert status[recorded["ids"]["ib"]] == "✓ stopped: step limit"  # stepscope stopped it: why
    links = {p.proto.label: p.proto for p in at.get("page_link")}
    assert links["Open run"].query_string == f"run={recorded['ids']['fail']}"  # newest
    assert "Compare" in " ".join(links)
    assert "3 of 3 runs" in texts(at)


def test_runs_page_filters(home: Path, recorded: dict) -> None:
    at = open_page("runs")
    at.multiselect(key="runs_status").set_value(["failed"]).run()
    no_errors(at)
    assert list(at.dataframe[0].value["id"]) == [recorded["ids"]["fail"]]
    at.multiselect(key="runs_status").set_value([]).run()
    at.text_input(key="runs_name").set_value("dense_compute").run()  # matches the command
    assert list(at.dataframe[0].value["id"]) == [recorded["ids"]["dense"]]
    at.text_input(key="runs_name").set_value("no such run").run()
    assert "No run matches" in texts(at)


def test_empty_store_says_how_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPSCOPE_HOME", str(tmp_path / "empty"))
    for page in ("runs", "run", "compare", "optimize"):
        at = open_page(page)
        no_errors(at)
        assert "No runs yet" in texts(at) or "none yet" in texts(at), page
        assert any("stepscope run" in c.value for c in at.code), page


# -- run page ----------------------------------------------------------------------------
def test_run_page_headline_and_trace_views(home: Path, recorded: dict) -> None:
    run_id = recorded["ids"]["ib"]
    at = open_page("run", run=str(run_id))
    no_errors(at)
    s = summary_of(home, run_id)
    assert at.title[0].value == f"Run {run_id} · input-bound"
    m = metrics(at)
    assert m["step time p50"] == fmt_s(s["step_time_median_s"])
    assert m["step time p95"] == fmt_s(s["step_time_p95_s"])
    assert m["steps/s"] == fmt_num(s["steps_per_s"])
    assert m["samples/s"] == fmt_num(s["samples_per_s"])
    assert m["data wait"] == fmt_pct(s["data_wait_share"])
    assert m["peak RSS"].endswith("MiB")
    assert f"{s['steps']} steps recorded; {s['timed_steps']} timed" in texts(at)
    # a training job leads with its step time and samples/s (issue 39)
    assert [x.label for x in at.metric][:2] == ["step time p50", "samples/s"]

    with RunStore(home) as store:
        arts = store.artifacts(run_id)
    paths = list(arts.loc[arts["kind"] == "trace", "path"])
    report = analyze_trace(paths)
    specs = chart_specs(at)
    breakdown = next(sp for sp in specs if "DataLoader" in trace_names(sp))
    assert (
        len(values(breakdown["data"][0]["x"])) == len(report.per_step) == 2
    )  # the 2 profiled steps
    loader = next(t for t in breakdown["data"] if t["name"] == "DataLoader")
    assert values(loader["y"]) == pytest.approx(list(report.per_step["DataLoader"] / 1e6))
    step_time = next(sp for sp in specs if "timed" in trace_names(sp))
    assert len(values(step_time["data"][0]["x"])) == s["timed_steps"]
    assert any("thread" in str(sp["layout"]["yaxis"].get("ticktext")) for sp in specs)  # timeline
    assert any(sp["data"][0].get("name", "").startswith("cpu allocated") for sp in specs)  # memory

    ops = next(df.value for df in at.dataframe if "operator" in df.value.columns)
    assert ops["operator"].iloc[0] == report.ops_top["name"].iloc[0]
    downloads = at.get("download_button")
    assert len(downloads) == len(paths) == 1
    assert Path(paths[0]).name in downloads[0].proto.label
    system = next(sp for sp in specs if "CPU (cores busy)" in json.dumps(sp["layout"]))
    assert "job RSS" in trace_names(system)  # the memory panel shares the time axis
    # one scale for the job and the machine: cores busy, never above the machine's cores
    cpu = {t["name"]: values(t["y"]) for t in system["data"] if t.get("name") in ("job", "machine")}
    assert 0 < max(cpu["machine"]) <= (os.cpu_count() or 1) + 0.01
    assert max(cpu["job"]) <= (os.cpu_count() or 1) * 1.2  # psutil's per-process figure
    xaxes = [v for k, v in system["layout"].items() if k.startswith("xaxis")]
    assert len(xaxes) >= 2 and len({a.get("matches") for a in xaxes if "matches" in a}) == 1
    assert sum("matches" in a for a in xaxes) == len(xaxes) - 1  # one shared time axis


def test_run_page_without_trace_uses_the_step_timer(home: Path, recorded: dict) -> None:
    run_id = recorded["ids"]["dense"]
    at = open_page("run", run="dense")  # by name, as the CLI takes it
    no_errors(at)
    assert at.title[0].value == f"Run {run_id} · dense"
    assert "no profiler trace" in texts(at) and "--profile-at" in texts(at)
    bars = next(sp for sp in chart_specs(at) if "data wait" in trace_names(sp))
    with RunStore(home) as store:
        steps = store.steps(run_id)
    wait = next(t for t in bars["data"] if t["name"] == "data wait")
    assert values(wait["y"]) == pytest.approx(list(steps["data_wait_s"] * 1e3))
    tb_button = at.button(key="tensorboard")
    assert tb_button.disabled  # nothing to show: explained, not a dead button
    assert "no trace" in texts(at)
    assert "Where the main thread spends its time" not in [s.value for s in at.subheader]


def test_run_page_mfu_phases_and_roofline(home: Path, recorded: dict) -> None:
    """The profiled run: MFU against the home's calibration (and, without one, the line
    that says to calibrate), the trace's phases per step, the roofline tab."""
    run_id = recorded["ids"]["ib"]
    with RunStore(home) as store:
        arts = store.artifacts(run_id)
    paths = list(arts.loc[arts["kind"] == "trace", "path"])
    cal_file = save_calibration(home, ROUND_CALIBRATION)
    try:
        at = open_page("run", run=str(run_id))
        no_errors(at)
        report = analyze_trace(paths, calibration_home=home)
        roof = report.roofline
        assert roof is not None and roof.mfu is not None
        assert metrics(at)["MFU"] == fmt_pct(roof.mfu)
        assert "of CPU Test CPU float32 100 GFLOP/s" in texts(at)
        mfu = next(m for m in at.metric if m.label == "MFU")
        assert "2025-01-02 03:04" in mfu.help  # the calibration's date and conditions

        specs = chart_specs(at)
        phases = next(sp for sp in specs if "optimizer step" in trace_names(sp))
        forward = next(t for t in phases["data"] if t["name"] == "forward")
        assert values(forward["y"]) == pytest.approx(list(report.phases["forward"] / 1e6))
        assert "From the profiler trace, each instant counted once: data wait" in texts(at)
        assert "Roofline" in [t.label for t in at.tabs]
        chart = next(sp for sp in specs if "compute roof" in trace_names(sp))
        assert chart["layout"]["xaxis"]["type"] == chart["layout"]["yaxis"]["type"] == "log"
        # the matmul roof, 0.1 TFLOP/s, on a CPU's axis in GFLOP/s
        assert chart["layout"]["yaxis"]["title"]["text"] == "achieved GFLOP/s"
        assert values(chart["data"][1]["y"]) == pytest.approx([100.0, 100.0])
    finally:
        cal_file.unlink()

    at = open_page("run", run=str(run_id))  # calibration gone: a new cache key
    no_errors(at)
    assert "MFU" not in metrics(at)
    assert "No MFU: no calibration for this host: run `stepscope calibrate`." in texts(at)
    assert "No roofs: no calibration" in texts(at)
    chart = next(sp for sp in chart_specs(at) if "operator classes" in trace_names(sp))
    assert "compute roof" not in trace_names(chart)  # the points alone


def test_run_page_phases_from_the_step_timer_without_a_trace(home: Path, recorded: dict) -> None:
    run_id = recorded["ids"]["dense"]
    at = open_page("run", run=str(run_id))
    no_errors(at)
    assert "MFU" not in metrics(at) and "No MFU" not in texts(at)  # no trace: nothing
    with RunStore(home) as store:
        steps = store.steps(run_id)
    assert steps["forward_s"].notna().all()  # the step timer records the phases
    bars = next(sp for sp in chart_specs(at) if "optimizer step" in trace_names(sp))
    assert trace_names(bars)[:3] == ["data wait", "forward", "backward"]
    backward = next(t for t in bars["data"] if t["name"] == "backward")
    assert values(backward["y"]) == pytest.approx(list(steps["backward_s"] * 1e3))
    assert f"From the step timer (host clock, all {len(steps)} steps" in texts(at)
    assert "this run has none" in texts(at)  # the roofline tab says what is missing


def test_gpu_trace_views(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real A100 trace (NCCL, 3 steps) as a run's artifact: kernels, device lanes."""
    home = tmp_path / "home"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"], name="a100", status="completed")
        path = str(in_run_folder(store, run_id, trace_path(A100)))
        store.add_artifact(run_id, "trace", path)
        store.finish_run(run_id, "completed", exit_code=0)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(run_id))
    no_errors(at)
    report = analyze_trace([path])
    kernels = next(df.value for df in at.dataframe if "kernel" in df.value.columns)
    assert kernels["kernel"].iloc[0] == report.kernels_top["name"].iloc[0]
    assert kernels["share (%)"].iloc[0] == pytest.approx(report.kernels_top["share"].iloc[0] * 100)
    specs = chart_specs(at)
    breakdown = next(sp for sp in specs if "Kernel" in trace_names(sp))
    assert "Communication" in trace_names(breakdown)
    timeline = next(sp for sp in specs if sp["layout"].get("yaxis", {}).get("ticktext"))
    lanes = timeline["layout"]["yaxis"]["ticktext"]
    assert any(ln.startswith("stream ") for ln in lanes) and lanes[0].startswith("thread ")
    assert "kernel" in trace_names(timeline)
    assert "longest of" in texts(at)  # downsampled: the step has more events than drawn


def test_failed_run_shows_its_error(home: Path, recorded: dict) -> None:
    at = open_page("run", run=str(recorded["ids"]["fail"]))
    assert not at.exception
    with RunStore(home) as store:
        error = store.run(recorded["ids"]["fail"])["error"]
    assert error and "ZeroDivisionError" in error
    assert [e.value for e in at.error] == [f"failed: {error}"]


def test_missing_run_is_one_line(home: Path) -> None:
    at = open_page("run", run="999")
    assert not at.exception
    assert len(at.error) == 1 and "no run with id or name '999'" in at.error[0].value


def test_unreadable_trace_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded
) -> None:
    """A run whose trace file was cut short (disk full, copied while written)."""
    with RunStore(recorded["home"]) as store:
        arts = store.artifacts(recorded["ids"]["ib"])
    good = Path(arts.loc[arts["kind"] == "trace", "path"].iloc[0])
    home = tmp_path / "home"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"], name="cut", status="completed")
        bad = store.run_dir(run_id) / good.name
        raw = gzip.decompress(good.read_bytes())
        bad.write_bytes(gzip.compress(raw[: len(raw) // 2]))
        store.add_artifact(run_id, "trace", bad)
        store.finish_run(run_id, "completed", exit_code=0)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(run_id))
    assert not at.exception
    assert len(at.error) == 1
    assert at.error[0].value.startswith("The trace could not be analysed:")
    assert "truncated JSON" in at.error[0].value and bad.name in at.error[0].value


def test_corrupt_store_is_one_line_on_every_page(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "stepscope.db").write_bytes(b"this is not a database\n" * 100)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    for page in ("runs", "run", "compare", "optimize"):
        at = open_page(page, run="1", a="1", b="2", experiment="1")
        assert not at.exception, page
        assert len(at.error) == 1, page
        line = at.error[0].value
        assert "\n" not in line and "cannot open the run store" in line and "stepscope.db" in line


def test_locked_store_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holds the write lock past the store's busy timeout (10 s) while
    the page must write: a run whose launcher is gone is marked lost as it is read
    (reading alone is not blocked: WAL, and opening a store at its version only reads)."""
    home = tmp_path / "home"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_started = psutil.Process(dead.pid).create_time()
    dead.wait()
    with RunStore(home) as store:
        store.create_run(["python", "gone.py"], pid=dead.pid, pid_started_at=dead_started)
    holder = sqlite3.connect(home / "stepscope.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        monkeypatch.setenv("STEPSCOPE_HOME", str(home))
        at = open_page("runs")
    finally:
        holder.rollback()
        holder.close()
    assert not at.exception
    assert len(at.error) == 1
    assert "locked" in at.error[0].value and "\n" not in at.error[0].value


def test_tensorboard_button_starts_tensorboard(home: Path, recorded: dict) -> None:
    at = open_page("run", run=str(recorded["ids"]["ib"]))
    button = at.button(key="tensorboard")
    reason = tensorboard.unavailable_reason()
    if reason is not None:
        assert button.disabled and reason in texts(at)
        return
    assert not button.disabled
    assert "no longer maintained" in texts(at)
    button.click().run()
    no_errors(at)
    link = at.get("link_button")
    assert len(link) == 1
    url = link[0].proto.url
    assert url.startswith("http://127.0.0.1:") and url.endswith("/#pytorch_profiler")
    try:
        with urllib.request.urlopen(url.split("#")[0], timeout=30) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(url.split("#")[0] + "data/plugins_listing", timeout=30) as resp:
            assert "pytorch_profiler" in json.loads(resp.read())
    finally:
        from stepscope.app.dashboard.views.run.run_actions import _tensorboards

        for tb in _tensorboards().values():
            tb.stop()


# -- compare page --------------------------------------------------------------------------
def test_compare_page_ratio_and_changes(home: Path, recorded: dict) -> None:
    a, b = recorded["ids"]["ib"], recorded["ids"]["dense"]
    at = open_page("compare", a=str(a), b=str(b))
    no_errors(at)
    with RunStore(home) as store:
        sa, sb = store.steps(a), store.steps(b)
        cmd_b = store.run(b)["command"]
    # input_bound.py against dense_compute.py: two programs, so no ratio and no verdict
    # (issue 39: "166.44x faster"); each run's own figures side by side
    m = metrics(at)
    assert "speed-up B vs A" not in m and "median step-time ratio" not in m
    assert "These are different programs" in " ".join(w.value for w in at.warning)
    assert m["median step A"] == fmt_s(summarize_steps(sa)["step_time_median_s"])
    assert m["median step B"] == fmt_s(summarize_steps(sb)["step_time_median_s"])
    assert "Throughput:" not in texts(at)
    assert at.selectbox[0].value == a and at.selectbox[1].value == b
    # only ib has a trace: both sides are compared on the step timer's basis
    assert "only one run has a profiler trace" in texts(at)
    specs = chart_specs(at)
    dist = next(sp for sp in specs if sp["data"][0]["type"] == "violin")
    assert len(values(dist["data"][0]["y"])) == len(timed_step_times(sa))
    assert any(
        len(sp["data"]) == 2 and sp["layout"]["yaxis"].get("title", {}).get("text") == "loss"
        for sp in specs
    )
    assert cmd_b[1] in texts(at)  # what differs names dense_compute.py
    # switching A updates the URL, so the view stays linkable
    at.selectbox[0].set_value(recorded["ids"]["fail"]).run()
    assert at.query_params["a"] == str(recorded["ids"]["fail"])


def test_compare_defaults_and_bad_ids(home: Path, recorded: dict) -> None:
    at = open_page("compare")
    no_errors(at)
    ids = sorted(recorded["ids"].values(), reverse=True)
    assert (at.selectbox[0].value, at.selectbox[1].value) == (ids[1], ids[0])
    at = open_page("compare", a="999", b=str(ids[0]))
    assert not at.exception
    assert len(at.error) == 1 and "no run with id 999" in at.error[0].value


# -- actions on a running job -----------------------------------------------------------------
def test_live_job_capture_button_and_live_badge(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "live-home"
    job = start_live_job(home)
    try:
        run_id = wait_running(home, "live", min_steps=2)
        monkeypatch.setenv("STEPSCOPE_HOME", str(home))
        runs = open_page("runs")
        no_errors(runs)
        assert "1 running · live" in texts(runs)
        assert runs.dataframe[0].value["status"].iloc[0] == "● running"

        at = open_page("run", run=str(run_id))
        no_errors(at)
        assert "running" in texts(at)
        at.number_input(key="capture_k").set_value(2).run()
        assert at.button(key="capture").label == "Capture 2 steps"
        at.button(key="capture").click().run()
        no_errors(at)
        request = json.loads(capture_request_path(home / "runs" / str(run_id)).read_text())
        assert request["steps"] == 2
        assert request["id"][:8] in at.success[0].value
        opt = open_page("optimize", run=str(run_id))  # not a baseline while it runs
        no_errors(opt)
        assert f"Run {run_id} is still running" in texts(opt)
        assert not [b for b in opt.button if b.key == "apply"]
        # the job serves it: a trace of exactly the requested steps lands in the store
        deadline = time.monotonic() + 120
        traces = []
        while time.monotonic() < deadline and not traces:
            with RunStore(home) as store:
                arts = store.artifacts(run_id)
            traces = [m for k, m in zip(arts["kind"], arts["meta"], strict=True) if k == "trace"]
            time.sleep(0.5)
        assert traces and traces[0]["steps"] == 2 and traces[0]["request_id"] == request["id"]
    finally:
        stop_job(job)
    at = open_page("run", run=str(run_id))  # interrupted now: no capture offered
    assert not [b for b in at.button if b.key == "capture"]
    assert "interrupted" in texts(at)


def test_capture_is_only_offered_for_running_jobs(home: Path, recorded: dict) -> None:
    at = open_page("run", run=str(recorded["ids"]["ib"]))
    assert not [b for b in at.button if b.key == "capture"]


# -- diagnosis (last: it writes findings into the module's store) -----------------------------
def test_an_ended_run_is_diagnosed_when_its_page_opens(home: Path, recorded: dict) -> None:
    """No Diagnose click: a run that ended without its verdict (recorded by the API here,
    as by a launcher that was killed) is diagnosed on opening, and saved."""
    run_id = recorded["ids"]["ib"]
    with RunStore(home) as store:  # as it ended (earlier pages here may have diagnosed it)
        store.save_findings(run_id, [])
        store.merge_run_json(run_id, "config", {"diagnosed": None})
    at = open_page("run", run=str(run_id))
    no_errors(at)
    with RunStore(home) as store:
        found = store.findings(run_id)
        assert store.run(run_id)["config"]["diagnosed"]["level"] == "trace"
    # the job waits on its loader: an I/O finding (first on a quiet machine; on a loaded
    # one the compute slows down too, so its rank is not asserted)
    io = next(f for f in found if f.klass == "io")
    page = texts(at)
    assert all(f.title in page for f in found)
    assert all(fix.title in page for fix in io.fixes)
    # each snippet with the values an experiment would use (the plan's num_workers)
    auto = sorted({x.id for f in found for x in f.fixes if x.auto})
    with RunStore(home) as store:
        planned = {p.id: p.params for p in choose_fixes(store, run_id, auto, allow_numerics=True)}
    shared = {k: v for params in planned.values() for k, v in params.items()}
    snippets = {with_params(f.snippet, {**shared, **planned.get(f.id, {})}) for f in io.fixes}
    assert {c.value for c in at.code} >= snippets - {""}
    assert not [b for b in at.button if b.key == "diagnose"]
    # next to the findings: the way to apply them
    link = next(p.proto for p in at.get("page_link") if p.proto.label == "Apply and compare…")
    assert link.page == "optimize" and link.query_string == f"run={run_id}"
    # the runs table now shows it as the run's top finding
    table = open_page("runs").dataframe[0].value
    assert found[0].title in table.loc[table["id"] == run_id, "top finding"].iloc[0]


def test_dashboard_command_line() -> None:
    from stepscope.app.cli.dashboard import ENTRY as entry
    from stepscope.app.cli.dashboard import streamlit_command

    cmd = streamlit_command("127.0.0.1", 8599)
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(entry)]
    assert entry == ENTRY and entry.is_file()
    opts = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert opts["--server.headless"] == "true"
    assert opts["--server.address"] == "127.0.0.1" and opts["--server.port"] == "8599"
    assert opts["--browser.gatherUsageStats"] == "false"


# -- optimize page (its own store: experiments add trial runs) -----------------------------
EXPERIMENT_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def optimizable(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A short input-bound run (not diagnosed yet) and a job that fails after 3 steps."""
    home = ib_short(tmp_path_factory, "optimize")
    with RunStore(home) as store:
        ids = {"ib": store.resolve_run("input-bound")}
    ids["fail"] = failing_run(home)
    return {"home": home, "ids": ids}


@pytest.fixture
def opt_home(optimizable: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    monkeypatch.setenv("STEPSCOPE_HOME", str(optimizable["home"]))
    return optimizable["home"]


def auto_fix_ids(home: Path, run_id: int) -> list[str]:
    """The auto fixes over the run's saved findings, diagnosing it first if need be."""
    from stepscope.analyzers.rules.diagnosis import diagnose_run

    with RunStore(home) as store:
        if not store.findings(run_id):
            diagnose_run(store, run_id)
        found = store.findings(run_id)
    return list(dict.fromkeys(x.id for f in found for x in f.fixes if x.auto))


def only_fixes(at: AppTest, run_id: int, keep: set[str]) -> None:
    for box in at.checkbox:
        # a fix that needs consent is locked (and unchecked) until numerics are allowed
        if box.key.startswith(f"fix_{run_id}_") and not box.disabled:
            box.set_value(box.key.removeprefix(f"fix_{run_id}_") in keep)
    at.run()


def trial_runs(store: RunStore, experiment_id: int, status: str | None = None) -> list[int]:
    runs = store.runs()
    return [
        int(r["id"])
        for r in runs.to_dict("records")
        if (r["config"] or {}).get("experiment") == experiment_id
        and (status is None or r["status"] == status)
    ]


def process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_ended(home: Path, experiment_id: int, timeout: float = EXPERIMENT_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + timeout
    with RunStore(home) as store:
        while (row := store.experiment(experiment_id))["status"] == "running":
            assert time.monotonic() < deadline, f"experiment still running: {row['progress']}"
            time.sleep(1.0)
    return row


def test_optimize_diagnoses_then_offers_the_auto_fixes(opt_home: Path, optimizable) -> None:
    run_id = optimizable["ids"]["ib"]
    at = open_page("optimize", run=str(run_id))
    no_errors(at)
    assert at.title[0].value == f"Optimize run {run_id} · input-bound"
    # the ended run was diagnosed on opening the page: no Diagnose click before the form
    assert not [b for b in at.button if b.key == "diagnose"]

    expected = auto_fix_ids(opt_home, run_id)  # from the findings the page saved
    assert "dataloader_workers" in expected
    boxes = {b.key.removeprefix(f"fix_{run_id}_"): b for b in at.checkbox}
    assert sorted(boxes) == sorted(expected)
    # A fix that changes numerics (bf16 autocast, on a CPU with native bf16) is offered
    # locked and unchecked until numerics are allowed; one predicted to gain nothing
    # (<= 1.00x) is offered unchecked; every other one is checked.
    consent = {f for f in expected if get_fix(f).needs_consent}
    with RunStore(opt_home) as store:
        idle = {x.id for f in store.findings(run_id) for x in f.fixes if x.gains_nothing}
    for fix_id, box in boxes.items():
        if fix_id in consent:
            assert box.disabled and not box.value and "needs consent" in box.label
        else:
            assert box.value == (fix_id not in idle) and not box.disabled
    toggles = [(t.key, t.value) for t in at.toggle]
    assert (f"keep_explicit_{run_id}", False) in toggles
    # the "allow numerics" toggle is there exactly when some fix needs consent
    assert len(toggles) == (2 if consent else 1)
    # the experiment's own inputs (the largest-batch search below has its own: fit_*)
    assert [(n.label, n.value) for n in at.number_input if n.key.startswith("opt_")] == [
        ("trials per arm", 3),
        ("steps per trial", 30),
    ]
    assert "Largest batch that fits" in [h.value for h in at.subheader]  # a training run
    notes = next(df.value for df in at.dataframe if "parameters" in df.value.columns)
    with RunStore(opt_home) as store:
        checked = [f for f in expected if f not in consent and f not in idle]
        plans = {p.id: p for p in choose_fixes(store, run_id, checked)}
    row = notes[notes["fix"] == "dataloader_workers"].iloc[0]
    workers = plans["dataloader_workers"]
    assert row["parameters"] == f"num_workers={workers.params['num_workers']}"
    assert row["why these"] == workers.why_params
    assert row["predicted (bound)"] == f"≤ {workers.predicted_speedup:.2f}x"
    arms = 1 + len(candidate_arms(list(plans.values())))
    assert f"{arms} arms" in texts(at) and f"= {arms * 3} trial runs" in texts(at)
    assert not at.button(key="apply").disabled

    only_fixes(at, run_id, set())
    assert at.button(key="apply").disabled and "check at least one fix" in texts(at)


def test_optimize_apply_and_compare(opt_home: Path, optimizable) -> None:
    """The button starts a real experiment; the page follows it and shows its result."""
    run_id = optimizable["ids"]["ib"]
    auto_fix_ids(opt_home, run_id)
    at = open_page("optimize", run=str(run_id))
    only_fixes(at, run_id, {"dataloader_workers"})
    at.number_input(key="opt_steps").set_value(12)
    at.number_input(key="opt_trials").set_value(2)
    at.button(key="apply").click().run()
    no_errors(at)
    experiment_id = int(at.query_params["experiment"])
    with RunStore(opt_home) as store:
        config = store.experiment(experiment_id)["config"]
    assert (config["fixes"], config["steps"], config["trials"]) == (["dataloader_workers"], 12, 2)
    assert at.get("progress") and at.button(key="cancel")  # running: followed, cancellable

    row = wait_ended(opt_home, experiment_id)
    assert row["status"] == "completed", row["error"]
    result = row["result"]
    at.run()
    no_errors(at)
    table = table_with(at, "candidate")
    assert list(table["candidate"]) == [c["name"] for c in result["candidates"]] == ["all"]
    for shown, c in zip(table.to_dict("records"), result["candidates"], strict=True):
        assert shown["fixes"] == "dataloader_workers" and shown["status"] == c["status"]
        assert shown["vs baseline"] == c["speedup"]
        assert shown["95 % CI"] == f"{c['ci'][0]:.2f}–{c['ci'][1]:.2f}x"
        assert shown["verdict"] == c["verdict"]
        assert shown["median step ratio"] == c["step_time"]["ratio"]
        assert shown["loss"] == ("same" if c["quality_ok"] else "changed")
        assert shown["why"] == c["quality"]["reason"]
    fixes = table_with(at, "bound (diagnosis)")
    f = result["fixes"][0]
    assert fixes["measured"].iloc[0] == f["measured"]
    assert fixes["bound (diagnosis)"].iloc[0] == f["predicted"]
    assert fixes["kept"].iloc[0] == ("✓ keep" if f["kept"] else "—")
    best = result["best"]
    if best["fixes"]:
        assert f"{best['speedup']:.2f}x the throughput" in at.success[0].value
    else:
        c = result["candidates"][0]
        assert "No fix measured faster" in texts(at)
        assert f"all {c['speedup']:.2f}x (95 % CI {c['ci'][0]:.2f}–{c['ci'][1]:.2f}x" in texts(at)

    # it ends on Compare: one baseline trial and one candidate trial of the same round
    link = next(p.proto for p in at.get("page_link") if p.proto.page == "compare")
    pair = dict(kv.split("=") for kv in link.query_string.split("&"))
    a, b = int(pair["a"]), int(pair["b"])
    rounds = list(zip(result["baseline"]["runs"], result["candidates"][0]["runs"], strict=True))
    assert (a, b) in rounds
    with RunStore(opt_home) as store:
        sa, sb = store.steps(a), store.steps(b)
    pair_ratio = f"{speedup_ci(per_sample(sa), per_sample(sb), statistic='mean').ratio:.2f}x"
    assert metrics(at)[f"run #{b} vs #{a}"] == pair_ratio
    compare = open_page("compare", a=str(a), b=str(b))
    no_errors(compare)
    assert metrics(compare)["speed-up B vs A"] == pair_ratio  # the inline headline = Compare's

    # the page can be left and reopened from the URL or the run's list of experiments
    again = open_page("optimize", experiment=str(experiment_id))
    no_errors(again)
    assert again.query_params["run"] == str(run_id)
    assert table_with(again, "candidate")["vs baseline"].iloc[0] == c["speedup"]
    past = table_with(open_page("optimize", run=str(run_id)), "outcome")
    mine = past[past["id"] == experiment_id].iloc[0]
    assert mine["open"] == f"optimize?run={run_id}&experiment={experiment_id}"
    assert "completed" in mine["status"]


def test_optimize_cancel_ends_a_running_experiment(opt_home: Path, optimizable) -> None:
    run_id = optimizable["ids"]["ib"]
    auto_fix_ids(opt_home, run_id)
    experiment_id = start_experiment(
        opt_home,
        run_id,
        ExperimentOptions(fixes=("dataloader_workers",), steps=10_000, trials=1, timeout_s=300),
    )
    deadline = time.monotonic() + 120
    with RunStore(opt_home) as store:  # wait for its first trial job to be running
        while not (trials := trial_runs(store, experiment_id, status="running")):
            assert time.monotonic() < deadline, store.experiment(experiment_id)
            time.sleep(0.5)
        pid = store.experiment(experiment_id)["pid"]

    # the run opens on its running experiment; its form says one experiment per run at a time
    assert open_page("optimize", run=str(run_id)).query_params["experiment"] == str(experiment_id)
    form = open_page("optimize", run=str(run_id), new="1")
    no_errors(form)
    assert f"Experiment {experiment_id} on this run is running" in texts(form)
    assert form.button(key="apply").disabled and "still running" in texts(form)

    at = open_page("optimize", run=str(run_id), experiment=str(experiment_id))
    no_errors(at)
    assert "0 of 2 trial runs · now: baseline" in at.get("progress")[0].proto.text
    at.button(key="cancel").click().run()
    no_errors(at)
    # the page says it is stopping, unless the experiment's process already wrote its end
    # before the page ran again (a quick cancel: it then says cancelled, with no button)
    if f"Experiment {experiment_id} was cancelled" not in texts(at):
        assert "Stopping" in texts(at) and at.button(key="cancel").disabled
    row = wait_ended(opt_home, experiment_id, timeout=120)
    assert (row["status"], row["error"]) == ("failed", "interrupted")
    with RunStore(opt_home) as store:
        assert store.run(trials[0])["status"] == "interrupted"  # its trial was ended too
    deadline = time.monotonic() + 30  # it wrote its end; now it exits
    while not process_gone(pid):
        assert time.monotonic() < deadline, f"experiment process {pid} still alive"
        time.sleep(0.2)
    at.run()
    no_errors(at)
    assert f"Experiment {experiment_id} was cancelled" in texts(at)
    assert not [b for b in at.button if b.key == "cancel"]


def test_optimize_failed_run_and_failed_experiment(opt_home: Path, optimizable) -> None:
    """A run that failed after 3 steps: explained, still tried, and the experiment's
    failure (its baseline fails the same way) shown with its error and run."""
    run_id = optimizable["ids"]["fail"]
    at = open_page("optimize", run=str(run_id))
    no_errors(at)
    with RunStore(opt_home) as store:
        error = store.run(run_id)["error"]
    assert f"Run {run_id} failed after 3 steps ({error})" in at.warning[0].value
    # the 3-step diagnosis varies with the machine's load (fused_optimizer, else
    # cpu_threads): any one offered fix will do, the baseline fails before it matters
    offered = [b.key.removeprefix(f"fix_{run_id}_") for b in at.checkbox if not b.disabled]
    only_fixes(at, run_id, {"fused_optimizer" if "fused_optimizer" in offered else offered[0]})
    at.number_input(key="opt_trials").set_value(1)
    at.button(key="apply").click().run()
    experiment_id = int(at.query_params["experiment"])
    row = wait_ended(opt_home, experiment_id, timeout=120)
    assert row["status"] == "failed" and "the baseline failed" in row["error"]
    at.run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"Experiment {experiment_id} failed: {row['error']}"]
    failed_trial = row["progress"]["run_id"]
    link = next(p.proto for p in at.get("page_link") if "failed trial" in p.proto.label)
    assert link.query_string == f"run={failed_trial}"


def _a100_run(home: Path) -> int:
    """A run holding a real A100 trace (NCCL, 3 steps), diagnosed: GPU-only fixes."""
    from stepscope.analyzers.rules.diagnosis import diagnose_run

    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"], name="a100", status="completed")
        store.add_artifact(run_id, "trace", in_run_folder(store, run_id, trace_path(A100)))
        store.finish_run(run_id, "completed", exit_code=0)
        diagnose_run(store, run_id)
    return run_id


def test_optimize_marks_numerics_and_consent(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    run_id = _a100_run(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    with RunStore(home) as store:
        fixes = {x.id: x for f in store.findings(run_id) for x in f.fixes}
    consent = [i for i, x in fixes.items() if x.needs_consent]
    numerics = [
        i for i, x in fixes.items() if x.auto and x.changes_numerics and not x.needs_consent
    ]
    advice = [x for x in fixes.values() if not x.auto]
    # every automatic fix that changes numerics needs consent (bf16 ran without it once)
    assert {"larger_batch", "bf16_autocast"} <= set(consent) and not numerics and advice

    at = open_page("optimize", run=str(run_id))
    no_errors(at)
    for fix_id in consent:
        box = at.checkbox(key=f"fix_{run_id}_{fix_id}")
        assert box.disabled and not box.value and "needs consent" in box.label
    assert all(x.title in texts(at) for x in advice)  # listed, but not as checkboxes
    assert not [b for b in at.checkbox if b.key.endswith(advice[0].id)]

    at.toggle(key=f"allow_numerics_{run_id}").set_value(True).run()
    box = at.checkbox(key=f"fix_{run_id}_larger_batch")
    assert not box.disabled and not box.value  # allowed, still the user's to check
    box.check().run()
    notes = table_with(at, "numerics")
    assert notes.loc[notes["fix"] == "larger_batch", "parameters"].iloc[0] == "factor=2"
    at.toggle(key=f"allow_numerics_{run_id}").set_value(False).run()
    assert not at.checkbox(key=f"fix_{run_id}_larger_batch").value  # locked again, unchecked


def test_optimize_refusals_are_one_line(tmp_path: Path, monkeypatch) -> None:
    """Findings saved by another stepscope (a fix id this one does not know): start_experiment
    refuses, in one line; findings with only code-change advice: nothing to apply."""
    home = tmp_path / "home"
    run_id = _a100_run(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    with RunStore(home) as store:
        found = store.findings(run_id)
        renamed = [replace(f, fixes=[replace(x, id=x.id + "_v0") for x in f.fixes]) for f in found]
        store.save_findings(run_id, renamed)
    at = open_page("optimize", run=str(run_id))
    assert not at.exception
    at.button(key="apply").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("Not started: unknown fix '")
    assert "\n" not in errors[0]
    with RunStore(home) as store:
        assert store.experiments(run_id) == []  # nothing was started

        advice_only = [replace(f, fixes=[x for x in f.fixes if not x.auto]) for f in found]
        store.save_findings(run_id, advice_only)
    at = open_page("optimize", run=str(run_id))
    no_errors(at)
    assert "can be applied without changing its code" in texts(at)
    assert not [b for b in at.button if b.key == "apply"] and not at.checkbox

    at = open_page("optimize", experiment="999")
    assert not at.exception
    assert [e.value for e in at.error] == [f"no experiment with id 999 in {home} (?experiment=999)"]


def test_optimize_result_shows_not_applied_notes_and_contention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored result with the newer fields: a candidate whose fix did not take effect is
    'not applied' (with why), never a verdict; the fix's note; other work on the cores."""
    home = tmp_path / "home"
    ids = stored_experiment(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("optimize", experiment=str(ids["experiment"]))
    no_errors(at)
    assert "fixes override values the script set explicitly" in texts(at)
    warnings = [w.value for w in at.warning]
    assert CONTENTION_WARNING in warnings
    not_applied = f"not applied: dataloader_workers: {NOT_APPLIED_WHY}"
    assert f"**all** was not measured: {not_applied}." in warnings

    ablation = table_with(at, "candidate").set_index("candidate")
    assert ablation.loc["all", "status"] == "not applied"
    assert ablation.loc["all", "verdict"] == not_applied
    assert ablation.loc["all", "why"] == not_applied
    assert ablation.loc["all", "vs baseline"] == "—" and ablation.loc["all", "95 % CI"] == "—"
    assert ablation.loc["prefetch_factor", "verdict"] == "no measurable change"
    per_fix = table_with(at, "bound (diagnosis)").set_index("fix")
    assert per_fix.loc["dataloader_workers", "verdict"] == f"not applied: {NOT_APPLIED_WHY}"
    assert per_fix.loc["prefetch_factor", "verdict"] == "no measurable change"
    assert f"`prefetch_factor`: {FIX_NOTE}" in texts(at)


def test_optimize_result_stored_before_the_newer_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    ids = stored_experiment(home, new_fields=False)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("optimize", experiment=str(ids["experiment"]))
    no_errors(at)
    assert not at.warning and "explicitly" not in texts(at) and "not applied" not in texts(at)
    ablation = table_with(at, "candidate").set_index("candidate")
    assert (ablation.loc["all", "status"], ablation.loc["all", "verdict"]) == (
        "completed",
        "faster",
    )


def test_optimize_keep_explicit_toggle_reaches_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off by default; on, the experiment is started with keep_explicit=True (what that
    does inside the job is the runner's, tested with it)."""
    from stepscope.app.dashboard.views.optimize import optimize_setup

    home = tmp_path / "home"
    run_id = _a100_run(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    started: list[dict] = []

    def fake_start(home_arg: str, baseline: int, options: ExperimentOptions) -> int:
        started.append({"baseline": baseline, **options.to_json()})
        with RunStore(home_arg) as store:
            eid = store.create_experiment(baseline, {"keep_explicit": options.keep_explicit})
            result = experiment_result(eid, baseline, baseline)
            result["keep_explicit"] = options.keep_explicit
            store.update_experiment(eid, status="completed", ended_at=time.time(), result=result)
        return eid

    monkeypatch.setattr(optimize_setup, "start_experiment", fake_start)
    at = open_page("optimize", run=str(run_id))
    no_errors(at)
    toggle = at.toggle(key=f"keep_explicit_{run_id}")
    assert toggle.label == "Keep values my script set explicitly" and toggle.value is False
    toggle.set_value(True).run()
    at.button(key="apply").click().run()
    no_errors(at)
    assert [(s["baseline"], s["keep_explicit"]) for s in started] == [(run_id, True)]
    assert "values the script set explicitly kept" in texts(at)  # the experiment's header


def test_trial_run_lists_what_it_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    ids = stored_experiment(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(ids["trial"]))
    no_errors(at)
    assert f"**Trial run** of experiment {ids['experiment']}, arm all, trial 1" in texts(at)
    applied = table_with(at, "change").set_index("fix")
    assert applied.loc["dataloader_workers", "change"] == APPLIED_CHANGE
    assert applied.loc["dataloader_workers", "state"] == "applied, verified"
    assert applied.loc["prefetch_factor", "state"] == "not applied"
    link = next(p.proto for p in at.get("page_link") if p.proto.page == "optimize")
    assert link.query_string == f"run={ids['baseline']}&experiment={ids['experiment']}"

    baseline = open_page("run", run=str(ids["baseline"]))  # not a trial: no such section
    no_errors(baseline)
    assert "Trial run" not in texts(baseline)

    compare = open_page("compare", a=str(ids["baseline"]), b=str(ids["trial"]))
    assert not compare.exception
    shown = texts(compare)
    assert f"**fixes applied in B #{ids['trial']} nanogpt [all #1]**" in shown
    assert f"- `dataloader_workers`: {APPLIED_CHANGE} (applied, verified)" in shown


# -- attach page (last: its jobs run until the module ends) -----------------------------------
ATTACH_S = 4


@pytest.fixture(scope="module")
def attachable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Two live jobs in a fresh store: the input-bound example as a plain Python process,
    and the same under `stepscope run` (a run of the store, which the page must recognise)."""
    home = tmp_path_factory.mktemp("attach") / "home"
    plain = start_plain_job(home.parent)
    managed = start_live_job(home, "managed", steps=2000)
    try:
        run_id = wait_running(home, "managed", min_steps=1)
        yield {
            "home": home,
            "managed_run": run_id,
            "managed_pid": job_pid(managed, "examples/input_bound.py"),
            "launcher": managed.pid,
            "plain_proc": plain,
        }
    finally:
        stop_job(managed)
        end_process(plain)


@pytest.fixture
def attach_home(attachable: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    monkeypatch.setenv("STEPSCOPE_HOME", str(attachable["home"]))
    return attachable["home"]


@pytest.fixture(scope="module")
def cli_attached(attachable: dict) -> int:
    """A run recorded from outside only (`stepscope attach PID --duration 3 --no-inject`)
    on the plain job: the Run page's stack view, with no step timer in the job."""
    out = stepscope(
        attachable["home"], "attach", str(plain_pid(attachable)),
        "--duration", "3", "--json", "--no-inject",
    )  # fmt: skip
    return int(json.loads(out.stdout)["run_id"])


def plain_pid(attachable: dict) -> int:
    """The plain job's pid, checked alive: if it ended, say how, not "no such process"."""
    proc = attachable["plain_proc"]
    if proc.poll() is not None:
        log = (attachable["home"].parent / "plain.log").read_text(errors="replace")
        raise AssertionError(f"the plain job ended ({proc.returncode}): {log[-2000:]}")
    return proc.pid


def wait_attach_done(home: Path, run_id: int, timeout: float = 60) -> dict:
    """Wait until the attach has ended its run and its process has exited (diagnosed)."""
    deadline = time.monotonic() + timeout
    with RunStore(home) as store:
        while (run := store.run(run_id))["status"] == "running":
            assert time.monotonic() < deadline, "the attach is still running"
            time.sleep(0.2)
    wait_gone(int(run["pid"]), timeout=timeout)
    return run


def test_attach_page_lists_processes_and_knows_stepscope_runs(
    attach_home: Path, attachable: dict
) -> None:
    at = open_page("attach")
    no_errors(at)
    table = table_with(at, "stepscope")
    rows = {int(p): r for p, r in zip(table["pid"], table.to_dict("records"), strict=True)}
    plain, job, run_id = plain_pid(attachable), attachable["managed_pid"], attachable["managed_run"]
    assert "examples/input_bound.py --steps 2000" in rows[plain]["command"]
    assert rows[plain]["stepscope"] == ""
    assert rows[plain]["memory (MiB)"] > 10 and rows[plain]["CPU %"] >= 0
    assert rows[job]["stepscope"] == f"stepscope run {run_id}"
    assert os.getpid() not in rows and attachable["launcher"] not in rows  # stepscope's own
    options = at.selectbox(key="attach_pid").options
    assert {o.split(" · ")[0] for o in options} >= {str(plain), str(job)}
    # offered first: the busiest process no run records (issue 39: the newest was)
    chosen = int(at.selectbox(key="attach_pid").value)
    free = {p: r for p, r in rows.items() if not r["stepscope"]}
    assert chosen in free and free[chosen]["CPU %"] == max(r["CPU %"] for r in free.values())

    # a plain process: attach, with the duration shown on the button
    at.selectbox(key="attach_pid").set_value(plain).run()
    at.number_input(key="attach_duration").set_value(ATTACH_S).run()
    assert at.button(key="attach").label == f"Attach to {plain} for {ATTACH_S} s"
    assert not [b for b in at.button if b.key == "attach_anyway"]

    # a `stepscope run` job: its run and a capture first; attaching only "anyway"
    at.selectbox(key="attach_pid").set_value(job).run()
    no_errors(at)
    assert f"is the job of **run {run_id}** (managed)" in texts(at)
    link = next(p.proto for p in at.get("page_link") if p.proto.label == f"Open run {run_id}")
    assert link.page == "run" and link.query_string == f"run={run_id}"
    assert not [b for b in at.button if b.key == "attach"]
    assert at.button(key="attach_anyway").proto.type != "primary"
    at.button(key="capture").click().run()
    no_errors(at)
    request = json.loads(capture_request_path(attach_home / "runs" / str(run_id)).read_text())
    assert request["steps"] == 3 and request["id"][:8] in at.success[0].value

    at.button(key="attach_refresh").click().run()  # scans again
    no_errors(at)
    assert plain in set(table_with(at, "stepscope")["pid"])


def test_attach_records_a_process_and_shows_the_result(attach_home: Path, attachable: dict) -> None:
    pid = plain_pid(attachable)
    at = open_page("attach")
    at.selectbox(key="attach_pid").set_value(pid).run()
    at.number_input(key="attach_duration").set_value(ATTACH_S).run()
    at.text_input(key="attach_name").set_value("from-the-page").run()
    at.button(key="attach").click().run()
    no_errors(at)
    run_id = int(at.query_params["run"])  # the page follows the run it records into
    assert at.subheader[0].value == f"Run {run_id} · from-the-page"
    progress = at.get("progress")[0].proto.text
    assert progress.endswith("stack samples so far") and f"of {ATTACH_S} s" in progress
    assert at.button(key="attach_stop")

    run = wait_attach_done(attach_home, run_id)
    with RunStore(attach_home) as store:
        samples = store.stack_samples(run_id)
        found = store.findings(run_id)
    assert (run["status"], run["stop_reason"]) == ("completed", "duration")
    assert run["config"]["mode"] == "attach" and run["config"]["attached_pid"] == pid
    assert run["config"]["duration_s"] == ATTACH_S and samples["samples"].sum() > 0
    at.run()
    no_errors(at)
    assert "completed" in texts(at) and not [b for b in at.button if b.key == "attach_stop"]
    assert "The attach ran for the whole duration asked for." in at.success[0].value
    shares = phase_shares(classify_samples(samples))
    top_phase = shares.sort_values("share").iloc[-1]
    assert f"{top_phase['label']} {fmt_pct(top_phase['share'])}" in texts(at)
    assert found and found[0].title in texts(at)  # the top finding, diagnosed by the attach
    link = next(p.proto for p in at.get("page_link") if p.proto.label.startswith("Open run"))
    assert link.page == "run" and link.query_string == f"run={run_id}"


def test_attach_follows_a_running_attach_and_stops_it(attach_home: Path, attachable: dict) -> None:
    """Started elsewhere (the backend, as a reload or another browser would find it)."""
    pid = plain_pid(attachable)
    since = time.time()
    proc = start_attach(pid, duration_s=120, home=attach_home)
    try:
        deadline = time.monotonic() + 30
        with RunStore(attach_home) as store:
            while (run_id := attach_run_of(store, proc.pid, since)) is None:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        listing = open_page("attach")  # the recordings under way are listed
        no_errors(listing)
        link = next(p.proto for p in listing.get("page_link") if f"Run {run_id}" in p.proto.label)
        assert link.page == "attach" and link.query_string == f"run={run_id}"
        assert f"process {pid}" in link.label and "of 120 s" in link.label
        table = table_with(listing, "stepscope")
        assert table.loc[table["pid"] == pid, "stepscope"].iloc[0] == f"attaching: run {run_id}"

        deadline = time.monotonic() + 90  # the collectors go in (or it says why not)
        with RunStore(attach_home) as store:
            while (mode := inject_mode(store.run(run_id))) is None:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
        run_page = open_page("run", run=str(run_id))  # live: the way to its progress and Stop
        no_errors(run_page)
        # a capture is offered where the job has the collectors to read it (gdb put them
        # in: tests/test_attach_inject.py), not to an attach from outside only
        captures = [b for b in run_page.button if b.key == "capture"]
        assert bool(captures) == (mode == "injected"), mode
        follow = next(
            p.proto for p in run_page.get("page_link") if "Attaching now" in p.proto.label
        )
        assert follow.page == "attach" and follow.query_string == f"run={run_id}"

        at = open_page("attach", run=str(run_id))
        no_errors(at)
        assert "of 120 s" in at.get("progress")[0].proto.text
        at.button(key="attach_stop").click().run()
        no_errors(at)
        stops = [b for b in at.button if b.key == "attach_stop"]
        assert ("Detaching" in texts(at) and stops[0].disabled) or not stops  # or done already
        run = wait_attach_done(attach_home, run_id)
        assert (run["status"], run["stop_reason"]) == ("stopped", "detached")
        assert proc.wait(timeout=30) == 0
        at.run()
        no_errors(at)
        assert "stopped" in texts(at) and "stopped early (detached)" in at.success[0].value
        assert f"detached from process {pid} after" in texts(at)  # the attach's own line
        at.button(key="attach_new").click().run()  # back to the list
        assert "run" not in at.query_params and at.selectbox(key="attach_pid")
    finally:
        end_process(proc)


def test_attach_when_the_process_is_gone_or_ends(attach_home: Path) -> None:
    """Gone before the click: one line, nothing recorded. Ending while attached: the run
    keeps what was recorded and the page says how it ended."""
    short = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        at = open_page("attach")
        at.selectbox(key="attach_pid").set_value(short.pid).run()
    finally:
        end_process(short)  # gone before the click
    with RunStore(attach_home) as store:
        before = len(store.runs())
    at.button(key="attach").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"Cannot attach: no process with PID {short.pid}"]
    assert short.pid not in set(table_with(at, "stepscope")["pid"])  # the list was refreshed
    with RunStore(attach_home) as store:
        assert len(store.runs()) == before  # nothing was recorded

    # It ends once the attach has sampled it, whatever the load: a process that slept 3 s
    # was once gone before a loaded CI machine got from the refresh to the click.
    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        at.button(key="attach_refresh").click().run()
        at.selectbox(key="attach_pid").set_value(ending.pid).run()
        at.button(key="attach").click().run()  # 30 s asked for; it ends long before
        no_errors(at)
        run_id = int(at.query_params["run"])
        deadline = time.monotonic() + 60
        with RunStore(attach_home) as store:
            while store.samples(run_id).empty:
                assert time.monotonic() < deadline, store.run(run_id)
                time.sleep(0.2)
        end_process(ending)
        run = wait_attach_done(attach_home, run_id)
    finally:
        end_process(ending)
    assert (run["status"], run["stop_reason"]) == ("completed", "process_ended")
    at.run()
    no_errors(at)
    assert "The process ended while attached" in at.info[0].value
    assert f"process {ending.pid} ended after" in texts(at)  # the attach's own line


def test_run_page_shows_where_the_main_thread_spends_its_time(
    attach_home: Path, cli_attached: int
) -> None:
    run_id = cli_attached
    at = open_page("run", run=str(run_id))
    no_errors(at)
    with RunStore(attach_home) as store:
        samples = store.stack_samples(run_id)
        run = store.run(run_id)
    classified = classify_samples(samples)
    shares, sites = phase_shares(classified), top_sites(classified, 10)
    assert "Where the main thread spends its time" in [s.value for s in at.subheader]
    assert "Steps" not in [s.value for s in at.subheader]  # no step timer in an attach
    assert not [b for b in at.button if b.key == "capture"]  # nor anything to capture
    m = metrics(at)
    assert m["process"] == str(run["config"]["attached_pid"])
    assert m["stack samples"] == f"{int(samples['samples'].sum()):,}"
    top = shares.sort_values("share").iloc[-1]
    assert m[f"main thread in {top['label']}"] == fmt_pct(top["share"])
    specs = chart_specs(at)
    bar = next(sp for sp in specs if sp["data"][0].get("orientation") == "h")
    assert bar["data"][0]["y"] == list(shares["label"])
    assert values(bar["data"][0]["x"]) == pytest.approx(list(shares["share"] * 100))
    over = next(sp for sp in specs if sp["layout"].get("barmode") == "stack")
    shown = {t["name"] for t in over["data"]}
    assert shown == set(shares.loc[shares["share"] > 0, "label"])
    table = table_with(at, "line")
    assert list(table["line"]) == list(sites["site"])
    assert table["share (%)"].to_numpy() == pytest.approx(sites["share"].to_numpy() * 100)


def test_diagnose_on_a_run_without_steps_says_why(tmp_path: Path, monkeypatch) -> None:
    """A job that ended before its first step: the page gives the reason, not
    "no bottleneck found", and offers no Diagnose button."""
    home = tmp_path / "home"
    run_id, code = launch_run([sys.executable, "-c", "import torch"], home=home, quiet=True)
    assert code == 0
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(run_id))
    no_errors(at)
    shown = [i.value for i in at.info]
    assert any(v.startswith("Nothing to diagnose: no steps recorded") for v in shown), shown
    assert not [b for b in at.button if b.key == "diagnose"]
