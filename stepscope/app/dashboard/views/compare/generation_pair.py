"""Compare's Speed section for two generation runs: tokens/s, TTFT, TPOT and request
p50/p99, each with its interval and the timed requests behind it
(``optim_runner/speedup/generation_compare.py``), in place of the step and samples/s
figures, which for these runs would count requests as samples."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.app.formats import fmt_ci, fmt_num, fmt_ratio, fmt_s
from stepscope.optim_runner.speedup.generation_compare import GenerationFigure, compare_generation


@st.cache_data(max_entries=32, show_spinner=False)
def _figures(
    home: str, a: int, b: int, markers: tuple[tuple, tuple]
) -> list[GenerationFigure] | None:
    with data.open_store(home) as store:
        return compare_generation(
            store.requests(a), store.steps(a), store.requests(b), store.steps(b)
        )


def show(home: str, a: int, b: int, markers: tuple[tuple, tuple], verdict: bool) -> bool:
    """The generation figures of A and B, with ratios only where ``verdict`` (a like
    pair); False, with nothing shown, when either run served no request."""
    figures = _figures(home, a, b, markers)
    if figures is None:
        return False
    tokens = figures[0]
    cols = st.columns(3)
    cols[0].metric("tokens/s A → B", f"{fmt_num(tokens.a)} → {fmt_num(tokens.b)}", help=tokens.what)
    if verdict and tokens.ratio is not None:
        ui.ratio_metric(
            cols[1], "tokens/s B vs A", tokens.ratio, help="> 1 means B generates faster"
        )
    elif verdict and tokens.plain is not None:  # too few requests for an interval
        cols[1].metric("tokens/s B vs A", fmt_ratio(tokens.plain), help=tokens.why)
    cols[2].metric("timed requests A / B", f"{tokens.n_a} / {tokens.n_b}")
    st.dataframe(_table(figures, verdict), hide_index=True, key="generation_compare")
    st.caption(
        "Generation runs: each step is one generate() request, so they are compared by "
        "their requests' figures; ratios are B against A with > 1 better for B, with a 95 % "
        "bootstrap interval over each run's timed requests (a tail percentile of a few "
        "requests rests on the slowest of them)."
    )
    return True


def _table(figures: list[GenerationFigure], verdict: bool) -> pd.DataFrame:
    rows = []
    for f in figures:
        shown = fmt_num if f.unit == "tokens/s" else fmt_s
        row = {"figure": f.name, "A": shown(f.a), "B": shown(f.b)}
        if verdict:
            ratio = f.ratio
            row["B vs A"] = fmt_ratio(ratio.ratio if ratio else f.plain)
            row["95 % interval"] = fmt_ci((ratio.lo, ratio.hi)) if ratio else f.why
            row["verdict"] = ratio.verdict if ratio else "—"
        row["timed requests (A / B)"] = f"{f.n_a} / {f.n_b}"
        rows.append(row)
    return pd.DataFrame(rows)
