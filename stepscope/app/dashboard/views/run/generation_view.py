"""The Run page's Generation section: a text-generation run's requests and tokens.

A generation run's steps are its requests (``collectors/steps/generation.py``), and its
answer is the requests' figures: the page leads with them (``headline``: tokens/s, TTFT,
TPOT, requests, requests/s and request p99, once), and this section adds the rest of what
only requests have: their distributions, the per-token latency against the position (the
KV-cache picture) and the prefill / decode / other split. Every figure is
``analyzers/steps/generation.py``'s, the same ``stepscope show`` prints, read through a cache
keyed like ``data.run_data`` (the run and its marker), and redrawn every couple of
seconds while the job runs. Runs without requests get nothing at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.steps.generation import (
    REQUEST_COLUMNS,
    generation_summary,
    position_profile,
    requests_frame,
    timed_requests,
    token_latencies,
)
from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.charts.generation import (
    distribution_chart,
    position_chart,
    split_chart,
)
from stepscope.app.formats import fmt_num, fmt_pct, fmt_s
from stepscope.app.kv_cache_text import kv_cache_line

# The distributions drawn: summary key, the requests' column, the axis's words.
DISTRIBUTIONS = (
    ("request_s", "latency_s", "request latency"),
    ("ttft_s", "ttft_s", "time to first token"),
    ("tpot_s", "tpot_s", "time per output token"),
)


@dataclass
class GenerationData:
    """What the section shows, computed once per run and marker."""

    summary: dict[str, Any]  # generation_summary
    requests: pd.DataFrame  # requests_frame: every request, in order
    timed: pd.DataFrame  # the timed requests (REQUEST_COLUMNS): the figures' basis
    tokens: pd.DataFrame  # token_latencies
    profile: pd.DataFrame  # position_profile of the tokens
    errors: list[str]  # the failed requests' error lines, in order


@st.cache_data(max_entries=64, show_spinner=False)
def generation_data(home: str, run_id: int, marker: tuple[Any, ...]) -> GenerationData | None:
    """The run's requests and their figures; None for a run that served none."""
    with data.open_store(home) as store:
        requests = store.requests(run_id)
        steps = store.steps(run_id)
    summary = generation_summary(requests, steps)
    if summary is None:
        return None
    tokens = token_latencies(requests)
    failed = requests[requests["status"] == "error"]
    return GenerationData(
        summary=summary,
        requests=requests_frame(requests),
        timed=timed_requests(requests, steps).reindex(columns=REQUEST_COLUMNS),
        tokens=tokens,
        profile=position_profile(tokens),
        errors=[str((m or {}).get("error") or "no message") for m in failed["meta"]],
    )


def generation_section(home: str, run_id: int, live: bool) -> None:
    """The Generation section of run ``run_id``, or nothing when it served no request."""

    @st.fragment(run_every=data.LIVE_REFRESH_S if live else None)
    def section() -> None:
        with ui.errors_as_one_line():
            marker = data.run_marker(data.run_header(home, run_id))
            g = generation_data(home, run_id, marker)
        if g is not None:
            _show(g, live)

    section()


def headline(home: str, run_id: int, marker: tuple[Any, ...], live: bool) -> bool:
    """The run's headline when it served requests: what a user of a generation job came
    for, first on the page; False (nothing shown) for a run without requests."""
    g = generation_data(home, run_id, marker)
    if g is None:
        return False
    _metrics(g.summary)
    st.caption(_counts_line(g.summary, live))
    return True


def _show(g: GenerationData, live: bool) -> None:
    s = g.summary
    st.subheader("Generation")
    st.caption("The requests' figures lead the page; here, how they are distributed.")
    if s["failed"]:
        st.warning(
            f"{s['failed']} request(s) raised, counted but never timed; the first: "
            f"{g.errors[0] if g.errors else 'no message'}",
            icon=":material/warning:",
        )
    if s["unfinished"] and not live:
        st.warning(
            f"{s['unfinished']} request(s) unfinished: the job ended during them "
            "(counted, never timed).",
            icon=":material/warning:",
        )
    if g.timed.empty:
        st.info("No request has finished yet: no latency figures.")
        return
    for col, (key, column, what) in zip(st.columns(3), DISTRIBUTIONS, strict=True):
        with col:
            st.markdown(f"**{what.capitalize()}**")
            figures = s[key]
            if figures is None:
                st.caption(f"No {what}: no timed request decoded past its first token.")
                continue
            st.plotly_chart(distribution_chart(g.timed[column], figures, what), key=f"gen_{key}")
            st.caption(
                f"p50 {fmt_s(figures['p50'])} · p90 {fmt_s(figures['p90'])} · "
                f"p99 {fmt_s(figures['p99'])} · mean {fmt_s(figures['mean'])}"
            )
    left, right = st.columns([3, 2])
    with left:
        st.markdown("**Per-token latency against position** · the KV-cache picture")
        if g.tokens.empty:
            st.info("No decoded token after a prefill was recorded (one-token requests).")
        else:
            st.plotly_chart(position_chart(g.tokens, g.profile), key="gen_positions")
            st.caption(
                "Each token's inter-token latency (to the next token) at the context length "
                "it was computed over; lines: the median over requests, and the forward's "
                "own time. Flat with a KV cache; growing with the context without one."
            )
    with right:
        st.markdown("**Prefill / decode / other** · per request")
        done = g.requests[g.requests["status"] == "done"]
        st.plotly_chart(split_chart(done), key="gen_split")
        st.caption(_split_line(s["phases"]))
    kv = kv_cache_line(s.get("kv_cache"))
    if kv is not None:
        st.markdown(f"**Memory** · {ui.no_links(kv)}")
        st.caption(
            "The cache grows by one position per token for each row: the batch and the "
            "context that fit are what it leaves free. A static cache holds its full "
            "length from the first token."
        )
    with st.expander(f"Requests ({s['requests']})"):
        st.dataframe(_requests_table(g.requests), hide_index=True, key="gen_requests")


def _metrics(s: dict[str, Any]) -> None:
    cols = st.columns(6)
    cols[0].metric("requests", fmt_num(s["requests"]), help="every request, finished or not")
    cols[1].metric(
        "tokens/s", fmt_num(s["tokens_per_s"]), help="new tokens over the timed requests' time"
    )
    cols[2].metric("requests/s", fmt_num(s["requests_per_s"]), help="timed requests, one loop")
    cols[3].metric("TTFT p50", fmt_s(_get(s["ttft_s"], "p50")), help="time to first token")
    cols[4].metric(
        "TPOT p50", fmt_s(_get(s["tpot_s"], "p50")), help="time per output token after the first"
    )
    cols[5].metric("request p99", fmt_s(_get(s["request_s"], "p99")))


def _counts_line(s: dict[str, Any], live: bool) -> str:
    parts = [
        f"{s['requests']} requests ({', '.join(s['sources']) or 'no source'}), "
        f"{s['timed_requests']} timed (warm-up and profiled ones left out)",
        f"{fmt_num(s['prompt_tokens'])} prompt tokens",
        f"{fmt_num(s['new_tokens'])} new tokens",
    ]
    if s["rows"] > 1:
        parts.append(f"up to {s['rows']} rows per request")
    if s["unfinished"]:
        parts.append(f"{s['unfinished']} {'in flight' if live else 'unfinished'}")
    if s["failed"]:
        parts.append(f"{s['failed']} failed")
    return " · ".join(parts)


def _split_line(phases: dict[str, float] | None) -> str:
    """The timed requests' summed time, split: the shares ``stepscope show`` prints."""
    if phases is None:
        return "No timed request: no split."
    shares = " · ".join(f"{k} {fmt_pct(phases[k])}" for k in ("prefill", "decode", "other"))
    return (
        f"Of the timed requests' time: {shares}. Prefill is the first forward, decode the "
        "others; other is sampling, the tokenizer and the loop's own work."
    )


def _requests_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Every request with its figures as text (an unknown one reads "—")."""
    table = pd.DataFrame(
        {
            "request": requests["request"].astype(int),
            "status": requests["status"],
            "rows": requests["rows"].map(fmt_num),
            "prompt tokens": requests["prompt_tokens"].map(fmt_num),
            "new tokens": requests["new_tokens"].map(fmt_num),
            "latency": requests["latency_s"].map(fmt_s),
            "TTFT": requests["ttft_s"].map(fmt_s),
            "TPOT": requests["tpot_s"].map(fmt_s),
            "tokens/s": requests["tokens_per_s"].map(fmt_num),
            "prefill": requests["prefill_s"].map(fmt_s),
            "decode": requests["decode_s"].map(fmt_s),
            "other": requests["other_s"].map(fmt_s),
        }
    )
    if requests["rank"].nunique() > 1:
        table.insert(0, "rank", requests["rank"].astype(int))
    return table


def _get(figures: dict[str, float] | None, key: str) -> float | None:
    return None if figures is None else figures.get(key)


__all__ = ["GenerationData", "generation_data", "generation_section"]
