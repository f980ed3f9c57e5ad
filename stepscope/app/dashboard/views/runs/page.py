"""Runs: every recorded run, newest first, with its headline figures and top finding.

A shared store (`stepscope dashboard --store postgresql://...`) holds everybody's runs:
each shows who recorded it and on which host, and the user and host filters narrow the
table (default: all). Reading is open to all; the actions that run something are for
one's own runs on this host only (``app/ownership.py``).

The table redraws itself every couple of seconds while any job runs (a fragment, so
the filters and the rest of the page are not rebuilt), and stops doing so once none
does: an idle dashboard left open all day costs nothing.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from stepscope.app.dashboard import compare_pair, data, ui
from stepscope.app.dashboard.tables import fmt_one_decimal, unknown_in_words
from stepscope.app.formats import fmt_pct
from stepscope.app.ownership import this_host, this_user
from stepscope.types import Finding

home = data.store_home()
st.title("Runs")
st.caption(f"run store: `{home}`")

with ui.errors_as_one_line():
    table = data.runs_table(home)
# The table this full run read, for the fragment's first draw below (one read a run, not
# two: 10,000 runs take a second); its later draws, on their own, read it again.
fresh = [table]

if table.empty:
    st.info(
        "No runs yet. Start your training script under stepscope (no code change), "
        "and it shows up here while it runs:",
        icon=":material/rocket_launch:",
    )
    st.code(ui.HOW_TO_START, language="bash")
    st.caption(
        "Add `--profile-at 5 --profile-steps 3` to also capture a profiler trace of three "
        "steps, or ask a running job for one later with `stepscope capture RUN`."
    )
    st.stop()

f1, f2, f3, f4 = st.columns([2, 2, 2, 3])
statuses = sorted(table["status"].unique())
chosen = f1.multiselect("status", statuses, placeholder="all statuses", key="runs_status")
UNKNOWN = "(unknown)"  # runs recorded before users were recorded
users = sorted({u if isinstance(u, str) else UNKNOWN for u in table["user"]})
hosts = sorted({str(h) for h in table["host"]})
chosen_users = f2.multiselect(
    "user", users, placeholder="all users", key="runs_user", help=f"you are {this_user()}"
)
chosen_hosts = f3.multiselect(
    "host", hosts, placeholder="all hosts", key="runs_host", help=f"this is {this_host()}"
)
name_filter = f4.text_input("name or command contains", key="runs_name").strip().lower()
running_at_start = frozenset(table.loc[table["status"] == "running", "id"])


def _finding_text(f: Finding | None) -> str:
    if f is None:
        return ""
    share = f" ({fmt_pct(f.share, 0)} of step time)" if f.share is not None else ""
    return f"{f.label}: {f.title}{share}"


#: the figures' columns: one decimal, the unit in the header
FIGURES = ("median step (ms)", "samples/s", "data wait (%)")
#: thousands grouped where a figure runs to them (8,668 samples/s, not 8668.0)
FIGURE_FORMATS = {"samples/s": "localized"}


def _status(status: str, stop_reason: object) -> str:
    """The status mark, with why stepscope stopped a run ("✓ stopped: step limit")."""
    mark = ui.STATUS_MARK.get(status, status)
    why = {"max_steps": "step limit", "sweep": "sweep done"}.get(str(stop_reason or ""))
    return f"{mark}: {why}" if status == "stopped" and why else mark


def _view(t: pd.DataFrame) -> pd.DataFrame:
    """The table as shown: numbers stay numbers (sortable), units go in the column format;
    a column with an unknown figure (a run with no timed step) is text, with a dash."""
    view = pd.DataFrame(
        {
            "id": t["id"],
            "open": [f"run?run={i}" for i in t["id"]],
            "name": t["name"],
            "status": [_status(s, r) for s, r in zip(t["status"], t["stop_reason"], strict=True)],
            "steps": t["steps"],
            "median step (ms)": t["step_time_median_s"].astype(float) * 1e3,
            "samples/s": t["samples_per_s"].astype(float),
            "data wait (%)": t["data_wait_share"].astype(float) * 100,
            "top finding": [_finding_text(f) for f in t["top_finding"]],
            "user": [u if isinstance(u, str) else "" for u in t["user"]],
            "host": t["host"],
            "command": [ui.fmt_command(c) for c in t["command"]],
            "started": [datetime.fromtimestamp(s) for s in t["started_at"]],
        }
    )
    return unknown_in_words(view, dict.fromkeys(FIGURES, fmt_one_decimal))


def _filtered(t: pd.DataFrame) -> pd.DataFrame:
    if chosen:
        t = t[t["status"].isin(chosen)]
    if chosen_users:
        t = t[t["user"].map(lambda u: u if isinstance(u, str) else UNKNOWN).isin(chosen_users)]
    if chosen_hosts:
        t = t[t["host"].astype(str).isin(chosen_hosts)]
    if name_filter:
        hay = t["name"].str.lower() + " " + t["command"].map(ui.fmt_command).str.lower()
        t = t[hay.str.contains(name_filter, regex=False)]
    return t


@st.fragment(run_every=data.LIVE_REFRESH_S if running_at_start else None)
def runs_view() -> None:
    with ui.errors_as_one_line():
        t = fresh.pop() if fresh else data.runs_table(home)
    running = frozenset(t.loc[t["status"] == "running", "id"])
    if running != running_at_start:
        st.rerun(scope="app")  # a job started or ended: refresh on/off changes too
    if running:
        st.badge(
            f"{len(running)} running · live",
            icon=":material/sync:",
            color="blue",
            help=f"the table refreshes every {data.LIVE_REFRESH_S:g} s while jobs run",
        )
    shown = _filtered(t)
    st.caption(f"{len(shown)} of {len(t)} runs")
    view = _view(shown)
    event = st.dataframe(
        view,
        hide_index=True,
        on_select="rerun",
        selection_mode="multi-row",
        key="runs_table",
        column_config={
            "id": st.column_config.NumberColumn("id", format="%d", width="small"),
            "open": st.column_config.LinkColumn("open", display_text="open ›", width="small"),
            **{
                c: st.column_config.NumberColumn(format=FIGURE_FORMATS.get(c, "%.1f"))
                for c in FIGURES
                if pd.api.types.is_numeric_dtype(view[c])
            },
            "started": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss"),
            # read whole, not cut at a column's default width (issue 39)
            "top finding": st.column_config.TextColumn(width="large"),
            "command": st.column_config.TextColumn(width="large"),
        },
    )
    selected = [int(shown["id"].iloc[i]) for i in event.selection.rows] if event else []
    ids = [int(i) for i in shown["id"]]
    if not ids:
        st.info("No run matches the filters.")
        return

    # each option's label made once: a lookup in the table per option took 10 s on 10,000
    labels = {
        int(i): f"#{i} {name} ({status})"
        for i, name, status in zip(shown["id"], shown["name"], shown["status"], strict=True)
    }
    c1, c2, c3 = st.columns([3, 1, 2], vertical_alignment="bottom")
    pick = c1.selectbox(
        "run", ids, index=ids.index(selected[0]) if selected else 0, format_func=labels.get
    )
    c2.page_link(
        "views/run/page.py",
        label="Open run",
        icon=":material/open_in_new:",
        query_params={"run": str(pick)},
    )
    two = selected[:2] if len(selected) >= 2 else ids[:2]
    if len(two) == 2:
        with ui.errors_as_one_line():
            relations = data.pair_relations(home, two)
        # baseline first (an experiment's, else the older run): B's ratio is its gain
        a, b = compare_pair.ordered(two[0], two[1], relations)
        c3.page_link(
            "views/compare/page.py",
            label=f"Compare #{a} → #{b}",
            icon=":material/compare_arrows:",
            query_params={"a": str(a), "b": str(b)},
        )
    st.caption(
        "Select one row to open it, two to compare them (an experiment's baseline as A, "
        "else the older run)."
    )


runs_view()
