"""The Optimize page's batch sweep for a text-generation run: start it, read its curve.

A generation job's requests come one at a time from its own loop; the sweep batches them
(``optim_runner/sweeps/generation_sweep.py``: the job's own model and prompts, recorded once,
then generated 1, 2, 4, ... rows at a time) and shows per batch size tokens/s, request
latency and whether the answers stayed the same. Every figure is the stored result's, as
``stepscope optimize --sweep batch --json`` prints it.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.steps.generation import is_generation
from stepscope.app.dashboard import data
from stepscope.app.dashboard.charts.sweep import generation_curve
from stepscope.app.dashboard.ui import no_links
from stepscope.app.dashboard.views.optimize.sweep_button import sweep_button
from stepscope.app.formats import fmt_ci, fmt_pct, fmt_ratio, fmt_s
from stepscope.optim_runner.sweeps.generation_sweep import DEFAULT_BATCH_SIZES, DEFAULT_PROMPTS
from stepscope.optim_runner.sweeps.sweep import parse_factors


def start_form(
    home: str, run: dict[str, Any], steps: pd.DataFrame, busy: dict[str, Any] | None
) -> None:
    """For a generation run: batch sizes, prompts, trials and the button."""
    if not is_generation(steps):
        return
    st.subheader("Batch sweep of the requests")
    st.caption(
        "Runs the job once to record its first requests' prompts, then again per batch "
        "size with those prompts generated that many at a time (left-padded, the job's own "
        "model and settings): tokens/s, request latency and the share of tokens identical "
        "to batch 1's answers. The job's own loop is not changed: batching it is yours."
    )
    c1, c2, c3 = st.columns([2, 1, 1])
    text = c1.text_input(
        "batch sizes", value=",".join(map(str, DEFAULT_BATCH_SIZES)), key="gen_sweep_sizes"
    )
    prompts = c2.number_input("prompts", 1, 1024, value=DEFAULT_PROMPTS, key="gen_sweep_prompts")
    trials = c3.number_input("trials per batch size", 1, 10, value=1, key="gen_sweep_trials")
    try:
        sizes = parse_factors(text)
    except ValueError as exc:
        st.warning(
            data.one_line(exc).replace("--batch-factors", "batch sizes"), icon=":material/warning:"
        )
        return
    sweep_button(
        home,
        run,
        busy,
        label="Run the batch sweep",
        key="gen_sweep",
        what=f"batch sizes {', '.join(map(str, sizes))}",
        sizes=sizes,
        steps=int(prompts),
        trials=int(trials),
    )


def result_view(row: dict[str, Any]) -> None:
    """A finished sweep: the knee, the table and the curve."""
    result = row.get("result") or {}
    rows = result.get("rows") or []
    if not rows:
        st.warning(f"Sweep {row['id']} ended without a result.", icon=":material/warning:")
        return
    knee = result.get("knee")
    if knee:
        st.success(
            f"Knee: **batch {knee['batch_size']}** — {no_links(knee['why'])}; request p99 "
            f"{fmt_s(knee.get('p99_s'))}.",
            icon=":material/check_circle:",
        )
    changed = [r for r in rows if r.get("token_agreement") is not None and r["token_agreement"] < 1]
    if changed and not result.get("sampling"):
        sizes = ", ".join(str(r["batch_size"]) for r in changed)
        st.warning(
            f"Batched answers differ from batch 1's at batch size {sizes}: read the "
            "'same tokens' column before batching.",
            icon=":material/warning:",
        )
    warning = (result.get("contention") or {}).get("warning")
    if warning:
        st.warning(warning, icon=":material/warning:")
    st.dataframe(
        pd.DataFrame([_table_row(r, knee) for r in rows]), hide_index=True, key="gen_sweep_table"
    )
    fig = generation_curve(rows, knee)
    if fig is not None:
        st.plotly_chart(fig, key="gen_sweep_curve")
    st.caption(
        f"The first {result.get('prompts')} requests' prompts (recorded by run "
        f"{result.get('capture_run')}), {result.get('trials')} trial(s) per batch size, "
        "interleaved; a request's latency is its batch's; tokens/s ratio against batch 1 "
        f"with a bootstrap 95 % interval. {result.get('numerics') or ''}"
    )


def _table_row(r: dict[str, Any], knee: dict[str, Any] | None) -> dict[str, Any]:
    same = fmt_pct(r.get("token_agreement"))
    if r.get("first_divergence") is not None:
        same += f" (first at token {r['first_divergence']})"
    return {
        "batch size": r["batch_size"],
        "tokens/s": r.get("tokens_per_s"),
        "vs batch 1": fmt_ratio(r.get("speedup")) if r["batch_size"] != 1 else "1.00x",
        "95 % CI": fmt_ci(r.get("ci")) if r["batch_size"] != 1 else "—",
        "request p50": fmt_s(r.get("request_p50_s")),
        "request p99": fmt_s(r.get("request_p99_s")),
        "same tokens": same,
        "status": r.get("status") if r.get("status") != "completed" else "ok",
        "knee": "◀ knee" if knee and r["batch_size"] == knee.get("batch_size") else "",
        "trial runs": ", ".join(f"#{x}" for x in r.get("runs") or []),
    }


__all__ = ["result_view", "start_form"]
