"""`stepscope dashboard`, and who may reach a dashboard and act there: the options
`dashboard` and `demo` share.

Declared once for both commands, so the demo's dashboard is exactly as safe as the
plain one (``dashboard.access_refusal`` judges them before Streamlit starts).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.app.cli.dashboard import Access


def register(sub: Any) -> None:
    dash = sub.add_parser("dashboard", help="open the dashboard in the browser (Streamlit)")
    dash.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    dash.add_argument(
        "--store",
        dest="dashboard_store",
        metavar="URL",
        help="the run store's database, e.g. postgresql://user@host/db (a team's shared store)",
    )
    add_access_options(dash)
    dash.set_defaults(func=run_dashboard)


def run_dashboard(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.dashboard import cmd_dashboard  # local: see verbs/__init__.py

    return cmd_dashboard(access_of(args), args.port, store=args.dashboard_store)


def add_access_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --host to be other than the loopback address (everyone who can reach "
        "the port sees the runs; actions stay off unless --allow-actions)",
    )
    parser.add_argument(
        "--require-login",
        action="store_true",
        help="ask people to sign in first (Streamlit's OIDC: [auth] in .streamlit/secrets.toml); "
        "needs --allow-users",
    )
    parser.add_argument(
        "--allow-users",
        metavar="LIST",
        help="who may sign in: comma-separated e-mails and @domains, or '*' for every "
        "account the sign-in provider accepts",
    )
    parser.add_argument(
        "--allow-actions",
        action="store_true",
        help="on a dashboard others can reach, allow actions (apply and compare, cancel, "
        "capture, attach) for signed-in allowed users; needs --require-login",
    )


def access_of(args: argparse.Namespace) -> Access:
    from stepscope.app.cli.dashboard import Access  # local: see verbs/__init__.py

    return Access(
        host=args.host,
        allow_remote=args.allow_remote,
        require_login=args.require_login,
        allow_users=args.allow_users,
        allow_actions=args.allow_actions,
    )


__all__ = ["access_of", "add_access_options", "register"]
