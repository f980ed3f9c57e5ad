"""What `stepscope show` computes over a run's records: its step figures, its requests,
its samples' means and maxima, and its memory breakdown.

A module of its own because it is the part of `show` that needs pandas and the trace
analyzers: ``show_kept.py`` imports it only when the run's kept figures do not hold (a
running run, one never shown, one that changed since). Everything it returns is JSON as
it is (``term.jsonable``: plain numbers, None for NaN, string keys), the same whether
`show` prints it now or reads it back from the store later, so the two print alike.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from stepscope.analyzers.steps.generation import generation_summary
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.app.cli.memory import memory_breakdown_json
from stepscope.app.cli.term import jsonable


def compute_figures(store: Any, run_id: int) -> dict[str, Any]:
    """``{"steps", "generation", "samples", "memory"}`` of the run, as the store has it
    now: ``summarize_steps``' figures, ``generation_summary`` (None for a run that served
    no requests), ``samples_summary`` and the memory breakdown's JSON form (None without
    a timeline; ``memory_section.with_lines`` words it)."""
    steps = store.steps(run_id)
    return jsonable(
        {
            "steps": summarize_steps(steps),
            "generation": generation_summary(store.requests(run_id), steps),
            "samples": samples_summary(store.samples(run_id)),
            "memory": memory_breakdown_json(store, run_id),
        }
    )


def samples_summary(samples: pd.DataFrame) -> dict[str, Any]:
    """Mean and max of every sampled metric, keyed ``scope.metric``."""
    if samples.empty:
        return {"count": 0, "duration_s": None, "metrics": {}}
    grouped = samples.dropna(subset=["value"]).groupby(["scope", "metric"])["value"]
    metrics = {
        f"{scope}.{metric}": {"mean": float(s.mean()), "max": float(s.max()), "n": int(len(s))}
        for (scope, metric), s in grouped
    }
    return {
        "count": int(samples["t"].nunique()),
        "duration_s": float(samples["t"].max() - samples["t"].min()),
        "metrics": metrics,
    }
