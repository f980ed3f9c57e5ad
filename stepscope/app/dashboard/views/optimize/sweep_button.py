"""The button that starts a batch sweep in the background, for the inference sweep's form
and the generation sweep's (the same refusals, the same start, the same jump to it)."""

from __future__ import annotations

from typing import Any

import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.access import rerun_action_refusal
from stepscope.optim_runner.background import start_sweep


def sweep_button(
    home: str,
    run: dict[str, Any],
    busy: dict[str, Any] | None,
    *,
    label: str,
    key: str,
    what: str,
    sizes: list[int],
    steps: int,
    trials: int,
    memory_limit: int | None = None,
    memory_fixes: list[str] | None = None,
) -> None:
    """Disabled, with the reason on hover, where the run's command is not this user's or
    another experiment on it is running; on a click the sweep starts and the page shows it.
    ``what``: the hover text's description of the sizes."""
    blocked = rerun_action_refusal(run)  # a shared store holds other people's commands
    if blocked is None and busy is not None:
        blocked = f"experiment {busy['id']} on this run is still running"
    clicked = st.button(
        label,
        key=key,
        icon=":material/stacked_line_chart:",
        disabled=blocked is not None,
        help=blocked or f"{what}, in the background",
    )
    if not clicked:
        return
    try:
        experiment_id = start_sweep(
            home,
            int(run["id"]),
            factors=sizes,
            steps=int(steps),
            trials=int(trials),
            memory_limit=memory_limit,
            memory_fixes=memory_fixes,
        )
    except ValueError as exc:
        st.error(f"Not started: {data.one_line(exc)}", icon=":material/error:")
        return
    ui.set_query(run=int(run["id"]), experiment=experiment_id)
    st.rerun()


__all__ = ["sweep_button"]
