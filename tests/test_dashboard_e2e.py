"""End to end in a real browser: `stepscope dashboard` served over a store of real runs,
driven by headless Chromium (Debian's, through Playwright).

The input-bound example is recorded twice (as is, and with the fix by hand: DataLoader
workers); the test opens the runs page, opens the run, checks its figures (and, when
the diagnosis module exists, clicks Diagnose and checks the I/O finding), then opens
the comparison and checks the measured speed-up. Screenshots go to the test's folder,
and to $STEPSCOPE_SCREENSHOTS when set (that is how docs/screenshots/ is made).

Skipped with a reason when Chromium or Playwright is missing, except under CI=true,
where a missing browser fails: CI installs both, so a skip there would hide a break.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dashboard_helpers import REPO, cli_env, record

from stepscope.analyzers.step_stats import summarize_steps
from stepscope.app import ui
from stepscope.optim_runner.stats import speedup_ci, timed_step_times
from stepscope.store import RunStore

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("STEPSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
LOAD_TIMEOUT_MS = 90_000


def _require_browser() -> None:
    missing = []
    if not Path(CHROMIUM).is_file():
        missing.append(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright is not installed (pip install playwright)")
    if not missing:
        return
    reason = "; ".join(missing)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the end-to-end test cannot run: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"stepscope dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "_stcore/health", timeout=2) as resp:
                if resp.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the dashboard did not answer at {url} within {timeout} s")


@pytest.fixture(scope="module")
def store_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An input-bound run and the same job with DataLoader workers (the fix, by hand)."""
    _require_browser()
    home = tmp_path_factory.mktemp("e2e") / "home"
    # 30 steps: with fewer, the workers' run is all start-up and prefetch bursts (its
    # step times swing between 5 and 200 ms) and the interval of the ratio contains 1
    opts = ("--max-steps", "30", "--profile-at", "3", "--profile-steps", "2")
    record(home, "input-bound", "input_bound.py", "--steps", "32", opts=opts)
    record(
        home,
        "input-bound-workers",
        "input_bound.py",
        "--steps",
        "32",
        "--num-workers",
        "4",
        "--persistent-workers",
        opts=opts,
    )
    return home


@pytest.fixture
def dashboard(store_home: Path, tmp_path: Path):
    port = _free_port()
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepscope.app.cli",
            "--home",
            str(store_home),
            "dashboard",
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=cli_env(store_home),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_healthy(url, proc)
        yield url
    finally:
        # Ctrl-C, as a user would: the dashboard must stop Streamlit and exit 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
        output = (tmp_path / "dashboard.log").read_text(errors="replace")
        assert code == 0, output
        assert "stepscope: dashboard on " + url in output
        assert "Traceback" not in output, output


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


def _no_error_on_page(page) -> None:
    assert page.locator("[data-testid=stException]").count() == 0
    errors = page.locator("[data-testid=stAlertContentError]")
    assert errors.count() == 0, errors.all_inner_texts()


def test_runs_run_diagnose_compare_in_chromium(
    dashboard: str, store_home: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    with RunStore(store_home) as store:
        base_id = store.resolve_run("input-bound")
        fix_id = store.resolve_run("input-bound-workers")
        base_steps, fix_steps = store.steps(base_id), store.steps(fix_id)
    base = summarize_steps(base_steps)
    ci = speedup_ci(timed_step_times(base_steps), timed_step_times(fix_steps))
    try:
        import stepscope.analyzers.diagnosis  # noqa: F401

        has_diagnosis = True
    except ImportError:
        has_diagnosis = False

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, color_scheme="light")
        page.set_default_timeout(LOAD_TIMEOUT_MS)
        try:
            # runs page: both runs, newest first in the picker
            page.goto(dashboard)
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            expect(page.get_by_text("2 of 2 runs")).to_be_visible()
            _no_error_on_page(page)
            _screenshot(page, "runs", tmp_path)

            # open the input-bound run through the picker and the "Open run" link
            page.get_by_test_id("stSelectbox").first.click()
            page.get_by_role("option", name=re.compile(r"input-bound \(")).click()
            open_link = page.get_by_role("link", name="Open run")
            expect(open_link).to_have_attribute("href", f"run?run={base_id}")  # after the rerun
            open_link.click()
            page.wait_for_url(re.compile(rf"/run\?run={base_id}$"))
            expect(page.get_by_role("heading", name=f"Run {base_id} · input-bound")).to_be_visible()
            values = page.get_by_test_id("stMetricValue")
            expect(values.first).to_be_visible()
            shown = values.all_inner_texts()
            assert ui.fmt_s(base["step_time_median_s"]) in shown
            assert ui.fmt_pct(base["data_wait_share"]) in shown
            expect(page.get_by_text("Step-time breakdown")).to_be_visible()
            _no_error_on_page(page)

            if has_diagnosis:
                page.get_by_role("button", name="Diagnose").click()
                with RunStore(store_home) as store:
                    deadline = time.monotonic() + LOAD_TIMEOUT_MS / 1000
                    while not store.findings(base_id) and time.monotonic() < deadline:
                        time.sleep(0.5)
                    found = store.findings(base_id)
                io = [f for f in found if f["class"] == "io"]
                assert io, found  # the job waits on its loader
                expect(page.get_by_text(io[0]["title"])).to_be_visible()
                expect(page.get_by_text("I/O", exact=True).first).to_be_visible()
                _no_error_on_page(page)
            _screenshot(page, "run", tmp_path)

            # compare: from the runs page's link (the two newest runs, older as baseline)
            page.get_by_test_id("stSidebarNav").get_by_role("link", name="Runs").click()
            expect(page.get_by_text("2 of 2 runs")).to_be_visible()
            page.get_by_role("link", name=f"Compare #{base_id} → #{fix_id}").click()
            page.wait_for_url(re.compile(rf"/compare\?a={base_id}&b={fix_id}$"))
            expect(page.get_by_text(f"{ci.ratio:.2f}x", exact=True)).to_be_visible()
            expect(page.get_by_text(ci.describe(), exact=False)).to_be_visible()
            # the verdict as the delta under the ratio; its value is the machine's business
            # (4 workers usually win by 4-8x, but a neighbour's load can eat that)
            expect(page.get_by_test_id("stMetricDelta").get_by_text(ci.verdict)).to_be_visible()
            expect(page.get_by_text("added: --num-workers 4 --persistent-workers")).to_be_visible()
            _no_error_on_page(page)
            _screenshot(page, "compare", tmp_path)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            browser.close()
