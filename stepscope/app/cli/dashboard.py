"""`stepscope dashboard [--host H] [--port P]`: the Streamlit app, in the foreground.

This module only starts it: the app is ``app/dashboard/``, whose entry script
(``main.py``) is run by path, so the CLI never imports Streamlit itself.

Streamlit is started as a child (``python -m streamlit run``) rather than in this
process so that its options are exactly the command line below, whatever the user's
own ``~/.streamlit/config.toml`` says about prompts and telemetry: headless (no
browser, no e-mail prompt), no usage statistics, no file watcher (the installed
package does not change under a user), and error details reduced to one line in the
browser (tracebacks go to this terminal). Command-line options outrank config files.
The store travels in $STEPSCOPE_HOME, which `stepscope --home` has already set, and a
database URL (`--store postgresql://...`, a team's shared store) in $STEPSCOPE_STORE.

Safe by default: it binds to the loopback address. Any other address is refused unless
``--allow-remote`` says so, and then a warning says who can see what; a shared
dashboard should also ask people to sign in (``--require-login``, Streamlit's OIDC).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from stepscope.store.store import default_home

ENTRY = Path(__file__).resolve().parents[1] / "dashboard" / "main.py"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: set for the dashboard's process: sign-in is required before any page shows
ENV_REQUIRE_LOGIN = "STEPSCOPE_REQUIRE_LOGIN"


def bind_refusal(host: str, allow_remote: bool) -> str | None:
    """Why the dashboard must not listen on ``host``; None when it may."""
    if host in LOOPBACK or allow_remote:
        return None
    return (
        f"refusing to listen on {host or 'all addresses'}: anyone who can reach that port "
        "would see every run and its command; pass --allow-remote to do it anyway"
    )


def redacted(url: str) -> str:
    """A database URL fit to print: its password replaced by ***."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


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


def cmd_dashboard(
    host: str,
    port: int,
    *,
    allow_remote: bool = False,
    store: str | None = None,
    require_login: bool = False,
) -> int:
    """Run the dashboard until Ctrl-C (exit 0) or until Streamlit exits (its exit code).

    ``store``: a database URL for the dashboard's process (else $STEPSCOPE_STORE, else
    the SQLite store in the home folder). SIGTERM (a service manager, a test) is passed
    on to Streamlit too: dying alone would leave it serving with nobody to stop it.
    """
    refused = bind_refusal(host, allow_remote)
    if refused is not None:  # before Streamlit starts: nothing listens, even briefly
        print(f"stepscope: {refused}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["STEPSCOPE_HOME"] = str(default_home())
    if store:
        env["STEPSCOPE_STORE"] = store
    if require_login:
        env[ENV_REQUIRE_LOGIN] = "1"
    shown_store = redacted(env["STEPSCOPE_STORE"]) if env.get("STEPSCOPE_STORE") else None
    # command-line options outrank any .streamlit/config.toml, so these hold everywhere
    proc = subprocess.Popen(streamlit_command(host, port), env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: _forward_term(proc))
    print(
        f"stepscope: dashboard on {dashboard_url(host, port)} "
        f"(store {shown_store or env['STEPSCOPE_HOME']}); Ctrl-C to stop",
        flush=True,
    )
    if host not in LOOPBACK:
        print(
            f"stepscope: warning: listening on {host}: anyone who can reach this port sees "
            "the runs" + ("" if require_login else " (add --require-login to make them sign in)"),
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
