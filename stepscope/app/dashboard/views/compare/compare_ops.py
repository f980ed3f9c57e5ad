"""Compare's "Where the time went": B against A, operator by operator and phase by phase.

The speed-up says how much; this section says where: each operator's and kernel's time
per step in A and B (``analyzers/report/run_diff_ops.diff_runs``, the same diff as
``stepscope diff``), the change with its 95 % interval and a status, so one noisy
operator does not read as a regression. Biggest change first, as the CLI's table;
filters narrow it to a kind, a status or a name, and the chart shows the top of what
is left. The trace's step-time categories and the step timer's phases follow: a pair
of runs without traces still gets the phases, with a line saying why that is all.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.report.op_diff import STATUSES
from stepscope.analyzers.report.run_diff_ops import RunDiff
from stepscope.app.dashboard import data
from stepscope.app.dashboard.charts.op_diff import TOP, biggest_changes
from stepscope.app.dashboard.tables import DASH
from stepscope.app.formats import fmt_num, fmt_pct, fmt_s, fmt_signed_s, missing

#: the kind filter's options: what each shows
KINDS = {"all": None, "operators": "operator", "kernels": "kernel"}
#: what a RunDiff warning starts with when it says the commands differ (run_diff_ops)
_COMMANDS_DIFFER = "different commands"


# -- the table's text -------------------------------------------------------------------------
def _time(ns: Any) -> str:
    return DASH if missing(ns) else fmt_s(float(ns) / 1e9)


def _signed(ns: Any) -> str:
    return DASH if missing(ns) else fmt_signed_s(float(ns) / 1e9)


def _change(row: pd.Series) -> str:
    """'-8.9 ms (-98 %)': the percentage only where both runs spent time on it."""
    text = _signed(row["diff_ns"])
    if row["a_ns"] > 0 and row["b_ns"] > 0:
        share = float(row["diff_ns"]) / float(row["a_ns"])
        text += f" ({'+' if share > 0 else '-' if share < 0 else '±'}{fmt_pct(abs(share), 0)})"
    return text


def _interval(row: pd.Series) -> str:
    if missing(row["lo_ns"]) or missing(row["hi_ns"]):
        return DASH
    return f"{_signed(row['lo_ns'])} … {_signed(row['hi_ns'])}"


def in_words(rows: pd.DataFrame, calls: bool = True) -> pd.DataFrame:
    """The diff's rows (``op_diff.COLUMNS``) as the page shows them: every figure as text
    of ``app.formats`` (an unknown one a dash); ``calls``: the calls per step A → B."""
    out = pd.DataFrame(
        {
            "kind": rows["kind"].astype(str),
            "name": rows["name"].astype(str),
            "A / step": [_time(v) for v in rows["a_ns"]],
            "B / step": [_time(v) for v in rows["b_ns"]],
            "change": [_change(r) for _, r in rows.iterrows()],
            "95 % interval": [_interval(r) for _, r in rows.iterrows()],
        }
    )
    if calls:
        out["calls A → B"] = [
            f"{fmt_num(float(a))} → {fmt_num(float(b))}"
            for a, b in zip(rows["a_calls"], rows["b_calls"], strict=True)
        ]
    out["status"] = rows["status"].astype(str).to_numpy()
    return out


def filtered(ops: pd.DataFrame, kind: str | None, statuses: list[str], name: str) -> pd.DataFrame:
    """The rows of ``kind`` (None: all), of ``statuses`` (none picked: all), whose name
    holds ``name`` (any case); the order (biggest change first) kept."""
    keep = pd.Series(True, index=ops.index)
    if kind is not None:
        keep &= ops["kind"] == kind
    if statuses:
        keep &= ops["status"].isin(statuses)
    if name.strip():
        keep &= ops["name"].str.contains(name.strip(), case=False, regex=False)
    return ops[keep]


def _basis(rows: pd.DataFrame) -> str:
    """How the intervals were made, in words, from the rows' ``basis``."""
    kinds = set(rows["basis"].dropna())
    if kinds == {"steps"}:
        return "bootstrap over steps"
    if kinds == {"calls"}:
        return "bootstrap over calls (too few profiled steps to resample steps)"
    return "bootstrap over steps where both runs have enough of them, else over calls"


# -- the section ------------------------------------------------------------------------------
def _warnings(diff: RunDiff, commands_noted: bool) -> None:
    """The diff's own warnings; different commands only where the page has not said so."""
    for line in diff.warnings:
        if line.startswith(_COMMANDS_DIFFER):
            if not commands_noted:
                st.warning(line[0].upper() + line[1:] + ".", icon=":material/warning:")
        elif line.startswith("no trace"):
            st.info(line[0].upper() + line[1:] + ".", icon=":material/info:")
        else:
            st.warning(line[0].upper() + line[1:] + ".", icon=":material/warning:")


def _ops(diff: RunDiff) -> None:
    ops = diff.ops
    c1, c2, c3 = st.columns([2, 3, 3])
    kind = c1.radio("kind", list(KINDS), horizontal=True, key="ops_kind")
    present = [s for s in STATUSES if s in set(ops["status"])]
    statuses = c2.multiselect("status", present, placeholder="all statuses", key="ops_status")
    name = c3.text_input("name contains", key="ops_name", placeholder="aten::mm, gemm, …")
    rows = filtered(ops, KINDS[kind], statuses, name)
    if rows.empty:
        st.info("No operator or kernel matches these filters.", icon=":material/filter_alt:")
        return
    fig = biggest_changes(rows, diff.step_ns_a)
    if fig is not None:
        st.plotly_chart(fig, key="ops_diff_chart")
    st.dataframe(in_words(rows), hide_index=True, key="ops_diff")
    st.caption(
        f"{len(rows)} of {len(ops)} operators and kernels, measured changes first (the chart: "
        f"the top {min(TOP, len(rows))}). Time per step of each run's profiled steps "
        "(operators by self time, kernels by duration); the change B - A with its 95 % "
        f"interval, {_basis(rows)}. A change counts where its whole interval is beyond "
        "1 % of A's step and 5 % of the name's own time; a dash: no interval needed "
        "(new, gone, or a change smaller than that)."
    )


def show(home: str, a: int, b: int, markers: tuple[Any, Any], commands_noted: bool) -> None:
    """The section for runs ``a`` (baseline) and ``b``; ``markers``: their
    ``data.run_marker``s (the diff's cache key); ``commands_noted``: the page already said
    the two commands differ."""
    st.subheader("Where the time went")
    try:
        diff = data.ops_diff(home, a, b, markers[0], markers[1])
    except data.user_errors() as exc:
        st.warning(f"No operator diff: {data.one_line(exc)}", icon=":material/warning:")
        return
    _warnings(diff, commands_noted)
    if not diff.ops.empty:
        _ops(diff)
    if diff.categories.empty:
        return
    st.markdown("**Step-time categories and phases**")
    st.dataframe(in_words(diff.categories, calls=False), hide_index=True, key="phase_diff")
    kinds = set(diff.categories["kind"])
    parts = []
    if "category" in kinds:
        parts.append("category: the trace's breakdown over its profiled steps")
    if "phase" in kinds:
        parts.append("phase: the step timer's over every timed step (other: what no phase covers)")
    st.caption("; ".join(parts) + f". Intervals: {_basis(diff.categories)}.")
