"""The figures the runs list shows for each run, kept in the store once the run has ended.

`stepscope runs` and the dashboard's Runs page show, for every run, figures of
``summarize_steps`` (``LISTED``). Computed for every run at every listing, they took
minutes over a team's store of 10,000 runs (20 ms of ``summarize_steps`` a run, and a
query each for its steps). A run's figures change only while it gets steps, so those of
an ended run are kept (``store/summaries.py``) with the state of the run they were
computed for (its step count, status and end): a run whose state differs from its kept
one (steps added or replaced since, a lost run found, a run ended again), a run never
kept (recorded before the table, or listed for the first time), and figures kept by
another ``FIGURES_VERSION`` are computed again, and kept. A running run's are computed
at every listing: they change. Whoever lists the store keeps what it computed, so the
first listing after an upgrade pays for every run once, in batches (each batch kept as
it is done: an interrupted listing keeps its progress), and later ones only for runs
that ended since.

The figures are ``summarize_steps``' own, over the steps ``store.steps`` returns: the
same function on the same frames (``store.steps_of``), so a kept figure is the one a
fresh computation gives, to the last bit (a JSON round trip keeps a float exactly).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepscope.store.db import db_errors
from stepscope.store.summaries import Figures, KeptSummary, SummaryKey
from stepscope.store.url import StoreError

if TYPE_CHECKING:
    import pandas as pd

#: the figures of ``summarize_steps`` that the runs list shows (CLI and dashboard)
LISTED = ("step_time_median_s", "samples_per_s", "data_wait_share")
#: how the kept figures were computed: raise it when ``summarize_steps`` computes one of
#: LISTED another way (or LISTED changes), and every kept row is computed again once
FIGURES_VERSION = 2  # 2: evaluation steps of another process left out
#: steps read and summarised per batch, and runs: a bound on memory, and on the work an
#: interrupted first listing loses (500 runs: about 10 s)
BATCH_STEPS = 200_000
BATCH_RUNS = 500


@dataclass(frozen=True)
class RunState:
    """What of a run decides whether its kept figures still hold."""

    run_id: int
    step_count: int
    status: str
    ended_at: float | None

    @property
    def ended(self) -> bool:
        return self.status != "running"


def run_states(runs: pd.DataFrame | Sequence[Mapping[str, Any]]) -> list[RunState]:
    """The state of each run of ``store.runs()`` or ``store.run_list()`` (its ``steps``
    column is the count), or of each dict of ``store.run_rows()``."""
    names = ("id", "steps", "status", "ended_at")
    if isinstance(runs, Sequence):  # dicts: the runs list's path without pandas
        columns = [[row[name] for row in runs] for name in names]
    else:
        columns = [runs[name] for name in names]
    return [
        RunState(int(i), int(n), str(status), _seconds(end))
        for i, n, status, end in zip(*columns, strict=True)
    ]


def _seconds(value: Any) -> float | None:
    """A moment of a frame's float column (NaN: none) or of a row (None: none)."""
    return None if value is None or value != value else float(value)


def kept_figures(store: Any, states: list[RunState]) -> tuple[dict[int, Figures], list[RunState]]:
    """The figures kept for runs whose state is still the one they were computed for,
    and the runs whose figures must be computed (running, never kept, or changed since)."""
    kept = store.kept_summaries([state.run_id for state in states])
    known: dict[int, Figures] = {}
    todo: list[RunState] = []
    for state in states:
        row = kept.get(state.run_id)
        if state.ended and row is not None and row.key == _key(state):
            known[state.run_id] = {name: row.figures.get(name) for name in LISTED}
        else:
            todo.append(state)
    return known, todo


def compute_figures(store: Any, todo: list[RunState]) -> dict[int, Figures]:
    """The figures of ``todo``'s runs, their steps read in batches of a query per few
    hundred runs; those of ended runs are kept as each batch is done."""
    out: dict[int, Figures] = {}
    if not todo:  # every figure kept: the list needs no pandas
        return out
    # local: pandas (0.6 s), which a list whose figures are all kept never needs
    from stepscope.analyzers.steps.step_stats import summarize_steps

    for batch in _batches(todo):
        steps_of = store.steps_of([s.run_id for s in batch])
        done: list[KeptSummary] = []
        for state in batch:
            steps = steps_of[state.run_id]
            summary = summarize_steps(steps)
            figures = {name: summary[name] for name in LISTED}
            out[state.run_id] = figures
            if state.ended:  # keyed by the steps read, in case one came after the count
                key = _key(RunState(state.run_id, len(steps), state.status, state.ended_at))
                done.append(KeptSummary(state.run_id, key, figures))
        _keep(store, done)
    return out


def listed_figures(store: Any, runs: pd.DataFrame) -> dict[int, Figures]:
    """run id -> LISTED figures, for every run of ``store.runs()``: kept, or computed."""
    known, todo = kept_figures(store, run_states(runs))
    return {**known, **compute_figures(store, todo)}


def _key(state: RunState) -> SummaryKey:
    return SummaryKey(state.step_count, state.status, state.ended_at, FIGURES_VERSION)


def _batches(todo: list[RunState]) -> list[list[RunState]]:
    """``todo`` cut into at most BATCH_RUNS runs of at most BATCH_STEPS steps together
    (a run with more is a batch of its own)."""
    batches: list[list[RunState]] = []
    current: list[RunState] = []
    size = 0
    for state in todo:
        if current and (size + state.step_count > BATCH_STEPS or len(current) == BATCH_RUNS):
            batches.append(current)
            current, size = [], 0
        current.append(state)
        size += state.step_count
    if current:
        batches.append(current)
    return batches


def _keep(store: Any, done: list[KeptSummary]) -> None:
    """Keep what was computed; a store this user cannot write (a read-only file, a
    server role without INSERT) is listed all the same, its figures computed again."""
    try:
        store.keep_summaries(done)
    except (StoreError, *db_errors()):
        pass
