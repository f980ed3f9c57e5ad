"""The Optimize page's largest-batch search for a training run: the form that starts a
batch sweep under a memory limit, and a finished sweep's answer.

The sweep itself is the batch sweep of ``optim_runner/sweeps/sweep.py`` (a training job:
its command line's batch flag or its DataLoader's batch size, each trial's peak memory,
then runs at the predicted largest batch, ``largest_batch.py``); its table and curve are
the inference sweep's (``inference_view.result_view``), with a peak-memory column.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope import fixes as catalog
from stepscope.app.cli.sizes import parse_size
from stepscope.app.dashboard import data
from stepscope.app.dashboard.ui import no_links
from stepscope.app.dashboard.views.optimize.sweep_button import sweep_button
from stepscope.app.largest_batch_text import curves_line, largest_batch_lines
from stepscope.collectors.launch.memory_limit import MEMORY_LIMIT_KEY
from stepscope.optim_runner.sweeps.batch_flag import find_batch_flag
from stepscope.optim_runner.sweeps.sweep import DEFAULT_FACTORS, parse_factors
from stepscope.optim_runner.trials.plan import CAPACITY
from stepscope.optim_runner.verdict.fits import size_text

STEPS = 6  # a training step's peak is reached in its first steps: a few per trial suffice
#: the fixes a curve can be drawn for: those that free memory
MEMORY_FIXES = sorted(f.id for f in catalog.FIXES.values() if CAPACITY in f.addresses)


def sweepable_training(run: dict[str, Any], steps: pd.DataFrame) -> str | None:
    """How a training run's batch can change ('--batch-size 32', 'its DataLoader'), or
    None: not a training run, or no batch size to change."""
    if steps.empty or not (run.get("facts") or {}).get("optimizer"):
        return None
    flag = find_batch_flag(list(run.get("command") or []))
    if flag is not None:
        return f"{flag.flag} {flag.value}"
    loaders = (run.get("facts") or {}).get("dataloaders") or []
    return "its DataLoader's batch size" if any(ld.get("batch_size") for ld in loaders) else None


def start_form(
    home: str, run: dict[str, Any], steps: pd.DataFrame, busy: dict[str, Any] | None
) -> None:
    """For a training run with a batch size to change: factors, the memory limit, trials
    and steps, and the button; nothing for other runs."""
    how = sweepable_training(run, steps)
    if how is None:
        return
    st.subheader("Largest batch that fits")
    recorded = (run.get("config") or {}).get(MEMORY_LIMIT_KEY)
    st.caption(
        f"Re-runs this training job at several batch sizes ({how}, multiplied by each "
        "factor), measures samples/s and peak memory per batch size, fits peak = fixed + "
        "bytes per sample, and runs the largest batch the fit says fits under the memory "
        "limit to confirm it. The job learns differently at another batch: nothing of it "
        "is changed, the sweep only measures."
    )
    c1, c2, c3, c4 = st.columns([2, 2, 1, 1])
    text = c1.text_input(
        "batch-size factors", value=",".join(map(str, DEFAULT_FACTORS)), key="fit_factors"
    )
    limit_text = c2.text_input(
        "memory limit (CPU: address space)",
        key="fit_limit",
        placeholder=f"the run's: {size_text(recorded)}" if recorded else "e.g. 2.5GB",
        help="empty: the run's own --memory-limit, or a GPU's memory",
    )
    trials = c3.number_input("trials per batch size", 1, 20, value=1, key="fit_trials")
    n_steps = c4.number_input("steps per trial", 4, 100_000, value=STEPS, key="fit_steps")
    curves = st.multiselect(
        "also with each memory fix (a curve each)",
        MEMORY_FIXES,
        key="fit_curves",
        help="every batch size runs again with the fix applied: the batch each fix allows",
    )
    try:
        factors = parse_factors(text)
        limit = parse_size(limit_text) if limit_text.strip() else None
    except ValueError as exc:
        st.warning(data.one_line(exc), icon=":material/warning:")
        return
    sweep_button(
        home,
        run,
        busy,
        label="Find the largest batch",
        key="fit_sweep",
        what=f"batch sizes x{', x'.join(map(str, factors))} and the largest that fits",
        sizes=factors,
        steps=int(n_steps),
        trials=int(trials),
        memory_limit=limit,
        memory_fixes=list(curves),
    )


def answer_view(result: dict[str, Any]) -> None:
    """A training sweep's answer above its table: the largest batch that ran under the
    limit, its speed and peak, and the fitted line it was predicted from."""
    largest = result.get("largest_batch")
    if not largest:
        return
    # the result is read from a shared store
    answer, prediction = (
        None if line is None else no_links(line) for line in largest_batch_lines(largest)
    )
    if largest.get("batch_size") is None or largest.get("limit_bytes") is None:
        st.info(answer, icon=":material/info:")
    else:
        st.success(answer, icon=":material/check_circle:")
        if prediction:
            st.caption(prediction)
    if result.get("curves"):
        for curve in result["curves"]:
            with_ = " + ".join(curve["fixes"])
            line, _ = largest_batch_lines(curve["largest_batch"])
            st.info(no_links(f"With {with_}: {line}"), icon=":material/memory:")
        st.markdown(no_links(curves_line(result)))


__all__ = ["answer_view", "start_form", "sweepable_training"]
