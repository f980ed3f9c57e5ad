"""Optional sign-in for a shared dashboard, with Streamlit's own OIDC support (`st.login`).

`stepscope dashboard --require-login --allow-users LIST` sets ``STEPSCOPE_REQUIRE_LOGIN``
and ``STEPSCOPE_ALLOW_USERS``; then no page shows until the visitor has signed in with
the provider configured in the ``[auth]`` section of ``.streamlit/secrets.toml`` (see the
README) as an account on the list. Signing in says who is looking, the list whether they
may come in: a provider such as Google signs in any of its accounts. What may be
executed stays the dashboard's own user's signed runs on its own host
(``app/ownership.py``), and on a dashboard others can reach only with
``--allow-actions`` (``access.py``). Without the variable the dashboard is as
before. With it but without a usable ``[auth]`` section (or without Authlib, which
`st.login` needs), the dashboard shows one line saying so and nothing else: it fails
closed, never open.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import streamlit as st

from stepscope.app.cli.dashboard import ENV_ALLOW_USERS, ENV_REQUIRE_LOGIN


def required() -> bool:
    return os.environ.get(ENV_REQUIRE_LOGIN) == "1"


def setup_problem() -> str | None:
    """Why sign-in cannot work here, or None."""
    if importlib.util.find_spec("authlib") is None:
        return "st.login needs Authlib (pip install 'Authlib>=1.3.2')"
    try:
        auth = st.secrets.get("auth")
    except Exception:  # no secrets.toml at all, or one that does not parse
        auth = None
    if not auth:
        return "no [auth] section in .streamlit/secrets.toml"
    missing = [k for k in ("redirect_uri", "cookie_secret") if k not in auth]
    if missing:
        return f"[auth] in .streamlit/secrets.toml lacks {', '.join(missing)}"
    return None


def gate() -> None:
    """Stop the script here until the visitor has signed in (when sign-in is required)."""
    if not required():
        return
    problem = setup_problem()
    if problem is not None:
        st.error(
            f"This dashboard requires sign-in, which is not set up: {problem}.",
            icon=":material/lock:",
        )
        st.stop()
    if not st.user.is_logged_in:
        st.title("stepscope")
        st.info("This dashboard shows a team's runs: sign in to see them.", icon=":material/lock:")
        st.button("Sign in", key="sign_in", icon=":material/login:", on_click=st.login)
        st.stop()
    email = st.user.get("email")
    who = email or st.user.get("name") or "signed in"
    if not allowed(email, st.user.get("email_verified"), allow_list()):
        st.title("stepscope")
        st.error(
            f"Signed in as {who}, who is not among this dashboard's users (--allow-users).",
            icon=":material/block:",
        )
        st.button("Sign out", key="sign_out", icon=":material/logout:", on_click=st.logout)
        st.stop()
    st.sidebar.caption(f"signed in: {who}")
    st.sidebar.button("Sign out", key="sign_out", on_click=st.logout)


def allow_list() -> list[str]:
    """``--allow-users``' entries as the dashboard's process was given them (none: nobody)."""
    return [e.strip().lower() for e in os.environ.get(ENV_ALLOW_USERS, "").split(",") if e.strip()]


def allowed(email: Any, verified: Any, allow: list[str]) -> bool:
    """Whether an account may come in: ``*`` lets every signed-in account in; otherwise
    its e-mail, verified by the provider where the provider says, must be listed, or its
    domain as ``@domain``."""
    if "*" in allow:
        return True
    if not isinstance(email, str) or "@" not in email or verified is False:
        return False
    email = email.strip().lower()
    return email in allow or "@" + email.rpartition("@")[2] in allow
