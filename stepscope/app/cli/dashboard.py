"""`stepscope dashboard [--host H] [--port P]`: the Streamlit app, in the foreground.

This module only starts it: the app is ``app/dashboard/``, whose entry script
(``main.py``) is run by path, so the CLI never imports Streamlit itself.

Streamlit is started as a child (``python -m streamlit run``) rather than in this
process so that its options are exactly the command line below, whatever the user's
own ``~/.streamlit/config.toml`` says about prompts and telemetry: headless (no
browser, no e-mail prompt), no usage statistics, no file watcher (the installed
package does not change under a user), and error details reduced to one line in the
browser (tracebacks go to this terminal). Command-line options outrank config files.
The store travels in $STEPSCOPE_HOME, which `stepscope --home` has already set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from stepscope.store.store import default_home

ENTRY = Path(__file__).resolve().parents[1] / "dashboard" / "main.py"


def streamlit_command(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ENTRY),
        "--server.headless",
        "true",
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.showErrorDetails",
        "none",
        "--client.toolbarMode",
        "viewer",
    ]


def dashboard_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}/"


def cmd_dashboard(host: str, port: int) -> int:
    """Run the dashboard until Ctrl-C (exit 0) or until Streamlit exits (its exit code).

    SIGTERM (a service manager, a test) is passed on to Streamlit too: dying alone
    would leave it serving with nobody to stop it.
    """
    env = dict(os.environ)
    env["STEPSCOPE_HOME"] = str(default_home())
    # command-line options outrank any .streamlit/config.toml, so these hold everywhere
    proc = subprocess.Popen(streamlit_command(host, port), env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: _forward_term(proc))
    print(
        f"stepscope: dashboard on {dashboard_url(host, port)} (store {env['STEPSCOPE_HOME']}); "
        "Ctrl-C to stop",
        flush=True,
    )
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"stepscope: listening on {host}: anyone who can reach this port sees the runs",
            file=sys.stderr,
        )
    try:
        code = proc.wait()
        return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code
    except KeyboardInterrupt:
        # The terminal sent SIGINT to the whole process group, Streamlit included; give
        # it a moment to close its sessions, then make sure it is gone.
        try:
            _stop(proc, signal.SIGINT)
        except KeyboardInterrupt:
            proc.kill()
            return 130
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _forward_term(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)


def _stop(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
