"""Optimize: apply a run's recommended fixes and measure them (``?run=ID&experiment=EID``).

Before an experiment the page is a form (``optimize_setup``); the click starts the
experiment in a process of its own and puts its id in the URL, so the page can be
closed, reloaded or shared and still shows the same experiment (``experiment_view``).
With ``?experiment=`` alone the run is the experiment's baseline; a ``?run=`` that
disagrees with it is corrected, since an experiment has exactly one baseline.

A run that has experiments opens on its latest (``?run=`` alone, or the sidebar's link,
which starts on the run last looked at): what was measured is what one comes back for,
and a form that re-ticks the same fixes invites measuring them again. The form is one
click away ("New experiment", ``?new=1``).
"""

from __future__ import annotations

import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.views.optimize import experiment_progress as progress
from stepscope.app.dashboard.views.optimize import experiment_view as ev
from stepscope.app.dashboard.views.optimize import generation_sweep_view as generation
from stepscope.app.dashboard.views.optimize import inference_view as inference
from stepscope.app.dashboard.views.optimize import largest_batch_view as largest_batch
from stepscope.app.dashboard.views.optimize import optimize_history as history
from stepscope.app.dashboard.views.optimize import optimize_setup as setup
from stepscope.app.dashboard.views.run import run_actions
from stepscope.store import RunNotFound

home = data.store_home()

with ui.errors_as_one_line():
    choices = data.run_choices(home)
if choices.empty:
    st.title("Optimize")
    st.info(
        "No runs yet. Record your job first; its diagnosis then says what to try here:",
        icon=":material/rocket_launch:",
    )
    st.code(ui.HOW_TO_START, language="bash")
    st.stop()

experiment_id = ui.query_int("experiment")
form_asked = experiment_id is None and st.query_params.get("new") == "1"  # "New experiment"
row = None
if experiment_id is not None:
    with ui.errors_as_one_line():
        row = data.experiment_row(home, experiment_id)
    if row is None:
        st.title("Optimize")
        ui.fail(f"no experiment with id {experiment_id} in {home} (?experiment={experiment_id})")
    run_id = int(row["baseline_run_id"])
else:
    ref = st.query_params.get("run")
    with ui.errors_as_one_line():
        try:
            with data.open_store(home) as store:
                if ref:
                    run_id = store.resolve_run(ref)
                elif (seen := run_actions.last_run(set(choices["id"]))) is not None:
                    run_id = seen  # opened from the sidebar: the run last looked at
                else:  # the newest run that is not itself an experiment's trial
                    own = choices[choices["parent_run_id"].isna()]
                    run_id = int((own if not own.empty else choices)["id"].iloc[0])
        except RunNotFound as exc:
            st.title("Optimize")
            ui.fail(data.one_line(exc))

with ui.errors_as_one_line():
    experiments = data.run_experiments(home, run_id)
if row is None and experiments and not form_asked:
    row = experiments[0]  # a run already optimized opens on its latest experiment
    experiment_id = int(row["id"])
ui.set_query(run=run_id, experiment=experiment_id, new=1 if row is None and form_asked else None)
run_actions.remember_run(run_id)

ui.sidebar_run_picker(home, choices, run_id, experiment=None, new=None)

with ui.errors_as_one_line():
    header = data.run_header(home, run_id)
    d = data.run_data(home, run_id, data.run_marker(header))

st.title(f"Optimize run {run_id} · {header['name']}")
st.page_link(
    "views/run/page.py",
    label=f"Run {run_id}: figures and diagnosis",
    icon=":material/arrow_back:",
    query_params={"run": str(run_id)},
)
st.caption(
    "Re-runs the job's recorded command with fixes applied at start-up (no edit to the "
    "script), beside baseline trials, and measures what each fix gives."
)

busy = next((e for e in experiments if e["status"] == "running"), None)
if row is None:
    if busy is not None:
        st.info(f"Experiment {busy['id']} on this run is running.", icon=":material/sync:")
        if st.button("Follow it", key="follow", icon=":material/visibility:"):
            ui.set_query(experiment=int(busy["id"]))
            st.rerun()
    setup.show(home, header, d, busy, experiments)
    inference.start_form(home, header, d.steps, busy)  # inference runs only
    generation.start_form(home, header, d.steps, busy)  # generation runs only
    largest_batch.start_form(home, header, d.steps, busy)  # training runs with a batch size
else:
    ev.header(row)
    if row["status"] == "running":
        progress.running_view(home, row)
    elif row["status"] == "failed":
        progress.failed_view(row)
    elif inference.is_sweep(row) and (row.get("result") or {}).get("generation"):
        generation.result_view(row)
    elif inference.is_sweep(row):
        inference.result_view(row)
    else:
        ev.result_view(home, row)
    if st.button(
        "New experiment",
        key="new",
        icon=":material/add:",
        help="the set-up form: which fixes to try on this run, for how long",
    ):
        ui.set_query(experiment=None, new=1)
        st.rerun()

history.experiments_table(run_id, experiments, experiment_id)
