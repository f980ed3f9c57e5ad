"""The Optimize page before an experiment: which fixes to try, for how long, and the
button that starts it (the run's past experiments: ``optimize_history``).

Decisions, and why:

* **The fixes come from the run's saved findings** (``plan.recommended``), never from a
  diagnosis run behind the user's back: an undiagnosed run gets the Diagnose button,
  so what the page offers is what the Run page shows.
* **Checked by default**, except fixes that need consent (``larger_batch`` changes what
  an optimizer step sees): those stay unchecked and locked until the user allows
  numerics to change, as ``stepscope optimize --allow-numerics`` does. Fixes that change
  numerics without needing consent (bf16, TF32) are marked: the quality guard checks
  the loss, but the user should know before the click, not after. Nor are fixes that
  an earlier experiment on this run measured slower or without a measurable change
  (``optimize_history``): the form says what they measured.
* **Parameters are shown before the click**, from the same ``plan.choose_fixes`` the
  experiment will call, with their reason: "4 workers" is a claim to be checked.
* **One experiment per run at a time**: two would share the machine and measure each
  other's load; the button says so instead of doing nothing.
* **Fixes override what the script set, unless asked not to.** A script passing
  ``num_workers=args.workers`` with 0 is exactly the job the workers fix is for, so by
  default the fix replaces the script's value (each trial's log says what it replaced);
  the toggle keeps the script's explicit values, as ``stepscope optimize --keep-explicit``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.access import rerun_action_refusal
from stepscope.app.dashboard.tables import DASH, in_words
from stepscope.app.dashboard.views.optimize import optimize_history as history
from stepscope.app.dashboard.views.optimize.inference_view import guard_limits
from stepscope.app.dashboard.views.optimize.option_inputs import option_input
from stepscope.app.dashboard.views.run.findings_view import findings_to_apply
from stepscope.app.formats import fmt_ratio, missing
from stepscope.optim_runner.background import start_experiment
from stepscope.optim_runner.experiment.options import ExperimentOptions
from stepscope.optim_runner.trials import plan as planning
from stepscope.types import FixAdvice


# -- what can be tried -------------------------------------------------------------------
@st.cache_data(max_entries=64, show_spinner=False)
def recommended(home: str, run_id: int, marker: str) -> list[FixAdvice]:
    """The run's recommended fixes, one per id, best predicted bound first, those
    predicted at 1.00x or less last."""
    with data.open_store(home) as store:
        recs = planning.recommended(store, run_id)
    return sorted(recs, key=FixAdvice.order_key)


@st.cache_data(max_entries=256, show_spinner=False)
def planned(
    home: str, run_id: int, ids: tuple[str, ...], marker: str
) -> tuple[list[dict[str, Any]], str | None]:
    """(the fixes as the experiment will plan them, why they cannot be) for ``ids``."""
    if not ids:
        return [], None
    with data.open_store(home) as store:
        try:
            chosen = planning.choose_fixes(store, run_id, list(ids), allow_numerics=True)
        except ValueError as exc:
            return [], data.one_line(exc)
    return [f.to_json() for f in chosen], None


# -- the states before the form ----------------------------------------------------------
def can_optimize(home: str, run: dict[str, Any], summary: dict[str, Any]) -> bool:
    """Explain why this run cannot be a baseline (and say False), or warn and say True."""
    run_id, status = int(run["id"]), run["status"]
    if status == "running":
        st.info(
            f"Run {run_id} is still running. Optimize it once it has ended: trials run "
            "beside it would measure its load, not the fixes.",
            icon=":material/hourglass_top:",
        )
        return False
    if not run.get("command"):
        st.info(
            f"Run {run_id} has no recorded command (it was not started with `stepscope run`), "
            "so there is nothing to re-run with fixes.",
            icon=":material/info:",
        )
        return False
    if status in ("failed", "killed"):
        line = ui.failure_line(run)
        if summary["timed_steps"] < 2:
            st.error(f"Run {run_id} {status}: {line}", icon=":material/error:")
            st.info(
                "It ended before recording two timed steps, so there is no speed to improve "
                "on yet. Fix the job, record it again with `stepscope run`, and optimize "
                "that run.",
                icon=":material/lightbulb:",
            )
            return False
        st.warning(
            f"Run {run_id} {status} after {summary['steps']} steps ({line}). Trials stop "
            "after the number of steps set below, so they may end before the failure; if "
            "the baseline trial fails, the experiment stops with its error.",
            icon=":material/warning:",
        )
    return True


# -- the form ----------------------------------------------------------------------------
def fix_picker(
    run_id: int, auto: list[FixAdvice], measured: dict[str, history.Measured] | None = None
) -> tuple[list[str], bool]:
    """Checkboxes for the auto fixes; returns (checked ids, numerics allowed).

    ``measured``: each fix's newest measurement on this run; one measured slower or
    without a measurable change starts unticked, with the measurement beside it; so does
    one predicted at 1.00x or less (nothing to win, a trial's time to lose).
    """
    measured = measured or {}
    allow = False
    if any(f.needs_consent for f in auto):
        allow = option_input("allow_numerics", f"allow_numerics_{run_id}")
    checked = []
    for fix in auto:
        key = f"fix_{run_id}_{fix.id}"
        locked = fix.needs_consent and not allow
        if locked:
            st.session_state[key] = False
        else:
            before = measured.get(fix.id)
            known = before is not None and before.not_worth_ticking
            st.session_state.setdefault(
                key, not fix.needs_consent and not known and not fix.gains_nothing
            )
        marks = ""
        if fix.needs_consent:
            marks += " :red-badge[needs consent]"
        if fix.changes_numerics:
            marks += " :orange-badge[changes numerics]"
        if st.checkbox(f"**{fix.title}** `{fix.id}`{marks}", key=key, disabled=locked):
            checked.append(fix.id)
        if fix.id in measured:
            st.caption(f"`{fix.id}`: {measured[fix.id].note()}")
    return checked, allow


def fix_notes(auto: list[FixAdvice], plans: dict[str, dict[str, Any]]) -> None:
    """Per fix: the predicted bound, the parameters and why, the numerics caveat."""
    rows = []
    for fix in auto:
        plan = plans.get(fix.id, {})
        params = ", ".join(f"{k}={v}" for k, v in (plan.get("params") or {}).items())
        if fix.needs_consent:
            note = "changes what the model computes: tried only when numerics may change"
        elif fix.changes_numerics:
            note = "changes numerics: the quality guard compares the loss step by step"
        else:
            note = "same numerics"
        rows.append(
            {
                "fix": fix.id,
                "predicted (bound)": fix.predicted_speedup,
                "basis": fix.basis or "",
                "parameters": params or ("—" if fix.id in plans else "(when checked)"),
                "why these": plan.get("why_params") or "",
                "numerics": note,
                "finding": fix.finding or "",
            }
        )
    st.dataframe(
        # no bound (no figure fits this job): a dash, as the basis says why
        in_words(pd.DataFrame(rows), {"predicted (bound)": _bound}),
        hide_index=True,
        key="fix_notes",
        column_config={"why these": st.column_config.TextColumn(width="large")},
    )


def _bound(x: Any) -> str:
    return DASH if missing(x) else f"≤ {fmt_ratio(float(x))}"


def keep_explicit_toggle(run_id: int) -> bool:
    """Off by default: a fix the user asked to try replaces the script's own value."""
    return bool(option_input("keep_explicit", f"keep_explicit_{run_id}"))


def settings() -> tuple[int, int]:
    """(trials per arm, steps per trial)."""
    c1, c2, _ = st.columns([1, 1, 2])
    trials = option_input("trials", "opt_trials", c1)
    steps = option_input("steps", "opt_steps", c2)
    return int(trials), int(steps)


def apply_button(
    home: str,
    run_id: int,
    selected: list[str],
    allow: bool,
    trials: int,
    steps: int,
    busy: dict[str, Any] | None,
    keep_explicit: bool = False,
    refused: str | None = None,
    limits: dict[str, float] | None = None,  # the output guard's (inference runs)
) -> None:
    """Start the experiment (unless ``refused``: why ``access`` says this dashboard must
    not re-run the run's command); on success the URL names it, so the page can be left."""
    blocked = None
    if refused is not None:
        blocked = refused
    elif busy is not None:
        blocked = f"experiment {busy['id']} on this run is still running"
    elif not selected:
        blocked = "check at least one fix"
    clicked = st.button(
        "Apply and compare",
        key="apply",
        type="primary",
        icon=":material/play_arrow:",
        disabled=blocked is not None,
        help=blocked or "re-runs the job with the checked fixes, in the background",
    )
    if blocked is not None:
        st.caption(f"Not available: {blocked}.")
        return
    if not clicked:
        return
    try:
        options = ExperimentOptions(
            fixes=tuple(selected),
            steps=steps,
            trials=trials,
            allow_numerics=allow,
            keep_explicit=keep_explicit,
            **(limits or {}),
        )  # the fields options.form_fields() names; the others keep their defaults
        experiment_id = start_experiment(home, run_id, options)
    except ValueError as exc:
        st.error(f"Not started: {data.one_line(exc)}", icon=":material/error:")
        return
    except data.user_errors() as exc:
        ui.fail(f"Not started: {data.one_line(exc)}")
    ui.set_query(run=run_id, experiment=experiment_id, new=None)
    st.rerun()


def show(
    home: str,
    run: dict[str, Any],
    d: data.RunData,
    busy: dict[str, Any] | None,
    experiments: list[dict[str, Any]] | None = None,
) -> None:
    """Everything before the click: the states that rule it out, else the form.

    ``experiments``: the run's own, newest first; what they measured sets which fixes
    start ticked (``optimize_history``).
    """
    run_id = int(run["id"])
    if not can_optimize(home, run, d.summary):
        return
    found = findings_to_apply(home, run_id)
    if not found:
        return
    marker = data.findings_marker(found)
    with ui.errors_as_one_line():
        recs = recommended(home, run_id, marker)
    auto = [r for r in recs if r.auto]
    advice = [r for r in recs if not r.auto]
    if not auto:
        st.info(
            "None of the fixes recommended for this run can be applied without changing its "
            "code, so there is nothing to apply automatically. The Run page shows each with "
            "its snippet.",
            icon=":material/info:",
        )
        _advice(advice, run_id)
        return

    st.subheader("Fixes to try")
    st.caption(
        "The automatic fixes the diagnosis recommends: applied at start-up, without editing "
        "the script. Each is measured together with the others and alone."
    )
    selected, allow = fix_picker(run_id, auto, history.earlier_measurements(experiments or []))
    keep = keep_explicit_toggle(run_id)
    # planned as they will run: one fix's parameters can depend on the others checked
    plans, problem = planned(home, run_id, tuple(selected), marker)
    fix_notes(auto, {p["id"]: p for p in plans})
    if problem:
        st.warning(f"Parameters not available: {problem}", icon=":material/warning:")
    _advice(advice, run_id)

    st.subheader("How long")
    trials, steps = settings()
    chosen = [p for p in plans if p["id"] in selected]
    if chosen:
        with ui.errors_as_one_line():
            measured = history.trial_times(home, run)
        st.caption(history.estimate(run, d.steps, chosen, trials, steps, measured))
    limits = guard_limits(run, d.steps)
    apply_button(
        home, run_id, selected, allow, trials, steps, busy, keep, rerun_action_refusal(run), limits
    )


def _advice(advice: list[FixAdvice], run_id: int) -> None:
    if not advice:
        return
    with st.expander(f"Also recommended, needing a code change ({len(advice)})"):
        for fix in advice:
            st.markdown(f"- **{fix.title}** `{fix.id}`")
        st.page_link(
            "views/run/page.py",
            label="Snippets on the Run page",
            icon=":material/code:",
            query_params={"run": str(run_id)},
        )
