"""End to end in a real browser: `stepscope dashboard` served over a store of real runs,
driven by headless Chromium (Debian's, through Playwright).

The store holds one recorded run of the input-bound example. The test opens the runs
page, opens the run, checks its figures and the I/O finding (diagnosed on opening),
follows "Apply and compare…" to the Optimize page, keeps only the DataLoader-workers
fix, clicks Apply and compare and waits for the real experiment to end, checks the
measured speed-up shown against the stored result, then follows the page's link into
Compare and checks its headline against the two trial runs. A second test attaches to
a plain Python job from the Attach page and follows it to its Run page. Screenshots go to the
test's folder, and to $STEPSCOPE_SCREENSHOTS when set (that is how docs/screenshots/
is made).

Skipped with a reason when Chromium or Playwright is missing, except under CI=true,
where a missing browser fails: CI installs both, so a skip there would hide a break.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, LOAD_TIMEOUT_MS, require_browser, served
from calibrations import ROUND_CALIBRATION
from dashboard_helpers import end_process, start_plain_job
from recordings import ib_profiled

from stepscope import fixes
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.app.formats import fmt_pct, fmt_s
from stepscope.optim_runner.speedup.stats import speedup_ci, timed_step_times
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.trials.trials import candidate_arms
from stepscope.store import RunStore
from stepscope.store.calibration import save_calibration

pytestmark = pytest.mark.slow

EXPERIMENT_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def store_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One input-bound run, profiled for two steps: the run a user would start from."""
    require_browser()
    home = ib_profiled(tmp_path_factory, "e2e")
    # the CPU's peaks for the run's MFU and roofline (`stepscope calibrate` measures them:
    # test_calibrate.py); round figures, so the page's numbers do not depend on the machine
    save_calibration(home, ROUND_CALIBRATION)
    return home


@pytest.fixture
def dashboard(store_home: Path, tmp_path: Path) -> Iterator[str]:
    with served(store_home, tmp_path / "dashboard.log") as url:
        yield url


def _screenshot(page, name: str, folder: Path) -> Path:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to it."""
    height = page.evaluate(
        "() => Math.max(...[...document.querySelectorAll('[data-testid=stMain], section')]"
        ".map(e => e.scrollHeight), document.body.scrollHeight)"
    )
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 40, 6000)})
    page.wait_for_timeout(1500)  # charts re-layout to the new size
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("STEPSCOPE_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)
    page.set_viewport_size({"width": 1400, "height": 1000})
    return path


def _arm_count(fix_ids: set[str]) -> int:
    """The arms the page should plan for these fixes: the baseline and the experiment's own
    arms (a fix alone runs with the fix it needs, so it can repeat the all-fixes arm)."""
    plan = [PlannedFix(id=i, needs=fixes.get(i).needs) for i in sorted(fix_ids)]
    return 1 + len(candidate_arms(plan))


def _no_error_on_page(page) -> None:
    assert page.locator("[data-testid=stException]").count() == 0
    errors = page.locator("[data-testid=stAlertContentError]")
    assert errors.count() == 0, errors.all_inner_texts()


def _per_sample(steps: pd.DataFrame) -> np.ndarray:
    """Seconds per sample of the timed steps: what the throughput ratio is made of."""
    duration = steps["end_s"] - steps["start_s"]
    return timed_step_times(steps.assign(end_s=steps["start_s"] + duration / steps["batch_size"]))


def _wait_experiment(home: Path, experiment_id: int) -> dict:
    deadline = time.monotonic() + EXPERIMENT_TIMEOUT_S
    with RunStore(home) as store:
        while (row := store.experiment(experiment_id))["status"] == "running":
            assert time.monotonic() < deadline, f"still running: {row['progress']}"
            time.sleep(1.0)
    return row


def _x(value: float) -> str:
    return f"{value:.2f}x"


def test_runs_run_diagnose_optimize_compare_in_chromium(
    dashboard: str, store_home: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    # expect() keeps its own 5 s default whatever the page's timeout: on a loaded 2-core
    # machine a page that analyses a trace renders its metrics later than that.
    expect.set_options(timeout=LOAD_TIMEOUT_MS)

    with RunStore(store_home) as store:
        base_id = store.resolve_run("input-bound")
        base = summarize_steps(store.steps(base_id))

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, color_scheme="light")
        page.set_default_timeout(LOAD_TIMEOUT_MS)
        try:
            # runs page: the one run; open it through the picker's "Open run" link
            page.goto(dashboard)
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            expect(page.get_by_text("1 of 1 runs")).to_be_visible()
            _no_error_on_page(page)
            _screenshot(page, "runs", tmp_path)
            open_link = page.get_by_role("link", name="Open run")
            expect(open_link).to_have_attribute("href", f"run?run={base_id}")
            open_link.click()
            page.wait_for_url(re.compile(rf"/run\?run={base_id}$"))
            expect(page.get_by_role("heading", name=f"Run {base_id} · input-bound")).to_be_visible()
            values = page.get_by_test_id("stMetricValue")
            expect(values.first).to_be_visible()
            shown = values.all_inner_texts()
            assert fmt_s(base["step_time_median_s"]) in shown
            assert fmt_pct(base["data_wait_share"]) in shown
            expect(page.get_by_text("Step-time breakdown")).to_be_visible()
            # MFU against the calibration beside the headline; the roofline on log axes
            mfu = page.get_by_test_id("stMetric").filter(has_text="MFU")
            expect(mfu.get_by_test_id("stMetricValue")).to_have_text(re.compile(r"^\d+\.\d %$"))
            expect(page.get_by_text("Phases of each step")).to_be_visible()
            page.get_by_role("tab", name="Roofline").click()
            expect(page.get_by_text("Roofs: CPU", exact=False)).to_be_visible()
            page.wait_for_function(
                "() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p._fullLayout"
                " && p._fullLayout.xaxis.type === 'log' && p._fullLayout.yaxis.type === 'log'"
                " && p.data.some(t => t.name === 'compute roof'))"
            )
            _no_error_on_page(page)

            # the diagnosis, made when the ended run was first opened (no click): the I/O
            # finding, with the way to apply its fixes next to it
            expect(page.get_by_role("button", name="Diagnose")).to_have_count(0)
            apply_link = page.get_by_role("link", name="Apply and compare…")
            expect(apply_link).to_be_visible()
            with RunStore(store_home) as store:
                found = store.findings(base_id)
            io = [f for f in found if f.klass == "io"]
            assert io, found  # the job waits on its loader
            expect(page.get_by_text(io[0].title)).to_be_visible()
            expect(page.get_by_text("I/O", exact=True).first).to_be_visible()
            _no_error_on_page(page)
            _screenshot(page, "run", tmp_path)

            # optimize: keep only the DataLoader workers, 2 trials of 30 steps per arm
            apply_link.click()
            page.wait_for_url(re.compile(rf"/optimize\?run={base_id}$"))
            expect(page.get_by_role("heading", name=f"Optimize run {base_id}")).to_be_visible()
            boxes = page.get_by_test_id("stCheckbox")
            expect(boxes.first).to_be_visible()
            # the arms line comes after every checkbox: once it is there, all of them are
            # (counted earlier, a busy machine's page may not have drawn the last ones yet)
            expect(page.get_by_text(re.compile(r"^\d+ arms \("))).to_be_visible()
            toggles = ("Keep values my script set", "Allow numerics")
            checked = {
                boxes.nth(i).locator("code").inner_text()
                for i in range(boxes.count())
                if not any(t in boxes.nth(i).inner_text() for t in toggles)
                and boxes.nth(i).locator("input").is_checked()
            }
            for i in range(boxes.count()):
                box = boxes.nth(i)
                text = box.inner_text()
                if any(t in text for t in toggles):
                    # toggles, left off (the default); the consent toggle shows where the
                    # diagnosis offers a fix that changes numerics
                    expect(box.locator("input")).not_to_be_checked()
                elif (
                    "dataloader_workers" not in text
                    and box.locator("input").is_enabled()
                    and box.locator("input").is_checked()
                ):
                    # (a fix that needs the consent toggle is shown disabled, unticked; one
                    # predicted to gain nothing is shown unticked: both are left as they are)
                    box.locator("label").click()
                    expect(box.locator("input")).not_to_be_checked()
                    # the rerun this click started is over before the next click: a click
                    # that lands during a rerun can be undone by it
                    checked.discard(box.locator("code").inner_text())
                    arms = _arm_count(checked)
                    expect(page.get_by_text(re.compile(rf"^{arms} arms \("))).to_be_visible()
            expect(
                page.get_by_text("2 arms (the baseline, all checked fixes together)")
            ).to_be_visible()
            trials = page.get_by_role("spinbutton", name="trials per arm")
            trials.fill("2")
            trials.press("Enter")
            expect(page.get_by_text("× 2 trials = 4 trial runs")).to_be_visible()
            _no_error_on_page(page)
            page.get_by_role("button", name="Apply and compare").click()
            page.wait_for_url(re.compile(rf"/optimize\?run={base_id}&experiment=\d+$"))
            experiment_id = int(page.url.rsplit("=", 1)[1])
            expect(page.get_by_role("button", name="Cancel")).to_be_visible()
            row = _wait_experiment(store_home, experiment_id)
            assert row["status"] == "completed", row["error"]
            result = row["result"]
            assert [c["fixes"] for c in result["candidates"]] == [["dataloader_workers"]]
            workers = result["candidates"][0]
            # the page follows the experiment by itself (no reload): the measured speed-up
            shown = page.get_by_text(f"{_x(workers['speedup'])} (95 % CI", exact=False)
            if result["best"]["fixes"]:
                shown = page.get_by_test_id("stAlertContentSuccess").get_by_text(
                    f"{_x(result['best']['speedup'])} the throughput", exact=False
                )
            expect(shown.first).to_be_visible(timeout=30_000)
            expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
            expect(page.get_by_role("heading", name="Experiments on this run")).to_be_visible()
            expect(page.get_by_test_id("stPlotlyChart")).to_have_count(2)  # per fix, pooled
            _no_error_on_page(page)
            _screenshot(page, "optimize", tmp_path)

            # ... and it ends on Compare: a baseline trial against a workers trial
            compare_link = page.get_by_role("link", name=re.compile(r"^Compare baseline trial"))
            href = compare_link.get_attribute("href") or ""
            pair = dict(kv.split("=") for kv in href.split("?", 1)[1].split("&"))
            a, b = int(pair["a"]), int(pair["b"])
            assert a in result["baseline"]["runs"] and b in workers["runs"]
            with RunStore(store_home) as store:
                sa, sb = store.steps(a), store.steps(b)
            ci = speedup_ci(_per_sample(sa), _per_sample(sb), statistic="mean")
            compare_link.click()
            page.wait_for_url(re.compile(rf"/compare\?a={a}&b={b}$"))
            headline = page.get_by_test_id("stMetric").filter(has_text="speed-up B vs A")
            expect(headline.get_by_test_id("stMetricValue")).to_have_text(_x(ci.ratio))
            # the verdict as the delta under the ratio; its value is the machine's business
            expect(headline.get_by_test_id("stMetricDelta")).to_contain_text(ci.verdict)
            expect(page.get_by_text(f"Throughput: {ci.describe()}", exact=False)).to_be_visible()
            expect(page.get_by_text("What changed")).to_be_visible()
            _no_error_on_page(page)
            _screenshot(page, "compare", tmp_path)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            browser.close()


def test_attach_to_a_running_process_in_chromium(
    dashboard: str, store_home: Path, tmp_path: Path
) -> None:
    """Pick a plain Python job on the Attach page, record it for 3 s, follow the run
    it recorded into, and open its Run page at the stack-sample section."""
    from playwright.sync_api import expect, sync_playwright

    # expect() keeps its own 5 s default whatever the page's timeout: on a loaded 2-core
    # machine a page that analyses a trace renders its metrics later than that.
    expect.set_options(timeout=LOAD_TIMEOUT_MS)

    job = start_plain_job(tmp_path)
    try:
        time.sleep(2)  # into its training loop (imports torch first)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, color_scheme="light")
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            try:
                page.goto(dashboard + "attach")
                expect(page.get_by_role("heading", name="Attach")).to_be_visible()
                page.get_by_test_id("stSelectbox").filter(has_text="process").click()
                page.get_by_role("option", name=re.compile(rf"^{job.pid} · ")).click()
                duration = page.get_by_role("spinbutton", name="duration (s)")
                duration.fill("3")
                duration.press("Enter")
                attach = page.get_by_role("button", name=f"Attach to {job.pid} for 3 s")
                expect(attach).to_be_visible()
                _no_error_on_page(page)
                attach.click()
                page.wait_for_url(re.compile(r"/attach\?run=\d+$"))
                run_id = int(page.url.rsplit("=", 1)[1])
                # it follows the attach by itself to the end, then shows the top finding;
                # the end is the attach process's own (py-spy stops, the run is diagnosed),
                # seconds after the 3 s window on a loaded machine: expect's 5 s is too short
                done = page.get_by_text("The attach ran for the whole duration")
                expect(done).to_be_visible(timeout=LOAD_TIMEOUT_MS)
                with RunStore(store_home) as store:
                    run = store.run(run_id)
                    samples = int(store.stack_samples(run_id)["samples"].sum())
                assert run["config"]["attached_pid"] == job.pid and samples > 0
                open_run = page.get_by_role("link", name=re.compile(rf"^Open run {run_id}:"))
                expect(open_run).to_be_visible()
                _no_error_on_page(page)
                _screenshot(page, "attach", tmp_path)
                open_run.click()
                page.wait_for_url(re.compile(rf"/run\?run={run_id}$"))
                expect(
                    page.get_by_role("heading", name="Where the main thread spends its time")
                ).to_be_visible()
                expect(page.get_by_text("Top lines of the job's own code")).to_be_visible()
                _no_error_on_page(page)
                _screenshot(page, "attached-run", tmp_path)
            except Exception:
                page.screenshot(path=str(tmp_path / "failure.png"))
                raise
            finally:
                browser.close()
    finally:
        end_process(job)
