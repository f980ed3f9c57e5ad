"""Where the time went, in the dashboard and in experiments: Compare's operator diff
section, and each experiment arm's line of what it changed most (``arm_changes``).

Three real runs of tests/jobs/train.py (about 3 s each): "slow" waits 1 ms per sample
in its loader, "compute" does 3 extra matmuls per step instead, both with the default
capture; "bare" is "compute" without a trace. Against "slow", "compute" waits for data
no more and calls ``aten::mm`` more: the diff has both kinds of change to show.
"""

from __future__ import annotations

import io
import json
import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from dashboard_helpers import experiment_result, no_errors, open_page, stepscope, texts

from stepscope.app.cli.optimize import render
from stepscope.app.cli.term import console
from stepscope.app.dashboard.views.compare.compare_ops import filtered
from stepscope.app.dashboard.views.optimize.experiment_view import CHANGES
from stepscope.optim_runner.verdict.arm_changes import (
    NOTHING,
    SEPARATOR,
    UNKNOWN,
    changes_line,
    explain_arm,
    explain_result,
)
from stepscope.store import RunStore

TRAIN = Path(__file__).resolve().parent / "jobs" / "train.py"
CHART_AXIS = "change of time per step, B - A (ms)"
#: what a table cell or a line must never say: Python's None/NaN reprs, pandas' <NA>
RAW = re.compile(r"\b(None|nan|NaN|NaT)\b|<NA>")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    home = tmp_path_factory.mktemp("compare_diff") / "home"
    for name, args, opts in (
        ("slow", ("--sleep", "0.001"), ()),
        ("compute", ("--compute", "3"), ()),
        ("bare", ("--compute", "3"), ("--no-profile",)),
    ):
        job = [sys.executable, str(TRAIN), "--steps", "40", *args]
        stepscope(home, "run", "--quiet", "--name", name, *opts, "--", *job)
    with RunStore(home) as store:
        ids = {name: store.resolve_run(name) for name in ("slow", "compute", "bare")}
    return {"home": home, "ids": ids}


@pytest.fixture
def home(runs: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    monkeypatch.setenv("STEPSCOPE_HOME", str(runs["home"]))
    return runs["home"]


def _ops_table(at) -> pd.DataFrame | None:
    return next((t.value for t in at.dataframe if "calls A → B" in t.value.columns), None)


def _phase_table(at) -> pd.DataFrame:
    tables = [t.value for t in at.dataframe]
    return next(t for t in tables if "95 % interval" in t and "calls A → B" not in t)


def _no_unknown_cells(at) -> None:
    for table in at.dataframe:
        df = table.value
        assert not df.isna().any().any(), list(df.columns)
        cells = " ".join(map(str, df.astype(str).to_numpy().ravel().tolist()))
        assert not RAW.findall(cells), (RAW.findall(cells)[:5], list(df.columns))


def test_compare_shows_where_the_time_went(home: Path, runs: dict) -> None:
    a, b = runs["ids"]["slow"], runs["ids"]["compute"]
    at = open_page("compare", a=str(a), b=str(b))
    no_errors(at)
    assert "Where the time went" in [h.value for h in at.subheader]
    ops = _ops_table(at)
    assert ops is not None and len(ops) > 5
    assert list(ops.columns) == [
        "kind",
        "name",
        "A / step",
        "B / step",
        "change",
        "95 % interval",
        "calls A → B",
        "status",
    ]
    # its calls per step changed (3 -> 6): aten::mm's rows are by input shapes, and the
    # job's 3 added calls are of shapes the model never used
    mm = ops[ops["name"].str.startswith("aten::mm (") & (ops["status"] == "new")].iloc[0]
    assert mm["calls A → B"] == "0 → 3"
    phases = _phase_table(at)
    wait = phases[(phases["kind"] == "phase") & (phases["name"] == "data wait")].iloc[0]
    assert wait["status"] == "faster" and wait["change"].startswith("-")
    _no_unknown_cells(at)
    # the chart: the biggest changes, at most 15 bars, the intervals as error bars
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    axis = [s["layout"].get("xaxis", {}).get("title", {}).get("text") for s in specs]
    chart = specs[axis.index(CHART_AXIS)]
    bars = sum(len(t["y"]) for t in chart["data"])
    assert 0 < bars <= 15
    assert any(t["name"] == "slower" and t["error_x"]["type"] == "data" for t in chart["data"])
    # the commands differ: said once, by the page's own note, not again by the section
    assert texts(at).count("different command") == 1

    # the filters narrow the table: a name, then a status
    at.text_input(key="ops_name").input("mm").run()
    narrowed = _ops_table(at)
    assert 0 < len(narrowed) < len(ops)
    assert narrowed["name"].str.contains("mm", case=False).all()
    at.text_input(key="ops_name").input("").run()
    at.multiselect(key="ops_status").set_value(["slower"]).run()
    slower = _ops_table(at)
    assert 0 < len(slower) < len(ops) and set(slower["status"]) == {"slower"}
    at.text_input(key="ops_name").input("no such operator").run()
    assert _ops_table(at) is None and "No operator or kernel matches" in texts(at)
    no_errors(at)


def test_a_pair_without_a_trace_gets_the_phase_diff(home: Path, runs: dict) -> None:
    a, b = runs["ids"]["slow"], runs["ids"]["bare"]
    at = open_page("compare", a=str(a), b=str(b))
    no_errors(at)
    assert _ops_table(at) is None
    assert f"No trace in run {b}" in texts(at) and "step timer's phases" in texts(at)
    phases = _phase_table(at)
    assert set(phases["kind"]) == {"phase"} and "data wait" in set(phases["name"])
    _no_unknown_cells(at)


def test_filters_keep_the_order() -> None:
    ops = pd.DataFrame(
        {
            "kind": ["operator", "kernel", "operator"],
            "name": ["aten::mm", "gemm_kernel", "aten::add"],
            "status": ["slower", "new", "no measurable change"],
            "diff_ns": [9.0, 5.0, 1.0],
        }
    )
    assert list(filtered(ops, None, [], "")["name"]) == list(ops["name"])
    assert list(filtered(ops, "operator", [], "")["name"]) == ["aten::mm", "aten::add"]
    assert list(filtered(ops, None, ["new", "slower"], "")["name"]) == ["aten::mm", "gemm_kernel"]
    assert list(filtered(ops, None, [], " ADD ")["name"]) == ["aten::add"]


# -- experiments explain themselves -------------------------------------------------------------
def test_an_arm_names_what_it_changed(runs: dict) -> None:
    a, b = runs["ids"]["slow"], runs["ids"]["compute"]
    with RunStore(runs["home"]) as store:
        line = explain_arm(store, a, b)
        assert explain_arm(store, a, a) == NOTHING
        bad = explain_arm(store, a, 9999)
    assert line.startswith("data wait -") and "%" in line  # the biggest change first
    assert len(line.split(SEPARATOR)) == 3
    assert bad.startswith(f"{UNKNOWN}: ") and "9999" in bad and "\n" not in bad


def test_a_line_says_new_and_gone() -> None:
    rows = pd.DataFrame(
        {
            "kind": ["operator", "phase", "operator", "category", "operator"],
            "name": [
                "aten::_fused_adamw_",
                "data wait",
                "aten::addmm",
                "DataLoader",
                "aten::x (2, 3)",
            ],
            "a_ns": [0.0, 100.0, 50.0, 100.0, 10.0],
            "b_ns": [70.0, 16.0, 30.0, 10.0, 0.0],
            "diff_ns": [70.0, -84.0, -20.0, -90.0, -10.0],
            "status": ["new", "faster", "faster", "faster", "gone"],
        }
    )
    line = changes_line(rows.iloc[:0], rows, limit=4)
    assert (
        line == "data wait -84 %; new aten::_fused_adamw_; aten::addmm -40 %; aten::x (2, 3) gone"
    )


def _experiment(home: Path, base: int, arm: int) -> tuple[int, dict]:
    """A finished experiment on ``base`` whose "prefetch_factor" arm's trial is ``arm``
    and whose "all" arm was not applied (``experiment_result``, with real trial runs)."""
    with RunStore(home) as store:
        experiment = store.create_experiment(base, {"fixes": ["prefetch_factor"]})
        result = experiment_result(experiment, base, arm)
        result["baseline"]["runs"] = [base]
        result["candidates"][1]["runs"] = [arm]
        store.update_experiment(experiment, status="completed", ended_at=time.time(), result=result)
    return experiment, result


def test_the_optimize_table_and_page_carry_each_arms_line(home: Path, runs: dict) -> None:
    a, b = runs["ids"]["slow"], runs["ids"]["compute"]
    experiment, result = _experiment(home, a, b)
    with RunStore(home) as store:
        changes = explain_result(store, result)
    assert changes["prefetch_factor"].startswith("data wait -")
    assert changes["all"].startswith(f"{UNKNOWN}: ")  # not applied: never measured
    buf = io.StringIO()
    render(result, console(file=buf), changes=changes)
    out = buf.getvalue()
    assert "changed most vs baseline" in out and changes["prefetch_factor"] in out

    at = open_page("optimize", run=str(a), experiment=str(experiment))
    no_errors(at)
    table = next(t.value for t in at.dataframe if CHANGES in t.value.columns)
    shown = dict(zip(table["candidate"], table[CHANGES], strict=True))
    assert shown == changes


def test_a_missing_trial_is_one_line_not_a_broken_table(runs: dict) -> None:
    a = runs["ids"]["slow"]
    result = {
        "baseline": {"runs": [a]},
        "candidates": [
            {"name": "all", "status": "completed", "runs": [9999]},
            {"name": "crashed", "status": "failed", "runs": []},
        ],
    }
    with RunStore(runs["home"]) as store:
        changes = explain_result(store, result)
        # a run with no steps: nothing was compared, which is not "no change"
        empty = store.create_run(["python", "x.py"], name="empty", status="completed")
        store.finish_run(empty, "completed", exit_code=0)
        nothing = explain_arm(store, a, empty)
    assert changes == {
        "all": f"{UNKNOWN}: no trial of this arm ran its steps",
        "crashed": f"{UNKNOWN}: no trial of this arm ran its steps",
    }
    assert nothing == f"{UNKNOWN}: no timed steps on one side: no phase diff"


def test_where_the_time_went_in_chromium(runs: dict, tmp_path: Path) -> None:
    """The real dashboard in a real browser: the section, its chart and its table."""
    from browser import CHROMIUM, CHROMIUM_ARGS, LOAD_TIMEOUT_MS, require_browser, served

    require_browser()
    from playwright.sync_api import sync_playwright

    ids = runs["ids"]
    with served(runs["home"], tmp_path / "dashboard.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            page.goto(f"{url}compare?a={ids['slow']}&b={ids['compute']}")
            page.get_by_text("Where the time went").wait_for()
            chart = page.locator(".js-plotly-plot", has_text=CHART_AXIS)
            chart.wait_for()
            assert chart.count() == 1
            text = page.locator("[data-testid=stMain]").inner_text()
            assert page.locator("[data-testid=stException]").count() == 0
            # st.dataframe draws on a canvas, so the page's text names operators only in
            # the chart's axis: the extra matmuls are among the biggest changes
            assert "aten::mm" in chart.inner_text()
            assert not RAW.findall(text), RAW.findall(text)[:5]
        finally:
            browser.close()
