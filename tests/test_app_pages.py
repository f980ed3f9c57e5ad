"""The dashboard pages under Streamlit's AppTest, over a store of real example runs.

One store is recorded for the module (an input-bound run with a 2-step trace, a
dense-compute run without one, a job that fails); every figure a page shows is
checked against what the store and the analyzers say, and every button against its
effect (a capture request file, findings in the store, a TensorBoard that answers).
"""

from __future__ import annotations

import base64
import gzip
import json
import sqlite3
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_helpers import (
    ENTRY,
    record,
    start_live_job,
    stepscope,
    stop_job,
    wait_running,
)
from streamlit.testing.v1 import AppTest
from traces import A100, trace_path

from stepscope.analyzers.step_stats import summarize_steps
from stepscope.analyzers.trace_report import analyze_trace
from stepscope.app import tb_launch, ui
from stepscope.collectors.control import capture_request_path
from stepscope.optim_runner.stats import speedup_ci, timed_step_times
from stepscope.store import RunStore

pytestmark = pytest.mark.slow

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Real runs: ib (profiled steps 3-4), dense (no trace), fail (its code raises)."""
    home = tmp_path_factory.mktemp("dash") / "home"
    ids = {
        "ib": record(
            home,
            "ib",
            "input_bound.py",
            "--steps",
            "14",
            opts=("--max-steps", "12", "--profile-at", "3", "--profile-steps", "2"),
        ),
        "dense": record(
            home, "dense", "dense_compute.py", "--steps", "8", opts=("--max-steps", "6")
        ),
    }
    failed = stepscope(
        home, "run", "--name", "fail", "--", sys.executable, "tests/jobs/fail.py", check=False
    )
    assert failed.returncode == 1, failed.stderr  # the job's own exit code passes through
    with RunStore(home) as store:
        ids["fail"] = store.resolve_run("fail")
    return {"home": home, "ids": ids}


@pytest.fixture
def home(recorded: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    """The recorded store as the dashboard's store (after conftest's per-test one)."""
    monkeypatch.setenv("STEPSCOPE_HOME", str(recorded["home"]))
    return recorded["home"]


def open_page(page: str, **params: str) -> AppTest:
    """The dashboard's entry script, on ``page`` with ``params`` as the URL's query."""
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT_S)
    at.run()
    if page != "runs":
        at.query_params.update(params)
        at.switch_page(f"views/{page}.py").run()
    return at


def no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += (
        [i.value for i in at.info] + [e.value for e in at.error] + [w.value for w in at.warning]
    )
    return "\n".join(parts)


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
            assert median != median  # NaN: shown empty
        else:
            assert median == pytest.approx(s["step_time_median_s"] * 1e3)
        assert row["open"] == f"run?run={row['id']}"
        finding = top.get(row["id"])
        assert (finding["title"] in row["top finding"]) if finding else row["top finding"] == ""
    status = dict(zip(table["id"], table["status"], strict=True))
    assert status[recorded["ids"]["fail"]] == "✗ failed"
    assert status[recorded["ids"]["ib"]] == "✓ stopped"
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
    for page in ("runs", "run", "compare"):
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
    assert at.title[0].value == f"Run {run_id} · ib"
    m = metrics(at)
    assert m["step time p50"] == ui.fmt_s(s["step_time_median_s"])
    assert m["step time p95"] == ui.fmt_s(s["step_time_p95_s"])
    assert m["steps/s"] == ui.fmt_num(s["steps_per_s"])
    assert m["samples/s"] == ui.fmt_num(s["samples_per_s"])
    assert m["data wait"] == ui.fmt_pct(s["data_wait_share"])
    assert m["peak RSS"].endswith("MiB")
    assert f"{s['steps']} steps recorded, {s['timed_steps']} timed" in texts(at)

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
    system = next(sp for sp in specs if "CPU % (%)" in json.dumps(sp["layout"]))
    assert "job RSS" in trace_names(system)  # the memory panel shares the time axis
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


def test_gpu_trace_views(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real A100 trace (NCCL, 3 steps) as a run's artifact: kernels, device lanes."""
    path = trace_path(A100)
    home = tmp_path / "home"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"], name="a100", status="completed")
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
    for page in ("runs", "run", "compare"):
        at = open_page(page, run="1", a="1", b="2")
        assert not at.exception, page
        assert len(at.error) == 1, page
        line = at.error[0].value
        assert "\n" not in line and "cannot open the run store" in line and "stepscope.db" in line


def test_locked_store_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holds the write lock past the store's busy timeout (10 s)."""
    home = tmp_path / "home"
    RunStore(home).close()
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
    reason = tb_launch.unavailable_reason()
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
        from stepscope.app.run_sections import _tensorboards

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
    # the headline is throughput (mean seconds per sample), as experiments decide; the
    # median step-time ratio beside it
    assert sa["batch_size"].notna().all() and sb["batch_size"].notna().all()
    throughput = speedup_ci(per_sample(sa), per_sample(sb), statistic="mean")
    median = speedup_ci(timed_step_times(sa), timed_step_times(sb))
    m = metrics(at)
    assert m["speed-up B vs A"] == f"{throughput.ratio:.2f}x"
    assert m["median step-time ratio"] == f"{median.ratio:.2f}x"
    assert m["median step A"] == ui.fmt_s(summarize_steps(sa)["step_time_median_s"])
    assert m["median step B"] == ui.fmt_s(summarize_steps(sb)["step_time_median_s"])
    assert f"Throughput: {throughput.describe()}" in texts(at)
    assert f"Median step time: {median.describe()}" in texts(at)
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
    assert cmd_b[1] in texts(at)  # the command diff names dense_compute.py
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
def test_diagnose_button(home: Path, recorded: dict) -> None:
    run_id = recorded["ids"]["ib"]
    at = open_page("run", run=str(run_id))
    no_errors(at)
    try:
        import stepscope.analyzers.diagnosis  # noqa: F401
    except ImportError:
        assert not [b for b in at.button if b.key == "diagnose"]
        assert "no diagnosis module" in texts(at)
        pytest.skip("stepscope.analyzers.diagnosis is not importable yet")
    with RunStore(home) as store:
        assert store.findings(run_id) == []
    at.button(key="diagnose").click().run()
    no_errors(at)
    with RunStore(home) as store:
        found = store.findings(run_id)
    # the job waits on its loader: an I/O finding (first on a quiet machine; on a loaded
    # one the compute slows down too, so its rank is not asserted)
    io = next(f for f in found if f["class"] == "io")
    page = texts(at)
    assert all(f["title"] in page for f in found)
    assert all(fix["title"] in page for fix in io["fixes"])
    assert {c.value for c in at.code} >= {f["snippet"] for f in io["fixes"] if f["snippet"]}
    assert not [b for b in at.button if b.key == "diagnose"]
    # the runs table now shows it as the run's top finding
    table = open_page("runs").dataframe[0].value
    assert found[0]["title"] in table.loc[table["id"] == run_id, "top finding"].iloc[0]


def test_dashboard_command_line() -> None:
    from stepscope.app.cli_dashboard import ENTRY as entry
    from stepscope.app.cli_dashboard import streamlit_command

    cmd = streamlit_command("127.0.0.1", 8599)
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(entry)]
    assert entry == ENTRY and entry.is_file()
    opts = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert opts["--server.headless"] == "true"
    assert opts["--server.address"] == "127.0.0.1" and opts["--server.port"] == "8599"
    assert opts["--browser.gatherUsageStats"] == "false"
