"""The Optimize page's leave-one-out table: each step's set, each fix taken out of it,
and what that did (``optim_runner/verdict/leave_one_out.py`` decides; this only shows).
The names and figures come from the experiment's stored result: shown in a dataframe
and as code, never as HTML."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope.app.formats import fmt_ci, fmt_ratio


def leave_one_out(result: dict[str, Any]) -> None:
    """Each leave-one-out step: the set, each fix taken out of it, and what that did."""
    record = result.get("leave_one_out")
    if not record or not record.get("steps"):
        return
    st.markdown(f"**Leave-one-out** from `{record['from']}`: each fix taken out of the set")
    rows = [
        {
            "set": step["set"],
            "without": ", ".join(r["removed"]) if r.get("arm") else "— (the baseline)",
            "its speed vs the set": fmt_ratio(r.get("ratio")),
            "95 % CI": fmt_ci(r.get("ci")),
            "decision": ("dropped: " if r["fix"] in step["dropped"] else "kept: ") + r["text"],
        }
        for step in record["steps"]
        for r in step["removals"]
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="leave_one_out")
    notes = [s["note"] for s in record["steps"] if s.get("note")]
    notes += [f"not settled: {record['unsettled']}"] if record.get("unsettled") else []
    if notes:
        st.caption(" · ".join(notes))
