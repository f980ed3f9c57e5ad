"""The run's diagnosis on the page: each finding with its evidence and fixes, why there
is none, or the Diagnose button of a running run not diagnosed yet (the Run and Optimize
pages). An ended run is diagnosed when it ends (or when first opened), never behind a
click."""

from __future__ import annotations

import html
import logging

import streamlit as st

from stepscope.analyzers.rules.diagnosis import LEVEL_TEXT, Diagnosis, diagnose_run
from stepscope.analyzers.rules.shares import overlap_note
from stepscope.app.dashboard import data, trace_data, ui
from stepscope.app.formats import fmt_pct
from stepscope.fixes.snippets import with_params
from stepscope.optim_runner.trials import plan as planning
from stepscope.types import EvidenceItem, Finding, FixAdvice, phase_label

log = logging.getLogger("stepscope.dashboard")


def findings_section(home: str, run_id: int, diagnosis: Diagnosis | None) -> None:
    st.subheader("Diagnosis")
    if diagnosis is None:
        diagnose_button(home, run_id)
        return
    if diagnosis.reason:
        st.info(f"Nothing to diagnose: {diagnosis.reason}", icon=":material/info:")
        return
    if diagnosis.capture_note:  # its shares were of the job's tail, not of a step
        st.caption(
            f":material/info: {diagnosis.capture_note[0].upper()}{diagnosis.capture_note[1:]}."
        )
    found = diagnosis.findings
    if not found:
        st.success(
            "Diagnosed: no bottleneck worth reporting was found in this run.",
            icon=":material/check:",
        )
        return
    st.caption(f"Diagnosed from {LEVEL_TEXT.get(diagnosis.level, diagnosis.level)}.")
    overlap = overlap_note(found)
    if overlap:
        st.caption(overlap)
    if any(fix.auto for f in found for fix in f.fixes):
        st.page_link(
            "views/optimize/page.py",
            label="Apply and compare…",
            icon=":material/science:",
            query_params={"run": str(run_id)},
            help="re-run the job with the automatic fixes applied, and measure the gain",
        )
    auto = tuple(sorted({fix.id for f in found for fix in f.fixes if fix.auto}))
    params = planned_params(home, run_id, auto, str(diagnosis.level))
    for i, f in enumerate(found):
        _finding(f, i, params)


@st.cache_data(max_entries=64, show_spinner=False)
def planned_params(
    home: str, run_id: int, ids: tuple[str, ...], marker: str
) -> dict[str, dict[str, object]]:
    """Each automatic fix's parameters as an experiment on this run would choose them
    (``plan.choose_fixes``, the one function that decides): the snippet shows the same
    ``num_workers`` the experiment tries. {} where the plan cannot be made."""
    if not ids:
        return {}
    try:
        with data.open_store(home) as store:
            chosen = planning.choose_fixes(store, run_id, list(ids), allow_numerics=True)
    except (ValueError, *data.user_errors()) as exc:
        log.info("run %s: no plan for the snippets: %s", run_id, exc)
        return {}
    return {f.id: dict(f.params) for f in chosen}


def _finding(f: Finding, index: int, params: dict[str, dict[str, object]]) -> None:
    # every snippet shows the plan's values, a fix's own first: prefetch_factor's snippet
    # names num_workers too, and must say the workers fix's number
    shared = {k: v for p in params.values() for k, v in p.items()}
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
            st.markdown(evidence_markdown(f.evidence), unsafe_allow_html=True)
        where = f" · in the {phase_label(f.phase)} phase of the step" if f.phase else ""
        st.caption(f"evidence level: {f.level or '—'}{where}")
        if f.fixes:
            # the top finding's fixes are what the user came for; the others stay folded
            n = len(f.fixes)
            with st.expander(f"{n} fix{'es' if n > 1 else ''}", expanded=index == 0):
                for fix in sorted(f.fixes, key=FixAdvice.order_key):  # a stored older order too
                    _fix(fix, {**shared, **params.get(fix.id, {})})


def evidence_markdown(evidence: list[EvidenceItem]) -> str:
    """One list item per piece of evidence, its source in small type. The text and the
    source come from the store, where anyone who records a run writes: both are escaped,
    so the ``<small>`` around the source is the only HTML the page gets, and their square
    brackets are markdown-escaped, so no markdown image or link (an outside address the
    page would fetch) comes through either."""
    return "\n".join(
        f"- {_plain(e.text)}" + (f" <small>· {_plain(e.source)}</small>" if e.source else "")
        for e in evidence
    )


def _plain(text: object) -> str:
    return ui.no_links(html.escape(str(text)))


def _fix(fix: FixAdvice, params: dict[str, object]) -> None:
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
        st.code(with_params(fix.snippet, params), language="python")


def findings_to_apply(home: str, run_id: int) -> list[Finding]:
    """The Optimize page's findings; [] after saying why there are none to apply (an
    ended run not diagnosed yet is diagnosed now; a failed diagnosis offers the button)."""
    diagnosis, held = None, False
    with ui.errors_as_one_line():
        held = trace_data.held_back(home, run_id)  # too big to read unasked: left out
        diagnosis = data.diagnosis(home, run_id, read_trace=not held)
    if held and diagnosis is not None:
        st.caption(
            "The run's trace is not read here (too big to analyse unasked): the Run page "
            "analyses it on a click, and the diagnosis then uses it."
        )
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
