"""The run_summaries table: the runs list's figures of each ended run, kept.

A part of ``RunStore`` (see ``store.py``). `stepscope runs` and the dashboard's Runs
page show a few figures of every run (its median step, throughput, data-wait share),
which cost a read of its steps and ``summarize_steps`` each: 20 ms a run, minutes over a
team's store of 10,000 runs. A run's figures change only while it gets steps, so those
of an ended run are kept here, with the state of the run they were computed for
(``SummaryKey``); ``analyzers/steps/run_figures.py`` computes them and decides when a
kept row still holds. This module only stores and reads them: it knows nothing of what
the figures mean.

The figures of a shared store are written by anyone who lists it: they are data, read
back as numbers or nothing (``_numbers``), shown and never executed; a row that is not
is as good as absent, and is computed again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepscope.store.db import int_list

if TYPE_CHECKING:
    from stepscope.store.db import Db

Figures = dict[str, float | None]

_UPSERT = (
    "INSERT INTO run_summaries(run_id, step_count, status, ended_at, version, figures,"
    " created_at) VALUES (?,?,?,?,?,?,?) ON CONFLICT(run_id) DO UPDATE SET"
    " step_count=excluded.step_count, status=excluded.status, ended_at=excluded.ended_at,"
    " version=excluded.version, figures=excluded.figures, created_at=excluded.created_at"
)


@dataclass(frozen=True)
class SummaryKey:
    """The state of a run its figures were computed for: a run that differs from it (a
    step more, another status or end) or figures computed another way (``version``)
    have them computed again."""

    step_count: int
    status: str
    ended_at: float | None
    version: int


@dataclass(frozen=True)
class KeptSummary:
    run_id: int
    key: SummaryKey
    figures: Figures


class SummariesTable:
    """Kept figures: read all at once, written in batches by whoever computed them."""

    _db: Db

    def kept_summaries(self, run_ids: Collection[int] | None = None) -> dict[int, KeptSummary]:
        """Every kept row by run id, or those of ``run_ids`` (the 50 runs a table shows
        need not decode the figures of thousands), in one query; a row whose figures are
        not a mapping of names to numbers or nulls is left out, as if never kept."""
        sql = "SELECT run_id, step_count, status, ended_at, version, figures FROM run_summaries"
        if run_ids is not None:
            if not run_ids:
                return {}
            sql += f" WHERE run_id IN ({int_list(run_ids)})"
        rows = self._db.rows(sql)
        out: dict[int, KeptSummary] = {}
        for r in rows:
            figures = _numbers(r["figures"])
            if figures is None:
                continue
            ended = r["ended_at"]
            key = SummaryKey(
                int(r["step_count"]),
                str(r["status"]),
                None if ended is None else float(ended),
                int(r["version"]),
            )
            out[int(r["run_id"])] = KeptSummary(int(r["run_id"]), key, figures)
        return out

    def keep_summaries(self, kept: Iterable[KeptSummary]) -> None:
        """Write (or replace) rows in one transaction."""
        now = time.time()
        data = [
            (k.run_id, k.key.step_count, k.key.status, k.key.ended_at, k.key.version,
             json.dumps(k.figures), now)
            for k in kept
        ]  # fmt: skip
        if data:
            self._db.executemany(_UPSERT, data)


def _numbers(text: object) -> Figures | None:
    """``text`` read as ``{name: number | null}``; None for anything else."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(value, Mapping):
        return None
    out: Figures = {}
    for name, v in value.items():
        if v is None:
            out[name] = None
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[name] = float(v)
        else:
            return None
    return out
