"""A real browser for the dashboard's end-to-end tests: Debian's Chromium through
Playwright, and `stepscope dashboard` served on a free port over a test's store.

Without Chromium or Playwright a test is skipped with the reason, except under CI=true,
where a missing browser fails: CI installs both, so a skip there would hide a break.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from dashboard_helpers import REPO, cli_env

CHROMIUM = os.environ.get("STEPSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
LOAD_TIMEOUT_MS = 90_000


def require_browser() -> None:
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
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


@contextmanager
def served(home: Path, log_path: Path, *options: str) -> Iterator[str]:
    """`stepscope dashboard [options]` on ``home``; yields its URL (on the loopback
    address, which a dashboard bound to every address answers too), then stops it with
    Ctrl-C as a user would: it must stop Streamlit and exit 0, without a traceback."""
    port = free_port()
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "dashboard"]
        + ["--port", str(port), *options],
        cwd=REPO,
        env=cli_env(home),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # not stopped by Ctrl-C: its Streamlit child too, or it lives on (one such
            # left a core busy for the rest of a session)
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
            proc.kill()
            code = proc.wait()
        log.close()
        output = log_path.read_text(errors="replace")
        assert code == 0, f"exit code {code} 30 s after Ctrl-C:\n{output}"
        assert "stepscope: dashboard on " + url in output
        assert "Traceback" not in output, output
