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
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from stepscope.store.store import default_home
from stepscope.store.url import redacted

ENTRY = Path(__file__).resolve().parents[1] / "dashboard" / "main.py"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: set for the dashboard's process: sign-in is required before any page shows
ENV_REQUIRE_LOGIN = "STEPSCOPE_REQUIRE_LOGIN"
#: set for the dashboard's process: who may sign in (comma-separated e-mails, @domains, *)
ENV_ALLOW_USERS = "STEPSCOPE_ALLOW_USERS"
#: set for the dashboard's process: actions stay on although it listens beyond loopback
ENV_ALLOW_ACTIONS = "STEPSCOPE_ALLOW_ACTIONS"


@dataclass(frozen=True)
class Access:
    """Who may reach the dashboard and what they may do there (``--allow-remote``,
    ``--require-login``, ``--allow-users``, ``--allow-actions``)."""

    host: str = "127.0.0.1"
    allow_remote: bool = False
    require_login: bool = False
    allow_users: str | None = None
    allow_actions: bool = False

    def env(self) -> dict[str, str]:
        """The variables that tell the dashboard's process these settings."""
        out = {}
        if self.require_login:
            out[ENV_REQUIRE_LOGIN] = "1"
            out[ENV_ALLOW_USERS] = ",".join(allowed_users(self.allow_users or ""))
        if self.allow_actions:
            out[ENV_ALLOW_ACTIONS] = "1"
        return out


def bind_refusal(host: str, allow_remote: bool) -> str | None:
    """Why the dashboard must not listen on ``host``; None when it may."""
    if host in LOOPBACK or allow_remote:
        return None
    return (
        f"refusing to listen on {host or 'all addresses'}: anyone who can reach that port "
        "would see every run and its command; pass --allow-remote to do it anyway"
    )


def access_refusal(access: Access) -> str | None:
    """Why the dashboard must not start with these settings; None when it may.

    Sign-in says who a visitor is, never whether they may come in: ``--require-login``
    needs ``--allow-users`` (``*`` says every account the provider signs in, on purpose).
    Actions on a dashboard others can reach need both: then whoever clicks is known.
    """
    refused = bind_refusal(access.host, access.allow_remote)
    if refused is not None:
        return refused
    if access.allow_users is not None and not access.require_login:
        return "--allow-users needs --require-login: without sign-in nobody says who they are"
    if access.require_login:
        if not access.allow_users:
            return (
                "--require-login needs --allow-users (e-mails, @domain, or '*' for every "
                "account the sign-in provider accepts): sign-in alone lets anyone in"
            )
        try:
            allowed_users(access.allow_users)
        except ValueError as exc:
            return f"--allow-users: {exc}"
    if access.allow_actions and not access.require_login:
        return (
            "--allow-actions needs --require-login and --allow-users: actions start and stop "
            "processes as you, so whoever clicks must have signed in"
        )
    return None


def allowed_users(text: str) -> list[str]:
    """``--allow-users``'s entries, lower-cased: ``name@domain``, ``@domain`` or ``*``.
    Raises ValueError naming the first entry that is none of these."""
    entries = [e.strip().lower() for e in text.split(",") if e.strip()]
    if not entries:
        raise ValueError("no e-mail, @domain or '*' given")
    for entry in entries:
        if entry == "*":
            continue
        local, at, domain = entry.rpartition("@")
        if not at or "." not in domain or " " in entry or "@" in local:
            raise ValueError(f"{entry!r} is not an e-mail, an @domain or '*'")
    return entries


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


def cmd_dashboard(access: Access, port: int, *, store: str | None = None) -> int:
    """Run the dashboard until Ctrl-C (exit 0) or until Streamlit exits (its exit code).

    ``store``: a database URL for the dashboard's process (else $STEPSCOPE_STORE, else
    the SQLite store in the home folder). SIGTERM (a service manager, a test) is passed
    on to Streamlit too: dying alone would leave it serving with nobody to stop it.
    """
    host, require_login = access.host, access.require_login
    refused = access_refusal(access)
    if refused is not None:  # before Streamlit starts: nothing listens, even briefly
        print(f"stepscope: {refused}", file=sys.stderr)
        return 2
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (ENV_REQUIRE_LOGIN, ENV_ALLOW_USERS, ENV_ALLOW_ACTIONS)
    }
    env["STEPSCOPE_HOME"] = str(default_home())
    if store:
        env["STEPSCOPE_STORE"] = store
    env.update(access.env())
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
            "the runs"
            + (
                f" once signed in as one of {access.allow_users}"
                if require_login
                else " (add --require-login --allow-users to make them sign in)"
            )
            + ("; actions are on" if access.allow_actions else "; actions are off"),
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
