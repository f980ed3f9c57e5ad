"""Attached runs as the pages read them: their stack samples, classified, and the
attaches still recording.

Cached under the run marker like ``data.run_data``; the Attach page's polls are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.steps.stacks import (
    classify_samples,
    phase_shares,
    shares_over_time,
    top_sites,
)
from stepscope.app.dashboard.data import open_store, plain


@dataclass
class StackView:
    """Where an attached job's main thread spent its time, as the Run page draws it."""

    samples: int  # main-thread samples classified (the shares' denominator)
    all_samples: int  # every stored sample, all threads and processes
    processes: int  # training processes (ranks) the shares average over
    windows: int  # sampling windows stored so far
    t0: float  # the run's start (unix s): the time axis's zero
    duration_s: float  # from the first window's start to the last one's end
    shares: pd.DataFrame  # stacks.phase_shares: category, label, samples, share
    sites: pd.DataFrame  # stacks.top_sites: site, category, samples, share
    over_time: pd.DataFrame  # stacks.shares_over_time plus t_end: t, t_end, category, share


@st.cache_data(max_entries=64, show_spinner="Reading the stack samples…")
def stack_view(home: str, run_id: int, marker: tuple[Any, ...]) -> StackView | None:
    """The run's stack samples, classified into step phases; None when it has none.

    Cached under the run marker like ``run_data``: a finished attach is classified once,
    a running one again every ``data.LIVE_REFRESH_S`` at most (a window lands every few seconds).
    """
    with open_store(home) as store:
        raw = store.stack_samples(run_id)
        started_at = float(store.run(run_id)["started_at"])
    if raw.empty:
        return None
    classified = classify_samples(raw)
    over_time = shares_over_time(classified)
    ends = raw.groupby("t_start")["t_end"].max()
    over_time = over_time.assign(t_end=over_time["t"].map(ends).astype(float))
    return StackView(
        samples=int(classified["samples"].sum()) if not classified.empty else 0,
        all_samples=int(raw["samples"].sum()),
        processes=int(classified["pid"].nunique()) if not classified.empty else 0,
        windows=int(raw["t_start"].nunique()),
        t0=started_at,
        duration_s=float(raw["t_end"].max() - raw["t_start"].min()),
        shares=phase_shares(classified),
        sites=top_sites(classified, 10),
        over_time=over_time,
    )


def stack_sample_count(home: str, run_id: int) -> int:
    """Stack samples stored so far (uncached: the Attach page's progress polls it)."""
    with open_store(home) as store:
        raw = store.stack_samples(run_id)
    return int(raw["samples"].sum()) if not raw.empty else 0


def is_attach(run: dict[str, Any]) -> bool:
    """Whether the run was recorded by attaching to a process."""
    return (run.get("config") or {}).get("mode") == "attach"


def inject_mode(run: dict[str, Any]) -> str | None:
    """An attach's collectors: 'injected' (steps, requests and captures as under
    ``stepscope run``), 'stacks' (from outside only; the config says why), or None
    (being tried, or an attach from before injection)."""
    return ((run.get("config") or {}).get("inject") or {}).get("mode")


def running_attaches(home: str) -> list[dict[str, Any]]:
    """Attach runs still recording, newest first (uncached: a reloaded Attach page finds
    the recordings under way here, whoever started them)."""
    with open_store(home) as store:
        runs = store.runs()
    if runs.empty:
        return []
    live = runs[runs["status"] == "running"]
    return [
        {k: plain(v) for k, v in rec.items()} for rec in live.to_dict("records") if is_attach(rec)
    ]
