"""Optional sign-in for a shared dashboard, with Streamlit's own OIDC support (`st.login`).

`stepscope dashboard --require-login` sets ``STEPSCOPE_REQUIRE_LOGIN``; then no page
shows until the visitor has signed in with the provider configured in the ``[auth]``
section of ``.streamlit/secrets.toml`` (see the README). Signing in says who is looking;
it changes nothing about what may be executed: that stays the dashboard's own user's
runs on its own host (``app/ownership.py``). Without the variable the dashboard is as
before. With it but without a usable ``[auth]`` section (or without Authlib, which
`st.login` needs), the dashboard shows one line saying so and nothing else: it fails
closed, never open.
"""

from __future__ import annotations

import importlib.util
import os

import streamlit as st

from stepscope.app.cli.dashboard import ENV_REQUIRE_LOGIN


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
    who = st.user.get("email") or st.user.get("name") or "signed in"
    st.sidebar.caption(f"signed in: {who}")
    st.sidebar.button("Sign out", key="sign_out", on_click=st.logout)
