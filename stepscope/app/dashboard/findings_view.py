"""The run's diagnosis on the page: each finding with its evidence and fixes, why there
is none, or the Diagnose button of a running run not diagnosed yet (the Run and Optimize
pages). An ended run is diagnosed when it ends (or when first opened), never behind a
click."""

from __future__ import annotations

import logging

import streamlit as st

from stepscope.analyzers.rules.diagnosis import LEVEL_TEXT, Diagnosis, diagnose_run
from stepscope.app.dashboard import data, ui
from stepscope.app.formats import fmt_pct
from stepscope.types import Finding, FixAdvice, phase_label

log = logging.getLogger("stepscope.dashboard")


def findings_section(home: str, run_id: int, diagnosis: Diagnosis | None) -> None:
    st.subheader("Diagnosis")
    if diagnosis is None:
        diagnose_button(home, run_id)
        return
    if diagnosis.reason:
        st.info(f"Nothing to diagnose: {diagnosis.reason}", icon=":material/info:")
        return
    found = diagnosis.findings
    if not found:
        st.success(
            "Diagnosed: no bottleneck worth reporting was found in this run.",
            icon=":material/check:",
        )
        return
    st.caption(f"Diagnosed from {LEVEL_TEXT.get(diagnosis.level, diagnosis.level)}.")
    if any(fix.auto for f in found for fix in f.fixes):
        st.page_link(
            "views/optimize.py",
            label="Apply and compare…",
            icon=":material/science:",
            query_params={"run": str(run_id)},
            help="re-run the job with the automatic fixes applied, and measure the gain",
        )
    for i, f in enumerate(found):
        _finding(f, i)


def _finding(f: Finding, index: int) -> None:
    with st.container(border=True):
        head = st.columns([6, 1, 1], vertical_alignment="center")
        with head[0]:
            st.badge(
                f.label,
                color=ui.CLASS_COLOR.get(f.klass, "gray"),  # type: ignore[arg-type]
            )
            st.markdown(f"**{f.title}**  \n{f.subtype.replace('_', ' ')}")
        head[1].metric("share of step", fmt_pct(f.share, 0))
        head[2].metric("confidence", fmt_pct(f.confidence, 0))
        if f.evidence:
            st.markdown(
                "\n".join(
                    f"- {e.text}" + (f" <small>· {e.source}</small>" if e.source else "")
                    for e in f.evidence
                ),
                unsafe_allow_html=True,
            )
        where = f" · in the {phase_label(f.phase)} phase of the step" if f.phase else ""
        st.caption(f"evidence level: {f.level or '—'}{where}")
        if f.fixes:
            # the top finding's fixes are what the user came for; the others stay folded
            n = len(f.fixes)
            with st.expander(f"{n} fix{'es' if n > 1 else ''}", expanded=index == 0):
                for fix in f.fixes:
                    _fix(fix)


def _fix(fix: FixAdvice) -> None:
    bits = []
    if fix.predicted_speedup:
        bits.append(f"predicted up to **{fix.predicted_speedup:.2f}x**")
    if fix.typical and len(fix.typical) == 2:
        src = f" ({fix.typical_source})" if fix.typical_source else ""
        bits.append(f"typically {fix.typical[0]:g}-{fix.typical[1]:g}x{src}")
    bits.append("no code change needed" if fix.auto else "needs a code change")
    if fix.changes_numerics:
        bits.append("changes numerics")
    st.markdown(f":material/build: **{fix.title or fix.id}** · " + " · ".join(bits))
    if fix.basis:
        st.caption(fix.basis)
    if fix.snippet:
        st.code(fix.snippet, language="python")


def findings_to_apply(home: str, run_id: int) -> list[Finding]:
    """The Optimize page's findings; [] after saying why there are none to apply (an
    ended run not diagnosed yet is diagnosed now; a failed diagnosis offers the button)."""
    diagnosis = None
    with ui.errors_as_one_line():
        diagnosis = data.diagnosis(home, run_id)
    if diagnosis is None:
        st.info(
            "The fixes to try come from the run's diagnosis, and this run has none yet.",
            icon=":material/troubleshoot:",
        )
        diagnose_button(home, run_id)
        return []
    if not diagnosis.findings:
        why = diagnosis.reason or "no bottleneck worth reporting was found in this run"
        st.info(f"Nothing to apply: {why}.", icon=":material/info:")
    return diagnosis.findings


def diagnose_button(home: str, run_id: int) -> None:
    """The Diagnose action of a run without findings (the Run and Optimize pages)."""
    done = st.session_state.get(f"diagnosed_{run_id}")
    reason = st.session_state.get(f"diagnosed_reason_{run_id}")
    if reason:
        st.info(f"Nothing to diagnose: {reason}", icon=":material/info:")
        return
    if done is not None:
        st.success(
            "Diagnosed: no bottleneck worth reporting was found in this run.",
            icon=":material/check:",
        )
    st.caption("This run has not been diagnosed yet.")
    if st.button("Diagnose", key="diagnose", icon=":material/troubleshoot:", type="primary"):
        try:
            with st.spinner("Diagnosing…"), data.open_store(home) as store:
                result = diagnose_run(store, run_id)
        except data.user_errors() as exc:
            ui.fail(f"diagnosis failed: {data.one_line(exc)}")
        except Exception as exc:  # a diagnosis bug must not take the page down
            log.exception("diagnosis of run %s failed", run_id)
            ui.fail(f"diagnosis failed ({type(exc).__name__}: {data.one_line(exc)})")
        st.session_state[f"diagnosed_{run_id}"] = len(result.findings)
        st.session_state[f"diagnosed_reason_{run_id}"] = result.reason
        st.rerun()
