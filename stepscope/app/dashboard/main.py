"""The dashboard's entry script (`stepscope dashboard` runs it with `streamlit run`).

It only routes: each page is a folder of ``views/`` (its script ``page.py`` and the
sections it is made of) and reads everything through ``data``, ``trace_data`` and
``stack_data`` beside this script (the store and the analyzers, cached). The page that
runs is wrapped so that an unexpected exception shows one line naming the page, with the traceback
in the server's log, never on the page: users keep this open next to their job and a
wall of Python frames helps no one there.
"""

from __future__ import annotations

import logging
from pathlib import Path

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

from stepscope.app.dashboard import sign_in
from stepscope.app.dashboard.page_icon import page_icon

# Not "pages/": Streamlit treats a pages/ folder beside the entry script as a v1
# multipage app and runs a page file on its own (no navigation, no layout, no error
# guard) whenever a session's first request is that page's URL.
VIEWS = Path(__file__).resolve().parent / "views"
log = logging.getLogger("stepscope.dashboard")

st.set_page_config(page_title="stepscope", page_icon=page_icon(), layout="wide")

PAGES = [
    st.Page(
        VIEWS / "runs" / "page.py",
        title="Runs",
        icon=":material/list:",
        url_path="runs",
        default=True,
    ),
    st.Page(VIEWS / "run" / "page.py", title="Run", icon=":material/monitoring:", url_path="run"),
    st.Page(
        VIEWS / "compare" / "page.py",
        title="Compare",
        icon=":material/compare_arrows:",
        url_path="compare",
    ),
    st.Page(
        VIEWS / "optimize" / "page.py",
        title="Optimize",
        icon=":material/science:",
        url_path="optimize",
    ),
    st.Page(
        VIEWS / "attach" / "page.py", title="Attach", icon=":material/link:", url_path="attach"
    ),
]

sign_in.gate()  # only with `stepscope dashboard --require-login`
page = st.navigation(PAGES)
try:
    page.run()
except ScriptControlException:  # st.stop, st.rerun, st.switch_page: control flow
    raise
except Exception as exc:  # the last line of defence; known errors are handled in the pages
    log.exception("stepscope dashboard: page %s failed", page.title)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    st.error(
        f"stepscope: the {page.title} page failed ({type(exc).__name__}"
        + (f": {first}" if first else "")
        + "); details are in the dashboard's log",
        icon=":material/error:",
    )
