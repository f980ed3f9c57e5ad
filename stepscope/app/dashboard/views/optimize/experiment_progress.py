"""An experiment while it runs, and one that ended badly (the Optimize page).

A progress bar that polls the store (the experiment is a process of its own, so the
page can be closed and reopened), a Cancel button, and for a failed or cancelled
experiment its error, the failed trial and the trial runs recorded.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.access import actions_refusal
from stepscope.app.design_text import PHASES
from stepscope.optim_runner.background import cancel_experiment


def first_line(text: Any) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else ""


# -- running ---------------------------------------------------------------------------------
def progress_bar(progress: dict[str, Any]) -> None:
    """Done/total trial runs and what runs now, from the experiment's progress record."""
    done, total = int(progress.get("done") or 0), progress.get("total")
    if not total:
        st.progress(0.0, text="Starting the experiment…")
        return
    text = f"{done} of {total} trial runs"
    arm = progress.get("arm")
    if arm:
        fixes = ", ".join(progress.get("fixes") or []) or "no fixes"
        now = "now" if progress.get("event") == "trial_start" else "last"
        text += (
            f" · {now}: {arm} ({fixes}), trial {int(progress.get('trial') or 0) + 1} "
            f"of {progress.get('trials', '?')}"
        )
        if progress.get("phase") in PHASES:
            text += f" · {PHASES[progress['phase']]}"
    st.progress(min(1.0, done / int(total)), text=text)
    if progress.get("event") == "trial_end" and progress.get("status") == "failed":
        st.caption(
            f":material/warning: {arm} failed in run {progress.get('run_id')}: "
            f"{first_line(progress.get('error'))}; the other arms go on without it."
        )
    elif progress.get("event") == "decision" and progress.get("note"):
        st.caption(f":material/alt_route: {progress['note']}")  # arms stopped, or the end
    elif progress.get("event") == "trial_end" and progress.get("status") == "repeated":
        st.caption(f":material/replay: {arm}: {progress.get('note')}")
    elif progress.get("event") == "trial_end" and progress.get("status") == "not applied":
        st.caption(
            f":material/block: {arm} ran in run {progress.get('run_id')}, but "
            f"{first_line(progress.get('error'))}: it is not measured; the other arms go on."
        )


@st.fragment(run_every=data.LIVE_REFRESH_S)
def live_progress(home: str, experiment_id: int) -> None:
    """Redrawn every couple of seconds; the whole page once the experiment has ended."""
    with ui.errors_as_one_line():
        row = data.experiment_row(home, experiment_id)
    if row is None or row["status"] != "running":
        st.rerun(scope="app")
    progress_bar(row.get("progress") or {})


def cancel_button(home: str, experiment_id: int) -> None:
    """SIGTERM to the experiment: its running trial is ended, then it records the stop."""
    asked = st.session_state.get(f"cancel_asked_{experiment_id}", False)
    off = actions_refusal()
    if st.button(
        "Cancel",
        key="cancel",
        icon=":material/cancel:",
        disabled=asked or off is not None,
        help=off
        or ("stopping: waiting for the running trial to end" if asked else "stop the experiment"),
    ):
        with ui.errors_as_one_line(), data.open_store(home) as store:
            sent = cancel_experiment(store, experiment_id)
        st.session_state[f"cancel_asked_{experiment_id}"] = sent
        st.rerun()  # sent or not (it had just ended), the page shows what is true now
    if asked:
        st.info(
            "Stopping: the running trial is ended first, then the experiment records what it has.",
            icon=":material/hourglass_bottom:",
        )


def running_view(home: str, row: dict[str, Any]) -> None:
    live_progress(home, int(row["id"]))
    cancel_button(home, int(row["id"]))
    st.caption(
        "The experiment runs in a process of its own: this page can be closed and "
        "reopened (the URL names the experiment)."
    )


# -- ended badly -------------------------------------------------------------------------------
def failed_view(row: dict[str, Any]) -> None:
    error = first_line(row.get("error")) or "no error recorded"
    progress = row.get("progress") or {}
    done, total = progress.get("done") or 0, progress.get("total") or "?"
    if error == "interrupted":
        st.warning(
            f"Experiment {row['id']} was cancelled after {done} of {total} trial runs: "
            "nothing was measured to the end.",
            icon=":material/cancel:",
        )
    else:
        st.error(f"Experiment {row['id']} failed: {error}", icon=":material/error:")
    failed_run = progress.get("run_id") if progress.get("status") == "failed" else None
    if failed_run:
        st.page_link(
            "views/run/page.py",
            label=f"Open the failed trial, run {failed_run} (its error and log)",
            icon=":material/open_in_new:",
            query_params={"run": str(failed_run)},
        )
    runs = (row.get("result") or {}).get("runs") or progress.get("runs") or {}
    recorded = [f"{arm} {', '.join(f'#{r}' for r in ids)}" for arm, ids in runs.items() if ids]
    if recorded:
        st.caption("Trial runs recorded: " + " · ".join(recorded))
