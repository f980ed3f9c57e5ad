"""The dict a step travels in from the step timer to the store.

Keys without a leading underscore are the store's columns (``RunStore.add_steps``);
keys with one are the timer's own until the row is written: the loss tensors still to
read, the batch count the look-ahead check compares, the CUDA events.
"""

from __future__ import annotations

from typing import Any

# The phase columns of a step row (``step_accounting.py`` says what each one times).
PHASE_COLUMNS = ("forward_s", "backward_s", "optimizer_s")


def public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def sum_or_none(values: list[float]) -> float | None:
    return float(sum(values)) if values else None


def add_phases(totals: list[float], row: dict[str, Any]) -> list[float]:
    """``totals`` (one slot per PHASE_COLUMNS) plus the row's phases, as a new list."""
    return [t + row[c] for t, c in zip(totals, PHASE_COLUMNS, strict=True)]


def merge_rows(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """One row spanning two consecutive ones (an iteration with several optimizers)."""
    merged = dict(later)
    merged["start_s"] = first["start_s"]
    merged["data_wait_s"] = first["data_wait_s"] + later["data_wait_s"]
    batch = (first["batch_size"] or 0) + (later["batch_size"] or 0)
    merged["batch_size"] = batch or None
    merged["_batches"] = first["_batches"] + later["_batches"]
    merged["_losses"] = first["_losses"] + later["_losses"]
    merged["profiled"] = first["profiled"] or later["profiled"]
    for column in PHASE_COLUMNS:  # each optimizer's step time is part of the iteration
        merged[column] = first[column] + later[column]
    return merged
