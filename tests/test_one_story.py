"""Every page tells one story (issue 27), on a store a user would have: a profiled training
run, an experiment on it, an inference run and a generation run.

Checked on every page, through AppTest (every element, every table cell) and in headless
Chromium (the text a user reads): no "None", "nan" or Python repr; data-wait figures
from two sources each say where they come from; Compare opens with the baseline as A;
"Compare with..." offers a run of the same command first; and no advice the page's own
figures contradict (no Tensor Core citation on a CPU run, no optimizer fix predicted
above the optimizer phase's Amdahl bound).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, LOAD_TIMEOUT_MS, require_browser, served
from dashboard_helpers import no_errors, open_page, record, stepscope, texts
from recordings import copy_of, shared_home
from streamlit.testing.v1 import AppTest

from stepscope.store import RunStore

pytestmark = pytest.mark.slow

#: a word the page must never show: Python's None/NaN/True/False reprs, pandas' <NA>
RAW = re.compile(r"\b(None|nan|NaN|NaT)\b|<NA>")


def _make(home: Path) -> None:
    record(
        home,
        "input-bound",
        "input_bound.py",
        *("--steps", "24"),
        opts=("--max-steps", "22", "--profile-at", "5", "--profile-steps", "3"),
    )
    stepscope(
        home,
        *("optimize", "input-bound", "--fixes", "dataloader_workers,prefetch_factor"),
        *("--steps", "14", "--trials", "2"),
    )
    stepscope(home, "run", "--name", "infer", "--", sys.executable, "tests/jobs/infer.py")
    stepscope(
        home,
        *("run", "--name", "generate", "--", sys.executable, "tests/jobs/generate_hf.py"),
        *("--requests", "3", "--new", "6"),
    )
    # a public script's shape (pytorch/examples imagenet), with the default capture: its
    # optimizer step is under 1 % of the step, which bounds an optimizer fix
    stepscope(
        home,
        *("run", "--name", "imagenet", "--", sys.executable, "examples/corpus/imagenet_style.py"),
        *("-j", "0", "--epochs", "1", "--iters-per-epoch", "12", "-p", "4"),
    )
    # a second run of the training command: what "Compare with..." should offer first
    record(home, "input-bound again", "input_bound.py", "--steps", "14", opts=("--max-steps", "12"))


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = copy_of(shared_home(tmp_path_factory, "one_story", _make), tmp_path_factory, "story")
    with RunStore(home) as store:
        runs = store.runs()
        names = ("input-bound", "infer", "generate", "imagenet")
        ids = {name: int(store.resolve_run(name)) for name in names}
        ids["again"] = int(store.resolve_run("input-bound again"))
        experiments = store.experiments(ids["input-bound"])
    ids["experiment"] = max(int(e["id"]) for e in experiments)
    trials = runs[runs["parent_run_id"] == ids["input-bound"]]
    return {"home": home, "ids": ids, "trials": [int(t) for t in trials["id"]]}


@pytest.fixture
def home(story: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    monkeypatch.setenv("STEPSCOPE_HOME", str(story["home"]))
    return story["home"]


def _pages(story: dict[str, Any]) -> Iterator[tuple[str, dict[str, str]]]:
    ids = story["ids"]
    yield "runs", {}
    for name in ("input-bound", "infer", "generate", "imagenet", "again"):
        yield "run", {"run": str(ids[name])}
    yield "run", {"run": str(story["trials"][0])}
    yield "compare", {}
    yield "compare", {"a": str(ids["input-bound"]), "b": str(ids["again"])}
    yield "optimize", {"run": str(ids["input-bound"]), "experiment": str(ids["experiment"])}
    yield "optimize", {"run": str(ids["infer"])}
    yield "attach", {}


def _shown(at: AppTest) -> str:
    """What the page says outside code blocks (a snippet may well hold ``None``)."""
    parts = [texts(at)]
    parts += [f"{m.label} {m.value}" for m in at.metric]
    parts += [t.value for t in at.title] + [h.value for h in at.header]
    parts += [h.value for h in at.subheader]
    return "\n".join(str(p) for p in parts)


def _tables(at: AppTest) -> list[pd.DataFrame]:
    return [df.value for df in at.dataframe]


def test_no_page_shows_none_nan_or_a_repr(home: Path, story: dict[str, Any]) -> None:
    problems = []
    for page, params in _pages(story):
        at = open_page(page, **params)
        no_errors(at)
        where = f"{page} {params}"
        raw = RAW.findall(_shown(at))
        if raw:
            problems.append(f"{where}: {raw[:5]} in the text")
        for table in _tables(at):
            # Streamlit draws an unknown cell as the word "None": a table says "—"
            blanks = table.columns[table.isna().any()].tolist()
            if blanks:
                problems.append(f"{where}: unknown cells in {blanks} of {list(table.columns)}")
            cells = " ".join(map(str, table.astype(str).to_numpy().ravel().tolist()))
            if RAW.findall(cells):
                problems.append(f"{where}: {RAW.findall(cells)[:5]} in {list(table.columns)}")
    assert not problems, "\n".join(problems)


def test_the_run_page_says_where_each_data_wait_figure_comes_from(
    home: Path, story: dict[str, Any]
) -> None:
    at = open_page("run", run=str(story["ids"]["input-bound"]))
    no_errors(at)
    shown = _shown(at)
    # the headline is the step timer's; the trace's figure is beside it, with its steps
    line = next(c.value for c in at.caption if c.value.startswith("data wait: "))
    assert "by the step timer over" in line and "the diagnosis uses it" in line
    assert re.search(r"in the profiler trace's 3 steps$", line), line
    # the steps left out add up: 3 in the trace, the ones after it paying for its export
    left_out = next(c.value for c in at.caption if " timed (" in c.value)
    assert re.search(
        r"\d+ profiled steps left out of the figures: 3 in the trace, \d+ after", left_out
    ), left_out
    assert "data wait" in shown


def test_a_generation_run_has_one_set_of_request_figures(home: Path, story: dict[str, Any]) -> None:
    """A generation run's steps are its requests: the page gives their latency and rates
    once, from the requests' timers, never a step-timer p50 beside a request p50."""
    at = open_page("run", run=str(story["ids"]["generate"]))
    no_errors(at)
    labels = [m.label for m in at.metric]
    assert "step time p50" not in labels and "steps/s" not in labels, labels
    assert labels.count("requests/s") == 1 and "request p99" in labels, labels


def test_a_cpu_run_gets_no_tensor_core_advice(home: Path, story: dict[str, Any]) -> None:
    for name in ("input-bound", "infer", "generate", "imagenet"):
        at = open_page("run", run=str(story["ids"][name]))
        no_errors(at)
        assert "Tensor Core" not in _shown(at), name
        assert "A100" not in _shown(at) and "V100" not in _shown(at), name


def test_no_fix_is_predicted_above_the_phase_it_acts_on(home: Path, story: dict[str, Any]) -> None:
    """The imagenet job's optimizer step is a sliver of its step: a fused optimizer can
    remove at most that sliver, so its prediction stays under that Amdahl bound, as the
    page's own phase figures have it."""
    at = open_page("run", run=str(story["ids"]["imagenet"]))
    no_errors(at)
    shown = _shown(at)
    phases = re.search(r"optimizer step (\d+\.\d) %", shown)
    assert phases, "the page shows the optimizer step's share"
    bound = 1 / (1 - float(phases.group(1)) / 100)
    fused = re.search(r"\*\*Fused optimizer step[^*]*\*\* · predicted up to \*\*([\d.]+)x", shown)
    if fused:  # offered where the trace reads the step as memory-bound
        assert float(fused.group(1)) <= bound + 0.005, (fused.group(0), phases.group(0))
    # every bound cut to a phase names that phase's share, as the phase caption does
    for share in re.findall(r"of the optimizer step's (\d+(?:\.\d)?) %", shown):
        assert abs(float(share) - float(phases.group(1))) <= 0.1, (share, phases.group(0))


def test_the_trial_run_says_why_it_stopped(home: Path, story: dict[str, Any]) -> None:
    at = open_page("run", run=str(story["trials"][0]))
    no_errors(at)
    assert "stopped by stepscope at its step limit (14 steps)" in texts(at)


def test_settings_are_shown_by_name(home: Path, story: dict[str, Any]) -> None:
    base = story["ids"]["input-bound"]
    with RunStore(home) as store:
        trial = next(
            t for t in story["trials"] if (store.run(t)["config"] or {}).get("arm") != "baseline"
        )
        config = store.run(trial)["config"]
    at = open_page("compare", a=str(base), b=str(trial))
    no_errors(at)
    settings = pd.concat([t for t in _tables(at) if "setting" in t.columns])
    assert not settings["setting"].str.contains(r"\[\d+\]").any(), settings["setting"].tolist()
    changed = {c["fix"]: c["change"] for c in config["applied"] if c["fix"] != "seed"}
    for fix, change in changed.items():
        row = settings[settings["setting"] == f"applied › {fix}"]
        assert row["B"].tolist() == [change], json.dumps(changed)


# -- in a real browser -----------------------------------------------------------------------
def _url(path: str, params: dict[str, str]) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return ("" if path == "runs" else path) + (f"?{query}" if query else "")


def _read(page: Any) -> str:
    """The page's text once Streamlit has finished running it, without code blocks."""
    # every page has a title: once it is drawn, the script has started (before that an
    # empty main block and no status widget would pass for a finished page)
    page.wait_for_selector("[data-testid=stMain] h1")
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=LOAD_TIMEOUT_MS
    )
    page.wait_for_timeout(1000)  # fragments and charts settle
    return page.evaluate(
        "() => { const main = document.querySelector('[data-testid=stMain]').cloneNode(true);"
        " main.querySelectorAll('[data-testid=stCode], pre').forEach(e => e.remove());"
        " return main.innerText; }"
    )


def test_every_page_in_chromium_says_one_thing(story: dict[str, Any], tmp_path: Path) -> None:
    require_browser()
    from playwright.sync_api import sync_playwright

    problems = []
    with served(story["home"], tmp_path / "dashboard.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            for path, params in _pages(story):
                page.goto(url + _url(path, params))
                training = path == "run" and params["run"] == str(story["ids"]["input-bound"])
                if training:  # its trace is analysed before the caption is drawn
                    page.get_by_text(re.compile(r"^data wait: .*by the step timer")).wait_for()
                text = _read(page)
                where = _url(path, params) or "runs"
                if page.locator("[data-testid=stException]").count():
                    problems.append(f"{where}: an exception on the page")
                if RAW.findall(text):
                    problems.append(f"{where}: {RAW.findall(text)[:5]}")
                if path == "run" and "Tensor Core" in text:
                    problems.append(f"{where}: a Tensor Core citation on a CPU run")
                if training:
                    # both data-wait figures, each with what it covers
                    assert "by the step timer over" in text and "in the profiler trace's" in text
        finally:
            browser.close()
    assert not problems, "\n".join(problems)


def _compare_link(at: AppTest) -> tuple[str, dict[str, str]]:
    link = next(p.proto for p in at.get("page_link") if p.proto.page == "compare")
    return link.label, dict(kv.split("=") for kv in link.query_string.split("&"))


def test_compare_with_a_trial_opens_its_baseline_as_a(home: Path, story: dict[str, Any]) -> None:
    base = story["ids"]["input-bound"]
    for trial in story["trials"]:
        at = open_page("run", run=str(trial))
        no_errors(at)
        label, query = _compare_link(at)
        assert query["b"] == str(trial) and query["a"] == str(base), (label, query)
        compare = open_page("compare", **query)
        no_errors(compare)
        assert "different command" not in _shown(compare)  # a trial runs its baseline's


def test_compare_with_offers_a_run_of_the_same_script_first(
    home: Path, story: dict[str, Any]
) -> None:
    """The second run of input_bound.py (other arguments) is paired with a run of that
    script, never with the generation or the imagenet job, and the page says the
    arguments differ."""
    again = story["ids"]["again"]
    at = open_page("run", run=str(again))
    no_errors(at)
    _label, query = _compare_link(at)
    with RunStore(home) as store:
        partner = store.run(int(query["a"]))
    assert query["b"] == str(again)
    assert any(str(c).endswith("input_bound.py") for c in partner["command"])
    compare = open_page("compare", **query)
    no_errors(compare)
    assert "different command" in _shown(compare)
